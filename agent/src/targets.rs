//! Finding, describing and starting the processes to record.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use regex::Regex;

use crate::procmaps::Vma;

/// What to record, as the user named it.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    Pids(Vec<u32>),
    Name(NameMatch),
    Command(Vec<String>),
}

/// Facts about a target process for the profile's metadata.
#[derive(Clone, Debug, Default)]
pub struct ProcessInfo {
    pub pid: u32,
    pub comm: String,
    pub exe: String,
    pub build_id: Option<String>,
}

pub fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// True while `pid` runs: it exists and is not a zombie waiting for its parent to reap it.
pub fn process_alive(pid: u32) -> bool {
    process_state(pid).is_some_and(|st| st != 'Z')
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `T` stopped, `Z` zombie ...); None: gone.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next()?.chars().next()
}

/// The file offset of `exe`'s entry point (where the dynamic loader jumps once it has mapped
/// the libraries), for a uprobe.
pub fn entry_offset(exe: &Path) -> Result<u64> {
    use object::{Object, ObjectSegment};
    let reader =
        crate::target_files::read_elf(exe).with_context(|| format!("reading {}", exe.display()))?;
    let elf = object::File::parse(&reader).with_context(|| format!("parsing {}", exe.display()))?;
    let entry = elf.entry();
    elf.segments()
        .find_map(|seg| {
            let (off, size) = seg.file_range();
            (seg.address() <= entry && entry < seg.address() + size)
                .then(|| entry - seg.address() + off)
        })
        .with_context(|| format!("no segment of {} holds its entry point", exe.display()))
}

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

/// `syscr` + `syscw` of /proc/PID/io (0 when gone or not counted by this kernel).
fn io_syscalls(pid: u32) -> u64 {
    use std::io::Read;
    let mut text = String::new();
    // A kernel file of seven short lines: read no more than a page of it.
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/io")) else {
        return 0;
    };
    if f.take(4096).read_to_string(&mut text).is_err() {
        return 0;
    }
    text.lines()
        .filter_map(|l| {
            let v = l
                .strip_prefix("syscr:")
                .or_else(|| l.strip_prefix("syscw:"))?;
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

pub fn read_comm(pid: u32, tid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

pub fn build_id_hex(path: &Path) -> Option<String> {
    let id = blazesym::helper::read_elf_build_id(&path).ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// `/proc/PID/exe`: opens the process's executable even from another mount namespace.
pub fn exe_link(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/exe"))
}

pub fn describe(pid: u32) -> Result<ProcessInfo> {
    if !process_exists(pid) {
        bail!("no process with pid {pid} (nothing in /proc/{pid})");
    }
    let exe = std::fs::read_link(exe_link(pid)).unwrap_or_default();
    Ok(ProcessInfo {
        pid,
        comm: read_comm(pid, pid).unwrap_or_default(),
        build_id: build_id_hex(&exe_link(pid)),
        exe: exe.to_string_lossy().into_owned(),
    })
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// How `--name` picks processes: by process name (its comm, or its executable's file name when
/// the 15-byte comm cuts it), as `pgrep` does; or by the whole command line (`--name-full`, as
/// `pgrep -f`), which also matches `timeout 60 etcd` or `tail -f etcd.log`. Never phaseprof.
#[derive(Clone, Debug)]
pub struct NameMatch {
    pub re: Regex,
    pub full: bool,
}

impl NameMatch {
    pub fn matches(&self, pid: u32) -> bool {
        if pid == std::process::id() {
            return false;
        }
        if self.full {
            return self.re.is_match(&cmdline(pid));
        }
        let comm = read_comm(pid, pid).unwrap_or_default();
        self.re.is_match(&comm)
            || std::fs::read_link(exe_link(pid)).is_ok_and(|exe| {
                exe.file_name()
                    .is_some_and(|n| self.re.is_match(&n.to_string_lossy()))
            })
    }

    /// Every running process that matches.
    pub fn scan(&self) -> Vec<u32> {
        all_pids()
            .into_iter()
            .filter(|&pid| self.matches(pid))
            .collect()
    }

    /// `pid 812 (etcd): /usr/bin/etcd --data-dir …`, for saying which processes were picked.
    pub fn describe_pick(pid: u32) -> String {
        let comm = read_comm(pid, pid).unwrap_or_default();
        let mut line = cmdline(pid);
        if line.chars().count() > 100 {
            line = line.chars().take(100).collect::<String>() + "…";
        }
        format!("pid {pid} ({comm}): {line}")
    }
}

impl std::fmt::Display for NameMatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.full {
            "command line"
        } else {
            "process name"
        };
        write!(f, "{what} /{}/", self.re)
    }
}

/// The process a pid names: itself, or for a thread's id, the process the thread belongs to
/// (`/proc/TID` exists for threads too, though `/proc` does not list them).
pub fn process_of(pid: u32) -> Result<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|_| anyhow::anyhow!("no process with pid {pid} (nothing in /proc/{pid})"))?;
    let tgid = status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("/proc/{pid}/status has no Tgid"))?;
    Ok(tgid)
}

/// Every process on the host, ascending.
pub fn all_pids() -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort();
    pids
}

/// The parent pid of `pid` (`/proc/PID/stat`'s fourth field).
pub fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `pid` and every process descending from it, parents before their children.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|p| Some((p, parent_pid(p)?)))
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// The ELF files with code in process `pid`, whose executable mappings are `vmas`: its
/// executable, then every shared object mapped executable, each once. Only paths that still name the mapped file (a regular file, the same
/// device and inode) are kept: a path its owner replaced (by a FIFO, a symlink, another file)
/// is skipped with a warning.
pub fn code_objects(pid: u32, vmas: &[Vma]) -> Result<Vec<PathBuf>> {
    use std::os::unix::fs::MetadataExt;
    let exe =
        std::fs::read_link(exe_link(pid)).with_context(|| format!("reading /proc/{pid}/exe"))?;
    let mut objects: Vec<PathBuf> = Vec::new();
    let exe_vma = vmas
        .iter()
        .find(|v| Path::new(v.path.trim_end_matches(" (deleted)")) == exe);
    for vma in exe_vma.into_iter().chain(vmas) {
        let path = PathBuf::from(vma.path.trim_end_matches(" (deleted)"));
        if !vma.is_file() || objects.contains(&path) {
            continue;
        }
        // lstat: never follows, never opens (a FIFO cannot block it).
        let same = std::fs::symlink_metadata(&path).is_ok_and(|m| {
            m.file_type().is_file() && vma.inode.is_none_or(|id| id == (m.dev(), m.ino()))
        });
        if same {
            objects.push(path);
        } else if !vma.path.ends_with(" (deleted)") {
            eprintln!(
                "phaseprof: warning: pid {pid}: {} is no longer the file it mapped; its code is not probed",
                path.display()
            );
        }
    }
    if objects.is_empty() {
        objects.push(exe);
    }
    Ok(objects)
}

/// The ELF files a command about to start will run code from, as far as they can be known
/// before it runs: its executable and the system C library (the one phaseprof itself maps,
/// which the dynamic loader picks for any program of this system). Libraries it loads later
/// beyond those are not known yet.
pub fn command_code_objects(exe: &Path) -> Vec<PathBuf> {
    let mut objects = vec![exe.to_path_buf()];
    if let Ok(vmas) = crate::procmaps::read_vmas(std::process::id()) {
        for vma in vmas {
            let path = PathBuf::from(&vma.path);
            let is_libc = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libc.so"));
            if vma.is_file() && is_libc && !objects.contains(&path) {
                objects.push(path);
            }
        }
    }
    objects
}

/// Finds `program` like execvp would, so a missing command is reported before anything starts.
pub fn resolve_command(program: &str) -> Result<PathBuf> {
    let is_exec = |p: &Path| {
        p.is_file()
            && std::fs::metadata(p)
                .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                .unwrap_or(false)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        if is_exec(&p) {
            return Ok(p);
        }
        bail!("command not found: `{program}` is not an executable file");
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let p = dir.join(program);
        if is_exec(&p) {
            return Ok(p);
        }
    }
    bail!("command not found: `{program}` is not in PATH")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that command resolution finds programs in PATH and rejects missing ones by name.
    #[test]
    fn resolves_commands_like_execvp() {
        assert!(resolve_command("sh").unwrap().ends_with("sh"));
        let err = resolve_command("no-such-command-phaseprof").unwrap_err();
        assert!(err
            .to_string()
            .contains("command not found: `no-such-command-phaseprof`"));
        assert!(resolve_command("/nonexistent/x").is_err());
    }

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

    // Checks liveness: this process is alive, a reaped child is not.
    #[test]
    fn liveness() {
        assert!(process_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    // Checks --name like pgrep: the process name by default, the command line with --name-full
    // (so `--name 4242` does not pick `sleep 4242`), and a thread id resolved to its process.
    #[test]
    fn names_match_like_pgrep() {
        let mut child = std::process::Command::new("sleep")
            .arg("4242")
            .spawn()
            .unwrap();
        let pid = child.id();
        // spawn returns once the exec has begun; its arguments appear as it completes.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !cmdline(pid).contains("4242") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let name = |re: &str, full| NameMatch {
            re: Regex::new(re).unwrap(),
            full,
        };
        assert!(name("^sleep$", false).matches(pid));
        assert!(!name("4242", false).matches(pid));
        assert!(name("sleep 4242", true).matches(pid));
        assert!(!name("^sleep$", true).matches(pid));
        child.kill().unwrap();
        child.wait().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).unwrap();
            let _ = done_rx.recv();
        });
        let tid = rx.recv().unwrap();
        let me = std::process::id();
        assert_ne!(tid, me);
        assert_eq!(process_of(tid).unwrap(), me);
        assert_eq!(process_of(me).unwrap(), me);
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }

    // Checks that a pid that does not exist is reported with the pid in the message.
    #[test]
    fn unknown_pid_is_reported() {
        let err = describe(u32::MAX - 1).unwrap_err();
        assert!(err.to_string().contains("no process with pid"), "{err}");
    }
}
