#!/usr/bin/env bash
# The kernel matrix: a fixed set of the end-to-end exactness tests (each compares phaseprof's
# numbers with the workload's own truth), run on this machine's kernel and then inside each of
# Debian's stock kernels (5.10 bullseye, 6.1 bookworm, 6.12 trixie), booted under qemu over a
# read-only view of this system with virtme-ng. Prints a matrix: `ok`, `n/a` where phaseprof
# refused the part with a one-line reason naming what the kernel lacks, `FAIL` otherwise.
# Exits non-zero on any FAIL or a kernel that did not boot.
#
#   bash scripts/kernels/matrix.sh              # every kernel
#   KERNELS="bookworm" bash scripts/kernels/matrix.sh
#   CHECKS=offcpu_equals_sleep KERNELS=trixie ...  # the checks whose test name contains it
#   MATRIX_HOST=0 ...                           # guests only, after the root suite has run
#                                               # these checks here (and built the workloads
#                                               # the guests run: their tree is read-only)
#
# No KVM is needed: qemu emulates the guest in software (~2.5 min per boot on 2 cores). Each
# check is bounded (scripts/kernels/run-checks.sh): one that hangs fails, with what its
# processes were waiting on, and the guest goes on to the next.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
kernels=${KERNELS:-bullseye bookworm trixie}
logs=$root/target/kernels/logs
mkdir -p "$logs"

# name|test: the checks, by the end-to-end test that makes each one.
checks=(
  "syscalls exact, off-CPU in sleep = slept|kernels::syscalls_exact_and_offcpu_equals_sleep"
  "syscalls and their failures equal strace -c|exactness::syscall_counts_equal_strace"
  "signals equal the shell's trap count|exactness::signals_equal_the_handlers_count"
  "cpu samples in the burn function|kernels::cpu_samples_in_the_burn_function"
  "native phases exact|kernels::native_phases_exact"
  "Go goroutine phases exact|phases::go_goroutine_phases_are_exact"
  "allocation totals exact|kernels::allocation_totals_exact"
  "dwarf stacks reach the entry (95%)|kernels::dwarf_stacks_reach_the_entry"
  "exec loop: each cat's write walked from tables|kernels::exec_loop_stacks_from_tables"
  "cheap phases under a budget stay exact|phase_budget::cheap_phases_under_a_budget_stay_exact"
  "hot phases under a budget within 10%|phase_budget::hot_phases_under_a_budget_are_estimated_from_slices"
  "syscalls under a budget within 5% of dd's|syscall_budget::syscalls_under_a_budget_are_estimated_from_slices"
  "a command that exited keeps its CPU time|probe_cost::a_command_that_exited_keeps_its_cpu_time"
  "sampled off-CPU stacks match every stack's|offcpu_stacks::sampled_offcpu_stacks_match_every_stack"
  "--version names the kernel's features|kernels::version_says_the_revision_and_what_the_kernel_can_do"
)
# CHECKS=PATTERN keeps the checks whose test name contains it (to boot a kernel again and again
# for one check).
if [ -n "${CHECKS:-}" ]; then
  kept=()
  for c in "${checks[@]}"; do [[ ${c#*|} == *"$CHECKS"* ]] && kept+=("$c"); done
  ((${#kept[@]})) || { echo "matrix: no check's test name contains \`$CHECKS\`" >&2; exit 2; }
  checks=("${kept[@]}")
fi
tests=()
for c in "${checks[@]}"; do tests+=("${c#*|}"); done

# qemu and virtme-ng (which needs depmod and a static busybox for its initramfs): what a fresh
# machine lacks.
for p in qemu-system-x86 kmod busybox-static; do
  dpkg -s "$p" >/dev/null 2>&1 || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null
done
command -v vng >/dev/null || pip install --quiet virtme-ng==1.42 >/dev/null
bash scripts/kernels/fetch.sh $kernels

exe=$(bash scripts/integration-exe.sh)

columns=()
results=()
if [ "${MATRIX_HOST:-1}" != 0 ]; then
  columns+=("host $(uname -r)")
  results+=("$logs/host.log")
  echo "matrix: host kernel $(uname -r) (also builds the workloads the guests run)"
  bash scripts/kernels/run-checks.sh "$exe" "${tests[@]}" >"$logs/host.log" 2>&1
fi
# A guest whose heartbeat stopped for FROZEN_AFTER seconds (default 120) once its tests began is
# frozen: its kernel no longer runs user space (a 6.1 guest once held both emulated CPUs for 10
# minutes inside one check, whose own time limit never fired). It is stopped and the console's
# last kernel messages are shown, instead of holding CI until GUEST_LIMIT; the check it was in
# gets one more guest (below), and fails as frozen if that one freezes too.
watch_guest() {
  local guest=$1 alive=$2 log=$3 console=$4 release=$5 beat="" seen=0
  while kill -0 "$guest" 2>/dev/null; do
    sleep 10
    [ -e "$alive" ] || continue
    # By the host's clock: when the heartbeat file last changed (the guest's clock may drift).
    local now=$SECONDS stamp
    stamp=$(stat -c %y "$alive" 2>/dev/null) || continue
    [ "$stamp" != "$beat" ] && beat=$stamp seen=$now
    local age=$((now - seen))
    if ((age > ${FROZEN_AFTER:-120})); then
      echo "matrix: the $release guest froze: no heartbeat for ${age}s, in: $(grep '^test ' "$log" | tail -n 1)" >&2
      printf "\nmatrix: the guest froze (no heartbeat for %ss)\n" "$age" >>"$log"
      grep -v "^\s*$" "$console" | tail -n 40 >&2 || true
      kill -TERM -- "-$guest" 2>/dev/null || true
      sleep 5
      # Under `set -e`: a guest that went at TERM makes this kill fail, which must not end the
      # matrix (it once did, in CI, with no table printed).
      kill -KILL -- "-$guest" 2>/dev/null || true
      return 0
    fi
  done
}

for suite in $kernels; do
  vmlinuz=$(ls "$root/target/kernels/$suite"/boot/vmlinuz-* | head -1)
  release=${vmlinuz##*/vmlinuz-}
  columns+=("$release")
  results+=("$logs/$suite.log")
  echo "matrix: booting $release ($suite) under qemu"
  # The guest's /tmp is its own and writable; the tree is read-only there (the workloads are
  # built) but for the logs directory. Output goes to a file: the console loses its beginning.
  # The guest reads its command from a script in the logs directory: on the kernel's command
  # line (2,048 bytes), PATH and a dozen test names did not fit, and the guest never ran them.
  guest_script=$logs/$suite.guest.sh
  alive=$logs/$suite.alive
  log=$logs/$suite.log
  : >"$log"
  # A TSC clocksource, as on real machines: the emulated HPET would make every clock read a
  # syscall (the vDSO falls back), which the workloads' truth does not count on. The console is
  # verbose: the guest kernel's own messages (a soft lockup, an RCU stall, the OOM killer) are
  # in it. Three things that software emulation on a busy machine has done in CI runs get one
  # more guest each, and all are shown: a guest that did not boot as far as its first test is
  # booted again, with its console; a guest that froze (emulated CPUs stuck in the kernel's
  # entry code for minutes, seen once on 5.10 and once on 6.1, never in a run by hand) or whose
  # kernel crashed (a panic seen once on 6.12, 17 s after boot, in its first check) is booted
  # again for the check it stopped in and those after it, which is then marked so in the
  # matrix; a crash's trace is printed. A check that stops its guest twice fails; each other
  # check a guest stopped in gets one more guest (a CI run once saw a 6.1 guest freeze in one
  # check, then its second guest in the next). Each boot keeps its console ($suite.N.console).
  pending=("${tests[@]}")
  boots=0
  froze_in=()
  rm -f "$logs/$suite".*.console
  while ((${#pending[@]})); do
    boots=$((boots + 1))
    {
      echo "cd $root && export PATH='$PATH' PHASEPROF_PREBUILT_WORKLOADS=1"
      echo "echo \"matrix-guest: \$(uname -r)\""
      # A heartbeat the host watches: a guest whose user space cannot touch a file for
      # FROZEN_AFTER seconds is frozen (see above).
      echo "( while :; do touch $alive; sleep 5; done ) &"
      echo "CHECK_LIMIT=${CHECK_LIMIT:-300} bash $root/scripts/kernels/run-checks.sh $exe ${pending[*]}"
    } >"$guest_script"
    rm -f "$logs/$suite.part" "$alive"
    console=$logs/$suite.$boots.console
    setsid timeout "${GUEST_LIMIT:-45m}" vng --verbose --run "$vmlinuz" --disable-kvm --force-9p \
      --cpus 2 --memory 3G --append "clocksource=tsc tsc=reliable" \
      --rwdir="$logs" --exec "bash $guest_script >$logs/$suite.part 2>&1" >"$console" 2>&1 &
    guest=$!
    watch_guest "$guest" "$alive" "$logs/$suite.part" "$console" "$release"
    wait "$guest" || true
    touch "$logs/$suite.part"
    # A kernel that crashed (a panic, a BUG, an oops) ends its guest wherever it was: its trace,
    # from the console, goes in the log after the check it stopped (the matrix's evidence) and
    # to stderr.
    if panic=$(grep -a -m1 -n "Kernel panic\|BUG: \|Oops: \|general protection fault" "$console"); then
      from=$((${panic%%:*} > 30 ? ${panic%%:*} - 30 : 1))
      {
        printf "\nmatrix: the guest's kernel crashed (%s); its console from there:\n" "$(echo "${panic#*:}" | tr -d '\r' | cut -c1-120)"
        tail -n "+$from" "$console" | tr -d '\r' | grep -av "^\s*$" | head -n 80 | sed 's/^/  /' || true
      } >>"$logs/$suite.part"
      echo "matrix: the $release guest's kernel crashed (guest $boots, console $console):" >&2
      grep -a -A 40 "^matrix: the guest's kernel crashed" "$logs/$suite.part" >&2 || true
    fi
    cat "$logs/$suite.part" >>"$log"
    if ! grep -q "^running " "$logs/$suite.part"; then
      echo "matrix: $release did not boot to the tests (guest $boots); its console and log end:" >&2
      tail -n 25 "$console" "$logs/$suite.part" >&2 || true
      ((boots < 2)) && continue
      break
    fi
    how=$(grep -o "^matrix: the guest\('s kernel\)\? \(froze\|crashed\)" "$logs/$suite.part" | head -1) || break
    # What is left: the check the guest stopped in (it has no result line) and those after it.
    left=()
    for t in "${pending[@]}"; do
      grep -q "^test $t \.\.\. [A-Za-z]" "$log" || left+=("$t")
    done
    pending=("${left[@]}")
    stuck=${pending[0]:-}
    [[ -n $stuck && " ${froze_in[*]} " != *" $stuck "* ]] || break
    froze_in+=("$stuck")
    echo "matrix: booting $release again for the ${#pending[@]} checks from the one it ${how##* } in"
  done
done

python3 - "${#checks[@]}" "${checks[@]}" "${#columns[@]}" "${columns[@]}" "${results[@]}" <<'EOF'
import re, sys
args = sys.argv[1:]
n = int(args[0]); checks = args[1:1 + n]; args = args[1 + n:]
k = int(args[0]); columns = args[1:1 + k]; logs = args[1 + k:]
failed = False
cells = {}
evidence = []
for col, log in zip(columns, logs):
    text = open(log, errors="replace").read()
    booted = "test result" in text
    for c in checks:
        name, test = c.split("|", 1)
        m = re.search(r"^test %s \.\.\. (\w+)" % re.escape(test), text, re.M)
        if not booted:
            cell = "no boot"
            failed = True
        elif m and m.group(1) == "ok":
            # Passed in a second guest, after the first froze or crashed in it: shown, not hidden.
            stopped = re.search(r"^test %s \.\.\. *\n+matrix: the guest(?:'s kernel)? (froze|crashed)" % re.escape(test), text, re.M)
            cell = "ok (2nd guest: 1st %s)" % stopped.group(1) if stopped else "ok"
        else:
            # The test's own output: a refusal names what this kernel lacks, in one line.
            parts = text.split("---- %s stdout ----" % test, 1)
            block = parts[1].split("\n---- ", 1)[0] if len(parts) > 1 else ""
            why = re.search(r"phaseprof: error: (.*which this kernel \(.*)", block)
            if why and "os error" not in why.group(1):
                cell = "n/a: " + re.sub(r",? which this kernel.*", "", why.group(1)).split(": needs ")[-1]
            else:
                cell = "FAIL"
                failed = True
                lines = block.strip().splitlines()
                if not lines and "test %s ..." % test not in text:
                    lines = ["(never started: the guest's time limit, GUEST_LIMIT, ran out first)"]
                elif not lines and "matrix: the guest froze" in text.split("test %s ..." % test, 1)[1]:
                    lines = ["(the guest froze while it ran: its kernel's last messages are above)"]
                elif not lines and "matrix: the guest's kernel crashed" in text.split("test %s ..." % test, 1)[1]:
                    lines = ["(the guest's kernel crashed while it ran: its trace is above)"]
                elif not lines and not text.split("test %s ..." % test, 1)[1].strip():
                    lines = ["(still running when the guest's time limit, GUEST_LIMIT, ran out)"]
                evidence.append("%s on %s:\n  %s" % (test, col, "\n  ".join(lines[:60] or ["(no output)"])))
        cells[(name, col)] = cell
w0 = max(len(c.split("|")[0]) for c in checks)
widths = [max(len(col), *(len(cells[(c.split("|")[0], col)]) for c in checks)) for col in columns]
print("\n" + "check".ljust(w0) + " | " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)))
print("-" * w0 + "-+-" + "-+-".join("-" * w for w in widths))
for c in checks:
    name = c.split("|")[0]
    print(name.ljust(w0) + " | " + " | ".join(cells[(name, col)].ljust(w) for col, w in zip(columns, widths)))
print("\n(logs: target/kernels/logs/)")
for e in evidence:
    print("\nFAIL: " + e, file=sys.stderr)
sys.exit(1 if failed else 0)
EOF
