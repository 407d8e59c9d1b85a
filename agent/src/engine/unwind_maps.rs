//! The unwind tables in the kernel (`--unwind dwarf`): the rows array, written through a shared
//! mapping of it (millions of rows: one update syscall each would take seconds); the blocks of
//! per-process mappings; which targets are walked from them; the walker's counters.
use anyhow::{bail, Context, Result};
use libbpf_rs::{MapCore, MapFlags};
use phaseprof_bpf::{limits, types};

use super::{pod, Engine};

/// Executable mappings per process the walker searches.
pub const MAX_UNWIND_MAPPINGS: usize = limits::MAX_UNWIND_MAPPINGS as usize;
/// Blocks of mappings (processes walked from tables at once, and spares for changes).
pub const MAX_UNWIND_BLOCKS: u32 = limits::MAX_UNWIND_BLOCKS as u32;
/// Counters of the walker (`enum unwind_counter`).
pub const UNWIND_COUNTERS: usize = types::unwind_counter::UNW_MAX.0 as usize;

/// Default capacity of the rows array: 2M rows of 8 bytes (16 MiB of kernel memory, allocated
/// at load; a glibc takes ~25k rows, a 100 MB Rust binary ~1.5M).
pub const DEFAULT_UNWIND_ROWS: u32 = 2 << 20;

/// One executable mapping of a process as the walker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableMapping {
    pub start: u64,
    pub end: u64,
    /// Address - bias = the rows' pc.
    pub bias: u64,
    pub row_start: u32,
    /// 0: no table (frame pointers).
    pub row_count: u32,
}

/// The programs' key of a file (`struct program_file`): the kernel's dev_t (major << 20 |
/// minor, not stat's encoding) and the inode.
pub(super) fn program_file(dev: u64, ino: u64) -> [u8; 16] {
    let kernel_dev = (libc::major(dev) as u64) << 20 | libc::minor(dev) as u64;
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&kernel_dev.to_ne_bytes());
    key[8..].copy_from_slice(&ino.to_ne_bytes());
    key
}

/// Blocks a program's entry point fills itself (the last ENTRY_BLOCKS: see `file_rows`).
pub const ENTRY_BLOCKS: u32 = limits::ENTRY_BLOCKS as u32;

/// One file's rows in the kernel, as the entry point needs them (`struct file_rows`).
pub struct FileRowsInfo<'a> {
    /// (device, inode), as stat gives them.
    pub file: (u64, u64),
    pub row_start: u32,
    pub row_count: u32,
    pub base: u64,
    /// Its loadable segments' (p_offset, p_vaddr).
    pub segments: &'a [(u64, u64)],
}

impl Engine<'_> {
    /// Tells the entry point where a file's rows are (see `uprobe__entry_hold`): a program
    /// whose files all have theirs there runs on from its entry point with a block the
    /// kernel fills. Segments past FILE_SEGMENTS are left out (their code: frame pointers
    /// until user space installs its own block).
    pub fn publish_file_rows(&self, f: &FileRowsInfo) -> Result<()> {
        const PAGE: u64 = 0x1000;
        let mut value = types::file_rows {
            row_start: f.row_start,
            row_count: f.row_count,
            base: f.base,
            ..Default::default()
        };
        let n = f.segments.len().min(value.seg_offset.len());
        for (i, &(off, vaddr)) in f.segments[..n].iter().enumerate() {
            value.seg_offset[i] = off & !(PAGE - 1);
            value.seg_vaddr[i] = vaddr & !(PAGE - 1);
        }
        value.segments = n as u32;
        self.skel
            .maps
            .file_rows
            .update(
                &program_file(f.file.0, f.file.1),
                as_bytes(&value),
                MapFlags::ANY,
            )
            .context("publishing a file's unwind rows")
    }

    /// Forgets every file's rows (the rows array starts afresh).
    pub fn clear_file_rows(&self) {
        let map = &self.skel.maps.file_rows;
        let keys: Vec<Vec<u8>> = map.keys().collect();
        for k in keys {
            let _ = map.delete(&k);
        }
    }

    /// The mappings the programs wrote into entry block `slot` (for a process gone before we
    /// read its own): up to the first empty one, which ends them.
    pub fn entry_block(&self, slot: u32) -> Vec<TableMapping> {
        let Some(array) = self.unwind_mappings.as_ref() else {
            return Vec::new();
        };
        let first = (MAX_UNWIND_BLOCKS - ENTRY_BLOCKS + slot) as usize * MAX_UNWIND_MAPPINGS;
        let size = std::mem::size_of::<types::unwind_mapping>();
        let mut out = Vec::new();
        let mut raw = vec![0u8; size];
        for i in 0..MAX_UNWIND_MAPPINGS {
            if array.read((first + i) * size, &mut raw).is_err() {
                break;
            }
            let m: types::unwind_mapping = pod(&raw);
            if m.start == 0 && m.end == 0 {
                break;
            }
            out.push(TableMapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                row_start: m.row_start,
                row_count: m.row_count,
            });
        }
        out
    }

    /// Frees entry block `slot` (its process has a block of ours now, or is gone).
    pub fn free_entry_block(&self, slot: u32) {
        let _ = self.skel.maps.entry_block_owner.delete(&slot.to_ne_bytes());
    }

    /// Rows the kernel's array holds.
    pub fn unwind_rows_capacity(&self) -> u32 {
        self.rows.as_ref().map_or(0, |r| (r.len() / 8) as u32)
    }

    /// Writes encoded rows (`struct unwind_row`, 8 bytes each) from index `at`.
    pub fn write_unwind_rows(&mut self, at: u32, rows: &[[u8; 8]]) -> Result<()> {
        let Some(m) = &self.rows else {
            bail!("no unwind rows were allocated at load");
        };
        // The BPF walker reads rows only through mappings published after this write (see
        // `publish_unwind_block`).
        m.write(at as usize * 8, rows.as_flattened())
            .with_context(|| format!("unwind rows {at}..+{}", rows.len()))
    }

    /// Writes block `block`'s mappings (sorted by start, at most MAX_UNWIND_MAPPINGS).
    pub fn write_unwind_block(&self, block: u32, maps: &[TableMapping]) -> Result<()> {
        if block >= MAX_UNWIND_BLOCKS || maps.len() > MAX_UNWIND_MAPPINGS {
            bail!(
                "unwind block {block} of {} mappings out of range",
                maps.len()
            );
        }
        let Some(array) = &self.unwind_mappings else {
            bail!("no unwind tables were allocated at load");
        };
        let size = std::mem::size_of::<types::unwind_mapping>();
        // The walker reads a block only once it is published (`publish_unwind_block`, a
        // syscall after these stores).
        for (i, m) in maps.iter().enumerate() {
            let key = block as usize * MAX_UNWIND_MAPPINGS + i;
            let value = types::unwind_mapping {
                start: m.start,
                end: m.end,
                bias: m.bias,
                row_start: m.row_start,
                row_count: m.row_count,
            };
            array
                .write(key * size, as_bytes(&value))
                .context("writing an unwind mapping")?;
        }
        Ok(())
    }

    /// From now on `pid`'s user stacks are walked from the `count` mappings of `block`; None:
    /// by frame pointers again.
    pub fn publish_unwind_block(&self, pid: u32, block: Option<(u32, usize)>) -> Result<()> {
        let map = &self.skel.maps.table_pids;
        match block {
            Some((block, count)) => {
                let value = types::unwind_target {
                    first: block * MAX_UNWIND_MAPPINGS as u32,
                    count: count as u32,
                };
                map.update(&pid.to_ne_bytes(), as_bytes(&value), MapFlags::ANY)
                    .with_context(|| format!("switching pid {pid} to unwind tables"))
            }
            None => {
                let _ = map.delete(&pid.to_ne_bytes());
                Ok(())
            }
        }
    }

    /// The walker's counters so far, summed over CPUs, by `enum unwind_counter`.
    pub fn unwind_counts(&self) -> Result<[u64; UNWIND_COUNTERS]> {
        let mut out = [0u64; UNWIND_COUNTERS];
        for (i, slot) in out.iter_mut().enumerate() {
            let per_cpu = self
                .skel
                .maps
                .unwind_counts
                .lookup_percpu(&(i as u32).to_ne_bytes(), MapFlags::ANY)?;
            *slot = per_cpu
                .unwrap_or_default()
                .iter()
                .map(|v| pod::<u64>(v))
                .sum();
        }
        Ok(out)
    }
}

/// The bytes of a generated header record.
fn as_bytes<T: Copy>(v: &T) -> &[u8] {
    // SAFETY: T is a `#[repr(C)]` integer-only record generated from the BPF object's BTF
    // (no padding the header does not name), viewed for its size only.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}
