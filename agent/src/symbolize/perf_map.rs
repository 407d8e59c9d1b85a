//! JIT-compiled code named by the runtime's perf map (`/tmp/perf-PID.map`: one `START SIZE name`
//! line per function, hex, as perf and blazesym read it). Runtimes append as they compile, so a
//! map is read on: only the bytes added since, when a lookup misses and the file grew. It is
//! read through the process's own root (a container writes its own `/tmp`, under the pid it
//! knows itself by), falling back to the host's `/tmp`, and opened the guarded way
//! (`target_files`): a regular file, no symlink, owned by the target's user or root (as perf
//! requires), never more than `MAX_PERF_MAP_BYTES` or `MAX_FUNCTIONS` functions.
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;

use crate::target_files::{self, Expect, MAX_PERF_MAP_BYTES};

/// A JIT function: start, end, name.
type JitFunction = (u64, u64, String);

/// Functions kept per map (a JIT's map holds thousands; a map past this is not a JIT's).
const MAX_FUNCTIONS: usize = 200_000;
/// Bytes read per lookup that misses: a map is read on in steps, as far as lookups need.
const READ_STEP: u64 = 4 << 20;
/// A line longer than this is no `START SIZE name` line: dropped unread.
const MAX_LINE: usize = 64 << 10;

#[derive(Default)]
pub struct PerfMaps {
    by_pid: HashMap<u32, PerfMap>,
}

impl PerfMaps {
    /// Forgets the processes `keep` rejects (their maps closed).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.by_pid.retain(|&pid, _| keep(pid));
    }
}

/// One process's map: the open file, how far it was read, and its functions sorted by start.
struct PerfMap {
    file: Option<File>,
    read: u64,
    /// A line cut by the end of what was there when last read.
    partial: Vec<u8>,
    functions: Vec<JitFunction>,
    /// Said once: refused, or over a limit.
    warned: bool,
}

/// The pid `pid` has in its own namespace (the last `NSpid:` field), for its map's name.
fn namespaced_pid(pid: u32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last()?.parse().ok())
        })
        .unwrap_or(pid)
}

fn map_paths(pid: u32) -> [(Option<u32>, PathBuf); 2] {
    [
        (
            Some(pid),
            PathBuf::from(format!("/tmp/perf-{}.map", namespaced_pid(pid))),
        ),
        (None, PathBuf::from(format!("/tmp/perf-{pid}.map"))),
    ]
}

/// `START SIZE name` lines (hex, with or without `0x`); others are skipped.
pub fn parse(text: &str) -> Vec<JitFunction> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let mut out: Vec<JitFunction> = text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ' ');
            let start = hex(parts.next()?)?;
            let size = hex(parts.next()?)?;
            let name = parts.next()?.trim();
            (!name.is_empty() && size > 0).then(|| (start, start + size, name.to_string()))
        })
        .collect();
    out.sort();
    out
}

impl PerfMaps {
    /// The JIT function of `pid` that holds `addr`, if its perf map names one.
    pub fn lookup(&mut self, pid: u32, addr: u64) -> Option<String> {
        let map = self.by_pid.entry(pid).or_insert_with(|| PerfMap::open(pid));
        if map.find(addr).is_none() {
            map.read_more(pid);
        }
        map.find(addr)
    }
}

impl PerfMap {
    fn open(pid: u32) -> PerfMap {
        let mut map = PerfMap {
            file: None,
            read: 0,
            partial: Vec::new(),
            functions: Vec::new(),
            warned: false,
        };
        let expect = Expect {
            owner: target_files::owner_of(pid),
            ..Expect::default()
        };
        for (root, path) in map_paths(pid) {
            match target_files::open_in_root(root, &path, false, &expect) {
                Ok(f) => {
                    let len = f.metadata().map_or(0, |m| m.len());
                    if len > MAX_PERF_MAP_BYTES {
                        eprintln!(
                            "phaseprof: warning: perf map of pid {pid} is {} MiB: only its first {} MiB are read",
                            len >> 20,
                            MAX_PERF_MAP_BYTES >> 20
                        );
                    }
                    map.file = Some(f);
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    eprintln!("phaseprof: warning: perf map of pid {pid}: {e}");
                    map.warned = true;
                    break;
                }
                Err(_) => {}
            }
        }
        map
    }

    fn find(&self, addr: u64) -> Option<String> {
        let i = self
            .functions
            .partition_point(|(start, _, _)| *start <= addr);
        let (start, end, name) = self.functions.get(i.checked_sub(1)?)?;
        (*start <= addr && addr < *end).then(|| name.clone())
    }

    /// Reads what was appended since the last read, within the limits.
    fn read_more(&mut self, pid: u32) {
        let Some(file) = &mut self.file else { return };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let room = MAX_PERF_MAP_BYTES.saturating_sub(self.read);
        if len <= self.read || room == 0 || self.functions.len() >= MAX_FUNCTIONS {
            if (room == 0 || self.functions.len() >= MAX_FUNCTIONS) && !self.warned {
                eprintln!(
                    "phaseprof: warning: perf map of pid {pid} is past {} MiB or {MAX_FUNCTIONS} \
                     functions: the rest is not read",
                    MAX_PERF_MAP_BYTES >> 20
                );
                self.warned = true;
            }
            return;
        }
        let mut bytes = std::mem::take(&mut self.partial);
        let want = (len - self.read).min(room).min(READ_STEP);
        let Ok(n) = file.take(want).read_to_end(&mut bytes) else {
            return;
        };
        self.read += n as u64;
        let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        self.partial = bytes.split_off(complete);
        if self.partial.len() > MAX_LINE {
            self.partial.clear();
        }
        let mut added = parse(&String::from_utf8_lossy(&bytes));
        added.truncate(MAX_FUNCTIONS - self.functions.len());
        self.functions.append(&mut added);
        self.functions.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the perf map format: hex with or without 0x, names with spaces, bad lines skipped.
    #[test]
    fn parses_perf_maps() {
        let m =
            parse("7f0000001000 40 jit_loop\n0x7f0000002000 0x10 LazyCompile:~f app.js:3\nbad\n");
        assert_eq!(
            m[0],
            (0x7f00_0000_1000, 0x7f00_0000_1040, "jit_loop".into())
        );
        assert_eq!(m[1].2, "LazyCompile:~f app.js:3");
        assert_eq!(m.len(), 2);
    }
}
