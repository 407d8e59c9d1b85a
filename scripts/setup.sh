#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test phaseprof (run as root).
# Quick when everything is present already.
set -euo pipefail

packages=(clang clang-format llvm libelf-dev zlib1g-dev pkg-config bpftool linux-perf strace bpftrace gzip util-linux time
          chromium                                        # the web UI's browser test
          clickhouse-server clickhouse-client             # the collector's ClickHouse store test
          redis-server redis-tools                        # bench --only redis: a real C server
          podman buildah runc dpkg-dev)                   # scripts/package.sh: the image, the .deb
command -v go >/dev/null 2>&1 || packages+=(golang-go)   # `go tool pprof` reads our exports
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm) # playwright-core drives chromium
command -v objcopy >/dev/null 2>&1 || packages+=(binutils) # tests split debug files off

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
  # The bench starts its own redis-server; the package's service, started by the install, is
  # not wanted on this machine.
  if [[ " ${missing[*]} " == *" redis-server "* ]] && command -v systemctl >/dev/null 2>&1; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
  fi
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

# rust-toolchain.toml names the toolchain by version; a machine whose `stable` is that version
# gets it under that name rather than downloaded again (rustup itself installs it otherwise).
# `rustup toolchain link` refuses version names, so the link is made by hand, as rustup lays out.
if command -v rustup >/dev/null 2>&1; then
  pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
  host=$(rustc +stable -vV 2>/dev/null | sed -n 's/^host: //p')
  toolchains="$(rustup show home)/toolchains"
  if [ -n "$host" ] && [ ! -e "$toolchains/$pinned-$host" ] &&
    rustc +stable --version | grep -q "^rustc $pinned "; then
    ln -s "$(rustc +stable --print sysroot)" "$toolchains/$pinned-$host"
  fi
fi

# The lint and format gates of scripts/test.sh.
if command -v rustup >/dev/null 2>&1; then
  for c in clippy rustfmt; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c" >/dev/null
  done
fi

# cargo-deb builds the Debian package (scripts/package.sh).
if ! cargo deb --version 2>/dev/null | grep -q "3.6.0"; then
  echo "setup: installing cargo-deb 3.6.0 (crates.io)"
  cargo install --quiet --locked cargo-deb --version 3.6.0
fi

# chDB (the current ClickHouse release embedded, from PyPI) backs the ClickHouse store tests a
# second time (tests/chdb/clickhouse_http.py), Debian's server being from 2018.
if [ "$(id -u)" = 0 ] && ! python3 -c 'import chdb' >/dev/null 2>&1; then
  echo "setup: installing chdb (PyPI) for the ClickHouse store tests"
  python3 -m pip install --quiet chdb==4.4.0
fi

# playwright-core (no bundled browser: it drives Debian's chromium) for tests/browser, and
# speedscope's package (its file-format schema) with ajv to check exports against it.
browser_modules="$(dirname "$0")/../tests/browser/node_modules"
if [ ! -d "$browser_modules/playwright-core" ] || [ ! -d "$browser_modules/speedscope" ] || [ ! -d "$browser_modules/ajv" ]; then
  echo "setup: installing playwright-core, speedscope and ajv for tests/browser"
  (cd "$(dirname "$0")/../tests/browser" && npm install --no-audit --no-fund --loglevel=error)
fi
