//! JIT-compiled code named by the runtime's perf map (`/tmp/perf-PID.map`: one `START SIZE name`
//! line per function, hex, as perf and blazesym read it). Runtimes append as they compile, so a
//! map is read again when it has grown; it is read through the process's own root (a container
//! writes its own `/tmp`, under the pid it knows itself by), falling back to the host's `/tmp`.
use std::collections::HashMap;
use std::path::PathBuf;

/// A JIT function: start, end, name.
type JitFunction = (u64, u64, String);

#[derive(Default)]
pub struct PerfMaps {
    /// Per pid: the map's size when read, and its functions sorted by start.
    by_pid: HashMap<u32, (u64, Vec<JitFunction>)>,
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

fn map_paths(pid: u32) -> [PathBuf; 2] {
    [
        PathBuf::from(format!(
            "/proc/{pid}/root/tmp/perf-{}.map",
            namespaced_pid(pid)
        )),
        PathBuf::from(format!("/tmp/perf-{pid}.map")),
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
        if self.find(pid, addr).is_none() {
            self.reload(pid);
        }
        self.find(pid, addr)
    }

    fn find(&self, pid: u32, addr: u64) -> Option<String> {
        let (_, funcs) = self.by_pid.get(&pid)?;
        let i = funcs.partition_point(|(start, _, _)| *start <= addr);
        let (start, end, name) = funcs.get(i.checked_sub(1)?)?;
        (*start <= addr && addr < *end).then(|| name.clone())
    }

    /// Reads the map again if it grew since last read.
    fn reload(&mut self, pid: u32) {
        for path in map_paths(pid) {
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if self
                .by_pid
                .get(&pid)
                .is_some_and(|(len, _)| *len == meta.len())
            {
                return;
            }
            if let Ok(text) = std::fs::read_to_string(&path) {
                self.by_pid.insert(pid, (meta.len(), parse(&text)));
                return;
            }
        }
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
