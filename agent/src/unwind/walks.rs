//! How a session walks its targets' user stacks: per target (as `--unwind` and the binary
//! decide) by the kernel's frame-pointer walk, from unwind tables in the kernel, or from stack
//! copies unwound here; following exec, new code mappings and exits; and what each way cost and
//! achieved per window.
use std::path::Path;

use anyhow::Result;
use phaseprof_model::{UnwindInfo, WalkCounts};

use super::kernel_tables::KernelTables;
use super::samples::{SampleUnwinder, UnwindStats};
use super::{UnwindPolicy, Walk};
use crate::engine::{Engine, UNWIND_COUNTERS};
use crate::procmaps::Vma;
use crate::window::{RawSample, RawStackSample};

pub struct StackWalks {
    policy: UnwindPolicy,
    copies: SampleUnwinder,
    tables: KernelTables,
    /// Commands walked from tables whose tables go in at their entry point (`exec` without
    /// mappings).
    tables_later: std::collections::HashSet<u32>,
    /// Counts at the last window.
    copies_at_window: UnwindStats,
    walks_at_window: [u64; UNWIND_COUNTERS],
}

impl StackWalks {
    pub fn new(policy: UnwindPolicy) -> Self {
        let mut tables = KernelTables::default();
        tables.per_module = policy.mode == super::UnwindMode::Auto;
        StackWalks {
            policy,
            copies: SampleUnwinder::default(),
            tables,
            tables_later: Default::default(),
            copies_at_window: UnwindStats::default(),
            walks_at_window: [0; UNWIND_COUNTERS],
        }
    }

    /// Decides how `pid` (running `exe`) is walked and tells the kernel; returns the way and
    /// the decision as the report says it (`dwarf (auto: ...)`). `mapped`: its executable
    /// mappings as just read (empty: unreadable), or None for a `record -- CMD` child held
    /// before its exec, whose tables are installed at the exec.
    pub fn choose(
        &mut self,
        engine: &mut Engine,
        pid: u32,
        exe: &Path,
        mapped: Option<&[Vma]>,
    ) -> Result<(Walk, String)> {
        let d = self.policy.decide(exe);
        engine.set_unwind(pid, d.walk == Walk::Copy)?;
        let mut why = d.why;
        if let Some(vmas) = mapped {
            self.copies.maps_changed(pid, vmas);
        }
        if let (Walk::Tables, Some(vmas)) = (d.walk, mapped) {
            let installed = if vmas.is_empty() {
                Err(anyhow::anyhow!("its mappings could not be read"))
            } else {
                self.tables.install_vmas(engine, pid, vmas.to_vec())
            };
            if let Err(e) = installed {
                // Frame pointers then: the recording goes on with flatter stacks.
                self.tables.forget(engine, pid);
                why += &format!("; unwind tables not installed: {e:#}");
            }
        } else {
            self.tables.forget(engine, pid);
        }
        Ok((d.walk, format!("{} ({why})", d.walk.name())))
    }

    /// `pid` exec'd: a new program (mapped as `vmas`: the program and its loader, whose own
    /// syscalls then have whole stacks too; None: its tables go in at its entry point, with
    /// `entry_reached`), inspected afresh.
    pub fn exec(
        &mut self,
        engine: &mut Engine,
        pid: u32,
        exe: &Path,
        vmas: Option<&[Vma]>,
    ) -> Result<(Walk, String)> {
        self.copies.forget(pid);
        if vmas.is_none() {
            // To be read at its entry point: the programs dropped its old block at the exec,
            // and may have filled an entry block since, which must stay.
            self.tables.forget_block(pid);
        } else {
            self.tables.forget(engine, pid);
        }
        let chosen = self.choose(engine, pid, exe, vmas)?;
        if vmas.is_none() && chosen.0 == Walk::Tables {
            self.tables_later.insert(pid);
        }
        Ok(chosen)
    }

    /// A held command reached its entry point, its libraries mapped as `vmas`: its tables go in
    /// (whether or not they did at its exec).
    pub fn entry_reached(&mut self, engine: &mut Engine, pid: u32, vmas: &[Vma]) {
        self.copies.maps_changed(pid, vmas);
        let wanted = self.tables_later.remove(&pid) || self.tables.has(pid);
        if wanted
            && self
                .tables
                .install_vmas(engine, pid, vmas.to_vec())
                .is_err()
        {
            self.tables.forget(engine, pid);
        }
    }

    /// The executable mappings the programs wrote into entry block `slot` at a process's
    /// entry point (for a process gone before we read its own).
    pub fn entry_block_vmas(&self, engine: &Engine, slot: u32) -> Vec<Vma> {
        self.tables.vmas_of(&engine.entry_block(slot))
    }

    /// Whether `pid` is walked from a block of tables of ours.
    pub fn has_tables(&self, pid: u32) -> bool {
        self.tables.has(pid)
    }

    /// `pid`'s executable mappings changed (an mmap with PROT_EXEC was seen, or a read found
    /// them changed): `vmas`, just read.
    pub fn maps_changed(&mut self, engine: &mut Engine, pid: u32, vmas: &[Vma]) {
        self.copies.maps_changed(pid, vmas);
        if self.tables.has(pid)
            && self
                .tables
                .install_vmas(engine, pid, vmas.to_vec())
                .is_err()
        {
            self.tables.forget(engine, pid);
        }
    }

    pub fn exited(&mut self, engine: &Engine, pid: u32) {
        self.tables_later.remove(&pid);
        self.copies.forget(pid);
        self.tables.forget(engine, pid);
    }

    /// Unwinds one stack copy (the `copy` way) into a sample of count 1.
    pub fn unwind_copy(&mut self, s: &RawStackSample) -> RawSample {
        self.copies.unwind(s)
    }

    /// Writes what the walks did since the last window into `u`.
    pub fn window_info(&mut self, engine: &Engine, u: &mut UnwindInfo) {
        let now = self.copies.stats;
        let before = std::mem::replace(&mut self.copies_at_window, now);
        u.unwound_samples = now.samples - before.samples;
        u.complete = now.complete - before.complete;
        u.copied_bytes = now.copied_bytes - before.copied_bytes;
        let counts = engine.unwind_counts().unwrap_or(self.walks_at_window);
        let before = std::mem::replace(&mut self.walks_at_window, counts);
        let d = |i: usize| counts[i].saturating_sub(before[i]);
        use phaseprof_bpf::types::unwind_counter as c;
        u.walks = WalkCounts {
            stacks: d(c::UNW_WALKS.0 as usize),
            complete: d(c::UNW_COMPLETE.0 as usize),
            frames: d(c::UNW_FRAMES.0 as usize),
            fp_frames: d(c::UNW_FP_FRAMES.0 as usize),
            truncated: d(c::UNW_TRUNCATED.0 as usize),
        };
        u.modules.extend(
            self.tables
                .modules
                .iter()
                .map(|(path, how)| (path.clone(), how.clone())),
        );
        let t = &self.tables.stats;
        u.tables = phaseprof_model::TableInfo {
            files: t.files,
            rows: t.rows,
            capacity_bytes: engine.unwind_rows_capacity() as u64 * 8,
            build_ms: t.build_ms,
            files_without_room: t.files_without_room,
        };
    }
}
