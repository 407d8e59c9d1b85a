//! Reading a process's executable mappings (`/proc/PID/maps`): the only reader, which
//! `processes` (their owner) calls once per change.

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

/// The executable mappings of `pid`, in address order, user half only (the kernel half's
/// `[vsyscall]` runs no user code). Asked one mapping at a time with the PROCMAP_QUERY ioctl
/// where the kernel has it (6.11): for a small process ~17 µs against ~40 µs for the text,
/// which the kernel formats whole (every mapping, executable or not) and we parse; this runs
/// while a command is held at its entry point. Older kernels: the text.
pub fn read_vmas(pid: u32) -> std::io::Result<Vec<Vma>> {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    static NO_QUERY: AtomicBool = AtomicBool::new(false);
    let mut file = std::fs::File::open(format!("/proc/{pid}/maps"))?;
    if !NO_QUERY.load(Ordering::Relaxed) {
        match query::executable_vmas(&file) {
            Ok(vmas) => return Ok(vmas),
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => {
                NO_QUERY.store(true, Ordering::Relaxed)
            }
            // A name past the buffer, or any other refusal: the text says it all.
            Err(_) => {}
        }
    }
    // Room for a small process at once (std's `read_to_string` starts at 32 bytes for a file
    // whose size is 0, as /proc's are: ten reads for a small process).
    let mut text = String::with_capacity(16 << 10);
    file.read_to_string(&mut text)?;
    let mut vmas = parse_maps(&text);
    vmas.retain(|v| v.start < 1 << 63);
    Ok(vmas)
}

/// PROCMAP_QUERY (`include/uapi/linux/fs.h`, Linux 6.11), which the libc crate lacks.
mod query {
    use std::os::fd::AsRawFd;

    use super::Vma;

    #[repr(C)]
    #[derive(Default)]
    struct ProcmapQuery {
        size: u64,
        query_flags: u64,
        query_addr: u64,
        vma_start: u64,
        vma_end: u64,
        vma_flags: u64,
        vma_page_size: u64,
        vma_offset: u64,
        inode: u64,
        dev_major: u32,
        dev_minor: u32,
        vma_name_size: u32,
        build_id_size: u32,
        vma_name_addr: u64,
        build_id_addr: u64,
    }

    const VMA_EXECUTABLE: u64 = 0x04;
    const COVERING_OR_NEXT_VMA: u64 = 0x10;
    /// _IOWR('f', 17, struct procmap_query)
    const PROCMAP_QUERY: u64 =
        (3 << 30) | ((std::mem::size_of::<ProcmapQuery>() as u64) << 16) | (0x66 << 8) | 17;

    /// Every executable mapping of the process whose maps file `file` is, from address 0 up.
    pub(super) fn executable_vmas(file: &std::fs::File) -> std::io::Result<Vec<Vma>> {
        let mut vmas = Vec::new();
        let mut name = vec![0u8; libc::PATH_MAX as usize];
        let mut addr = 0u64;
        loop {
            let mut q = ProcmapQuery {
                size: std::mem::size_of::<ProcmapQuery>() as u64,
                query_flags: VMA_EXECUTABLE | COVERING_OR_NEXT_VMA,
                query_addr: addr,
                vma_name_size: name.len() as u32,
                vma_name_addr: name.as_mut_ptr() as u64,
                ..Default::default()
            };
            // SAFETY: q is a valid procmap_query of the size it states; the kernel writes at
            // most vma_name_size bytes to the name buffer, which lives across the call.
            let r = unsafe { libc::ioctl(file.as_raw_fd(), PROCMAP_QUERY as _, &mut q) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                // No mapping at or above `addr`: done.
                return match e.raw_os_error() {
                    Some(libc::ENOENT) => Ok(vmas),
                    _ => Err(e),
                };
            }
            // The size includes the terminating NUL; 0 for an anonymous mapping.
            let len = (q.vma_name_size as usize).saturating_sub(1).min(name.len());
            vmas.push(Vma {
                start: q.vma_start,
                end: q.vma_end,
                offset: q.vma_offset,
                path: String::from_utf8_lossy(&name[..len]).into_owned(),
                inode: Some((libc::makedev(q.dev_major, q.dev_minor), q.inode)),
            });
            addr = q.vma_end;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the mappings as read (PROCMAP_QUERY where the kernel has it) against the kernel's
    // own text of them, for this test process: the same executable mappings, field by field.
    #[test]
    fn read_vmas_equals_the_text() {
        let pid = std::process::id();
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let mut want = parse_maps(&text);
        want.retain(|v| v.start < 1 << 63);
        let got = read_vmas(pid).unwrap();
        assert!(!got.is_empty());
        assert_eq!(got, want);
    }

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
