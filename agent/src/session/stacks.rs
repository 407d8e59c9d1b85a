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
            Choice::Exec => walks.exec(&mut self.engine, pid, exe)?,
            Choice::Running => walks.choose(&mut self.engine, pid, exe, true)?,
            Choice::BeforeExec => walks.choose(&mut self.engine, pid, exe, false)?,
        };
        if self.verbose {
            eprintln!("phaseprof: pid {pid} stacks: {how}");
        }
        if let Some(u) = &mut self.agg.builder_mut().meta_mut().unwind {
            u.targets.insert(pid, how);
        }
        Ok(walk)
    }

    /// Target `pid` exec'd (and is stopped there if the engine holds execs): its way of walking
    /// stacks is decided for the new program; walked from tables, it stops again at its entry
    /// point, once the dynamic loader has mapped its libraries.
    pub(super) fn exec_seen(&mut self, pid: u32) -> Result<()> {
        let exe = targets::exe_link(pid);
        let walk = self.choose_unwind(pid, &exe, Choice::Exec);
        if self.hold_execs && matches!(walk, Ok(Walk::Tables)) {
            // Without this hold (an unreadable binary) its libraries' tables follow later.
            if let Ok(offset) = targets::entry_offset(&exe) {
                let _ = self.engine.hold_at_entry(pid, &exe, offset);
            }
        }
        if self.hold_execs {
            self.engine.resume(pid);
        }
        walk.map(|_| ())
    }

    /// A held command reached its entry point: its libraries are mapped, their tables go in
    /// before any of its code runs.
    pub(super) fn entry_reached(&mut self, pid: u32) {
        if let Some(w) = &mut self.walks {
            w.maps_changed(&mut self.engine, pid);
        }
        self.engine.release_entry(pid);
    }
}
