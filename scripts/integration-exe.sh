#!/usr/bin/env bash
# Prints the path of the end-to-end test binary (tests/integration), building it if needed. The
# test command and the kernel matrix run it directly: `cargo test -p phaseprof-e2e` would resolve
# features apart from the workspace's and rebuild a dozen crates first.
set -euo pipefail
cd "$(dirname "$0")/.."
exe=$(cargo test --release --workspace --test integration --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "integration":
        print(m["executable"])')
[ -x "$exe" ] || { echo "the integration test binary was not built" >&2; exit 1; }
echo "$exe"
