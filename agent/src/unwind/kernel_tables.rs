//! The unwind tables in the kernel (`--unwind dwarf`): each file's rows written once into the
//! shared rows array, however many targets map it (keyed by device and inode, so a rebuilt binary
//! at the same path gets new rows); each target's executable mappings written as a block that
//! points into them, replaced by a new block when they change (exec, dlopen), so that the BPF
//! walker never sees a half-written one.
use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use anyhow::Result;

use super::eh_frame_rows;
use super::process::mapped_vaddr;
use crate::engine::{
    Engine, FileRowsInfo, TableMapping, ENTRY_BLOCKS, MAX_UNWIND_BLOCKS, MAX_UNWIND_MAPPINGS,
};
use crate::procmaps::Vma;

/// One file's rows in the kernel.
struct FileRows {
    row_start: u32,
    row_count: u32,
    /// The table's base (a virtual address of the file): rows' pc = address - bias - base.
    base: u64,
    segments: Vec<(u64, u64)>,
    /// The path it was mapped at, to name code of a process gone before its mappings were read.
    path: String,
}

/// What the tables hold and cost, for the report and the bench.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TableStats {
    pub files: u64,
    pub rows: u64,
    /// Rows with a rule the walker cannot apply (their frames are walked by frame pointers).
    pub unsupported_rows: u64,
    /// Time spent compiling tables.
    pub build_ms: u64,
    /// Files whose rows did not fit (their frames are walked by frame pointers).
    pub files_without_room: u64,
    /// Times the rows array was full and rebuilt for the live targets.
    pub rebuilds: u64,
}

#[derive(Default)]
pub struct KernelTables {
    files: HashMap<(u64, u64), Option<FileRows>>,
    next_row: u32,
    /// pid -> (block, the mappings it was built from).
    targets: HashMap<u32, (u32, Vec<Vma>)>,
    free_blocks: Vec<u32>,
    blocks_used: u32,
    rebuilding: bool,
    /// Files loaded since the last rebuild: without any, a rebuild would free nothing.
    loaded_since_rebuild: u64,
    /// `--unwind auto`: a file that keeps frame pointers gets no rows (its frames are walked by
    /// them, in the same walk), one without them gets its rows.
    pub per_module: bool,
    /// Per file (as mapped), how its frames are walked and why, for `report -v`.
    pub modules: std::collections::BTreeMap<String, String>,
    pub stats: TableStats,
}

impl KernelTables {
    /// Walks `pid`'s stacks from tables of its executable mappings `vmas` (just read),
    /// compiling the files not yet in the kernel. A no-op when they did not change since the
    /// last call.
    pub fn install_vmas(&mut self, engine: &mut Engine, pid: u32, vmas: Vec<Vma>) -> Result<()> {
        if self.targets.get(&pid).is_some_and(|(_, v)| *v == vmas) {
            return Ok(());
        }
        let (mut maps, full) = self.mappings(engine, pid, &vmas)?;
        if full && self.rebuild(engine, pid)? {
            maps = self.mappings(engine, pid, &vmas)?.0;
        }
        maps.sort_by_key(|m| m.start);
        // The walker searches a fixed number: past it, code is walked by frame pointers.
        maps.truncate(MAX_UNWIND_MAPPINGS);
        let block = self.take_block()?;
        engine.write_unwind_block(block, &maps)?;
        engine.publish_unwind_block(pid, Some((block, maps.len())))?;
        if let Some((old, _)) = self.targets.insert(pid, (block, vmas)) {
            self.free_blocks.push(old);
        }
        Ok(())
    }

    /// `pid` is gone or no longer walked from tables.
    pub fn forget(&mut self, engine: &Engine, pid: u32) {
        if let Some((block, _)) = self.targets.remove(&pid) {
            let _ = engine.publish_unwind_block(pid, None);
            self.free_blocks.push(block);
        }
    }

    /// `forget`, the kernel no longer pointing `pid` at our block (it dropped it at an exec).
    pub fn forget_block(&mut self, pid: u32) {
        if let Some((block, _)) = self.targets.remove(&pid) {
            self.free_blocks.push(block);
        }
    }

    /// The executable mappings `maps` (a block the programs filled at an entry point) stand
    /// for, as far as our files tell: those with rows, whose file and offset they give back.
    pub fn vmas_of(&self, maps: &[TableMapping]) -> Vec<Vma> {
        const PAGE: u64 = 0x1000;
        let mut out = Vec::new();
        for m in maps.iter().filter(|m| m.row_count > 0) {
            let file = self.files.iter().find_map(|(key, f)| {
                f.as_ref()
                    .filter(|f| f.row_start == m.row_start && f.row_count == m.row_count)
                    .map(|f| (key, f))
            });
            let Some((&key, f)) = file else { continue };
            // bias = start - vaddr + base: the segment mapped there gives the file offset.
            let vaddr = m.start.wrapping_sub(m.bias).wrapping_add(f.base);
            let offset = f
                .segments
                .iter()
                .find(|&&(_, v)| v & !(PAGE - 1) == vaddr)
                .map(|&(off, _)| off & !(PAGE - 1));
            if let Some(offset) = offset {
                out.push(Vma {
                    start: m.start,
                    end: m.end,
                    offset,
                    path: f.path.clone(),
                    inode: Some(key),
                });
            }
        }
        out
    }

    /// Whether `pid` is walked from tables.
    pub fn has(&self, pid: u32) -> bool {
        self.targets.contains_key(&pid)
    }

    fn take_block(&mut self) -> Result<u32> {
        if let Some(b) = self.free_blocks.pop() {
            return Ok(b);
        }
        // The last ENTRY_BLOCKS are the programs' own (see `Engine::publish_file_rows`).
        anyhow::ensure!(
            self.blocks_used < MAX_UNWIND_BLOCKS - ENTRY_BLOCKS,
            "more than {} processes walked from unwind tables",
            (MAX_UNWIND_BLOCKS - ENTRY_BLOCKS) / 2
        );
        self.blocks_used += 1;
        Ok(self.blocks_used - 1)
    }

    /// The walker's view of each executable mapping, and whether a file's rows did not fit (its
    /// mapping has none then).
    fn mappings(
        &mut self,
        engine: &mut Engine,
        pid: u32,
        vmas: &[Vma],
    ) -> Result<(Vec<TableMapping>, bool)> {
        let mut full = false;
        let mut out = Vec::new();
        // Code without a file (the vDSO, the uprobe page, a JIT's) and files we cannot read
        // are known mappings without rows: walked by frame pointers, and no reason for the
        // walker to announce unknown code.
        let no_table = |vma: &Vma| TableMapping {
            start: vma.start,
            end: vma.end,
            bias: 0,
            row_start: 0,
            row_count: 0,
        };
        // The kernel half ([vsyscall]) runs no user code, and the walker's branch-free compare
        // holds for addresses below 2^63 only.
        for vma in vmas.iter().filter(|v| v.start < 1 << 63) {
            if !vma.is_file() {
                out.push(no_table(vma));
                continue;
            }
            // A file loaded already is known by the device and inode its maps line gives: no
            // open (a command that execs the same program a thousand times opens it once).
            let key = match vma.inode.filter(|k| self.files.contains_key(k)) {
                Some(key) => key,
                None => {
                    let Ok(file) = crate::target_files::open_mapped(pid, vma) else {
                        out.push(no_table(vma));
                        continue;
                    };
                    let Ok(meta) = file.metadata() else {
                        out.push(no_table(vma));
                        continue;
                    };
                    let key = (meta.dev(), meta.ino());
                    if !self.files.contains_key(&key) {
                        let path = crate::target_files::fd_path(&file);
                        let mut rows = self.load_file(engine, &path, &vma.path)?;
                        if let Some(f) = &mut rows {
                            f.path = vma.path.clone();
                            let _ = engine.publish_file_rows(&FileRowsInfo {
                                file: key,
                                row_start: f.row_start,
                                row_count: f.row_count,
                                base: f.base,
                                segments: &f.segments,
                            });
                        }
                        self.files.insert(key, rows);
                    }
                    key
                }
            };
            let Some(Some(f)) = self.files.get(&key) else {
                full = true;
                out.push(no_table(vma));
                continue;
            };
            let Some(vaddr) = mapped_vaddr(&f.segments, vma.offset) else {
                out.push(no_table(vma));
                continue;
            };
            let load_bias = vma.start.wrapping_sub(vaddr);
            out.push(TableMapping {
                start: vma.start,
                end: vma.end,
                bias: load_bias.wrapping_add(f.base),
                row_start: f.row_start,
                row_count: f.row_count,
            });
        }
        Ok((out, full))
    }

    /// Compiles `path` (mapped as `shown`) and writes its rows; None when they do not fit.
    /// Per module, a file that keeps frame pointers gets only its outermost frames' rows (its
    /// other frames are walked by frame pointers).
    fn load_file(
        &mut self,
        engine: &mut Engine,
        path: &std::path::Path,
        shown: &str,
    ) -> Result<Option<FileRows>> {
        let started = Instant::now();
        // A file we cannot parse has no rows: its frames are walked by frame pointers.
        let mut t = eh_frame_rows::compile(path).unwrap_or_default();
        if self.per_module {
            let (fp, why) = match super::frame_pointer_census(path) {
                Ok(c) => (
                    c.has_frame_pointers(),
                    format!(
                        "{} of {} functions keep frame pointers",
                        c.with, c.functions
                    ),
                ),
                Err(e) => (false, format!("not inspected ({e:#})")),
            };
            if fp {
                t.frame_pointers_only();
            }
            let walk = if fp { "fp" } else { "dwarf" };
            self.modules
                .insert(shown.to_string(), format!("{walk} ({why})"));
        }
        self.stats.build_ms += started.elapsed().as_millis() as u64;
        let n = t.rows.len() as u32;
        if (self.next_row as u64 + n as u64) > engine.unwind_rows_capacity() as u64 {
            self.stats.files_without_room += 1;
            return Ok(None);
        }
        let encoded: Vec<[u8; 8]> = t.rows.iter().map(|r| r.to_bytes()).collect();
        engine.write_unwind_rows(self.next_row, &encoded)?;
        let rows = FileRows {
            row_start: self.next_row,
            row_count: n,
            base: t.base,
            segments: t.segments,
            path: String::new(),
        };
        self.next_row += n;
        self.loaded_since_rebuild += 1;
        self.stats.files += 1;
        self.stats.rows += n as u64;
        self.stats.unsupported_rows += t.unsupported as u64;
        Ok(Some(rows))
    }

    /// The rows array is full: starts it afresh with the files the live targets map (rows of
    /// files no target maps any more are dropped) and reinstalls every target but `pid`, which
    /// the caller installs. False when already rebuilding, or when no file was loaded since the
    /// last rebuild (nothing would be freed).
    fn rebuild(&mut self, engine: &mut Engine, pid: u32) -> Result<bool> {
        if self.rebuilding || self.loaded_since_rebuild == 0 {
            return Ok(false);
        }
        self.rebuilding = true;
        self.loaded_since_rebuild = 0;
        self.stats.rebuilds += 1;
        let others: Vec<(u32, Vec<Vma>)> = self
            .targets
            .iter()
            .filter(|(&p, _)| p != pid)
            .map(|(&p, (_, vmas))| (p, vmas.clone()))
            .collect();
        // Frame pointers meanwhile: their blocks point at rows about to be overwritten.
        for (p, _) in &others {
            let _ = engine.publish_unwind_block(*p, None);
            if let Some((_, vmas)) = self.targets.get_mut(p) {
                vmas.clear(); // forces the reinstall below
            }
        }
        self.files.clear();
        engine.clear_file_rows();
        self.next_row = 0;
        for (p, vmas) in others {
            if self.install_vmas(engine, p, vmas).is_err() {
                self.forget(engine, p);
            }
        }
        self.rebuilding = false;
        Ok(true)
    }
}
