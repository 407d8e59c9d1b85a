#!/usr/bin/env bash
# Fuzzes the collector's window decoder (fuzz/fuzz_targets/window_decoder.rs) for SECONDS
# (default 60). Installs what it needs: a nightly toolchain (rustup) and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v rustup >/dev/null || { echo "fuzz: rustup is required (cargo fuzz needs nightly)" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
cargo +nightly fuzz run window_decoder corpus/window_decoder -- -max_total_time="$seconds" -rss_limit_mb=4096
