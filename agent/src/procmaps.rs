//! A cache of each target's executable mappings (`/proc/PID/maps`), read while the process is
//! alive so that its addresses can still be symbolized after it exits.
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The mapped file, or a pseudo name such as `[vdso]`.
    pub path: String,
    /// The mapped file's (device, inode), to check a file opened by path is the one mapped.
    pub inode: Option<(u64, u64)>,
}

impl Vma {
    /// True for mappings of a real file (not `[vdso]`, `[heap]`, anonymous memory).
    pub fn is_file(&self) -> bool {
        self.path.starts_with('/')
    }
}

/// `/proc/PID/maps` as text, read in a few large reads (std's `read_to_string` starts at 32
/// bytes for a file whose size is 0, as /proc's are: ten reads for a small process).
pub fn read_maps(pid: u32) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::with_capacity(16 << 10);
    std::fs::File::open(format!("/proc/{pid}/maps"))?.read_to_string(&mut text)?;
    Ok(text)
}

/// Parses the executable mappings of a `/proc/PID/maps` text.
pub fn parse_maps(text: &str) -> Vec<Vma> {
    let mut vmas = Vec::new();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms), Some(offset)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !perms.contains('x') {
            continue;
        }
        let inode = file_id(fields.next(), fields.next());
        // The path may contain spaces and ends in " (deleted)" when the file was replaced.
        let path = fields.collect::<Vec<_>>().join(" ");
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(end, 16),
            u64::from_str_radix(offset, 16),
        ) else {
            continue;
        };
        vmas.push(Vma {
            start,
            end,
            offset,
            path,
            inode,
        });
    }
    vmas
}

/// `MAJOR:MINOR` (hex) and an inode number as maps prints them, as `stat` gives them.
fn file_id(dev: Option<&str>, inode: Option<&str>) -> Option<(u64, u64)> {
    let (major, minor) = dev?.split_once(':')?;
    let major = u32::from_str_radix(major, 16).ok()?;
    let minor = u32::from_str_radix(minor, 16).ok()?;
    Some((libc::makedev(major, minor), inode?.parse().ok()?))
}

/// Executable mappings per process, kept after the process is gone.
#[derive(Default)]
pub struct ProcMaps {
    by_pid: HashMap<u32, Vec<Vma>>,
}

impl ProcMaps {
    /// Re-reads `pid`'s mappings. Keeps the last good copy if the process has exited.
    pub fn refresh(&mut self, pid: u32) {
        if let Ok(text) = read_maps(pid) {
            let vmas = parse_maps(&text);
            if !vmas.is_empty() {
                self.by_pid.insert(pid, vmas);
            }
        }
    }

    /// Forgets the processes `keep` rejects (gone, their windows symbolized).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.by_pid.retain(|&pid, _| keep(pid));
    }

    /// The executable mappings last read of `pid`.
    pub fn vmas(&self, pid: u32) -> &[Vma] {
        self.by_pid.get(&pid).map_or(&[], Vec::as_slice)
    }

    pub fn knows(&self, pid: u32) -> bool {
        self.by_pid.contains_key(&pid)
    }

    pub fn find(&self, pid: u32, addr: u64) -> Option<&Vma> {
        self.by_pid
            .get(&pid)?
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks parsing of real-looking maps lines: only executable ones, paths with spaces.
    #[test]
    fn parses_executable_mappings() {
        let text = "\
55d0c0a00000-55d0c0a20000 r--p 00000000 fe:01 123 /usr/bin/validator
55d0c0a20000-55d0c0a80000 r-xp 00020000 fe:01 123 /usr/bin/validator
7f0000000000-7f0000001000 rw-p 00000000 00:00 0
7f1000000000-7f1000100000 r-xp 00028000 fe:01 77 /opt/my lib/libx.so (deleted)
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
";
        let v = parse_maps(text);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].start, 0x55d0c0a20000);
        assert_eq!(v[0].offset, 0x20000);
        assert_eq!(v[1].path, "/opt/my lib/libx.so (deleted)");
        assert!(!v[2].is_file());
        assert_eq!(v[0].inode, Some((libc::makedev(0xfe, 1), 123)));
    }
}
