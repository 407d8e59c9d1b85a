//! The command line (clap types only); each subcommand converts into its options struct.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use phaseprof_model::units::{parse_bytes, parse_duration, parse_percent};
use phaseprof_model::{read_profile, EventKind, Profile};

use crate::engine::EngineConfig;
use crate::record::{record, RecordOptions, StopReason};
use crate::targets::TargetSpec;
use crate::unwind::parse_stack_copy;
use phaseprof_model::diff::DiffOptions;
use phaseprof_view::compare::{compare, CompareOptions, CompareOutput};
use phaseprof_view::export::{export, ExportFormat, ExportOptions};
use phaseprof_view::report::{write_report, ReportOptions};

#[derive(Parser, Debug)]
#[command(
    name = "phaseprof",
    version,
    about = "eBPF profiler that attributes every cost to the phase the thread was in"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record processes (by pid, by name, or a command started with every probe in place).
    Record(RecordArgs),
    /// Print a profile's tables, or its JSON summary.
    Report(ReportArgs),
    /// Write a profile's stacks as folded text, pprof or an SVG flamegraph.
    Export(ExportArgs),
    /// Memory growth of a live process: RSS and its classes sampled, slopes fitted.
    Soak(SoakArgs),
    /// Serve saved profiles over HTTP: flamegraphs, phase tables, diffs, a JSON API.
    Serve(ServeArgs),
    /// Record a live process in windows and serve them over HTTP while it runs.
    Attach(AttachArgs),
    /// Run continuously: find targets, record windows, push them to a phaseprof-collector.
    Agent(AgentArgs),
    /// Compare runs of two builds: per-phase deltas, and with several runs per side intervals
    /// and verdicts (improved / regressed / no change / inconclusive).
    Diff(DiffArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[arg(required = true, value_name = "FILE.phaseprof")]
    pub files: Vec<PathBuf>,
    /// Address to listen on. Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Require this token on every request (`Authorization: Bearer TOKEN`, or ?token= once).
    #[arg(long, env = "PHASEPROF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

#[derive(Args, Debug)]
pub struct AttachArgs {
    #[arg(long)]
    pub pid: u32,
    /// Phases to attribute costs to.
    #[arg(long, value_name = "PHASES.toml")]
    pub phases: Option<PathBuf>,
    /// Event kinds, comma separated (alloc and pagefault are opt-in).
    #[arg(long, default_value = "cpu,offcpu,syscall", value_delimiter = ',')]
    pub events: Vec<String>,
    #[arg(long, default_value_t = 99)]
    pub freq: u64,
    /// How user stacks of cpu samples and page faults are walked: `fp` (frame pointers, cheap),
    /// `dwarf` (a copy of each sample's stack unwound from the binaries' call-frame information,
    /// for code built without frame pointers), or `auto` (per target: fp when its executable
    /// keeps frame pointers, else dwarf).
    #[arg(long, default_value = "auto", value_name = "auto|fp|dwarf")]
    pub unwind: crate::unwind::UnwindMode,
    /// With dwarf unwinding: bytes of user stack copied per sample (at most 64KiB; deeper
    /// stacks are cut there).
    #[arg(long, default_value = "16KiB", value_parser = parse_stack_copy, value_name = "BYTES")]
    pub stack_copy: u32,
    /// Length of a window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub window: Duration,
    /// How much history to keep (older windows are dropped).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub keep: Duration,
    /// Capture a user stack for every syscall.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub syscall_stacks: bool,
    /// With alloc: the allocation probes' budget (e.g. 1%).
    #[arg(long, value_parser = parse_percent, value_name = "PERCENT")]
    pub alloc_budget: Option<f64>,
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: std::net::SocketAddr,
    /// Require this token on every request (needed to listen beyond loopback).
    #[arg(long, env = "PHASEPROF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// On exit, save the windows kept as one .phaseprof.
    #[arg(short, long, value_name = "OUT.phaseprof")]
    pub output: Option<PathBuf>,
    #[arg(short, long)]
    pub verbose: bool,
}

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// agent.toml: collector, token, window, spool, labels, [[target]] rules.
    #[arg(long, value_name = "agent.toml")]
    pub config: PathBuf,
}

/// Runs an async server on a runtime of its own until Ctrl-C.
fn serve_until_ctrl_c(
    addr: std::net::SocketAddr,
    state: phaseprof_view::web::AppState,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the HTTP runtime")?;
    rt.block_on(phaseprof_view::web::serve(addr, state, async {
        let _ = tokio::signal::ctrl_c().await;
    }))
}

#[derive(Args, Debug)]
pub struct DiffArgs {
    /// Baseline runs (A).
    #[arg(required = true, value_name = "A.phaseprof")]
    pub a: Vec<PathBuf>,
    /// Runs to compare with the baseline (B).
    #[arg(long, required = true, num_args = 1.., value_name = "B.phaseprof")]
    pub vs: Vec<PathBuf>,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
    /// Event kind of the differential graph and the stack table (default: all in the table,
    /// cpu in the graph).
    #[arg(long)]
    pub event: Option<String>,
    /// Write a differential flamegraph (.svg) or a page with verdicts and graph (.html).
    #[arg(short, long, value_name = "diff.svg|diff.html")]
    pub output: Option<PathBuf>,
    /// Draw volumes as recorded instead of scaling A to B's total.
    #[arg(long)]
    pub absolute: bool,
    /// Relative change under which a difference is noise.
    #[arg(long, default_value = "1%", value_parser = parse_percent)]
    pub threshold: f64,
}

#[derive(Args, Debug)]
pub struct SoakArgs {
    #[arg(long)]
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
    /// Allocation stack sampling period (see `record --alloc-sample-bytes`).
    #[arg(long, default_value = "512KiB", value_parser = parse_bytes, value_name = "BYTES")]
    pub alloc_sample_bytes: u64,
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
        let output = self.output.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("phaseprof-soak-{}.phaseprof", std::process::id()))
        });
        Ok(Some(RecordOptions {
            target: TargetSpec::Pids(vec![self.pid]),
            duration: Some(self.duration),
            engine: EngineConfig {
                events,
                alloc_sample_bytes: self.alloc_sample_bytes,
                ..EngineConfig::default()
            },
            unwind: crate::unwind::UnwindMode::Auto,
            output,
            phases: self.phases.clone(),
            window: Duration::from_secs(1),
            alloc_budget: None,
            alloc_at_entry: false,
            verbose: false,
        }))
    }
}

#[derive(Args, Debug)]
pub struct RecordArgs {
    /// Process to record, with all its threads (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Record processes whose comm or command line matches, including ones that start later.
    #[arg(long, value_name = "REGEX")]
    pub name: Option<String>,
    /// Stop after this long (e.g. 30s, 500ms, 2m). Default: until the command exits or Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Event kinds, comma separated: cpu, offcpu, syscall, alloc, pagefault.
    #[arg(long, default_value = "cpu,offcpu,syscall", value_delimiter = ',')]
    pub events: Vec<String>,
    /// Phases to attribute costs to (phases.toml: [[phase]] name + function glob, [[cost]] rules).
    #[arg(long, value_name = "PHASES.toml")]
    pub phases: Option<PathBuf>,
    /// cpu-clock sampling frequency in Hz.
    #[arg(long, default_value_t = 99)]
    pub freq: u64,
    /// Capture a user stack for every syscall (counts are exact either way).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub syscall_stacks: bool,
    /// How often kernel maps are drained into the profile.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub window: Duration,
    /// How user stacks of cpu samples and page faults are walked: `fp` (frame pointers, cheap),
    /// `dwarf` (a copy of each sample's stack unwound from the binaries' call-frame information,
    /// for code built without frame pointers), or `auto` (per target: fp when its executable
    /// keeps frame pointers, else dwarf).
    #[arg(long, default_value = "auto", value_name = "auto|fp|dwarf")]
    pub unwind: crate::unwind::UnwindMode,
    /// With dwarf unwinding: bytes of user stack copied per sample (at most 64KiB; deeper
    /// stacks are cut there).
    #[arg(long, default_value = "16KiB", value_parser = parse_stack_copy, value_name = "BYTES")]
    pub stack_copy: u32,
    /// Distinct stacks the kernel side can hold (preallocated, ~1 KiB each).
    #[arg(long, default_value_t = 16384)]
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
    /// With alloc: where allocator probes go: `auto` (an instruction the kernel emulates) or
    /// `entry` (the first instruction, as naive tools do; for benchmarks).
    #[arg(long, default_value = "auto", value_parser = ["auto", "entry"])]
    pub alloc_placement: String,
    /// Output file.
    #[arg(short, long, value_name = "OUT.phaseprof")]
    pub output: PathBuf,
    /// Print attach time and target changes.
    #[arg(short, long)]
    pub verbose: bool,
    /// Command to start and record until it exits.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ReportArgs {
    pub file: PathBuf,
    /// Print the JSON summary instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only this event kind (cpu, offcpu, syscall, alloc, pagefault).
    #[arg(long)]
    pub event: Option<String>,
    /// Only stacks recorded in this phase.
    #[arg(long)]
    pub phase: Option<String>,
    /// Rows per table.
    #[arg(long, default_value_t = 20)]
    pub top: usize,
    /// Show the live heap at the end of the recording: allocations never freed, by stack,
    /// with their age (needs --events alloc).
    #[arg(long)]
    pub live: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    Folded,
    Pprof,
    Svg,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    pub file: PathBuf,
    #[arg(long, value_enum)]
    pub format: FormatArg,
    /// Event kind to export.
    #[arg(long, default_value = "cpu")]
    pub event: String,
    /// Only stacks recorded in this phase.
    #[arg(long)]
    pub phase: Option<String>,
    /// Output file (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

fn parse_event(s: &str) -> Result<EventKind> {
    EventKind::parse(s.trim()).ok_or_else(|| {
        anyhow!("unknown event kind `{s}` (known: cpu, offcpu, syscall, alloc, pagefault)")
    })
}

fn load(path: &PathBuf) -> Result<Profile> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    read_profile(std::io::BufReader::new(f))
        .with_context(|| format!("cannot read {}", path.display()))
}

fn phase_of(profile: &Profile, name: Option<&String>) -> Result<Option<u32>> {
    let Some(name) = name else { return Ok(None) };
    match profile.phase_index(name) {
        Some(i) => Ok(Some(i)),
        None => bail!(
            "the profile has no phase `{name}`; its phases are: {}",
            profile.phases.join(", ")
        ),
    }
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
            TargetSpec::Pids(self.pids)
        } else if let Some(re) = self.name {
            TargetSpec::Name(
                regex::Regex::new(&re).with_context(|| format!("--name: invalid regex `{re}`"))?,
            )
        } else {
            TargetSpec::Command(self.command)
        };
        let mut events = Vec::new();
        for e in &self.events {
            let k = parse_event(e)?;
            if !events.contains(&k) {
                events.push(k);
            }
        }
        if self.freq == 0 || self.freq > 10_000 {
            bail!("--freq must be between 1 and 10000 Hz");
        }
        if self.alloc_budget.is_some() && !events.contains(&EventKind::Alloc) {
            bail!("--alloc-budget limits the allocation probes: add alloc to --events");
        }
        Ok(RecordOptions {
            target,
            duration: self.duration,
            engine: EngineConfig {
                events,
                freq_hz: self.freq,
                syscall_stacks: self.syscall_stacks,
                stack_entries: self.stack_entries,
                alloc_sample_bytes: self.alloc_sample_bytes,
                stack_copy_bytes: self.stack_copy,
                ..EngineConfig::default()
            },
            unwind: self.unwind,
            alloc_budget: self.alloc_budget,
            alloc_at_entry: self.alloc_placement == "entry",
            output: self.output,
            phases: self.phases,
            window: self.window,
            verbose: self.verbose,
        })
    }
}

/// Runs the CLI; returns the process exit code.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Record(args) => {
            let opts = args.into_options()?;
            let interrupted = Arc::new(AtomicBool::new(false));
            let flag = interrupted.clone();
            ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
                .context("installing the Ctrl-C handler")?;
            let rec = record(&opts, interrupted)?;
            let p = &rec.profile;
            let samples: u64 = p.cpu.iter().map(|s| s.count).sum();
            let syscalls: u64 = p.syscalls.iter().map(|s| s.count).sum();
            let offcpu: u64 = p.offcpu.iter().map(|s| s.ns).sum();
            let why = match rec.stop {
                StopReason::Duration => "duration reached".to_string(),
                StopReason::Interrupted => "interrupted".to_string(),
                StopReason::CommandExited(s) => format!("command exited with status {s}"),
                StopReason::TargetsExited => "every target exited".to_string(),
            };
            eprintln!(
                "phaseprof: {why}; wrote {}: {samples} cpu samples, {} off-cpu, {syscalls} syscalls, lost {} events / {} stacks",
                opts.output.display(),
                phaseprof_view::format::fmt_ns(offcpu),
                p.lost.events,
                p.lost.stacks
            );
            Ok(0)
        }
        Command::Soak(args) => {
            if args.interval.is_zero() {
                bail!("--interval must be greater than zero");
            }
            crate::soak::check_pid(args.pid)?;
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
        Command::Report(args) => {
            let profile = load(&args.file)?;
            let opts = ReportOptions {
                json: args.json,
                event: args.event.as_deref().map(parse_event).transpose()?,
                phase: phase_of(&profile, args.phase.as_ref())?,
                top: args.top,
                live: args.live,
            };
            write_report(&profile, &opts, std::io::stdout().lock())?;
            Ok(0)
        }
        Command::Agent(args) => {
            let cfg = crate::fleet::config::AgentConfig::load(&args.config)?;
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            // SIGTERM (systemd, Kubernetes) and Ctrl-C both flush the current window.
            ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
                .context("installing the SIGTERM/Ctrl-C handler")?;
            crate::fleet::daemon::run(&cfg, stop)?;
            Ok(0)
        }
        Command::Attach(args) => {
            let mut events = Vec::new();
            for e in &args.events {
                let k = parse_event(e)?;
                if !events.contains(&k) {
                    events.push(k);
                }
            }
            if args.window < Duration::from_millis(100) {
                bail!("--window must be at least 100ms");
            }
            let opts = crate::attach::AttachOptions {
                record: RecordOptions {
                    target: TargetSpec::Pids(vec![args.pid]),
                    duration: None,
                    engine: EngineConfig {
                        events,
                        freq_hz: args.freq,
                        syscall_stacks: args.syscall_stacks,
                        stack_copy_bytes: args.stack_copy,
                        ..EngineConfig::default()
                    },
                    unwind: args.unwind,
                    output: PathBuf::new(),
                    phases: args.phases,
                    window: args.window,
                    alloc_budget: args.alloc_budget,
                    alloc_at_entry: false,
                    verbose: args.verbose,
                },
                keep: args.keep,
                listen: args.listen,
                token: args.token,
            };
            let interrupted = Arc::new(AtomicBool::new(false));
            let flag = interrupted.clone();
            ctrlc::set_handler(move || flag.store(true, std::sync::atomic::Ordering::SeqCst))
                .context("installing the Ctrl-C handler")?;
            crate::attach::attach(&opts, args.output, interrupted)?;
            Ok(0)
        }
        Command::Serve(args) => {
            phaseprof_view::web::check_listen(args.listen, args.token.as_deref())?;
            let mut profiles = Vec::new();
            for path in &args.files {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| path.display().to_string());
                profiles.push((name, load(path)?));
            }
            let state = phaseprof_view::web::AppState {
                source: std::sync::Arc::new(phaseprof_view::web::SavedProfiles::new(profiles)),
                token: args.token.map(|t| t.into()),
                tls: false,
            };
            serve_until_ctrl_c(args.listen, state)?;
            Ok(0)
        }
        Command::Diff(args) => {
            let load_all = |paths: &[PathBuf]| paths.iter().map(load).collect::<Result<Vec<_>>>();
            let (a, b) = (load_all(&args.a)?, load_all(&args.vs)?);
            let output = match args
                .output
                .as_ref()
                .and_then(|p| p.extension())
                .and_then(|e| e.to_str())
            {
                _ if args.output.is_none() && args.json => CompareOutput::Json,
                None if args.output.is_none() => CompareOutput::Text,
                Some("svg") => CompareOutput::Svg,
                Some("html" | "htm") => CompareOutput::Html,
                _ => bail!(
                    "-o takes a .svg (differential flamegraph) or .html (verdicts and graph) file"
                ),
            };
            let opts = CompareOptions {
                output,
                event: args.event.as_deref().map(parse_event).transpose()?,
                normalize: !args.absolute,
                diff: DiffOptions {
                    threshold: args.threshold,
                    ..DiffOptions::default()
                },
            };
            match &args.output {
                None => compare(&a, &b, &opts, std::io::stdout().lock())?,
                Some(path) => {
                    let f = std::fs::File::create(path)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    compare(&a, &b, &opts, std::io::BufWriter::new(f))?;
                    eprintln!("phaseprof: wrote {}", path.display());
                }
            }
            Ok(0)
        }
        Command::Export(args) => {
            let profile = load(&args.file)?;
            let opts = ExportOptions {
                format: match args.format {
                    FormatArg::Folded => ExportFormat::Folded,
                    FormatArg::Pprof => ExportFormat::Pprof,
                    FormatArg::Svg => ExportFormat::Svg,
                },
                event: parse_event(&args.event)?,
                phase: phase_of(&profile, args.phase.as_ref())?,
            };
            if let Some(p) = opts.phase {
                eprintln!(
                    "phaseprof: exporting {} stacks recorded inside phase `{}` (phases nested in it included)",
                    opts.event,
                    profile.phase_name(p)
                );
            }
            if args.output.as_os_str() == "-" {
                export(&profile, &opts, std::io::stdout().lock())?;
            } else {
                let f = std::fs::File::create(&args.output)
                    .with_context(|| format!("cannot write {}", args.output.display()))?;
                export(&profile, &opts, std::io::BufWriter::new(f))?;
            }
            Ok(0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that record refuses zero or two targets with one clear message.
    #[test]
    fn exactly_one_target() {
        let cli = Cli::try_parse_from([
            "phaseprof",
            "record",
            "-o",
            "x",
            "--pid",
            "1",
            "--name",
            "a",
        ])
        .unwrap();
        let Command::Record(args) = cli.command else {
            panic!()
        };
        assert!(args
            .into_options()
            .unwrap_err()
            .to_string()
            .contains("exactly one target"));
        let cli =
            Cli::try_parse_from(["phaseprof", "record", "-o", "x", "--", "gzip", "-c"]).unwrap();
        let Command::Record(args) = cli.command else {
            panic!()
        };
        let opts = args.into_options().unwrap();
        assert!(matches!(opts.target, TargetSpec::Command(ref c) if c == &["gzip", "-c"]));
    }
}
