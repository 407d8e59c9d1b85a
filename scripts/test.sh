#!/usr/bin/env bash
# The test command: set up, check the habits CI enforces (formatting, lints, structure), build
# everything, run every test, run the kernel matrix, check the deploy manifests, and fuzz briefly. As root the root
# tests (#[ignore = "needs root…"]) run too and load real BPF programs; without root they are
# reported as ignored.
#
# CI stops a run at 90 minutes; on the 2-core VM this takes about 65 (each step's time is
# printed). So the soak runs 5 minutes here (PHASEPROF_SOAK_MINUTES=10 or 60 by hand), and the
# matrix boots the two oldest of Debian's kernels (5.10 and 6.1, Debian 12's own) after the
# suite has run its checks on this one; `bash scripts/kernels/matrix.sh` adds 6.12.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
  local start=$SECONDS
  "$@"
  echo "test.sh: $((SECONDS - start)) s: $*" >&2
}
step source scripts/setup.sh
step cargo fmt --all --check
step clang-format --dry-run --Werror bpf/src/*.bpf.c bpf/src/*.bpf.h bpf/include/*.h
step bash scripts/check-structure.sh
step cargo build --release --workspace
step cargo clippy --release --workspace --all-targets -- -D warnings
if [ "$(id -u)" = 0 ]; then
  step cargo test --release --workspace -- --include-ignored
else
  step cargo test --release --workspace
fi
if [ "$(id -u)" = 0 ]; then
  exe=$(bash scripts/integration-exe.sh)
  # The ClickHouse store again on the current ClickHouse release (chDB behind its HTTP
  # interface): sums equal merges, and a fault at every step of a batch counts once.
  PHASEPROF_TEST_CHDB=1 step "$exe" --include-ignored --exact --test-threads 1 \
    store_sums::store_sums_equal_merge_clickhouse \
    store_faults::every_failed_step_of_a_clickhouse_batch_counts_once
  # The soak: an agent and a collector on ClickHouse over changing call paths, short-lived
  # targets, collector and ClickHouse restarts (its figures are printed).
  PHASEPROF_SOAK_MINUTES=${PHASEPROF_SOAK_MINUTES:-5} step "$exe" --include-ignored --exact \
    fleet_soak::agent_and_collector_soak --nocapture
  # The kernel matrix: the exactness checks again inside Debian's stock kernels booted under
  # qemu (root only, as the BPF tests).
  MATRIX_HOST=0 KERNELS=${KERNELS:-bullseye bookworm} step bash scripts/kernels/matrix.sh
  # The .deb installed and purged, the OCI image recording a host process under podman.
  step bash scripts/check-packages.sh
fi
step bash scripts/check-deploy.sh
step bash scripts/fuzz.sh 15
