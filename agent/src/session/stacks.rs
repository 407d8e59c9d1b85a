//! How the session walks its targets' user stacks: the choice per target (at add, exec and
//! fork), the holds that put a new program's unwind tables in before it runs.
use anyhow::Result;

use super::Session;
use crate::targets;
use crate::unwind::{StackWalks, UnwindMode, UnwindPolicy, Walk};

/// When a target's way of walking stacks is chosen.
#[derive(Clone, Copy)]
pub(super) enum Choice {
    /// Added while running.
    Running,
    /// A `record -- CMD` child held before its exec: tables follow at the exec.
    BeforeExec,
    /// It just exec'd a new program.
    Exec,
    /// It just exec'd a program it will stop at the entry of, running meanwhile: its tables
    /// go in there (installing them now would make it wait longer there).
    ExecHeld,
}

impl Session<'_> {
    /// Walks the user stacks per `mode`: each target added from now on is inspected (`auto`)
    /// and switched to unwind tables or stack copies of `copy_bytes` where needed.
    pub fn unwind_stacks(&mut self, mode: UnwindMode, copy_bytes: u32, hold_execs: bool) {
        self.hold_execs = hold_execs;
        self.walks = Some(StackWalks::new(UnwindPolicy::new(mode)));
        self.meta_mut().unwind = Some(phaseprof_model::UnwindInfo {
            mode: format!("{mode:?}").to_lowercase(),
            stack_copy_bytes: copy_bytes as u64,
            ..Default::default()
        });
    }

    /// Decides how `pid` (running `exe`; not yet when `running` is false) is walked and tells
    /// the kernel; `exec`: it just exec'd.
    pub(super) fn choose_unwind(
        &mut self,
        pid: u32,
        exe: &std::path::Path,
        how: Choice,
    ) -> Result<Walk> {
        let Some(walks) = &mut self.walks else {
            return Ok(Walk::Fp);
        };
        let (walk, how) = match how {
            // The symbolizer has just read its mappings (`track`).
            Choice::Exec => {
                let vmas = Some(self.processes.vmas(pid));
                walks.exec(&mut self.engine, pid, exe, vmas)?
            }
            Choice::ExecHeld => walks.exec(&mut self.engine, pid, exe, None)?,
            Choice::Running => {
                walks.choose(&mut self.engine, pid, exe, Some(self.processes.vmas(pid)))?
            }
            Choice::BeforeExec => walks.choose(&mut self.engine, pid, exe, None)?,
        };
        if self.verbose {
            eprintln!("phaseprof: pid {pid} stacks: {how}");
        }
        if let Some(u) = &mut self.agg.builder_mut().meta_mut().unwind {
            u.targets.insert(pid, how);
        }
        Ok(walk)
    }

    /// Target `pid` exec'd (`stopped` there if the engine holds execs and its program had no
    /// entry hold yet): its way of walking stacks is decided for the new program; walked from
    /// tables, it stops at its entry point, once the dynamic loader has mapped its libraries,
    /// whose tables go in there. Stopped at the exec, the tables of the program and its loader
    /// go in at once (the loader's syscalls have whole stacks); a program held before runs on
    /// to its entry meanwhile, where everything goes in (its loader's first syscalls may be
    /// walked by frame pointers).
    pub(super) fn exec_seen(&mut self, pid: u32, stopped: bool) -> Result<()> {
        // Its old program's mappings go: they would name the new one's code.
        self.processes.forget(pid);
        self.sym.exec(pid);
        // Held at its entry point, it is read there: its loader is mapping libraries now.
        if !(self.hold_execs && !stopped && self.engine.held_at_entry(pid)) {
            self.read_maps(pid);
        }
        let exe = targets::exe_link(pid);
        let how = if self.hold_execs && !stopped {
            Choice::ExecHeld
        } else {
            Choice::Exec
        };
        let walk = self.choose_unwind(pid, &exe, how);
        // While it is stopped at the exec, if it is: its first call is seen.
        self.phases_at_exec(pid);
        if !self.hold_execs {
            return walk.map(|_| ());
        }
        // The programs may have asked for a hold at the exec already: undone for other walks,
        // and where none can be set (an unreadable binary: its libraries' tables follow later).
        let tables = matches!(walk, Ok(Walk::Tables));
        // Its loader's mappings since the symbolizer read them were not announced (see the
        // programs' sys_exit): read again.
        if (!tables || self.engine.hold_at_entry(pid, &exe).is_err())
            && self.engine.unwant_entry(pid)
        {
            self.maps_changed(pid);
        }
        if stopped {
            self.engine.resume(pid);
        }
        walk.map(|_| ())
    }

    /// A held command reached its entry point: its libraries are mapped, their tables go in
    /// before any of its code runs. `entry_block`: it was not stopped, the kernel filled that
    /// entry block for it from the tables in already; ours replaces it.
    pub(super) fn entry_reached(&mut self, pid: u32, entry_block: Option<u32>) {
        // Running on, it may be gone already (`cat` lives a millisecond): its code is named from
        // what the programs wrote at its entry point, unless read again now.
        if let (Some(slot), Some(w)) = (entry_block, &self.walks) {
            self.processes
                .know(pid, w.entry_block_vmas(&self.engine, slot));
        }
        self.read_maps(pid);
        if let Some(w) = &mut self.walks {
            w.entry_reached(&mut self.engine, pid, self.processes.vmas(pid));
        }
        let Some(slot) = entry_block else {
            self.engine.release_entry(pid);
            return;
        };
        let _ = self.engine.unwant_entry(pid);
        // Not walked from our tables after all (its mappings unreadable): not from the entry
        // block either, which is free from now on.
        if !self.walks.as_ref().is_some_and(|w| w.has_tables(pid)) {
            let _ = self.engine.publish_unwind_block(pid, None);
        }
        self.engine.free_entry_block(slot);
    }
}
