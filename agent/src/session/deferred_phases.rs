//! Phases that could not resolve when recording began, and where they resolve later: in the
//! first process `--name` finds, or for `-- CMD` run through a wrapper (`env`, `timeout`,
//! `nice`, `sh -c`) in the first program the command's tree execs that defines them.
use anyhow::Result;

use super::Session;
use crate::phases::{PhaseConfig, PhasePlan};

/// Phases waiting for their program.
pub enum DeferredPhases {
    /// `--name`: resolved in the first process found (an error there is the recording's).
    FirstTarget(PhaseConfig, String),
    /// `-- CMD` whose own program does not define them: tried at every exec of the command's
    /// tree until one program does. `error`: why the command's own program did not.
    AtExec {
        cfg: PhaseConfig,
        file: String,
        command: String,
        error: String,
    },
}

impl DeferredPhases {
    /// The command at `path` did not define the phases (`e`): try its tree's execs.
    pub fn at_exec(
        cfg: PhaseConfig,
        file: String,
        path: &std::path::Path,
        e: anyhow::Error,
    ) -> Self {
        DeferredPhases::AtExec {
            cfg,
            file,
            command: path.display().to_string(),
            error: format!("{e:#}"),
        }
    }
}

impl Session<'_> {
    /// Resolves `cfg`'s phases in `pid`'s mapped objects and attaches their probes.
    pub(super) fn attach_phases_in(
        &mut self,
        pid: u32,
        cfg: &PhaseConfig,
        file: &str,
    ) -> Result<()> {
        let mut plan = PhasePlan::default();
        plan.resolve(cfg, file, &self.code_objects(pid)?)?;
        plan.attach(&mut self.engine, |p| p)?;
        self.phase_cost.note(&self.engine, &plan, |p| p);
        Ok(())
    }

    /// Target `pid` exec'd a new program: phases waiting for the program that defines them
    /// resolve in it if it does (and say where), else keep waiting.
    pub(super) fn phases_at_exec(&mut self, pid: u32) {
        let Some(DeferredPhases::AtExec { cfg, file, .. }) = &self.deferred_phases else {
            return;
        };
        let (cfg, file) = (cfg.clone(), file.clone());
        match self.attach_phases_in(pid, &cfg, &file) {
            Ok(()) => {
                let exe = std::fs::read_link(crate::targets::exe_link(pid)).unwrap_or_default();
                eprintln!(
                    "phaseprof: phases of {file} resolved in {} (pid {pid}, after its exec)",
                    exe.display()
                );
                self.deferred_phases = None;
            }
            Err(e) if self.verbose => {
                eprintln!("phaseprof: pid {pid}'s new program has not the phases: {e:#}");
            }
            Err(_) => {}
        }
    }

    /// Phases still waiting at the end: no program of the command defined them.
    pub fn unresolved_phases(&self) -> Option<String> {
        match &self.deferred_phases {
            Some(DeferredPhases::AtExec { command, error, .. }) => Some(format!(
                "no program the command ran defines the phases; in {command}: {error}"
            )),
            _ => None,
        }
    }
}
