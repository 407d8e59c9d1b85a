#!/usr/bin/env bash
# Downloads Debian's stock amd64 kernel images (the newest of each suite) and unpacks them under
# $KERNELS_DIR (default target/kernels/<suite>/): boot/vmlinuz-* and lib/modules/*. Idempotent:
# a suite already unpacked is kept. Uses a private apt state, so the host's sources are untouched.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${KERNELS_DIR:-$PWD/target/kernels}
suites=${*:-bullseye bookworm trixie}
mkdir -p "$dir"
for suite in $suites; do
  out=$dir/$suite
  if compgen -G "$out/boot/vmlinuz-*" >/dev/null; then
    continue
  fi
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir"/{lists/partial,cache/archives/partial}
  echo "deb [trusted=yes] http://deb.debian.org/debian $suite main" >"$apt_dir/sources.list"
  opts=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache"
    -o APT::Get::List-Cleanup=0 -o Acquire::Languages=none)
  apt-get "${opts[@]}" update -qq
  # The metapackage names the suite's current ABI: linux-image-amd64 -> linux-image-X-amd64.
  pkg=$(apt-cache "${opts[@]}" depends linux-image-amd64 |
    sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
  [ -n "$pkg" ] || { echo "no linux-image-amd64 in $suite" >&2; exit 1; }
  # The unsigned image is the same kernel without the EFI signature; either boots under qemu.
  (cd "$apt_dir" && { apt-get "${opts[@]}" download "$pkg-unsigned" 2>/dev/null ||
    apt-get "${opts[@]}" download "$pkg"; })
  mkdir -p "$out"
  dpkg -x "$apt_dir"/linux-image-*.deb "$out"
  rm -rf "$apt_dir"
  trap - EXIT
  echo "kernel $suite: $(basename "$out"/boot/vmlinuz-*)"
done
