//! Stops at a command's entry point (`record -- CMD` walked from unwind tables): where the
//! dynamic loader has mapped its libraries and none of its code has run, so that their tables
//! go in first.
//!
//! Attaching a uprobe and retiring it cost ~10 ms and ~100 ms here (the retirement waits for RCU
//! grace periods): per exec, a shell loop that runs `cat` a hundred times took 17 s instead of
//! 0.2 s. So the hold's uprobe is attached once per program file and entry offset, for every
//! process, and stays; the program stops only the processes in `entry_wanted`. Once a file's
//! probe is attached (`entry_probed`), a command that execs it is not stopped at the exec either:
//! the programs put it in `entry_wanted` themselves, and user space decides how to walk it while
//! the loader maps its libraries. At most MAX_PROGRAMS stay attached; past that the oldest is
//! retired on a thread of its own, as are all of them at detach, in parallel.
use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::MetadataExt;

use anyhow::{Context, Result};
use libbpf_rs::{Link, MapCore, MapFlags};

use super::attach::retire;
use super::unwind_maps::program_file;
use super::Engine;

/// Programs whose entry-hold uprobe stays attached at once.
const MAX_PROGRAMS: usize = 64;

#[derive(Default)]
pub(super) struct EntryHolds {
    /// (device, inode, entry offset) -> the uprobe, oldest first.
    probes: HashMap<(u64, u64, u64), Link>,
    order: VecDeque<(u64, u64, u64)>,
    /// Hold offsets of the programs seen (`x86::program_hold_offset`), by (device, inode);
    /// None: not an ELF we can read.
    offsets: HashMap<(u64, u64), Option<u64>>,
}

impl Engine<'_> {
    /// Stops `pid` (a command that just exec'd `exe`) at `exe`'s entry point, with a
    /// `TargetEvent::Entry`. Later execs of the same file stop there only, not at the exec.
    pub fn hold_at_entry(&mut self, pid: u32, exe: &std::path::Path) -> Result<()> {
        let meta = std::fs::metadata(exe).with_context(|| format!("{}", exe.display()))?;
        let file = (meta.dev(), meta.ino());
        let offset = *self.entry_holds.offsets.entry(file).or_insert_with(|| {
            let entry = crate::targets::entry_offset(exe).ok()?;
            Some(crate::x86::program_hold_offset(exe, entry))
        });
        let Some(offset) = offset else {
            anyhow::bail!("{}: no entry point found", exe.display());
        };
        let key = (file.0, file.1, offset);
        if !self.entry_holds.probes.contains_key(&key) {
            let link = self
                .skel
                .progs
                .uprobe__entry_hold
                .attach_uprobe(false, -1, exe, offset as usize)
                .with_context(|| format!("attaching the entry hold of pid {pid}"))?;
            if self.entry_holds.order.len() >= MAX_PROGRAMS {
                if let Some(old) = self.entry_holds.order.pop_front() {
                    let file = program_file(old.0, old.1);
                    let _ = self.skel.maps.entry_probed.delete(&file);
                    if let Some(l) = self.entry_holds.probes.remove(&old) {
                        drop(retire(vec![l]));
                    }
                }
            }
            self.entry_holds.probes.insert(key, link);
            self.entry_holds.order.push_back(key);
            let file = program_file(key.0, key.1);
            // Without it, execs of this file stop at the exec too: slower, never wrong.
            let _ = self
                .skel
                .maps
                .entry_probed
                .update(&file, &1u32.to_ne_bytes(), MapFlags::ANY);
        }
        self.skel
            .maps
            .entry_wanted
            .update(&pid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("holding pid {pid} at its entry point"))
    }

    /// Whether `pid` will stop (or has) at its entry point.
    pub fn held_at_entry(&self, pid: u32) -> bool {
        let map = &self.skel.maps.entry_wanted;
        matches!(map.lookup(&pid.to_ne_bytes(), MapFlags::ANY), Ok(Some(_)))
    }

    /// `pid` is not to stop at its entry point (the programs may have asked for it at its exec).
    /// True if it was to: its new code mappings were not announced meanwhile.
    pub fn unwant_entry(&self, pid: u32) -> bool {
        self.skel
            .maps
            .entry_wanted
            .delete(&pid.to_ne_bytes())
            .is_ok()
    }

    /// Continues `pid`, stopped at its entry point; it no longer stops there.
    pub fn release_entry(&mut self, pid: u32) {
        let _ = self.unwant_entry(pid);
        self.resume(pid);
    }

    /// Releases every held command and retires the entry uprobes (in parallel; waits for them).
    pub(super) fn retire_entry_holds(&mut self) {
        let held: Vec<u32> = self
            .skel
            .maps
            .entry_wanted
            .keys()
            .filter_map(|k| Some(u32::from_ne_bytes(k.as_slice().try_into().ok()?)))
            .collect();
        for pid in held {
            if crate::targets::process_state(pid) == Some('T') {
                self.release_entry(pid);
            } else {
                let _ = self.unwant_entry(pid);
            }
        }
        self.entry_holds.order.clear();
        let links: Vec<Link> = self.entry_holds.probes.drain().map(|(_, l)| l).collect();
        let _ = retire(links).join();
    }
}
