//! Finding, describing and starting the processes to record.
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use regex::Regex;

/// What to record, as the user named it.
#[derive(Clone, Debug)]
pub enum TargetSpec {
    Pids(Vec<u32>),
    Name(Regex),
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
    let data = std::fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    let elf =
        object::File::parse(&data[..]).with_context(|| format!("parsing {}", exe.display()))?;
    let entry = elf.entry();
    elf.segments()
        .find_map(|seg| {
            let (off, size) = seg.file_range();
            (seg.address() <= entry && entry < seg.address() + size)
                .then(|| entry - seg.address() + off)
        })
        .with_context(|| format!("no segment of {} holds its entry point", exe.display()))
}

/// CPU time of every thread of `pids`, in ns (exact: schedstat, not clock ticks).
pub fn cpu_ns(pids: impl Iterator<Item = u32>) -> u64 {
    let mut total = 0;
    for pid in pids {
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

/// True when `pid`'s comm or command line matches (never phaseprof itself).
pub fn matches_name(pid: u32, re: &Regex) -> bool {
    if pid == std::process::id() {
        return false;
    }
    let comm = read_comm(pid, pid).unwrap_or_default();
    re.is_match(&comm) || re.is_match(&cmdline(pid))
}

/// Every running process matching `re`.
pub fn scan_name(re: &Regex) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|&pid| matches_name(pid, re))
        .collect()
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

/// The ELF files with code in process `pid`: its executable, then every shared object mapped
/// executable, each once.
pub fn code_objects(pid: u32) -> Result<Vec<PathBuf>> {
    let exe =
        std::fs::read_link(exe_link(pid)).with_context(|| format!("reading /proc/{pid}/exe"))?;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .with_context(|| format!("reading /proc/{pid}/maps"))?;
    let mut objects = vec![exe];
    for vma in crate::procmaps::parse_maps(&maps) {
        let path = PathBuf::from(vma.path.trim_end_matches(" (deleted)"));
        if vma.is_file() && !objects.contains(&path) {
            objects.push(path);
        }
    }
    Ok(objects)
}

/// The ELF files a command about to start will run code from, as far as they can be known
/// before it runs: its executable and the system C library (the one phaseprof itself maps,
/// which the dynamic loader picks for any program of this system). Libraries it loads later
/// beyond those are not known yet.
pub fn command_code_objects(exe: &Path) -> Vec<PathBuf> {
    let mut objects = vec![exe.to_path_buf()];
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for vma in crate::procmaps::parse_maps(&maps) {
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

    // Checks that a pid that does not exist is reported with the pid in the message.
    #[test]
    fn unknown_pid_is_reported() {
        let err = describe(u32::MAX - 1).unwrap_err();
        assert!(err.to_string().contains("no process with pid"), "{err}");
    }
}
