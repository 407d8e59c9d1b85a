//! A stripped file's `.gnu_debuglink`, followed the way gdb and perf look (beside the file, in
//! its `.debug/` directory, under `/usr/lib/debug/` + its directory), but opened the guarded
//! way (`target_files`): inside the target's root, no symlink as the last component, a regular
//! file owned by root or the file's owner, and the same build ID when the file has one.
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use object::Object;

use crate::target_files::{self, Expect};

/// The file name a `.gnu_debuglink` section names (NUL-terminated, then padding and a CRC).
fn linked_name(file: &File) -> Option<String> {
    let reader = target_files::elf_reader(file.try_clone().ok()?);
    let elf = object::File::parse(&reader).ok()?;
    let section = elf.section_by_name(".gnu_debuglink")?;
    let data = target_files::section_bytes(&section)?;
    let name = data.split(|&b| b == 0).next()?;
    let name = std::str::from_utf8(name).ok()?;
    // A name, not a path: one that climbs out of the directories searched is ignored.
    (!name.is_empty() && !name.contains('/')).then(|| name.to_string())
}

/// Where gdb looks for `name` linked from a file in `dir`.
fn candidates(dir: &Path, name: &str) -> Vec<PathBuf> {
    let under_debug = Path::new("/usr/lib/debug").join(dir.strip_prefix("/").unwrap_or(dir));
    vec![
        dir.join(name),
        dir.join(".debug").join(name),
        under_debug.join(name),
    ]
}

/// The debug file `file` (mapped from `mapped_path` in `pid`'s root, the host's when None) links
/// to, if one is there and passes the checks.
pub fn find(
    pid: Option<u32>,
    file: &File,
    mapped_path: &str,
    build_id: Option<&str>,
) -> Option<File> {
    let name = linked_name(file)?;
    let owner = file.metadata().ok()?.uid();
    let dir = Path::new(mapped_path.trim_end_matches(" (deleted)")).parent()?;
    let expect = Expect {
        owner: Some(owner),
        ..Expect::default()
    };
    for path in candidates(dir, &name) {
        let found = match target_files::open_in_root(pid, &path, false, &expect) {
            Ok(f) => f,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    eprintln!("phaseprof: warning: debug link of {mapped_path}: {e}");
                }
                continue;
            }
        };
        let id = crate::targets::build_id_hex(&target_files::fd_path(&found));
        if build_id.is_some() && id.as_deref() != build_id {
            eprintln!(
                "phaseprof: warning: {} is not the debug file of {mapped_path} (another build ID)",
                path.display()
            );
            continue;
        }
        return Some(found);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the places looked in for a linked debug file, as gdb orders them.
    #[test]
    fn looks_beside_then_under_usr_lib_debug() {
        let c = candidates(Path::new("/opt/app/bin"), "app.debug");
        assert_eq!(c[0], Path::new("/opt/app/bin/app.debug"));
        assert_eq!(c[1], Path::new("/opt/app/bin/.debug/app.debug"));
        assert_eq!(c[2], Path::new("/usr/lib/debug/opt/app/bin/app.debug"));
    }
}
