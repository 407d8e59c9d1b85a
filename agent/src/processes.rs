//! The owner of each target's executable mappings: the one place that reads them (through
//! `procmaps`), once per change (the target added, an exec, its entry point, new code mapped,
//! an address outside them, the periodic look for libraries mapped without an event), and keeps
//! them after the process is gone so that its addresses can still be named. The session tells
//! the symbolizer, the unwind tables, the copy unwinder, allocator sites and phase resolution
//! what it read; none of them reads mappings itself.
use std::collections::{BTreeSet, HashMap};

use anyhow::{Context, Result};

use crate::procmaps::{read_vmas, Vma};

#[derive(Default)]
pub struct Processes {
    by_pid: HashMap<u32, Vec<Vma>>,
    /// Processes whose mappings a read found changed, since `take_changed`.
    changed: BTreeSet<u32>,
}

/// The mappings of a process not owned yet (phases resolved before a recording starts).
pub fn read_once(pid: u32) -> Result<Vec<Vma>> {
    read_vmas(pid).with_context(|| format!("reading the mappings of pid {pid}"))
}

impl Processes {
    /// Reads `pid`'s mappings again; true when they differ from those known. A process gone
    /// (its maps unreadable, or empty as a zombie's) keeps the last good copy.
    pub fn read(&mut self, pid: u32) -> bool {
        match read_vmas(pid) {
            Ok(vmas) if !vmas.is_empty() => self.know(pid, vmas),
            _ => false,
        }
    }

    /// `pid`'s mappings as known otherwise (the kernel wrote them at its entry point), until
    /// read again; true when they differ.
    pub fn know(&mut self, pid: u32, vmas: Vec<Vma>) -> bool {
        if vmas.is_empty() || self.by_pid.get(&pid) == Some(&vmas) {
            return false;
        }
        self.by_pid.insert(pid, vmas);
        self.changed.insert(pid);
        true
    }

    /// `pid`, forked by `parent`, has its parent's mappings (as last read) until read itself.
    pub fn inherit(&mut self, pid: u32, parent: u32) {
        if let Some(vmas) = self.by_pid.get(&parent).cloned() {
            self.by_pid.insert(pid, vmas);
        }
    }

    /// `pid` exec'd: its mappings are unknown until read again.
    pub fn forget(&mut self, pid: u32) {
        self.by_pid.remove(&pid);
        self.changed.remove(&pid);
    }

    /// Forgets the processes `keep` rejects (gone, their windows named).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.by_pid.retain(|&pid, _| keep(pid));
    }

    /// The executable mappings last known of `pid`.
    pub fn vmas(&self, pid: u32) -> &[Vma] {
        self.by_pid.get(&pid).map_or(&[], Vec::as_slice)
    }

    /// The mapping of `pid` that holds `addr`.
    pub fn find(&self, pid: u32, addr: u64) -> Option<&Vma> {
        self.by_pid
            .get(&pid)?
            .iter()
            .find(|v| v.start <= addr && addr < v.end)
    }

    /// The processes whose mappings changed since the last call, to be told to their users.
    pub fn take_changed(&mut self) -> BTreeSet<u32> {
        std::mem::take(&mut self.changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a read reports a change once: the first read of this process changes what is
    // known, the next (nothing mapped since) does not, and the change is taken once.
    #[test]
    fn a_change_is_reported_once() {
        let pid = std::process::id();
        let mut p = Processes::default();
        assert!(p.read(pid));
        assert!(!p.vmas(pid).is_empty());
        assert!(!p.read(pid));
        assert_eq!(p.take_changed(), BTreeSet::from([pid]));
        assert!(p.take_changed().is_empty());
    }
}
