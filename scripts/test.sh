#!/usr/bin/env bash
# The test command: set up, check the habits CI enforces (formatting, lints, structure), build
# everything, run every test, run the kernel matrix, check the deploy manifests, and fuzz briefly. As root the root
# tests (#[ignore = "needs root…"]) run too and load real BPF programs; without root they are
# reported as ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo fmt --all --check
clang-format --dry-run --Werror bpf/src/*.bpf.c bpf/src/*.bpf.h bpf/include/*.h
bash scripts/check-structure.sh
cargo build --release --workspace
cargo clippy --release --workspace --all-targets -- -D warnings
if [ "$(id -u)" = 0 ]; then
  cargo test --release --workspace -- --include-ignored
else
  cargo test --release --workspace
fi
# The ClickHouse store again on the current ClickHouse release (chDB behind its HTTP interface):
# sums equal merges, and a fault at every step of a batch counts once.
if [ "$(id -u)" = 0 ]; then
  PHASEPROF_TEST_CHDB=1 cargo test --release -p phaseprof-e2e --test integration -- \
    --include-ignored --exact --test-threads 1 store_sums::store_sums_equal_merge_clickhouse \
    store_faults::every_failed_step_of_a_clickhouse_batch_counts_once
fi
# The soak: an agent and a collector on ClickHouse for 10 minutes of changing call paths,
# short-lived targets, collector and ClickHouse restarts (its figures are printed).
if [ "$(id -u)" = 0 ]; then
  PHASEPROF_SOAK_MINUTES=10 cargo test --release -p phaseprof-e2e --test integration -- \
    --include-ignored --exact fleet_soak::agent_and_collector_soak --nocapture
fi
# The kernel matrix: the exactness checks again inside Debian's stock 5.10, 6.1 and 6.12 kernels
# booted under qemu (root only, as the BPF tests).
if [ "$(id -u)" = 0 ]; then
  bash scripts/kernels/matrix.sh
fi
bash scripts/check-deploy.sh
bash scripts/fuzz.sh 15
