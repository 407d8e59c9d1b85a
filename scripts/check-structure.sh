#!/usr/bin/env bash
# Structure gates CI enforces (see README, "Layout"):
#  - no source file over 600 lines, except generated ones (vmlinux.h, syscall tables);
#  - no function over 120 lines outside tests and the bench;
#  - no import cycle between the agent's top-level modules (each layer knows only the ones below);
#  - the collector does not depend on the BPF side (no libbpf in its dependency tree).
# Prints every violation, exits 1 if there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_FILE=600
MAX_FN=120
fail=0

sources=$(git ls-files '*.rs' '*.c' '*.h' | grep -v -e '^bpf/vmlinux/' -e 'syscall_names.rs$' -e '^fuzz/corpus/')

for f in $sources; do
  n=$(wc -l < "$f")
  if ((n > MAX_FILE)); then
    echo "structure: $f has $n lines (at most $MAX_FILE)"
    fail=1
  fi
done

# Function lengths. Rust as rustfmt lays it out: a function's closing brace is the first line
# after its signature at the signature's indentation. Test modules (from `#[cfg(test)]` on)
# and the test and bench crates are left out. C: a function's body opens and closes at column 0.
for f in $(echo "$sources" | grep -v -e '^tests/' -e '^fuzz/'); do
  awk -v max="$MAX_FN" -v file="$f" '
    /^#\[cfg\(test\)\]/ { exit }
    file ~ /\.rs$/ {
      if (!name && match($0, /^ *(pub(\([a-z]+\))? )?(const )?(async )?(unsafe )?(extern "C" )?fn [A-Za-z0-9_]+/)) {
        sig = substr($0, RSTART, RLENGTH); sub(/.*fn /, "", sig)
        indent = match($0, /[^ ]/) - 1
        # A declaration without a body (trait method) ends on its own line.
        if ($0 ~ /;$/) next
        name = sig; start = NR; next
      }
      if (name) {
        i = match($0, /[^ ]/) - 1
        if (i == indent && $0 ~ /^ *}/) {
          if (NR - start + 1 > max) printf "structure: %s:%d: fn %s has %d lines (at most %d)\n", file, start, name, NR - start + 1, max
          name = ""
        }
      }
      next
    }
    file ~ /\.[ch]$/ {
      if ($0 ~ /^[A-Za-z].*\(/ && $0 !~ /;$/) { cname = $0; cstart = NR }
      if ($0 ~ /^}/ && cname) {
        if (NR - cstart + 1 > max) printf "structure: %s:%d: %s has %d lines (at most %d)\n", file, cstart, cname, NR - cstart + 1, max
        cname = ""
      }
    }
  ' "$f"
done | tee /tmp/structure-fns.$$ 
[ -s /tmp/structure-fns.$$ ] && fail=1
rm -f /tmp/structure-fns.$$

# Import cycles between the agent's top-level modules: an edge A B when a file of module A
# names `crate::B`; tsort reports any loop.
edges=$(for f in $(git ls-files 'agent/src/*.rs'); do
  rel=${f#agent/src/}
  from=${rel%%/*}; from=${from%.rs}
  case $from in lib | main) continue ;; esac
  # `crate::x::…` and the first names of `crate::{x::…, y::…}`.
  { grep -o 'crate::[a-z_0-9]\+' "$f" | sed 's/crate:://'
    grep -o 'crate::{[^}]*' "$f" | sed 's/crate::{//' | tr ',' '\n' | sed 's/^ *//; s/::.*//' | grep -x '[a-z_0-9]\+'
  } | sort -u | while read -r to; do
    if [ "$to" != "$from" ]; then echo "$from $to"; fi
  done
done | sort -u || true)
if ! out=$(echo "$edges" | tsort 2>&1 >/dev/null) || [ -n "$out" ]; then
  echo "structure: import cycle between agent modules:"
  echo "$out" | sed 's/^/  /'
  fail=1
fi

if cargo tree -p phaseprof-collector -e normal 2>/dev/null | grep -q -e libbpf -e 'phaseprof-bpf'; then
  echo "structure: the collector depends on the BPF side:"
  cargo tree -p phaseprof-collector -e normal -i libbpf-sys 2>/dev/null | head -20 | sed 's/^/  /'
  fail=1
fi

exit $fail
