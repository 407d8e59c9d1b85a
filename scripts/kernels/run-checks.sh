#!/usr/bin/env bash
# Runs end-to-end tests one at a time, each bounded: a test still running after $CHECK_LIMIT
# seconds (default 300) is reported as `test NAME ... TIMEOUT` with what every process of it was
# doing (state, wait channel, kernel stack), then killed with its whole process group. The kernel
# matrix runs it on the host and inside each guest: a check that hangs under one kernel fails
# that check with the evidence, instead of holding the guest until its overall timeout.
#
#   bash scripts/kernels/run-checks.sh INTEGRATION_EXE TEST...
# libtest's output for each test goes to stdout.
set -uo pipefail
exe=$1
shift
limit=${CHECK_LIMIT:-300}

diagnose() {
  echo "---- $1 stdout ----"
  echo "TIMEOUT: still running after ${limit}s; its processes:"
  ps -eo pid,ppid,pgid,stat,wchan:32,etime,args | awk -v g="$2" 'NR == 1 || $3 == g'
  for p in $(ps -eo pid=,pgid= | awk -v g="$2" '$2 == g {print $1}'); do
    echo "== pid $p ($(cat "/proc/$p/comm" 2>/dev/null)): $(grep -h '^State' "/proc/$p/status" 2>/dev/null)"
    for t in /proc/"$p"/task/*; do
      echo "  tid ${t##*/} $(cat "$t/comm" 2>/dev/null) $(grep -h '^State' "$t/status" 2>/dev/null)"
      sed 's/^/    /' "$t/stack" 2>/dev/null | head -12
    done
  done
  echo
}

for t in "$@"; do
  # Its own session, so the test and everything it started form one group to inspect and kill.
  started=$SECONDS
  setsid "$exe" --include-ignored --exact --test-threads 1 "$t" &
  pid=$!
  for ((s = 0; s < limit; s++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    printf "\ntest %s ... TIMEOUT\n" "$t"
    diagnose "$t" "$pid"
    kill -KILL -- "-$pid" 2>/dev/null
  fi
  wait "$pid" 2>/dev/null
  # The wall time around the test's own (its binary's start over 9p and the workloads' included):
  # a guest that runs out of time shows where it went.
  echo "run-checks: $t: $((SECONDS - started))s wall"
done
exit 0
