#!/usr/bin/env bash
# The root test suite with two CPU-bound competitors on the machine (one per core of our 2-core
# machines): every bound must compare like with like (blocked time against sleeps, cpu wait
# against the kernel's run delay, samples against the targets' CPU time), never a fixed floor
# that contention breaks. Usage: scripts/test-contended.sh [HOGS] [test filters...]; run as root
# after scripts/test.sh has built everything. The competitors stop however the suite ends.
set -euo pipefail
cd "$(dirname "$0")/.."
hogs=${1:-2}
shift || true
pids=()
stop_hogs() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap stop_hogs EXIT INT TERM
for _ in $(seq "$hogs"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "test-contended: $hogs CPU hogs running (pids ${pids[*]})"
cargo test --release -p phaseprof-e2e --test integration -- --include-ignored "$@"
