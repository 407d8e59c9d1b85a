#!/usr/bin/env bash
# Fuzzes the collector's window decoder (fuzz/fuzz_targets/window_decoder.rs) and its HTTP
# ingest path (fuzz/fuzz_targets/http_ingest.rs: the real router over an in-memory store), both
# at once, for SECONDS each (default 60). Memory is bounded: libFuzzer stops with a failure if
# an input makes either one exceed 2 GiB (-rss_limit_mb) or allocate over 1 GiB at once.
# Installs what it needs: a nightly toolchain (rustup) and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v rustup >/dev/null || { echo "fuzz: rustup is required (cargo fuzz needs nightly)" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
pids=()
for target in window_decoder http_ingest; do
  mkdir -p "corpus/$target"
  cargo +nightly fuzz build "$target"
done
for target in window_decoder http_ingest; do
  cargo +nightly fuzz run "$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    >"../target/fuzz-$target.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  target=$([ "$i" = 0 ] && echo window_decoder || echo http_ingest)
  if wait "${pids[$i]}"; then
    echo "fuzz: $target: no crash in ${seconds} s: $(grep -a -E '^Done|stat::number_of_executed_units|#[0-9]+.*DONE' "../target/fuzz-$target.log" | tail -1)"
  else
    echo "fuzz: $target FAILED (log: target/fuzz-$target.log)" >&2
    tail -30 "../target/fuzz-$target.log" >&2
    status=1
  fi
done
exit $status
