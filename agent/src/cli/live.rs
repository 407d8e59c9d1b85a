//! The commands on live processes that run until stopped: `attach` (windows served over HTTP),
//! `agent` (windows pushed to a collector), `soak` (memory growth, with a recording alongside).
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use clap::Args;
use phaseprof_model::units::parse_duration;
use phaseprof_model::EventKind;

use super::engine_args::{parse_events, EngineArgs};
use super::{on_interrupt, parse_event};
use crate::record::{record, RecordOptions};
use crate::syscall_budget::DEFAULT_SYSCALL_BUDGET;
use crate::targets::TargetSpec;

#[derive(Args, Debug)]
pub struct AttachArgs {
    /// Process to record, with all its threads (a thread's id records its process).
    #[arg(short = 'p', long)]
    pub pid: u32,
    /// Phases to attribute costs to.
    #[arg(long, value_name = "PHASES.toml")]
    pub phases: Option<PathBuf>,
    /// Event kinds, comma separated (alloc, pagefault and signal are opt-in).
    #[arg(long, default_value = "cpu,offcpu,syscall", value_delimiter = ',')]
    pub events: Vec<String>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Length of a window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub window: Duration,
    /// How much history to keep (older windows are dropped).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub keep: Duration,
    /// Address to serve the windows on (host:port; a name such as localhost:7070 is resolved).
    /// Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = super::parse_listen)]
    pub listen: std::net::SocketAddr,
    /// Require this token on every request (needed to listen beyond loopback).
    #[arg(long, env = "PHASEPROF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// On exit, save the windows kept as one .phaseprof.
    #[arg(short, long, value_name = "OUT.phaseprof")]
    pub output: Option<PathBuf>,
    /// Print attach time, target changes and how each target's stacks are walked.
    #[arg(short, long)]
    pub verbose: bool,
    /// Record only the process named, not the children it forks while attached (recorded by
    /// default, as `strace -f` does).
    #[arg(long)]
    pub no_follow: bool,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// agent.toml: collector, token, window, spool, labels, [[target]] rules.
    #[arg(long, value_name = "agent.toml")]
    pub config: PathBuf,
}

#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Process whose memory is sampled (a thread's id stands for its process).
    #[arg(short = 'p', long)]
    pub pid: u32,
    /// How long to sample.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Time between samples.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub interval: Duration,
    /// Also record, for the soak's duration: `alloc` (live-heap growth by stack) and/or
    /// `pagefault` (page faults by stack and phase); `none` for the memory classes alone.
    #[arg(long, default_value = "alloc", value_delimiter = ',')]
    pub events: Vec<String>,
    /// Phases to attribute allocations and page faults to.
    #[arg(long, value_name = "PHASES.toml")]
    pub phases: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Keep the recording made during the soak (a .phaseprof).
    #[arg(short, long, value_name = "OUT.phaseprof")]
    pub output: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

impl SoakArgs {
    /// The recording to run alongside the soak, if any events were asked for.
    fn recording(&self) -> Result<Option<RecordOptions>> {
        let mut events = Vec::new();
        for e in self.events.iter().filter(|e| e.as_str() != "none") {
            let k = parse_event(e)?;
            if !matches!(k, EventKind::Alloc | EventKind::Pagefault) {
                bail!("soak --events takes alloc and pagefault (record the other kinds with `record`)");
            }
            events.push(k);
        }
        if events.is_empty() {
            return Ok(None);
        }
        self.engine.check_phase_budget(self.phases.is_some())?;
        let output = self.output.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("phaseprof-soak-{}.phaseprof", std::process::id()))
        });
        Ok(Some(RecordOptions {
            target: TargetSpec::Pids(vec![self.pid]),
            duration: Some(self.duration),
            engine: self.engine.config(events)?,
            unwind: self.engine.unwind,
            output,
            phases: self.phases.clone(),
            window: Duration::from_secs(1),
            alloc_budget: self.engine.alloc_budget,
            phase_budget: self.engine.phase_budget,
            syscall_budget: None,
            alloc_at_entry: false,
            baseline: Duration::ZERO,
            verbose: false,
        }))
    }
}

/// Records in windows and serves them until Ctrl-C.
pub fn run_attach(mut args: AttachArgs) -> Result<i32> {
    args.pid = super::processes_of(&[args.pid])?[0];
    let events = parse_events(&args.events)?;
    if args.window < Duration::from_millis(100) {
        bail!("--window must be at least 100ms");
    }
    args.engine.check_phase_budget(args.phases.is_some())?;
    let syscall_budget = (args.engine).syscall_budget(&events, Some(DEFAULT_SYSCALL_BUDGET))?;
    let mut engine = args.engine.config(events)?;
    engine.follow_children = !args.no_follow;
    let opts = crate::live_server::AttachOptions {
        record: RecordOptions {
            target: TargetSpec::Pids(vec![args.pid]),
            duration: None,
            engine,
            unwind: args.engine.unwind,
            output: PathBuf::new(),
            phases: args.phases,
            window: args.window,
            alloc_budget: args.engine.alloc_budget,
            phase_budget: args.engine.phase_budget,
            syscall_budget,
            alloc_at_entry: false,
            baseline: Duration::ZERO,
            verbose: args.verbose,
        },
        keep: args.keep,
        listen: args.listen,
        token: args.token,
    };
    let interrupted = on_interrupt()?;
    crate::live_server::attach(&opts, args.output, interrupted)?;
    Ok(0)
}

/// Runs the fleet agent until SIGTERM or Ctrl-C.
pub fn run_agent(args: AgentArgs) -> Result<i32> {
    let cfg = crate::fleet::config::AgentConfig::load(&args.config)?;
    // SIGTERM (systemd, Kubernetes) and Ctrl-C both flush the current window.
    let stop = on_interrupt()?;
    crate::fleet::daemon::run(&cfg, stop)?;
    Ok(0)
}

/// Samples memory classes (and records alongside), then prints the slopes.
pub fn run_soak(mut args: SoakArgs) -> Result<i32> {
    if args.interval.is_zero() {
        bail!("--interval must be greater than zero");
    }
    crate::soak::check_pid(args.pid)?;
    args.pid = super::processes_of(&[args.pid])?[0];
    let recording = args.recording()?.map(|opts| {
        let keep = args.output.is_some();
        std::thread::spawn(move || {
            let rec = record(&opts, Arc::new(AtomicBool::new(false)));
            if !keep {
                let _ = std::fs::remove_file(&opts.output);
            }
            rec
        })
    });
    let mut report = crate::soak::soak(&crate::soak::SoakOptions {
        pid: args.pid,
        duration: args.duration,
        interval: args.interval,
    })?;
    if let Some(handle) = recording {
        let rec = handle
            .join()
            .map_err(|_| anyhow!("the recording thread panicked"))??;
        (report.live_heap, report.page_faults) = crate::soak::stack_growth(&rec.profile);
    }
    if args.json {
        serde_json::to_writer_pretty(std::io::stdout().lock(), &report)?;
        println!();
    } else {
        crate::soak::write_human(&report, std::io::stdout().lock())?;
    }
    Ok(0)
}
