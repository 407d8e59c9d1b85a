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
