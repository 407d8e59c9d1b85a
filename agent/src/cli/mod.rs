//! The command line: clap types, each subcommand converting into its options struct and run by
//! its room (`record`, `live`: attach, agent, soak; `files`: report, export, diff, serve).
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use phaseprof_model::{read_profile, EventKind, Profile};

mod docs;
mod engine_args;
mod files;
mod live;
mod record_args;
mod unwind_table;

pub use engine_args::EngineArgs;
pub use files::{DiffArgs, ExportArgs, FormatArg, ReportArgs, ServeArgs};
pub use live::{AgentArgs, AttachArgs, SoakArgs};
pub use record_args::RecordArgs;

#[derive(Parser, Debug)]
#[command(
    name = "phaseprof",
    version = phaseprof_model::VERSION,
    about = "eBPF profiler that attributes every cost to the phase the thread was in"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The command line; `--version` (not `-V`) also says what this kernel's BPF can do,
    /// probed then (a few loads of tiny programs).
    pub fn from_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let mut cmd = Cli::command();
        if std::env::args_os().any(|a| a == "--version") {
            let features = crate::engine::features::KernelFeatures::version_text();
            // Once per run: clap takes a static string here.
            let text = format!("{}\n{features}", phaseprof_model::VERSION);
            cmd = cmd.long_version(&*Box::leak(text.into_boxed_str()));
        }
        Cli::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Record processes (by pid, by name, or a command started with every probe in place).
    Record(RecordArgs),
    /// Print a profile's tables, or its JSON summary.
    Report(ReportArgs),
    /// Write a profile's stacks as folded text, pprof, an SVG flamegraph, speedscope JSON or OTLP.
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
    /// The unwind table `--unwind dwarf` builds for a binary: rows, kernel memory, build time.
    UnwindTable(unwind_table::UnwindTableArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// Print the man page, or write every page into a directory.
    Man(docs::ManArgs),
}

/// Runs the CLI; returns the process exit code.
pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Record(args) => record_args::run_record(args),
        Command::Soak(args) => live::run_soak(args),
        Command::Attach(args) => live::run_attach(args),
        Command::Agent(args) => live::run_agent(args),
        Command::Report(args) => files::run_report(args),
        Command::Export(args) => files::run_export(args),
        Command::Diff(args) => files::run_diff(args),
        Command::Serve(args) => files::run_serve(args),
        Command::UnwindTable(args) => unwind_table::run_unwind_table(args),
        Command::Completions(args) => docs::run_completions(args),
        Command::Man(args) => docs::run_man(args),
    }
}

pub(crate) use crate::signals::on_interrupt;

/// `--pid` values as processes: a thread's id stands for its process (said once), each once.
pub(crate) fn processes_of(pids: &[u32]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for &pid in pids {
        let process = crate::targets::process_of(pid)?;
        if process != pid {
            let comm = crate::targets::read_comm(process, process).unwrap_or_default();
            eprintln!("phaseprof: {pid} is a thread of process {process} ({comm}): recording the whole process");
        }
        if !out.contains(&process) {
            out.push(process);
        }
    }
    Ok(out)
}

/// A listening address: `127.0.0.1:7070`, `[::1]:7070`, or a host name and port
/// (`localhost:7070`, resolved now; the first address wins, as most servers bind).
pub(crate) fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let mut addrs = s
        .to_socket_addrs()
        .map_err(|e| format!("`{s}` is not host:port ({e})"))?;
    addrs
        .next()
        .ok_or_else(|| format!("`{s}` resolves to no address"))
}

pub(crate) fn parse_event(s: &str) -> Result<EventKind> {
    EventKind::parse(s.trim()).ok_or_else(|| {
        anyhow!("unknown event kind `{s}` (known: cpu, offcpu, syscall, alloc, pagefault)")
    })
}

pub(crate) fn load(path: &PathBuf) -> Result<Profile> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    read_profile(std::io::BufReader::new(f))
        .with_context(|| format!("cannot read {}", path.display()))
}

pub(crate) fn phase_of(profile: &Profile, name: Option<&String>) -> Result<Option<u32>> {
    let Some(name) = name else { return Ok(None) };
    match profile.phase_index(name) {
        Some(i) => Ok(Some(i)),
        None => bail!(
            "the profile has no phase `{name}`; its phases are: {}",
            profile.phases.join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::targets::TargetSpec;
    use clap::CommandFactory;

    // Checks that every flag and argument of every subcommand says what it does in --help.
    #[test]
    fn every_flag_has_help() {
        let cli = Cli::command();
        let mut missing = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.get_help().is_none() && !["help", "version"].contains(&id) {
                    missing.push(format!("{} {id}", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "flags without help: {missing:?}");
    }

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
