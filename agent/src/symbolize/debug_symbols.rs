//! A stripped object's function symbols from its separate debug file, found as stacks find
//! theirs (by build ID under the debug directories or from debuginfod, else by its
//! `.gnu_debuglink`), with the offsets in the object that probes need: the debug file's symbol
//! addresses turned into file offsets through the object's own loadable segments (the debug
//! file's code sections hold no bytes, so its offsets mean nothing).
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment};

use super::{debug_files::DebugFiles, debug_link};
use crate::elf::{demangle, for_each_symbol, FunctionSymbol};
use crate::target_files;

/// The debug file of the stripped object at `path` (a host path) and the object's function
/// symbols from it; None when there is none, or it cannot be read.
pub fn of_stripped(path: &Path, files: &mut DebugFiles) -> Option<(PathBuf, Vec<FunctionSymbol>)> {
    let file = target_files::open_in_root(None, path, false, &Default::default()).ok()?;
    let id = crate::targets::build_id_hex(&target_files::fd_path(&file));
    let (debug, linked) = match id.as_deref().and_then(|id| files.for_build_id(id)) {
        Some(host) => (host, None),
        None => {
            let linked = debug_link::find(None, &file, &path.to_string_lossy(), id.as_deref())?;
            (target_files::fd_path(&linked), Some(linked))
        }
    };
    let reader = target_files::elf_reader(file);
    let elf = object::File::parse(&reader).ok()?;
    // (file start, size, address) of each loadable segment.
    let segments: Vec<(u64, u64, u64)> = (elf.segments())
        .map(|s| {
            let (start, size) = s.file_range();
            (start, size, s.address())
        })
        .collect();
    let offset = |addr: u64| {
        (segments.iter())
            .find(|(_, size, at)| *at <= addr && addr < at + size)
            .map(|(start, _, at)| start + (addr - at))
    };
    let mut syms: std::collections::BTreeMap<u64, FunctionSymbol> = Default::default();
    for_each_symbol(&debug, |sym| {
        if sym.sym_type != blazesym::SymType::Function {
            return;
        }
        if let Some(off) = offset(sym.addr) {
            syms.entry(off).or_insert_with(|| FunctionSymbol {
                name: demangle(&sym.name),
                raw: sym.name.to_string(),
                file_offset: off,
                size: sym.size.unwrap_or(0) as u64,
            });
        }
    })
    .ok()?;
    // Named as found: a path of ours (/proc/self/fd/N) says nothing to a user.
    let shown = if linked.is_some() {
        PathBuf::from(format!("its .gnu_debuglink beside {}", path.display()))
    } else {
        debug
    };
    Some((shown, syms.into_values().collect()))
}
