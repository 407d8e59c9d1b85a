//! `record`: a target (pids, a name, or a command) recorded into a .phaseprof file.
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use phaseprof_model::units::parse_duration;
use phaseprof_model::{SampleKind, CPU_COUNT, OFFCPU_NS, SYSCALL_COUNT};

use super::engine_args::{parse_events, EngineArgs};
use super::on_interrupt;
use crate::record::{record, RecordOptions, StopReason};
use crate::targets::TargetSpec;

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Process to record, with all its threads (repeatable, or comma separated). A thread's id
    /// records the process it belongs to.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub pids: Vec<u32>,
    /// Record processes whose name matches (the comm, or the executable's file name), as
    /// `pgrep` does, including ones that start later; each one picked is printed.
    #[arg(long, value_name = "REGEX")]
    pub name: Option<String>,
    /// With --name: match the whole command line instead (as `pgrep -f`).
    #[arg(long, requires = "name")]
    pub name_full: bool,
    /// Record only the processes named: not the children they fork while recorded, which
    /// `--pid` and `-- CMD` record too, as `strace -f` does (--name picks by name alone).
    #[arg(long)]
    pub no_follow: bool,
    /// Stop after this long (e.g. 30s, 500ms, 1m30s). Default: until the command exits or
    /// Ctrl-C. With `-- CMD`, the command is sent SIGTERM then (SIGKILL 5 s later if it still
    /// runs) and phaseprof exits with its status, as `timeout --preserve-status` does.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Event kinds, comma separated: cpu, offcpu, syscall, alloc, pagefault, signal.
    #[arg(long, default_value = "cpu,offcpu,syscall", value_delimiter = ',')]
    pub events: Vec<String>,
    /// Phases to attribute costs to (phases.toml: [[phase]] name + function glob, [[cost]] rules).
    #[arg(long, value_name = "PHASES.toml")]
    pub phases: Option<PathBuf>,
    /// How often kernel maps are drained into the profile.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub window: Duration,
    /// With --pid: how long the targets' CPU time per unit of work (the bytes their reads
    /// return, else their read and write syscalls: counted by the kernel, no probe) is watched
    /// before anything is attached, to measure phaseprof's whole cost in them against it at the
    /// end (`measured in the targets` in the report). 0 skips it.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub baseline: Duration,
    /// With alloc: where allocator probes go: `auto` (an instruction the kernel emulates) or
    /// `entry` (the first instruction, as naive tools do; for benchmarks).
    #[arg(long, default_value = "auto", value_parser = ["auto", "entry"])]
    pub alloc_placement: String,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Output file; an existing one is kept as FILE.old.
    #[arg(
        short,
        long,
        value_name = "OUT.phaseprof",
        default_value = "phaseprof.data"
    )]
    pub output: PathBuf,
    /// Print attach time and target changes.
    #[arg(short, long)]
    pub verbose: bool,
    /// Command to start and record until it exits. Ctrl-C reaches it as at any terminal; a
    /// SIGINT, SIGTERM or SIGHUP sent to phaseprof alone is forwarded to it; a second Ctrl-C
    /// kills it. phaseprof exits with the command's status.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl RecordArgs {
    pub fn into_options(self) -> Result<RecordOptions> {
        let given = [
            !self.pids.is_empty(),
            self.name.is_some(),
            !self.command.is_empty(),
        ];
        if given.iter().filter(|&&g| g).count() != 1 {
            bail!("name exactly one target: --pid PID (repeatable), --name REGEX, or -- CMD [ARGS...]");
        }
        let target = if !self.pids.is_empty() {
            TargetSpec::Pids(super::processes_of(&self.pids)?)
        } else if let Some(re) = self.name {
            TargetSpec::Name(crate::targets::NameMatch {
                re: regex::Regex::new(&re)
                    .with_context(|| format!("--name: invalid regex `{re}`"))?,
                full: self.name_full,
            })
        } else {
            TargetSpec::Command(self.command)
        };
        let events = parse_events(&self.events)?;
        self.engine.check_phase_budget(self.phases.is_some())?;
        // A live node is counted under a budget; a command of one's own, exactly (as strace).
        let default = match target {
            TargetSpec::Command(_) => None,
            _ => Some(crate::syscall_budget::DEFAULT_SYSCALL_BUDGET),
        };
        let syscall_budget = self.engine.syscall_budget(&events, default)?;
        let mut engine = self.engine.config(events)?;
        engine.follow_children = !self.no_follow && !matches!(target, TargetSpec::Name(_));
        Ok(RecordOptions {
            target,
            duration: self.duration,
            engine,
            unwind: self.engine.unwind,
            alloc_budget: self.engine.alloc_budget,
            phase_budget: self.engine.phase_budget,
            syscall_budget,
            alloc_at_entry: self.alloc_placement == "entry",
            baseline: self.baseline,
            output: self.output,
            phases: self.phases,
            window: self.window,
            verbose: self.verbose,
        })
    }
}

/// Records, then says why it stopped and what it wrote.
pub fn run_record(args: RecordArgs) -> Result<i32> {
    let opts = args.into_options()?;
    let interrupted = on_interrupt()?;
    let rec = record(&opts, interrupted)?;
    let p = &rec.profile;
    let samples = p.total(SampleKind::Cpu, CPU_COUNT);
    let syscalls = p.total(SampleKind::Syscall, SYSCALL_COUNT);
    let offcpu = p.total(SampleKind::Offcpu, OFFCPU_NS);
    let (why, status) = match rec.stop {
        StopReason::Duration => ("duration reached".to_string(), 0),
        StopReason::Interrupted => ("interrupted".to_string(), 0),
        StopReason::CommandExited { status, fate } => (fate, status),
        StopReason::TargetsExited => ("every target exited".to_string(), 0),
    };
    eprintln!(
        "phaseprof: {why}; wrote {}: {samples} cpu samples, {} off-cpu, {syscalls} syscalls, lost {} events / {} stacks",
        opts.output.display(),
        phaseprof_view::format::fmt_ns(offcpu),
        p.lost.events,
        p.lost.stacks
    );
    // What attaching cost them, as they measured it: the one figure an SRE needs at once.
    if let Some(line) = p.meta.targets_slowdown.and_then(|t| t.describe()) {
        eprintln!("phaseprof: measured in the targets: {line}");
    }
    // As perf and strace do: a script sees the command's own status.
    Ok(status)
}
