#!/usr/bin/env bash
# The test command: set up, build everything, run every test (root tests included; as root
# they load real BPF programs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo build --release --workspace
cargo test --release --workspace
bash scripts/check-deploy.sh
