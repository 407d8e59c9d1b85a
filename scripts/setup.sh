#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test phaseprof (run as root).
# Quick when everything is present already.
set -euo pipefail

packages=(clang llvm libelf-dev zlib1g-dev pkg-config bpftool linux-perf strace bpftrace gzip util-linux)
command -v go >/dev/null 2>&1 || packages+=(golang-go)   # `go tool pprof` reads our exports

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  for d in "$HOME/.cargo/bin" /root/.cargo/bin /usr/local/cargo/bin; do
    [ -x "$d/cargo" ] && export PATH="$d:$PATH" && break
  done
fi
command -v cargo >/dev/null 2>&1 || {
  echo "setup: cargo (Rust >= 1.88, via rustup) is required and was not found" >&2
  exit 1
}
