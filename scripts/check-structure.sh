#!/usr/bin/env bash
# Structure gates CI enforces (see README, "Layout"):
#  - no source file over 600 lines, except generated ones (vmlinux.h, syscall tables);
#  - no C function over 120 lines (Rust's: clippy's too_many_lines, Cargo.toml and clippy.toml);
#  - no import cycle between the top-level modules of any crate (each layer knows only the ones below);
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

# C function lengths: a function's body opens and closes at column 0.
for f in $(echo "$sources" | grep -e '\.c$' -e '\.h$'); do
  awk -v max="$MAX_FN" -v file="$f" '
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

# Import cycles between the top-level modules of each crate: an edge A B when a file of module A
# names `crate::B` (or `super::B` from a file directly under src/); tsort reports any loop.
module_edges() { # $1: the crate's src directory
  for f in $(git ls-files "$1/*.rs"); do
    rel=${f#"$1"/}
    from=${rel%%/*}; from=${from%.rs}
    case $from in lib | main) continue ;; esac
    # `crate::x::…` and the first names of `crate::{x::…, y::…}`.
    { grep -o 'crate::[a-z_0-9]\+' "$f" | sed 's/crate:://'
      grep -o 'crate::{[^}]*' "$f" | sed 's/crate::{//' | tr ',' '\n' | sed 's/^ *//; s/::.*//' | grep -x '[a-z_0-9]\+'
      case $rel in */*) ;; *) grep -o 'super::[a-z_0-9]\+' "$f" | sed 's/super:://' ;; esac
    } | sort -u | while read -r to; do
      if [ "$to" != "$from" ] && [ -e "$1/$to.rs" -o -d "$1/$to" ]; then echo "$from $to"; fi
    done
  done | sort -u || true
}
for src in $(git ls-files '*/src/lib.rs' '*/src/main.rs' | grep -v -e '^fuzz/' -e '^tests/workloads/' | xargs -n1 dirname | sort -u); do
  edges=$(module_edges "$src")
  [ -n "$edges" ] || continue
  if ! out=$(echo "$edges" | tsort 2>&1 >/dev/null) || [ -n "$out" ]; then
    echo "structure: import cycle between the modules of $src:"
    echo "$out" | sed 's/^/  /'
    fail=1
  fi
done

if cargo tree -p phaseprof-collector -e normal 2>/dev/null | grep -q -e libbpf -e 'phaseprof-bpf'; then
  echo "structure: the collector depends on the BPF side:"
  cargo tree -p phaseprof-collector -e normal -i libbpf-sys 2>/dev/null | head -20 | sed 's/^/  /'
  fail=1
fi

exit $fail
