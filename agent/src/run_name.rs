//! A program named as the user ran it. `/proc/PID/exe` and the mappings name the file a chain
//! of symlinks ends at (Debian's `/usr/bin/redis-server` is a link to `redis-check-rdb`), which
//! a user never typed: the path the process was started by is kept when it is a symlink to that
//! very file.
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Where a bare command name is looked up (argv[0] holds no directory).
const BIN_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Links followed at most from the name run to the file.
const MAX_LINKS: usize = 8;

/// The path `pid` was started by (its argv[0]: absolute, or a bare name in the system's bin
/// directories) when it is a symlink whose chain ends at `exe`, the file it runs.
pub fn of_process(pid: u32, exe: &Path) -> Option<PathBuf> {
    // argv[0] only: the first 4 KiB of the command line at most.
    let mut head = Vec::with_capacity(4096);
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    std::io::Read::read_to_end(&mut std::io::Read::take(file, 4096), &mut head).ok()?;
    let argv0 = head.split(|&b| b == 0).next()?;
    let argv0 = Path::new(std::str::from_utf8(argv0).ok()?);
    let candidates: Vec<PathBuf> = if argv0.is_absolute() {
        vec![argv0.to_path_buf()]
    } else if argv0.components().count() == 1 {
        BIN_DIRS.iter().map(|d| Path::new(d).join(argv0)).collect()
    } else {
        vec![]
    };
    candidates.into_iter().find(|c| links_to(c, exe))
}

/// Whether `path` is a symlink whose chain ends at `exe` (the same device and inode): links
/// are read (`readlink`), never opened, so a FIFO or a device at the end cannot block; and every
/// hop lies in directories root owns, so no lookup enters one a user controls (a FUSE mount of
/// theirs could stall it).
pub fn links_to(path: &Path, exe: &Path) -> bool {
    if !in_root_owned_dirs(exe) {
        return false;
    }
    let Ok(want) = std::fs::symlink_metadata(exe) else {
        return false;
    };
    let mut at = path.to_path_buf();
    for hop in 0..=MAX_LINKS {
        if !in_root_owned_dirs(&at) {
            return false;
        }
        let Ok(meta) = std::fs::symlink_metadata(&at) else {
            return false;
        };
        if !meta.file_type().is_symlink() {
            // A hop at least: the name run must differ from the file's own.
            return hop > 0 && (meta.dev(), meta.ino()) == (want.dev(), want.ino());
        }
        let Ok(target) = std::fs::read_link(&at) else {
            return false;
        };
        at = match at.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
    }
    false
}

/// Whether every directory from `/` down to `path`'s parent is owned by root (looked at from the
/// top, so the first one that is not stops the walk before anything inside it is looked up).
fn in_root_owned_dirs(path: &Path) -> bool {
    let Some(parent) = path.parent() else {
        return false;
    };
    let mut dirs: Vec<&Path> = parent.ancestors().collect();
    dirs.reverse();
    path.is_absolute()
        && dirs
            .iter()
            .all(|d| std::fs::symlink_metadata(d).is_ok_and(|m| m.uid() == 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a chain of links to a file is recognised (relative and absolute hops), a
    // plain file or a link elsewhere is not.
    #[test]
    fn follows_links_to_the_file_only() {
        let dir = std::env::temp_dir().join(format!("phaseprof-run-name-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("redis-check-rdb");
        std::fs::write(&exe, b"x").unwrap();
        std::fs::write(dir.join("other"), b"y").unwrap();
        std::os::unix::fs::symlink("redis-check-rdb", dir.join("redis-server")).unwrap();
        std::os::unix::fs::symlink(dir.join("redis-server"), dir.join("alt")).unwrap();
        std::os::unix::fs::symlink("other", dir.join("elsewhere")).unwrap();
        assert!(links_to(&dir.join("redis-server"), &exe));
        assert!(links_to(&dir.join("alt"), &exe));
        assert!(!links_to(&exe, &exe));
        assert!(!links_to(&dir.join("elsewhere"), &exe));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
