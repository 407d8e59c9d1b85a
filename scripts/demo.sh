#!/usr/bin/env bash
# The main job: profile the bundled validator-sim per phase, print its report and write its
# flamegraphs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --workspace
(cd tests/workloads/validator-sim && cargo build --release --quiet)
out=${OUT:-target/demo}
mkdir -p "$out"
./target/release/phaseprof record -v --phases tests/workloads/validator-sim/phases.toml \
  --events cpu,offcpu,syscall,alloc,pagefault \
  -o "$out/validator-sim.phaseprof" -- \
  tests/workloads/validator-sim/target/release/validator-sim \
  --blocks 40 --threads 4 --burn-ms 25 --clone-bytes 1048576 --flushes 16 --sleep-ms 10 \
  --leak-bytes 65536
./target/release/phaseprof report "$out/validator-sim.phaseprof"
./target/release/phaseprof report "$out/validator-sim.phaseprof" --live --top 5
for kind in cpu offcpu syscall alloc pagefault; do
  ./target/release/phaseprof export "$out/validator-sim.phaseprof" --format svg --event "$kind" \
    -o "$out/validator-sim.$kind.svg"
done
./target/release/phaseprof export "$out/validator-sim.phaseprof" --format pprof -o "$out/validator-sim.cpu.pb.gz"
echo "flamegraphs: $out/validator-sim.{cpu,offcpu,syscall,alloc,pagefault}.svg  pprof: $out/validator-sim.cpu.pb.gz"
# Then serve it: flamegraphs per event kind and phase, the phase table, downloads
# (NO_SERVE=1 skips this; LISTEN=addr:port changes the address).
if [ -z "${NO_SERVE:-}" ]; then
  echo "serving on http://${LISTEN:-127.0.0.1:7070}/ (Ctrl-C stops)"
  exec ./target/release/phaseprof serve "$out/validator-sim.phaseprof" --listen "${LISTEN:-127.0.0.1:7070}"
fi
