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
        let same =
            (meta.dev(), meta.ino()) == (dev, ino) || (meta.ino() == ino && on_overlayfs(file));
        if !same {
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

/// Whether `file` is on overlayfs (a container's root, a union mount). A file mapped from there
/// is the layer's own file beneath: its maps line gives that layer's device while `stat`
/// through the overlay gives the overlay's, the inode number the same (unless overlayfs
/// composes inode numbers, `xino`: then no match, and no names after the target exits).
fn on_overlayfs(file: &File) -> bool {
    const OVERLAYFS_SUPER_MAGIC: libc::c_long = 0x794c_7630;
    // SAFETY: statfs is plain data, valid zeroed.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs fills `fs` for a descriptor `file` keeps open.
    let ok = unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } == 0;
    ok && fs.f_type as libc::c_long == OVERLAYFS_SUPER_MAGIC
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
/// said once, with why, and not tried again for that process until it execs (`forget`): a
/// refusal can be a race with its exec (its maps read before, the file opened after), and must
/// not cost the next program of that pid, or another process, the names of the same file.
#[derive(Default)]
pub struct MappedFiles {
    by_id: std::collections::HashMap<FileKey, File>,
    order: std::collections::VecDeque<FileKey>,
    failed: std::collections::HashSet<(u32, FileKey)>,
    /// Files refused (not a regular file, not the mapped inode, a symlink ...).
    pub refused: u64,
}

/// A mapped file as its maps line names it: device, inode and path.
type FileKey = (u64, u64, String);

const MAX_OPEN: usize = 256;
/// Refusals remembered (then forgotten all at once, and tried again).
const MAX_FAILED: usize = 4096;

impl MappedFiles {
    /// The file `vma` of `pid` maps, opened and checked (see `open_mapped`).
    pub fn get(&mut self, pid: u32, vma: &Vma) -> Option<&File> {
        let (dev, ino) = vma.inode.unwrap_or_default();
        let key = (dev, ino, vma.path.clone());
        if !self.by_id.contains_key(&key) {
            let tried = (pid, key.clone());
            if self.failed.contains(&tried) {
                return None;
            }
            match open_mapped(pid, vma) {
                Ok(f) => {
                    if self.order.len() >= MAX_OPEN {
                        if let Some(old) = self.order.pop_front() {
                            self.by_id.remove(&old);
                        }
                    }
                    self.by_id.insert(key.clone(), f);
                    self.order.push_back(key.clone());
                }
                Err(e) => {
                    if e.kind() == io::ErrorKind::PermissionDenied {
                        self.refused += 1;
                        eprintln!("phaseprof: warning: pid {pid}: {e}");
                    }
                    if self.failed.len() >= MAX_FAILED {
                        self.failed.clear();
                    }
                    self.failed.insert(tried);
                    return None;
                }
            }
        }
        self.by_id.get(&key)
    }

    /// `pid` exec'd (or is gone): what could not be opened for it is tried again.
    pub fn forget(&mut self, pid: u32) {
        self.failed.retain(|(p, _)| *p != pid);
    }

    /// Keeps the refusals of the processes `live` says are alive.
    pub fn retain(&mut self, live: impl Fn(u32) -> bool) {
        self.failed.retain(|(p, _)| live(*p));
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

    // A refusal is remembered for its process only, and until it execs: the same file is tried
    // again for another process, and for the same one after `forget` (a refusal in a race with
    // an exec once cost every later process the names of libc).
    #[test]
    fn a_refusal_is_not_remembered_past_the_process_or_its_exec() {
        let d = scratch("refusals");
        let plain = d.join("plain");
        std::fs::write(&plain, b"0123456789").unwrap();
        let meta = std::fs::metadata(&plain).unwrap();
        let vma = |ino| Vma {
            start: 0x1000,
            end: 0x2000,
            offset: 0,
            inode: Some((meta.dev(), ino)),
            path: plain.to_string_lossy().into_owned(),
        };
        // No such processes (above any pid_max): their files are looked up on the host's root.
        let (a, b) = (0x7fff_fff0, 0x7fff_fff1);
        let mut files = MappedFiles::default();
        let wrong = vma(meta.ino() + 1);
        assert!(files.get(a, &wrong).is_none());
        assert!(files.get(a, &wrong).is_none());
        assert_eq!(files.refused, 1, "tried once for the same process");
        assert!(files.get(b, &wrong).is_none());
        assert_eq!(files.refused, 2, "tried again for another process");
        files.forget(a);
        assert!(files.get(a, &wrong).is_none());
        assert_eq!(files.refused, 3, "tried again after its exec");
        assert!(files.get(a, &vma(meta.ino())).is_some());
        std::fs::remove_dir_all(&d).unwrap();
    }

    // A file of an overlayfs (a container's root) as its maps line gives it, the device of the
    // layer beneath, is the file opened through the overlay (which reports its own device).
    #[test]
    fn a_mapped_file_on_overlayfs_is_recognized() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: mounting an overlay needs root");
            return;
        }
        let d = scratch("overlay");
        let (lower, upper, work, merged) = (
            d.join("lower"),
            d.join("upper"),
            d.join("work"),
            d.join("merged"),
        );
        for dir in [&lower, &upper, &work, &merged] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(lower.join("lib.so"), b"0123456789").unwrap();
        std::fs::write(lower.join("other.so"), b"9876543210").unwrap();
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        let mounted = std::process::Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged)
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("SKIPPED: this kernel or container mounts no overlay");
            return;
        }
        let beneath = std::fs::metadata(lower.join("lib.so")).unwrap();
        let mapped = Expect {
            inode: Some((beneath.dev(), beneath.ino())),
            ..Expect::default()
        };
        let same = open_in_root(None, &merged.join("lib.so"), false, &mapped).map(drop);
        let other = open_in_root(None, &merged.join("other.so"), false, &mapped).map(drop);
        let _ = std::process::Command::new("umount").arg(&merged).status();
        assert!(same.is_ok(), "{same:?}");
        assert!(other.is_err(), "another file of the overlay passed");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
