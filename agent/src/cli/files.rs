//! The commands on saved profiles: `report`, `export`, `diff`, `serve`.
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use phaseprof_model::diff::DiffOptions;
use phaseprof_model::units::parse_percent;
use phaseprof_view::compare::{compare, CompareOptions, CompareOutput};
use phaseprof_view::export::{export, ExportFormat, ExportOptions};
use phaseprof_view::report::{write_report, ReportOptions, TreeView};

use super::{load, parse_event, phase_of};

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// The recording (default: phaseprof.data, where `record` writes).
    #[arg(default_value = "phaseprof.data", value_name = "FILE.phaseprof")]
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
    /// Also say how each target's stacks were walked (frame pointers, DWARF tables, copies).
    #[arg(short, long)]
    pub verbose: bool,
    /// Print the stacks of --event (default cpu) as a call tree, callers above callees.
    #[arg(long, conflicts_with = "callers")]
    pub tree: bool,
    /// Print who calls the functions whose name contains NAME: their callers, innermost
    /// first, as a tree (perf report's caller view).
    #[arg(long, value_name = "NAME")]
    pub callers: Option<String>,
    /// With --tree or --callers: fold branches under this share of the whole.
    #[arg(long, default_value = "1%", value_parser = parse_percent, value_name = "PERCENT")]
    pub min_percent: f64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FormatArg {
    Folded,
    Pprof,
    Svg,
    /// speedscope's JSON (https://www.speedscope.app): one profile per thread.
    Speedscope,
    /// OpenTelemetry profiles protobuf (OTLP profiles/v1development, as the Collector reads it).
    Otlp,
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The recording (default: phaseprof.data, where `record` writes).
    #[arg(default_value = "phaseprof.data", value_name = "FILE.phaseprof")]
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum)]
    pub format: FormatArg,
    /// Event kind to export.
    #[arg(long, default_value = "cpu")]
    pub event: String,
    /// Only stacks recorded in this phase.
    #[arg(long)]
    pub phase: Option<String>,
    /// Split stacks by `process` or `thread` (folded and svg: a root frame per pid or tid with
    /// its name; pprof samples carry pid, tid and thread labels either way).
    #[arg(long, value_name = "process|thread", value_parser = ["process", "thread"])]
    pub by: Option<String>,
    /// Output file (default, or `-`: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
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
pub struct ServeArgs {
    /// Recordings to serve (each its own page; pick two for a diff).
    #[arg(required = true, value_name = "FILE.phaseprof")]
    pub files: Vec<PathBuf>,
    /// Address to listen on (host:port; a name such as localhost:7070 is resolved). Anything
    /// but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1:7070", value_parser = super::parse_listen)]
    pub listen: std::net::SocketAddr,
    /// Require this token on every request (`Authorization: Bearer TOKEN`, or ?token= once).
    #[arg(long, env = "PHASEPROF_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
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

/// Prints a profile's tables or JSON summary.
pub fn run_report(args: ReportArgs) -> Result<i32> {
    let profile = load(&args.file)?;
    let opts = ReportOptions {
        json: args.json,
        event: args.event.as_deref().map(parse_event).transpose()?,
        phase: phase_of(&profile, args.phase.as_ref())?,
        top: args.top,
        live: args.live,
        verbose: args.verbose,
        tree: match (args.tree, args.callers) {
            (_, Some(name)) => Some(TreeView::Callers(name)),
            (true, None) => Some(TreeView::TopDown),
            (false, None) => None,
        },
        min_percent: args.min_percent * 100.0,
    };
    if let Some(kind) = opts.event.filter(|&k| !profile.recorded(k)) {
        bail!(phaseprof_flamegraphs::FlamegraphError::NotRecorded(kind));
    }
    // JSON escapes what it carries; text goes to a terminal, where names are shown escaped.
    let profile = match opts.json {
        true => profile,
        false => phaseprof_view::terminal::for_terminal(&profile),
    };
    write_report(&profile, &opts, std::io::stdout().lock())?;
    Ok(0)
}

/// Writes a profile's stacks as folded text, pprof or SVG.
pub fn run_export(args: ExportArgs) -> Result<i32> {
    let profile = load(&args.file)?;
    let opts = ExportOptions {
        format: match args.format {
            FormatArg::Folded => ExportFormat::Folded,
            FormatArg::Pprof => ExportFormat::Pprof,
            FormatArg::Svg => ExportFormat::Svg,
            FormatArg::Speedscope => ExportFormat::Speedscope,
            FormatArg::Otlp => ExportFormat::Otlp,
        },
        event: parse_event(&args.event)?,
        phase: phase_of(&profile, args.phase.as_ref())?,
        group: args
            .by
            .as_deref()
            .and_then(phaseprof_model::threads::GroupBy::parse),
    };
    if let Some(p) = opts.phase {
        eprintln!(
            "phaseprof: exporting {} stacks recorded inside phase `{}` (phases nested in it included)",
            opts.event,
            profile.phase_name(p)
        );
    }
    match args.output.filter(|o| o.as_os_str() != "-") {
        None => export(&profile, &opts, std::io::stdout().lock())?,
        Some(path) => {
            let f = std::fs::File::create(&path)
                .with_context(|| format!("cannot write {}", path.display()))?;
            export(&profile, &opts, std::io::BufWriter::new(f))?;
        }
    }
    Ok(0)
}

/// Compares runs of two builds.
pub fn run_diff(args: DiffArgs) -> Result<i32> {
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
        _ => bail!("-o takes a .svg (differential flamegraph) or .html (verdicts and graph) file"),
    };
    // Text goes to a terminal: names shown with their control characters escaped.
    let (a, b) = match output {
        CompareOutput::Text => {
            let shown = |v: Vec<phaseprof_model::Profile>| {
                v.iter()
                    .map(phaseprof_view::terminal::for_terminal)
                    .collect()
            };
            (shown(a), shown(b))
        }
        _ => (a, b),
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

/// Serves saved profiles until Ctrl-C.
pub fn run_serve(args: ServeArgs) -> Result<i32> {
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
