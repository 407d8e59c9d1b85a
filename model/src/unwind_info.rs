//! How user stacks were walked (`meta.unwind`): per target the way and why, what the stack
//! copies and the kernel's table walker did, and the tables in the kernel.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// How user stacks were walked.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct UnwindInfo {
    /// As asked: `auto`, `fp`, `dwarf` or `copy`.
    pub mode: String,
    /// Per target pid: `fp`, `dwarf` or `copy`, and why (`dwarf (auto: only 3 of 2140 functions
    /// keep frame pointers)`).
    pub targets: BTreeMap<u32, String>,
    /// Per module (as mapped) under `auto`: `fp` or `dwarf` and why (`dwarf (12 of 2900
    /// functions keep frame pointers)`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, String>,
    /// User stack copied per sample for `dwarf` targets.
    pub stack_copy_bytes: u64,
    /// Samples (cpu samples and page faults) unwound from a stack copy, and how many of them
    /// reached the end of the stack (the thread's entry) rather than stopping early.
    pub unwound_samples: u64,
    pub complete: u64,
    /// Bytes of user stack the kernel copied for them (the ring buffer's bandwidth).
    pub copied_bytes: u64,
    /// Stacks of every event kind walked in the kernel from unwind tables (`dwarf` targets).
    #[serde(default)]
    pub walks: WalkCounts,
    /// The unwind tables in the kernel at the end (files, rows, build time).
    #[serde(default)]
    pub tables: TableInfo,
}

/// What the kernel's table walker counted (each stack walked once, then stored).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct WalkCounts {
    pub stacks: u64,
    /// Walks that reached the thread's entry (a frame whose return address is undefined).
    pub complete: u64,
    pub frames: u64,
    /// Frames walked by frame pointer (no table row for their address: JIT, vDSO, Go).
    pub fp_frames: u64,
    /// Walks cut at the deepest stack the kernel stores.
    pub truncated: u64,
}

impl WalkCounts {
    pub fn absorb(&mut self, o: &WalkCounts) {
        self.stacks += o.stacks;
        self.complete += o.complete;
        self.frames += o.frames;
        self.fp_frames += o.fp_frames;
        self.truncated += o.truncated;
    }
}

/// The unwind tables in the kernel.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct TableInfo {
    pub files: u64,
    pub rows: u64,
    /// Kernel memory the rows array takes (allocated at load).
    pub capacity_bytes: u64,
    pub build_ms: u64,
    /// Files whose rows did not fit (their frames walked by frame pointers).
    pub files_without_room: u64,
}

impl UnwindInfo {
    /// One line for reports and pages: how each target was walked and how the stack copies
    /// fared (`pid 42: dwarf (auto: ...); 3262 samples unwound from stack copies, 99.9% to the
    /// end of the stack, 9.2 KiB copied per sample`).
    pub fn describe(&self) -> String {
        let mut line = self
            .targets
            .iter()
            .map(|(pid, how)| format!("pid {pid}: {how}"))
            .collect::<Vec<_>>()
            .join("; ");
        if line.is_empty() {
            line = format!("--unwind {}", self.mode);
        }
        if self.unwound_samples > 0 {
            line += &format!(
                "; {} samples unwound from stack copies, {:.1}% to the end of the stack, {:.1} KiB \
                 copied per sample",
                self.unwound_samples,
                100.0 * self.complete as f64 / self.unwound_samples as f64,
                self.copied_bytes as f64 / self.unwound_samples as f64 / 1024.0
            );
        }
        let w = &self.walks;
        if w.stacks > 0 {
            line += &format!(
                "; {} stacks walked from unwind tables, {:.1}% to the thread's entry, {:.1}% of \
                 frames by frame pointer ({} files, {} rows, built in {} ms)",
                w.stacks,
                100.0 * w.complete as f64 / w.stacks as f64,
                100.0 * w.fp_frames as f64 / w.frames.max(1) as f64,
                self.tables.files,
                self.tables.rows,
                self.tables.build_ms
            );
            if self.tables.files_without_room > 0 {
                line += &format!(
                    "; {} files did not fit the tables",
                    self.tables.files_without_room
                );
            }
        }
        line
    }

    /// One line per module walked under `auto` (`/usr/lib/…/libc.so.6: dwarf (12 of 2900
    /// functions keep frame pointers)`), for `report -v`.
    pub fn describe_modules(&self) -> Vec<String> {
        self.modules
            .iter()
            .map(|(path, how)| format!("{path}: {how}"))
            .collect()
    }

    /// Adds another recording's (or window's) counts.
    pub fn absorb(&mut self, other: &UnwindInfo) {
        self.targets
            .extend(other.targets.iter().map(|(p, d)| (*p, d.clone())));
        self.modules
            .extend(other.modules.iter().map(|(p, d)| (p.clone(), d.clone())));
        self.unwound_samples += other.unwound_samples;
        self.complete += other.complete;
        self.copied_bytes += other.copied_bytes;
        self.walks.absorb(&other.walks);
        // The tables are a state, not a count: the later one's.
        if other.tables != TableInfo::default() {
            self.tables = other.tables;
        }
    }
}
