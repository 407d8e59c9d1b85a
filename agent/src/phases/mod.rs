//! Phases: functions of the target, named in `phases.toml`, that delimit the work every event
//! is attributed to. `config` reads the file, `symbols` finds the functions in the target's
//! ELF objects.

pub mod budget;
pub mod config;
pub mod inlined;
pub mod plan;
pub mod probe_overhead;
pub mod symbols;

pub use config::{CostEvent, CostRule, PhaseConfig, PhaseSpec};
pub use plan::{PhasePlan, PhaseProbe};
