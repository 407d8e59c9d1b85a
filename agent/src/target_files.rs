//! Files phaseprof opens on a target's behalf: its perf map, its mapped executables and
//! libraries, their debug links. phaseprof runs as root and the target's user controls these
//! paths, so every one is opened the same guarded way:
//!
//! - resolved inside the target's own root (`openat2` with `RESOLVE_IN_ROOT`): an absolute
//!   symlink in a container points into the container, never at the host's files;
//! - the last component never followed (`O_NOFOLLOW`) where no symlink is expected;
//! - opened non-blocking and refused unless a regular file, so a FIFO or a device cannot stall
//!   a recording in `open` or `read`;
//! - checked against the mapping's device and inode where there is one (a mapped file is
//!   opened through `/proc/PID/map_files`, which is the mapped file itself, even deleted);
//! - owned by root or by the target's user, as perf checks its maps;
//! - within a size limit, and ELF files are read a section at a time (`elf_reader`), never
//!   whole.
//!
//! Consumers that take a path (blazesym) get `/proc/self/fd/N` of the checked descriptor.
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::procmaps::Vma;

/// Largest ELF section read from a target's file (`.eh_frame`, `.symtab`, `.text` ranges). Real
/// ones run to tens of MiB in the biggest programs; a header claiming more is refused.
pub const MAX_SECTION_BYTES: u64 = 96 << 20;
/// Largest perf map read; further lines are ignored (and counted by the caller).
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// What a file must be to be used.
#[derive(Clone, Copy, Debug, Default)]
pub struct Expect {
    /// Owned by root or this user (the target's).
    pub owner: Option<u32>,
    /// Exactly this file: (device, inode) as `/proc/PID/maps` shows it.
    pub inode: Option<(u64, u64)>,
    /// At most this many bytes (0: no limit; ELF files are read by section).
    pub max_len: u64,
}

fn refused(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: refused: {why}", path.display()),
    )
}

/// Checks an opened file against `expect`.
pub fn check(file: &File, path: &Path, expect: &Expect) -> io::Result<()> {
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(refused(path, "not a regular file"));
    }
    if let Some(uid) = expect.owner {
        if meta.uid() != 0 && meta.uid() != uid {
            return Err(refused(
                path,
                format!(
                    "owned by uid {}, not by the target's ({uid}) or root",
                    meta.uid()
                ),
            ));
        }
    }
    if let Some((dev, ino)) = expect.inode {
        if (meta.dev(), meta.ino()) != (dev, ino) {
            return Err(refused(path, "not the file the target mapped"));
        }
    }
    if expect.max_len > 0 && meta.len() > expect.max_len {
        return Err(refused(
            path,
            format!("{} bytes, over the limit of {}", meta.len(), expect.max_len),
        ));
    }
    Ok(())
}

const OPEN_FLAGS: i32 = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;

/// Opens `path` (absolute, as the target sees it) inside the root of `pid` (the host's when
/// None, or once the process is gone or exiting and its root cannot be opened), following
/// symlinks only within that root and only before the last component when `follow_last` is
/// false.
pub fn open_in_root(
    pid: Option<u32>,
    path: &Path,
    follow_last: bool,
    expect: &Expect,
) -> io::Result<File> {
    let root = pid
        .and_then(|pid| File::open(format!("/proc/{pid}/root")).ok())
        .map_or_else(|| File::open("/"), Ok)?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| refused(path, "NUL in the path"))?;
    let flags = OPEN_FLAGS | if follow_last { 0 } else { libc::O_NOFOLLOW };
    // SAFETY: open_how is plain integers; all zero is its "nothing asked" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and the struct we pass, with its size.
    let mut fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    } as i32;
    let errno = io::Error::last_os_error().raw_os_error();
    if fd < 0 && matches!(errno, Some(libc::ENOSYS | libc::EPERM)) {
        // Before 5.6, or a seccomp profile that does not know openat2 (older container
        // runtimes answer EPERM): no RESOLVE_IN_ROOT; the last component is still never
        // followed.
        // SAFETY: openat with a NUL-terminated path.
        fd = unsafe { libc::openat(root.as_raw_fd(), rel.as_ptr(), flags) };
    }
    if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ELOOP) {
            return Err(refused(path, "a symbolic link"));
        }
        return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
    }
    // SAFETY: fd is a descriptor we just opened and own.
    let file = unsafe { File::from_raw_fd(fd) };
    check(&file, path, expect)?;
    Ok(file)
}

/// The file `vma` of `pid` maps: the mapping itself while the process lives
/// (`/proc/PID/map_files`), else its path in the process's root, if it is still that file.
pub fn open_mapped(pid: u32, vma: &Vma) -> io::Result<File> {
    let expect = Expect {
        inode: vma.inode.filter(|&(_, ino)| ino != 0),
        ..Expect::default()
    };
    let link = PathBuf::from(format!(
        "/proc/{pid}/map_files/{:x}-{:x}",
        vma.start, vma.end
    ));
    match File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(&link)
    {
        Ok(file) => {
            // The mapping itself: only what it is needs checking (a device can be mapped).
            check(&file, Path::new(&vma.path), &Expect::default())?;
            Ok(file)
        }
        Err(_) => {
            let path = Path::new(vma.path.trim_end_matches(" (deleted)"));
            if expect.inode.is_none() {
                return Err(refused(path, "no inode to check it against"));
            }
            // A file that must be this inode: a symlink put in its place is no match anyway.
            open_in_root(Some(pid), path, false, &expect)
        }
    }
}

/// A path to an opened file for libraries that open by path: valid while `file` is open.
pub fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The owner of `pid` (its effective uid, as `/proc/PID` shows it).
pub fn owner_of(pid: u32) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|m| m.uid())
}

/// An ELF file read as its parser asks: headers first, then only the sections used.
pub type ElfReader = object::ReadCache<File>;

pub fn elf_reader(file: File) -> ElfReader {
    object::ReadCache::new(file)
}

/// An ELF file at `path` (a host path or a `/proc/self/fd/N` of a checked file): never a FIFO
/// or a device, read by section.
pub fn read_elf(path: &Path) -> io::Result<ElfReader> {
    Ok(elf_reader(open_host(path, &Expect::default())?))
}

/// A section's bytes, uncompressed, if within `MAX_SECTION_BYTES`.
pub fn section_bytes<'data>(
    section: &impl object::ObjectSection<'data>,
) -> Option<std::borrow::Cow<'data, [u8]>> {
    if section.size() > MAX_SECTION_BYTES {
        return None;
    }
    let data = section.uncompressed_data().ok()?;
    (data.len() as u64 <= MAX_SECTION_BYTES).then_some(data)
}

/// Opens a file phaseprof itself was pointed at (a debug directory of the host, a path on the
/// command line): symlinks followed, but never a FIFO or a device, and never blocking.
pub fn open_host(path: &Path, expect: &Expect) -> io::Result<File> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    check(&file, path, expect)?;
    Ok(file)
}

/// Mapped files opened once and kept open, so their `/proc/self/fd/N` paths stay valid for the
/// libraries that reopen them; at most `MAX_OPEN` (the oldest closed first). A file refused is
/// said once, with why, and not tried again.
#[derive(Default)]
pub struct MappedFiles {
    by_id: std::collections::HashMap<(u64, u64, String), Option<File>>,
    order: std::collections::VecDeque<(u64, u64, String)>,
    /// Files refused (not a regular file, not the mapped inode, a symlink ...).
    pub refused: u64,
}

const MAX_OPEN: usize = 256;

impl MappedFiles {
    /// The file `vma` of `pid` maps, opened and checked (see `open_mapped`).
    pub fn get(&mut self, pid: u32, vma: &Vma) -> Option<&File> {
        let (dev, ino) = vma.inode.unwrap_or_default();
        let key = (dev, ino, vma.path.clone());
        if !self.by_id.contains_key(&key) {
            if self.order.len() >= MAX_OPEN {
                if let Some(old) = self.order.pop_front() {
                    self.by_id.remove(&old);
                }
            }
            let opened = match open_mapped(pid, vma) {
                Ok(f) => Some(f),
                Err(e) => {
                    if e.kind() == io::ErrorKind::PermissionDenied {
                        self.refused += 1;
                        eprintln!("phaseprof: warning: pid {pid}: {e}");
                    }
                    None
                }
            };
            self.by_id.insert(key.clone(), opened);
            self.order.push_back(key.clone());
        }
        self.by_id.get(&key)?.as_ref()
    }
}

/// Whether an ELF file names other files to read (`.gnu_debuglink`, `.gnu_debugaltlink`,
/// `.debug_sup`): a library following those would open paths its owner chose.
pub fn links_elsewhere(file: &File) -> bool {
    use object::Object;
    let Ok(clone) = file.try_clone() else {
        return true;
    };
    let reader = elf_reader(clone);
    let Ok(elf) = object::File::parse(&reader) else {
        return false;
    };
    [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"]
        .iter()
        .any(|name| elf.section_by_name(name).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("phaseprof-tf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    // Checks the refusals: a FIFO (without blocking), a symlink as the last component, a file
    // over the size limit, a file that is not the expected inode; and that a plain file opens.
    #[test]
    fn refuses_what_a_target_could_plant() {
        let d = scratch("refuse");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let plain = d.join("plain");
        std::fs::write(&plain, b"0123456789").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&plain, &link).unwrap();
        let none = Expect::default();
        let e = open_in_root(None, &fifo, false, &none).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = open_in_root(None, &link, false, &none).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(open_in_root(None, &link, true, &none).is_ok());
        let small = Expect { max_len: 4, ..none };
        let e = open_in_root(None, &plain, false, &small).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        let meta = std::fs::metadata(&plain).unwrap();
        let other = Expect {
            inode: Some((meta.dev(), meta.ino() + 1)),
            ..none
        };
        assert!(open_in_root(None, &plain, false, &other).is_err());
        let same = Expect {
            inode: Some((meta.dev(), meta.ino())),
            ..none
        };
        let f = open_in_root(None, &plain, false, &same).unwrap();
        assert_eq!(std::fs::read(fd_path(&f)).unwrap(), b"0123456789");
        assert!(open_host(&fifo, &none).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
