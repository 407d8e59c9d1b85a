//! Live symbolization with blazesym: user addresses through each process's mappings as their
//! owner (`processes`) keeps them (so symbols survive the target's exit), kernel addresses through kallsyms. The mapped
//! files themselves are read by a thread of their own (`file_names`); code with no symbol is
//! named after its function's start from the file's call-frame information.
mod cfi_functions;
pub mod debug_files;
mod debug_link;
pub mod debug_symbols;
mod file_names;
mod perf_map;

use std::collections::HashMap;
use std::path::Path;

use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Sym, Symbolized, Symbolizer};
use blazesym::MaybeDefault;
use phaseprof_model::{Frame, FrameKind};

use self::file_names::{Job, Namer};
use crate::aggregate::Symbolize;
use crate::processes::Processes;
use crate::procmaps::Vma;

pub struct BlazeSymbolizer {
    /// For the kernel's and the vDSO's names (mapped files are named by `namer`).
    symbolizer: Symbolizer,
    /// A copy of the vDSO image, which is the same in every process of this kernel.
    vdso: Option<tempfile_path::TempPath>,
    /// Per mapped file (as the process names it) and file offset: symbolized once, whatever
    /// process it came from.
    by_file: HashMap<(String, u64), Vec<Frame>>,
    namer: Namer,
    /// Addresses named `file+offset` because their names had not come yet, since `take_late`.
    late: std::collections::HashSet<(String, u64)>,
    /// Every file symbolized, by module name: its path, build ID and first mapping.
    pub modules: std::collections::BTreeMap<String, phaseprof_model::ModuleInfo>,
    perf_maps: perf_map::PerfMaps,
    /// The mapped files, opened the guarded way (`target_files`).
    files: crate::target_files::MappedFiles,
    /// Mapped paths the user knows by another name (see `run_name`): the path run.
    run_names: HashMap<String, String>,
}

/// Bound of the names of addresses held by a symbolizer that runs for weeks (the fleet agent):
/// past it, they start afresh (named again as they come), as the naming thread's caches of
/// files do past theirs.
const MAX_NAMED_ADDRESSES: usize = 1 << 20;

impl BlazeSymbolizer {
    /// After a window is symbolized: forgets processes that `live` rejects, and starts the
    /// caches afresh where one is past its bound (blazesym's own per-file caches with them).
    pub fn trim(&mut self, live: impl Fn(u32) -> bool) {
        self.files.retain(&live);
        self.perf_maps.retain(&live);
        let reset = self.by_file.len() > MAX_NAMED_ADDRESSES;
        if reset {
            self.by_file.clear();
        }
        self.namer.trim(reset);
    }

    /// From now on, names of mapped files that take long to read (a big file's first look, a
    /// debug file from debuginfod) do not hold a lookup more than `wait`: their addresses are
    /// named `file+offset` until they come (counted by `take_late`).
    pub fn name_in_background(&mut self, wait: std::time::Duration) {
        self.namer.in_background(wait);
    }

    /// Addresses named `file+offset` since the last call because their names had not come.
    pub fn take_late(&mut self) -> u64 {
        std::mem::take(&mut self.late).len() as u64
    }

    /// Takes the names the naming thread has given, waiting for those of `wanted` as long as
    /// it may (see `name_in_background`).
    fn receive_names(&mut self, wanted: &[(String, u64)]) {
        let by_file = &mut self.by_file;
        let mut stale: Vec<String> = Vec::new();
        self.namer.receive(
            wanted,
            |key, off, frames| {
                by_file.insert((key, off), frames);
            },
            |paths| stale.extend_from_slice(paths),
        );
        if !stale.is_empty() {
            // Named without a debug file, which has come since: named again.
            self.by_file.retain(|(path, _), _| !stale.contains(path));
        }
    }
}

impl Default for BlazeSymbolizer {
    fn default() -> Self {
        BlazeSymbolizer {
            symbolizer: file_names::blazesym(),
            vdso: tempfile_path::copy_own_vdso(),
            by_file: HashMap::new(),
            namer: Namer::waiting(),
            late: Default::default(),
            modules: Default::default(),
            perf_maps: perf_map::PerfMaps::default(),
            files: Default::default(),
            run_names: HashMap::new(),
        }
    }
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
    /// Names the file mapped at `mapped` by `run`, the symlink the user ran it by (Debian's
    /// `redis-server` for `redis-check-rdb`), in frames and modules.
    pub fn name_as_run(&mut self, mapped: &str, run: &str) {
        self.run_names.insert(mapped.to_string(), run.to_string());
    }

    /// The path a mapped file is shown by.
    fn shown_path<'a>(&'a self, mapped: &'a str) -> &'a str {
        let mapped = mapped.trim_end_matches(" (deleted)");
        self.run_names.get(mapped).map_or(mapped, String::as_str)
    }

    /// A process exec'd, its mappings to be read later: files it could not be given before
    /// (its old program's, or opened in a race with the exec) are tried again.
    pub fn exec(&mut self, pid: u32) {
        self.files.forget(pid);
    }

    /// `pid` maps `vmas` (just read): its mapped files are opened while it lives (through its
    /// mappings themselves), so that its stacks are named from the very files it ran after it
    /// has exited too.
    pub fn mapped(&mut self, pid: u32, vmas: &[Vma]) {
        for vma in vmas.iter().filter(|v| v.is_file()) {
            let _ = self.files.get(pid, vma);
        }
    }

    /// Asks the naming thread for `offsets` of `vma`'s file not named yet.
    fn ask_names(&mut self, pid: u32, vma: &Vma, offsets: &[u64]) {
        let module = module_name(self.shown_path(&vma.path));
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
        let Ok(file) = file.try_clone() else { return };
        if !self.modules.contains_key(&module) {
            let info = phaseprof_model::ModuleInfo {
                path: self.shown_path(&vma.path).to_string(),
                build_id: crate::targets::build_id_hex(&crate::target_files::fd_path(&file)),
                start: vma.start,
                limit: vma.end,
                offset: vma.offset,
            };
            self.modules.insert(module.clone(), info);
        }
        self.namer.ask(Job {
            key: vma.path.clone(),
            module,
            pid,
            file,
            offsets: todo,
        });
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

/// The symbolizer with the mappings it names addresses through: what a window is named with.
pub struct Naming<'a> {
    pub sym: &'a mut BlazeSymbolizer,
    pub processes: &'a mut Processes,
    pub probe_resumes: &'a crate::engine::probe_resumes::ProbeResumes,
}

impl Symbolize for Naming<'_> {
    fn user(&mut self, pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>> {
        let maps = &mut *self.processes;
        if addrs.iter().any(|&a| maps.find(pid, a).is_none()) && maps.read(pid) {
            // Code mapped since we last looked (dlopen, a JIT): looked at again while it is
            // alive (the session tells the unwinders after the window).
            self.sym.mapped(pid, maps.vmas(pid));
        }
        self.sym.user(maps, pid, addrs)
    }

    fn probe_resumes_at(&self, pid: u32, addr: u64) -> bool {
        (self.processes.find(pid, addr)).is_some_and(|vma| self.probe_resumes.contains(vma, addr))
    }

    fn named_later(&self, pid: u32, addr: u64) -> bool {
        match self.processes.find(pid, addr) {
            Some(vma) if vma.is_file() => self
                .sym
                .namer
                .is_pending(&vma.path, addr - vma.start + vma.offset),
            _ => false,
        }
    }

    fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>> {
        self.sym.kernel(addrs)
    }
}

impl BlazeSymbolizer {
    fn user(&mut self, maps: &Processes, pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>> {
        // Group by mapping so each file is symbolized in one batch.
        let mut per_vma: HashMap<(u64, u64), (Vma, Vec<u64>)> = HashMap::new();
        for &a in addrs {
            if let Some(vma) = maps.find(pid, a) {
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
        let mut wanted = Vec::new();
        for (vma, offsets) in per_vma.values() {
            self.ask_names(pid, vma, offsets);
            wanted.extend(offsets.iter().map(|&o| (vma.path.clone(), o)));
        }
        self.receive_names(&wanted);
        let mut out = Vec::with_capacity(addrs.len());
        for &a in addrs {
            let vma = maps.find(pid, a).cloned();
            out.push(match vma {
                Some(vma) if vma.is_file() => {
                    let off = a - vma.start + vma.offset;
                    match self.by_file.get(&(vma.path.clone(), off)) {
                        Some(frames) => frames.clone(),
                        None => {
                            if self.namer.is_pending(&vma.path, off) {
                                self.late.insert((vma.path.clone(), off));
                            }
                            unknown(
                                &module_name(self.shown_path(&vma.path)),
                                off,
                                FrameKind::User,
                            )
                        }
                    }
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
                None => unknown(crate::aggregate::UNMAPPED_MODULE, a, FrameKind::User),
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
        let vmas = crate::procmaps::read_vmas(std::process::id()).ok()?;
        let vma = vmas.into_iter().find(|v| v.path == "[vdso]")?;
        let len = (vma.end - vma.start) as usize;
        // SAFETY: the kernel maps the vDSO readable for the life of the process; the range
        // comes from our own mappings.
        let image = unsafe { std::slice::from_raw_parts(vma.start as *const u8, len) };
        let path = std::env::temp_dir().join(format!("phaseprof-vdso-{}.so", std::process::id()));
        std::fs::write(&path, image).ok()?;
        Some(TempPath(path))
    }
}

#[cfg(test)]
mod tests;
