#!/usr/bin/env bash
# Builds the package and the image (scripts/package.sh), then, as root:
# - installs the package (dpkg -i) and checks what it installed: both binaries print their
#   version, the man pages and completions are in place, both units pass `systemd-analyze
#   verify`, the collector runs with the unit's command line and the packaged options and
#   answers, and the installed phaseprof records a process; then purges it;
# - runs the image under podman with the DaemonSet's capabilities (not privileged) and the
#   host's pids, recording a host process (dd), and checks the recording against dd: its CPU
#   samples, and its reads equal to its writes (dd writes each block it reads).
# Everything it starts or installs is removed again, failed or not.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/package.sh
version=$(awk -F'"' '/^version = /{print $2; exit}' Cargo.toml)
deb="target/debian/phaseprof_${version}-1_amd64.deb"
work=$(mktemp -d /tmp/phaseprof-packages.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  dpkg --purge phaseprof >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "check-packages: $*" >&2
  exit 1
}

# The package.
dpkg --purge phaseprof >/dev/null 2>&1 || true
dpkg -i "$deb" >/dev/null
# (Outputs taken whole before matching: a grep -q quitting early would break the pipe.)
out=$(/usr/bin/phaseprof --version)
grep -q "^phaseprof $version (git " <<<"$out" || fail "phaseprof --version: $out"
out=$(/usr/bin/phaseprof-collector --version)
grep -q "$version" <<<"$out" || fail "phaseprof-collector --version: $out"
for f in /usr/share/man/man1/phaseprof.1 /usr/share/man/man1/phaseprof-record.1 \
  /usr/share/man/man1/phaseprof-collector.1 /usr/share/bash-completion/completions/phaseprof \
  /etc/phaseprof/agent.toml /etc/phaseprof/collector.env /etc/phaseprof/agent-tokens; do
  [ -s "$f" ] || fail "$f not installed"
done
[ "$(stat -c %a /etc/phaseprof/agent-tokens)" = 600 ] || fail "agent-tokens is not 0600"
for unit in phaseprof-agent phaseprof-collector; do
  systemd-analyze verify "/usr/lib/systemd/system/$unit.service" || fail "$unit.service"
done
# The collector as its unit starts it: the unit's command line, the packaged options, the
# tokens where its credential would be.
echo "package-check 0123456789abcdef0123" >>/etc/phaseprof/agent-tokens
mkdir -p "$work/credentials" "$work/data"
cp /etc/phaseprof/agent-tokens "$work/credentials/"
exec_start=$(sed -n '/^ExecStart=/,/[^\\]$/p' /usr/lib/systemd/system/phaseprof-collector.service |
  sed 's/^ExecStart=//; s/\\$//' | tr -d '\n')
line=$(set -a && source /etc/phaseprof/collector.env && CREDENTIALS_DIRECTORY=$work/credentials &&
  eval "echo $exec_start")
line=${line/--data \/var\/lib\/phaseprof-collector/--data $work/data}
$line 2>"$work/collector.log" &
pids+=($!)
for _ in $(seq 50); do
  grep -q "listening on" "$work/collector.log" && break
  sleep 0.1
done
curl -sf http://127.0.0.1:7071/api/v1/store >/dev/null || fail "collector: $(cat "$work/collector.log")"
echo "check-packages: the packaged collector answers ($line)"
dd if=/dev/zero of=/dev/null bs=512 2>/dev/null &
dd_pid=$!
pids+=("$dd_pid")
/usr/bin/phaseprof record --pid "$dd_pid" --duration 2 --events cpu -o "$work/deb.phaseprof" 2>"$work/record.log" ||
  fail "installed phaseprof record: $(cat "$work/record.log")"
dpkg --purge phaseprof >/dev/null
[ ! -e /usr/bin/phaseprof ] || fail "purge left /usr/bin/phaseprof"
echo "check-packages: the package installs, works and purges"

# The image, recording the host's dd with the DaemonSet's capabilities. runc: crun refuses
# hosts with cgroup v1 and v2 both mounted, as this VM has. The limits are lowered, not
# raised (Podman raises the open-file limit, which needs CAP_SYS_RESOURCE). Debian 12's Podman
# needs its seccomp profile widened for bpf() under CAP_BPF (deploy/podman/bpf-seccomp.py).
python3 deploy/podman/bpf-seccomp.py >"$work/seccomp.json"
podman --runtime runc run --rm --network=none --pid=host --read-only \
  --ulimit "nofile=1024:$(ulimit -Hn)" --ulimit nproc=4096:4096 \
  --security-opt "seccomp=$work/seccomp.json" \
  --cap-drop=all --cap-add=BPF,PERFMON,SYS_PTRACE,DAC_READ_SEARCH,CHECKPOINT_RESTORE \
  --security-opt no-new-privileges \
  -v /sys/kernel/btf:/sys/kernel/btf:ro -v "$work:/out" \
  "localhost/phaseprof:$version" record --pid "$dd_pid" --duration 3 --events cpu,syscall \
  --syscall-budget exact -o /out/image.phaseprof 2>"$work/podman.log" ||
  fail "podman run: $(cat "$work/podman.log")"
# Without the capabilities, it says why instead of blaming the kernel.
out=$(podman --runtime runc run --rm --network=none --ulimit "nofile=1024:$(ulimit -Hn)" \
  --ulimit nproc=4096:4096 --cap-drop=all "localhost/phaseprof:$version" --version)
grep -q "bpf() was refused (EPERM)" <<<"$out" || fail "the image without capabilities: $out"
target/release/phaseprof report --json "$work/image.phaseprof" >"$work/image.json"
python3 - "$work/image.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
cpu = r["events"]["cpu"]["samples"]
calls = r["events"]["syscall"]["by_name"]
reads, writes = (calls.get(n, {}).get("count", 0) for n in ("read", "write"))
print(f"check-packages: the image recorded dd (a host process): {cpu} cpu samples, {reads} reads, {writes} writes")
assert r["target"]["comm"] == "dd", r["target"]
assert cpu > 0, "no cpu samples"
assert reads > 1000 and abs(reads - writes) <= 1, (reads, writes)
EOF
