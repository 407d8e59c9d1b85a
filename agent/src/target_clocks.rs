//! The kernel's per-process counters of the targets, summed as clocks that only grow: their
//! CPU time, their read and write syscalls, their reads and the bytes those returned (budgets'
//! slices are measured and extrapolated by them).

/// A per-process counter of the kernel's, summed over the targets as one counter that only
/// grows: each target's count since it was first read here, so that one added later (attached
/// by pid, a followed child) adds its count from then on, not its whole past, and one gone
/// stops adding.
#[derive(Default)]
struct TargetsCounter {
    last: std::collections::HashMap<u32, u64>,
    /// Targets whose exit was handed over (until their pid is added again).
    exited: std::collections::HashSet<u32>,
    total: u64,
}

impl TargetsCounter {
    /// Starts counting `pid`: from its birth (a target from its fork or its exec on), else
    /// from now.
    fn add(&mut self, pid: u32, from_birth: bool, of: impl Fn(u32) -> u64) {
        let mark = if from_birth { 0 } else { of(pid) };
        if self.exited.remove(&pid) {
            self.last.remove(&pid); // a pid reused
        }
        self.last.entry(pid).or_insert(mark);
    }

    /// `pid` exited with count `last` (0: unknown, read by `of` while /proc still has it); it
    /// adds nothing from now on.
    fn exited(&mut self, pid: u32, last: u64, of: impl Fn(u32) -> u64) {
        let last = if last > 0 { last } else { of(pid) };
        if let Some(before) = self.last.remove(&pid) {
            self.total += last.saturating_sub(before);
        }
        // Kept only while callers may still list the pid (until their next prune): bounded
        // for an agent that runs for weeks. A pid read once forgotten counts from that reading.
        if self.exited.len() >= 4096 {
            self.exited.clear();
        }
        self.exited.insert(pid);
    }

    /// The counter now, reading `pids` (one first read here counts from now). One whose exit
    /// was handed over stays out though the caller still lists it. A target reaped before its
    /// exit event is handled reads 0 (gone from /proc): its last reading stands until the exit
    /// hands over its last count, which would otherwise be added again from 0, its whole life
    /// twice.
    fn read(&mut self, pids: impl Iterator<Item = u32>, of: impl Fn(u32) -> u64) -> u64 {
        for pid in pids.filter(|pid| !self.exited.contains(pid)) {
            let now = of(pid);
            let before = self.last.entry(pid).or_insert(now);
            // The kernel's counts only grow: less is a process gone or unreadable.
            if now > *before {
                self.total += now - *before;
                *before = now;
            }
        }
        self.total
    }
}

/// The targets' CPU time (see `TargetsCounter`).
#[derive(Default)]
pub struct CpuClock(TargetsCounter);

impl CpuClock {
    /// The counter now, reading the CPU time of `pids`.
    pub fn read(&mut self, pids: impl Iterator<Item = u32>) -> u64 {
        self.0.read(pids, |pid| cpu_ns(std::iter::once(pid)))
    }

    pub fn add(&mut self, pid: u32, from_birth: bool) {
        self.0
            .add(pid, from_birth, |pid| cpu_ns(std::iter::once(pid)))
    }

    /// `pid` exited with `cpu_ns` of CPU time (see `TargetsCounter::exited`).
    pub fn exited(&mut self, pid: u32, cpu_ns: u64) {
        self.0
            .exited(pid, cpu_ns, |pid| self::cpu_ns(std::iter::once(pid)))
    }
}

/// The targets' read and write syscalls (see `TargetsCounter`), as the kernel counts them for
/// each process (`syscr`, `syscw` of /proc/PID/io, its exited threads' included): exact, and
/// free, with no probe on the syscall path.
#[derive(Default)]
pub struct IoSyscallClock(TargetsCounter);

impl IoSyscallClock {
    pub fn read(&mut self, pids: impl Iterator<Item = u32>) -> u64 {
        self.0.read(pids, io_syscalls)
    }

    pub fn add(&mut self, pid: u32, from_birth: bool) {
        self.0.add(pid, from_birth, io_syscalls)
    }

    /// `pid` exited with `n` read and write syscalls (see `TargetsCounter::exited`).
    pub fn exited(&mut self, pid: u32, n: u64) {
        self.0.exited(pid, n, io_syscalls)
    }
}

/// The targets' read syscalls (`syscr` of /proc/PID/io) and the bytes they returned (`rchar`):
/// a phase budget's slices are counted by the bytes where the reads carry the work (see
/// `slice_basis`). A target's exit leaves them to be read from /proc while its entry is still
/// there.
#[derive(Default)]
pub struct ReadClock {
    reads: TargetsCounter,
    bytes: TargetsCounter,
}

impl ReadClock {
    /// The counters now: (reads, bytes), each target's /proc/PID/io read once.
    pub fn read(&mut self, pids: impl Iterator<Item = u32>) -> (u64, u64) {
        let now: Vec<(u32, [u64; 2])> = pids.map(|pid| (pid, reads_and_bytes(pid))).collect();
        let now = &now;
        let of = |i: usize| move |pid: u32| now.iter().find(|p| p.0 == pid).map_or(0, |p| p.1[i]);
        let pids = || now.iter().map(|p| p.0);
        (
            self.reads.read(pids(), of(0)),
            self.bytes.read(pids(), of(1)),
        )
    }

    /// /proc/PID/io is read only when the counters need it: never for a target counted from its
    /// birth, which may be held in its exec, where reading it would wait on the exec's lock
    /// (a 6.1 guest hung so: `record -- time dd` under a syscall budget).
    pub fn add(&mut self, pid: u32, from_birth: bool) {
        self.reads.add(pid, from_birth, |p| reads_and_bytes(p)[0]);
        self.bytes.add(pid, from_birth, |p| reads_and_bytes(p)[1]);
    }

    pub fn exited(&mut self, pid: u32) {
        self.reads.exited(pid, 0, |p| reads_and_bytes(p)[0]);
        self.bytes.exited(pid, 0, |p| reads_and_bytes(p)[1]);
    }
}

/// A process's counts of its reads and writes (/proc/PID/io).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounts {
    /// Bytes its reads returned (`rchar`).
    pub bytes_read: u64,
    /// Its read syscalls (`syscr`).
    pub reads: u64,
    /// Its read and write syscalls (`syscr` + `syscw`).
    pub io_syscalls: u64,
}

/// `pid`'s counts (None when gone or unreadable).
pub fn io_counts(pid: u32) -> Option<IoCounts> {
    let text = proc_io(pid);
    if text.is_empty() {
        return None;
    }
    let field = |f: &str| proc_io_sum(&text, &[f]);
    Some(IoCounts {
        bytes_read: field("rchar:"),
        reads: field("syscr:"),
        io_syscalls: field("syscr:") + field("syscw:"),
    })
}

/// `syscr` + `syscw` of /proc/PID/io (0 when gone or not counted by this kernel).
fn io_syscalls(pid: u32) -> u64 {
    io_counts(pid).map_or(0, |c| c.io_syscalls)
}

/// `syscr` and `rchar` of /proc/PID/io (0 when gone).
fn reads_and_bytes(pid: u32) -> [u64; 2] {
    io_counts(pid).map_or([0, 0], |c| [c.reads, c.bytes_read])
}

/// The text of /proc/PID/io (empty when gone).
fn proc_io(pid: u32) -> String {
    use std::io::Read;
    let mut text = String::new();
    // A kernel file of seven short lines: read no more than a page of it.
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/io")) else {
        return text;
    };
    if f.take(4096).read_to_string(&mut text).is_err() {
        text.clear();
    }
    text
}

/// The sum of `fields` in the text of /proc/PID/io.
fn proc_io_sum(text: &str, fields: &[&str]) -> u64 {
    text.lines()
        .filter_map(|l| {
            let v = fields.iter().find_map(|f| l.strip_prefix(f))?;
            v.trim().parse::<u64>().ok()
        })
        .sum()
}

/// CPU time of every thread of `pids`, in ns (exact: schedstat, not clock ticks).
pub fn cpu_ns(pids: impl Iterator<Item = u32>) -> u64 {
    let mut total = 0;
    for pid in pids {
        if let Some(ns) = process_clock_ns(pid) {
            total += ns;
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

/// The CPU time of process `pid` by its CPU-time clock (what `clock_getcpuclockid` gives): up
/// to date to the ns for threads running right now, where schedstat's lags by up to a
/// scheduler tick (4 ms), too coarse for a budget's 20 ms slices; its exited threads included.
fn process_clock_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both pointers are to live locals of the types the calls take.
    unsafe {
        if libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) != 0
            || libc::clock_gettime(clock, &mut ts) != 0
        {
            return None;
        }
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the summed counter: a target counts from when it was added; one that exits adds
    // its count at the exit as the kernel gave it (or its last reading when the kernel gave
    // none) and nothing after, even when its pid is read again.
    #[test]
    fn an_exited_target_adds_its_last_count() {
        let counts =
            std::cell::RefCell::new(std::collections::HashMap::from([(1, 100u64), (2, 50)]));
        let of = |pid: u32| counts.borrow().get(&pid).copied().unwrap_or(0);
        let mut c = TargetsCounter::default();
        c.add(1, false, of);
        c.add(2, true, of);
        assert_eq!(c.read([1, 2].into_iter(), of), 50);
        counts.borrow_mut().insert(1, 130);
        c.exited(1, 160, of);
        assert_eq!(c.read([2].into_iter(), of), 110);
        // Gone from /proc: a read finds nothing new.
        counts.borrow_mut().remove(&1);
        assert_eq!(c.read([1, 2].into_iter(), of), 110);
        // No count from the kernel: the last reading stands for it.
        counts.borrow_mut().insert(2, 70);
        c.exited(2, 0, of);
        assert_eq!(c.read(std::iter::empty(), of), 130);
        // Reaped (gone from /proc) and read before its exit is handled: the exit adds what
        // came after the last reading, not its whole count again.
        c.add(3, false, of);
        counts.borrow_mut().insert(3, 40);
        assert_eq!(c.read([3].into_iter(), of), 170);
        counts.borrow_mut().remove(&3);
        assert_eq!(c.read([3].into_iter(), of), 170);
        c.exited(3, 45, of);
        assert_eq!(c.read([3].into_iter(), of), 175);
    }
}
