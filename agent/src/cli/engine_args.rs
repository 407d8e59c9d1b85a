//! Recording options shared by `record`, `attach` and `soak` (flattened into each), with their
//! defaults taken from the engine's constants, so a flag means the same everywhere.
use anyhow::{bail, Result};
use clap::Args;
use phaseprof_model::units::{parse_bytes, parse_percent};
use phaseprof_model::EventKind;

use crate::engine::{
    EngineConfig, OffcpuStacks, SyscallStacks, DEFAULT_FREQ_HZ, DEFAULT_STACK_ENTRIES,
};
use crate::unwind::{parse_stack_copy, UnwindMode};

#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// cpu-clock sampling frequency in Hz.
    #[arg(short = 'F', long, default_value_t = DEFAULT_FREQ_HZ)]
    pub freq: u64,
    /// Which syscalls carry a user stack: `sampled` (one in 16 per thread, fewer past 100
    /// stacks a second; syscalls without one count under the stacks sampled for the same
    /// syscall, in proportion), `all`, `none`, or `1/N`. Counts and latency are exact either way.
    #[arg(long, default_value = "sampled", value_name = "sampled|all|none|1/N")]
    pub syscall_stacks: SyscallStacks,
    /// Which switch-outs carry their stacks: `sampled` (every one while a thread switches out
    /// fewer than 100 times a second, else one in N, N adapted to hold that rate; the time of
    /// the others counts under the stacks sampled for the same thread and phase, in
    /// proportion) or `all`. Off-CPU time, per thread and per phase, is exact either way.
    #[arg(long, default_value = "sampled", value_name = "sampled|all")]
    pub offcpu_stacks: OffcpuStacks,
    /// How user stacks are walked: `fp` (frame pointers, cheap), `dwarf` (walked in the kernel
    /// from tables compiled from the binaries' call-frame information, for code built without
    /// frame pointers, every event kind), `auto` (per module: frame pointers through the files
    /// that keep them, tables through those that do not, in one walk; a static program that keeps
    /// them, Go's, is walked by the kernel's frame-pointer walker; `report -v` says which each
    /// module got and why), or `copy` (cpu samples and page faults only: a copy of the stack
    /// unwound in user space).
    #[arg(long, default_value = "auto", value_name = "auto|fp|dwarf|copy")]
    pub unwind: UnwindMode,
    /// With `--unwind copy`: bytes of user stack copied per sample (at most 64KiB; deeper
    /// stacks are cut there).
    #[arg(long, default_value = "16KiB", value_parser = parse_stack_copy, value_name = "BYTES")]
    pub stack_copy: u32,
    /// Distinct stacks the kernel side can hold (preallocated, ~1 KiB each).
    #[arg(long, default_value_t = DEFAULT_STACK_ENTRIES)]
    pub stack_entries: u32,
    /// With alloc: capture an allocation's stack once per this many bytes (as jemalloc's
    /// heap profiler does; 1 = every allocation). Totals are exact either way.
    #[arg(long, default_value = "512KiB", value_parser = parse_bytes, value_name = "BYTES")]
    pub alloc_sample_bytes: u64,
    /// With alloc: keep the slowdown the allocation probes cause under this share of the
    /// target's CPU time (e.g. 1%) by attaching them for part of each second; totals are then
    /// extrapolated, and the report says so.
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub alloc_budget: Option<f64>,
    /// With phases: keep the slowdown the phase probes cause under this share of the target's
    /// CPU time (e.g. 1%) by attaching them for slices of the recording (probes that cost less
    /// stay attached: exact). Phase totals are then estimated from the slices (by the targets'
    /// read and write syscalls, which the kernel counts in and out of slices, or by their own
    /// CPU time, whichever errs less) and the report says with what coverage; a call is
    /// counted only if it began and ended inside one slice.
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub phase_budget: Option<f64>,
    /// With syscall events: keep the slowdown of counting syscalls under this share of the
    /// targets' CPU time (e.g. 1%) by counting them in slices of the recording (counting that
    /// costs less goes on: exact). Counting a syscall costs ~0.4 us, so a server making a few
    /// per request loses 10-30% to exact counts. Totals are then estimated from the slices (by
    /// the targets' read and write syscalls, which the kernel counts in and out of slices) and
    /// the report says so; latencies come from syscalls that began and ended in a slice.
    /// `exact` counts every syscall. Default: 1% on running processes (`record -p`, `record
    /// --name`, `attach`), exact for `record -- CMD`.
    #[arg(long, value_parser = parse_budget, value_name = "PERCENT|exact")]
    pub syscall_budget: Option<Budget>,
}

/// A budget given on the command line: a share of the targets' CPU time, or `exact`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Exact,
    Share(f64),
}

fn parse_budget(s: &str) -> Result<Budget, String> {
    match s {
        "exact" => Ok(Budget::Exact),
        _ => parse_percent(s)
            .map(Budget::Share)
            .map_err(|e| format!("{e} (or `exact`)")),
    }
}

impl EngineArgs {
    /// The engine's configuration for recording `events` with these options.
    pub fn config(&self, events: Vec<EventKind>) -> Result<EngineConfig> {
        if self.freq == 0 || self.freq > 10_000 {
            bail!("--freq must be between 1 and 10000 Hz");
        }
        if self.alloc_budget.is_some() && !events.contains(&EventKind::Alloc) {
            bail!("--alloc-budget limits the allocation probes: add alloc to --events");
        }
        Ok(EngineConfig {
            events,
            freq_hz: self.freq,
            syscall_stacks: self.syscall_stacks,
            offcpu_stacks: self.offcpu_stacks,
            stack_entries: self.stack_entries,
            alloc_sample_bytes: self.alloc_sample_bytes,
            stack_copy_bytes: self.stack_copy,
            ..EngineConfig::default()
        })
    }

    /// The syscall budget for recording `events`: `--syscall-budget`, else `default` (None:
    /// exact).
    pub fn syscall_budget(
        &self,
        events: &[EventKind],
        default: Option<f64>,
    ) -> Result<Option<f64>> {
        let syscalls = events.contains(&EventKind::Syscall);
        match self.syscall_budget {
            Some(Budget::Share(_)) if !syscalls => {
                bail!("--syscall-budget limits syscall counting: add syscall to --events")
            }
            Some(Budget::Share(b)) => Ok(Some(b)),
            Some(Budget::Exact) => Ok(None),
            None => Ok(default.filter(|_| syscalls)),
        }
    }

    /// Checks `--phase-budget` against whether phases are probed (`phases`).
    pub fn check_phase_budget(&self, phases: bool) -> Result<()> {
        if self.phase_budget.is_none() {
            return Ok(());
        }
        if !phases {
            bail!("--phase-budget limits the phase probes: give --phases");
        }
        Ok(())
    }
}

/// Event kinds from `--events` values, each once, in the order given.
pub fn parse_events(values: &[String]) -> Result<Vec<EventKind>> {
    let mut events = Vec::new();
    for e in values {
        let k = super::parse_event(e)?;
        if !events.contains(&k) {
            events.push(k);
        }
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DEFAULT_ALLOC_SAMPLE_BYTES;
    use clap::Parser;

    #[derive(Parser)]
    struct Only {
        #[command(flatten)]
        engine: EngineArgs,
    }

    // Checks that the flags' defaults, `EngineConfig::default()` and agent.toml's defaults agree
    // (as inferno's default_options test does), so no front end records differently unasked.
    #[test]
    fn defaults_agree() {
        let args = Only::try_parse_from(["x"]).unwrap().engine;
        let from_flags = args.config(EngineConfig::default().events).unwrap();
        let d = EngineConfig::default();
        assert_eq!(
            (
                from_flags.freq_hz,
                from_flags.syscall_stacks,
                from_flags.offcpu_stacks,
                from_flags.stack_entries
            ),
            (
                d.freq_hz,
                d.syscall_stacks,
                d.offcpu_stacks,
                d.stack_entries
            )
        );
        assert_eq!(
            (from_flags.alloc_sample_bytes, from_flags.stack_copy_bytes),
            (d.alloc_sample_bytes, d.stack_copy_bytes)
        );
        assert_eq!(args.unwind, UnwindMode::default());
        assert_eq!(d.alloc_sample_bytes, DEFAULT_ALLOC_SAMPLE_BYTES);
        let toml = "collector = \"http://127.0.0.1:1\"\ntoken = \"t\"\nspool_dir = \"/tmp/x\"\n[[target]]\nname = \"x\"\n";
        let agent = crate::fleet::config::AgentConfig::parse("agent.toml", toml).unwrap();
        assert_eq!(agent.unwind, args.unwind);
        assert_eq!(agent.stack_copy_bytes, d.stack_copy_bytes);
        assert_eq!(agent.offcpu_stacks, d.offcpu_stacks);
    }

    // Checks the syscall budget's resolution: the command's default (exact for `record --
    // CMD`, 1% on running processes) unless given; `exact` wins over a default; a budget without syscall events
    // is refused, and no default applies to them.
    #[test]
    fn syscall_budget_by_command() {
        let args = |extra: &[&str]| {
            let argv = ["x"].iter().chain(extra).copied();
            Only::try_parse_from(argv).unwrap().engine
        };
        let syscalls = [EventKind::Syscall];
        assert_eq!(args(&[]).syscall_budget(&syscalls, None).unwrap(), None);
        assert_eq!(
            args(&[]).syscall_budget(&syscalls, Some(0.01)).unwrap(),
            Some(0.01)
        );
        let exact = args(&["--syscall-budget", "exact"]);
        assert_eq!(exact.syscall_budget(&syscalls, Some(0.01)).unwrap(), None);
        let two = args(&["--syscall-budget", "2%"]);
        assert_eq!(two.syscall_budget(&syscalls, None).unwrap(), Some(0.02));
        assert!(two.syscall_budget(&[EventKind::Cpu], None).is_err());
        assert_eq!(
            args(&[])
                .syscall_budget(&[EventKind::Cpu], Some(0.01))
                .unwrap(),
            None
        );
    }
}
