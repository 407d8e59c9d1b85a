//! Live symbolization with blazesym: user addresses through the cached mappings of each process
//! (so symbols survive the target's exit), kernel addresses through kallsyms. Code with no
//! symbol is named after its function's start from the file's call-frame information.
mod cfi_functions;
pub mod debug_files;
mod debug_link;
mod perf_map;

use std::collections::HashMap;
use std::path::Path;

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use blazesym::MaybeDefault;
use phaseprof_model::{Frame, FrameKind};

use self::cfi_functions::CfiFunctions;
use crate::aggregate::Symbolize;
use crate::procmaps::{ProcMaps, Vma};

pub struct BlazeSymbolizer {
    symbolizer: Symbolizer,
    maps: ProcMaps,
    /// A copy of the vDSO image, which is the same in every process of this kernel.
    vdso: Option<tempfile_path::TempPath>,
    /// Per mapped file (as the process names it) and file offset: symbolized once, whatever
    /// process it came from.
    by_file: HashMap<(String, u64), Vec<Frame>>,
    /// Per mapped file: its functions from `.eh_frame`, read at its first unnamed address.
    cfi: HashMap<String, CfiFunctions>,
    debug_files: debug_files::DebugFiles,
    /// Every file symbolized, by module name: its path, build ID and first mapping.
    pub modules: std::collections::BTreeMap<String, phaseprof_model::ModuleInfo>,
    perf_maps: perf_map::PerfMaps,
    /// The mapped files, opened the guarded way (`target_files`).
    files: crate::target_files::MappedFiles,
    /// Per mapped file with unnamed addresses: its separate debug file (by build ID), if any.
    separate: HashMap<String, Option<Separate>>,
}

/// A stripped file's separate debug file, and the file's loadable segments (file start, size,
/// address) to turn file offsets into the addresses the debug file is indexed by.
struct Separate {
    debug: DebugFile,
    segments: Vec<(u64, u64, u64)>,
}

/// A debug file: under a debug directory of the host (or elfutils' cache), or one beside the
/// target's file, opened and checked.
enum DebugFile {
    Host(std::path::PathBuf),
    Opened(std::fs::File),
}

impl DebugFile {
    fn path(&self) -> std::path::PathBuf {
        match self {
            DebugFile::Host(p) => p.clone(),
            DebugFile::Opened(f) => crate::target_files::fd_path(f),
        }
    }
}

impl Separate {
    /// The separate debug file of `file` (mapped at `mapped_path` in `pid`'s root): by build
    /// ID, else by its `.gnu_debuglink` (see `debug_link`).
    fn of(
        pid: u32,
        file: &std::fs::File,
        mapped_path: &str,
        files: &mut debug_files::DebugFiles,
    ) -> Option<Separate> {
        use object::{Object, ObjectSegment};
        let id = crate::targets::build_id_hex(&crate::target_files::fd_path(file));
        let debug = match id.as_deref().and_then(|id| files.for_build_id(id)) {
            Some(path) => Some(DebugFile::Host(path)),
            None => debug_link::find(pid, file, mapped_path, id.as_deref()).map(DebugFile::Opened),
        }?;
        let reader = crate::target_files::elf_reader(file.try_clone().ok()?);
        let elf = object::File::parse(&reader).ok()?;
        let segments = elf
            .segments()
            .map(|s| {
                let (start, size) = s.file_range();
                (start, size, s.address())
            })
            .collect();
        Some(Separate { debug, segments })
    }

    fn vaddr(&self, off: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(start, size, _)| *start <= off && off < start + size)
            .map(|(start, _, addr)| addr + (off - start))
    }
}

/// Bounds of the caches of a symbolizer that runs for weeks (the fleet agent): names of
/// addresses, and files whose functions or debug files are held. Past one, those caches start
/// afresh (names are looked up again as they come).
const MAX_NAMED_ADDRESSES: usize = 1 << 20;
const MAX_FILES_HELD: usize = 1024;

fn blazesym() -> Symbolizer {
    Symbolizer::builder()
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .enable_demangling(true)
        .build()
}

impl BlazeSymbolizer {
    /// After a window is symbolized: forgets processes that `live` rejects, and starts the
    /// caches afresh where one is past its bound (blazesym's own per-file caches with them).
    pub fn trim(&mut self, live: impl Fn(u32) -> bool) {
        self.maps.retain(&live);
        self.files.retain(&live);
        if self.debug_files.arrived() {
            // Files named without a debug file are looked at again: theirs may have come.
            let without: Vec<String> = self
                .separate
                .iter()
                .filter(|(_, s)| s.is_none())
                .map(|(path, _)| path.clone())
                .collect();
            for path in &without {
                self.separate.remove(path);
            }
            self.by_file.retain(|(path, _), _| !without.contains(path));
        }
        self.perf_maps.retain(&live);
        if self.by_file.len() > MAX_NAMED_ADDRESSES
            || self.cfi.len() > MAX_FILES_HELD
            || self.separate.len() > MAX_FILES_HELD
        {
            self.by_file.clear();
            self.cfi.clear();
            self.separate.clear();
            self.symbolizer = blazesym();
        }
    }
}

impl Default for BlazeSymbolizer {
    fn default() -> Self {
        BlazeSymbolizer {
            symbolizer: blazesym(),
            maps: ProcMaps::default(),
            vdso: tempfile_path::copy_own_vdso(),
            by_file: HashMap::new(),
            cfi: HashMap::new(),
            debug_files: debug_files::DebugFiles::default(),
            modules: Default::default(),
            perf_maps: perf_map::PerfMaps::default(),
            files: Default::default(),
            separate: HashMap::new(),
        }
    }
}

/// Whether blazesym may read `file`'s DWARF: it follows the links in there by path (beside the
/// file too), so only for files root owns or that link nowhere. Others' debug links are
/// followed by `debug_link`, the guarded way.
fn debug_syms_safe(file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata().is_ok_and(|m| m.uid() == 0) || !crate::target_files::links_elsewhere(file)
}

fn module_name(path: &str) -> String {
    Path::new(path.trim_end_matches(" (deleted)"))
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

fn unknown(module: &str, offset: u64, kind: FrameKind) -> Vec<Frame> {
    vec![Frame {
        function: format!("{module}+{offset:#x}"),
        module: module.to_string(),
        kind,
        inlined: false,
    }]
}

/// A symbol with its inlined callees, innermost first.
fn frames_of(sym: &Sym<'_>, module: &str, kind: FrameKind) -> Vec<Frame> {
    let mut frames: Vec<Frame> = sym
        .inlined
        .iter()
        .rev()
        .map(|f| Frame {
            function: f.name.to_string(),
            module: module.to_string(),
            kind,
            inlined: true,
        })
        .collect();
    frames.push(Frame {
        function: sym.name.to_string(),
        module: module.to_string(),
        kind,
        inlined: false,
    });
    frames
}

impl BlazeSymbolizer {
    /// Debug files are fetched by a thread of their own (see `DebugFiles::fetch_in_background`);
    /// names they give come at the first `trim` after they arrive.
    pub fn fetch_debug_files_in_background(&mut self) {
        self.debug_files.fetch_in_background();
    }

    /// `pid`'s executable mappings as `track` last read them.
    pub fn vmas(&self, pid: u32) -> &[Vma] {
        self.maps.vmas(pid)
    }

    /// Reads (again) the mappings of `pid`. Call when a target appears or maps code.
    pub fn track(&mut self, pid: u32) {
        self.maps.refresh(pid);
        self.open_mapped_files(pid);
    }

    /// `track` for a process that exec'd: files it could not be given before (its old
    /// program's, or opened in a race with the exec) are tried again.
    pub fn exec(&mut self, pid: u32) {
        self.files.forget(pid);
        self.track(pid);
    }

    /// Opens `pid`'s mapped files while it lives (through its mappings themselves), so that its
    /// stacks are named from the very files it ran after it has exited too.
    fn open_mapped_files(&mut self, pid: u32) {
        for vma in self.maps.vmas(pid).to_vec() {
            if vma.is_file() {
                let _ = self.files.get(pid, &vma);
            }
        }
    }

    fn symbolize_file(&mut self, pid: u32, vma: &Vma, offsets: &[u64]) {
        let module = module_name(&vma.path);
        let todo: Vec<u64> = offsets
            .iter()
            .copied()
            .filter(|o| !self.by_file.contains_key(&(vma.path.clone(), *o)))
            .collect();
        if todo.is_empty() {
            return;
        }
        // Not opened (now): unnamed, and not remembered as such (it may open after an exec).
        let Some(file) = self.files.get(pid, vma) else {
            return;
        };
        let file = file.try_clone().ok();
        let Some(file) = file else { return };
        let path = crate::target_files::fd_path(&file);
        if !self.modules.contains_key(&module) {
            let info = phaseprof_model::ModuleInfo {
                path: vma.path.trim_end_matches(" (deleted)").to_string(),
                build_id: crate::targets::build_id_hex(&path),
                start: vma.start,
                limit: vma.end,
                offset: vma.offset,
            };
            self.modules.insert(module.clone(), info);
        }
        let mut elf = Elf::new(&path);
        elf.debug_syms = debug_syms_safe(&file);
        let src = Source::Elf(elf);
        let results = self.symbolizer.symbolize(&src, Input::FileOffset(&todo));
        let named: Vec<Option<Vec<Frame>>> = (0..todo.len())
            .map(|i| match results.as_ref().ok().and_then(|r| r.get(i)) {
                Some(Symbolized::Sym(sym)) => Some(frames_of(sym, &module, FrameKind::User)),
                _ => None,
            })
            .collect();
        drop(results);
        let unnamed: Vec<u64> = (todo.iter().zip(&named))
            .filter(|(_, n)| n.is_none())
            .map(|(o, _)| *o)
            .collect();
        let mut from_debug = self.names_from_debug_file(pid, &vma.path, &file, &unnamed, &module);
        for (off, named) in todo.iter().zip(named) {
            let frames = match named.or_else(|| from_debug.remove(off)) {
                Some(frames) => frames,
                None => {
                    let functions = self
                        .cfi
                        .entry(vma.path.clone())
                        .or_insert_with(|| CfiFunctions::of(&file));
                    let at = functions.start_of(*off).unwrap_or(*off);
                    unknown(&module, at, FrameKind::User)
                }
            };
            self.by_file.insert((vma.path.clone(), *off), frames);
        }
    }
}

impl BlazeSymbolizer {
    /// Names for `offsets` of a stripped file from its separate debug file (found by build ID,
    /// locally or through debuginfod), when it has one.
    fn names_from_debug_file(
        &mut self,
        pid: u32,
        key: &str,
        file: &std::fs::File,
        offsets: &[u64],
        module: &str,
    ) -> HashMap<u64, Vec<Frame>> {
        if offsets.is_empty() {
            return HashMap::new();
        }
        let files = &mut self.debug_files;
        let separate = self
            .separate
            .entry(key.to_string())
            .or_insert_with(|| Separate::of(pid, file, key, files));
        let Some(sep) = separate else {
            return HashMap::new();
        };
        let known: Vec<(u64, u64)> = offsets
            .iter()
            .filter_map(|&o| Some((o, sep.vaddr(o)?)))
            .collect();
        let vaddrs: Vec<u64> = known.iter().map(|(_, v)| *v).collect();
        let mut elf = Elf::new(sep.debug.path());
        if let DebugFile::Opened(f) = &sep.debug {
            elf.debug_syms = debug_syms_safe(f);
        }
        let src = Source::Elf(elf);
        let Ok(results) = self.symbolizer.symbolize(&src, Input::VirtOffset(&vaddrs)) else {
            return HashMap::new();
        };
        known
            .iter()
            .zip(results.iter())
            .filter_map(|((off, _), r)| match r {
                Symbolized::Sym(sym) => Some((*off, frames_of(sym, module, FrameKind::User))),
                _ => None,
            })
            .collect()
    }

    /// vDSO frames (`clock_gettime` and friends), symbolized from our own copy of the image.
    fn vdso_frames(&mut self, offset: u64) -> Vec<Frame> {
        let key = ("[vdso]".to_string(), offset);
        if let Some(f) = self.by_file.get(&key) {
            return f.clone();
        }
        let frames = match &self.vdso {
            Some(path) => {
                let src = Source::Elf(Elf::new(path.path()));
                match self
                    .symbolizer
                    .symbolize_single(&src, Input::VirtOffset(offset))
                {
                    Ok(Symbolized::Sym(sym)) => frames_of(&sym, "[vdso]", FrameKind::User),
                    _ => unknown("[vdso]", offset, FrameKind::User),
                }
            }
            None => unknown("[vdso]", offset, FrameKind::User),
        };
        self.by_file.insert(key, frames.clone());
        frames
    }
}

impl Symbolize for BlazeSymbolizer {
    fn user(&mut self, pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>> {
        if addrs.iter().any(|&a| self.maps.find(pid, a).is_none()) {
            // Code mapped since we last looked (dlopen, a JIT): look again while it is alive.
            self.maps.refresh(pid);
            self.open_mapped_files(pid);
        }
        // Group by mapping so each file is symbolized in one batch.
        let mut per_vma: HashMap<(u64, u64), (Vma, Vec<u64>)> = HashMap::new();
        for &a in addrs {
            if let Some(vma) = self.maps.find(pid, a) {
                if vma.is_file() {
                    let off = a - vma.start + vma.offset;
                    per_vma
                        .entry((vma.start, vma.end))
                        .or_insert_with(|| (vma.clone(), Vec::new()))
                        .1
                        .push(off);
                }
            }
        }
        for (vma, offsets) in per_vma.values() {
            self.symbolize_file(pid, vma, offsets);
        }
        let mut out = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let vma = self.maps.find(pid, a).cloned();
            out.push(match vma {
                Some(vma) if vma.is_file() => {
                    let off = a - vma.start + vma.offset;
                    self.by_file
                        .get(&(vma.path.clone(), off))
                        .cloned()
                        .unwrap_or_else(|| unknown(&module_name(&vma.path), off, FrameKind::User))
                }
                Some(vma) if vma.path == "[vdso]" => self.vdso_frames(a - vma.start),
                // Anonymous executable memory: JIT-compiled code, named by the runtime's perf map
                // (looked up only there: an address in no mapping is a bad walk, not JIT code).
                Some(vma) => match self.perf_maps.lookup(pid, a) {
                    Some(function) => vec![Frame {
                        function,
                        module: "[jit]".into(),
                        kind: FrameKind::User,
                        inlined: false,
                    }],
                    None => unknown(&vma.path, a - vma.start, FrameKind::User),
                },
                None => unknown("[unknown]", a, FrameKind::User),
            });
        }
        out
    }

    fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>> {
        let src = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Default::default()
        });
        let results = self.symbolizer.symbolize(&src, Input::AbsAddr(addrs));
        addrs
            .iter()
            .enumerate()
            .map(
                |(i, &a)| match results.as_ref().ok().and_then(|r| r.get(i)) {
                    Some(Symbolized::Sym(sym)) => frames_of(sym, "[kernel]", FrameKind::Kernel),
                    _ => unknown("[kernel]", a, FrameKind::Kernel),
                },
            )
            .collect()
    }
}

/// The vDSO copied from our own address space into a file blazesym can open.
mod tempfile_path {
    use std::path::{Path, PathBuf};

    use crate::procmaps::parse_maps;

    /// A file removed when dropped.
    pub struct TempPath(PathBuf);

    impl TempPath {
        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub fn copy_own_vdso() -> Option<TempPath> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let vma = parse_maps(&maps).into_iter().find(|v| v.path == "[vdso]")?;
        let len = (vma.end - vma.start) as usize;
        // SAFETY: the kernel maps the vDSO readable for the life of the process; the range
        // comes from our own /proc/self/maps.
        let image = unsafe { std::slice::from_raw_parts(vma.start as *const u8, len) };
        let path = std::env::temp_dir().join(format!("phaseprof-vdso-{}.so", std::process::id()));
        std::fs::write(&path, image).ok()?;
        Some(TempPath(path))
    }
}
