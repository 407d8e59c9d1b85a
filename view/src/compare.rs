//! `phaseprof diff A... --vs B...`: the comparison of model::diff as text, JSON, a differential
//! flamegraph (SVG) or a self-contained HTML page (verdict table + graph).
use std::io::Write;

use crate::format::{fmt_delta, fmt_interval, fmt_side};
use anyhow::{bail, Result};
use phaseprof_flamegraphs::{folded_lines, write_diff_svg, GraphOptions, Selection};
use phaseprof_model::diff::{diff, DiffOptions, DiffReport};
use phaseprof_model::stats::Verdict;
use phaseprof_model::{EventKind, Profile};

/// What `diff` writes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CompareOutput {
    Text,
    Json,
    Svg,
    Html,
}

#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub output: CompareOutput,
    /// The event kind of the differential graph and of the stack table (None: all kinds in the
    /// table, cpu in the graph).
    pub event: Option<EventKind>,
    /// Scale A's stacks to B's total in the graph (compare shapes rather than volumes).
    pub normalize: bool,
    pub diff: DiffOptions,
}

/// Sums the folded stacks of every run.
fn summed_folded(runs: &[Profile], kind: EventKind) -> Result<Vec<String>> {
    let mut sum: std::collections::BTreeMap<String, u64> = Default::default();
    let sel = Selection {
        kind,
        phase: None,
        group: None,
    };
    for p in runs {
        for line in folded_lines(p, &sel)? {
            if let Some((stack, v)) = line.rsplit_once(' ') {
                *sum.entry(stack.to_string()).or_default() += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    Ok(sum.into_iter().map(|(s, v)| format!("{s} {v}")).collect())
}

/// The differential flamegraph of `kind`: B against A.
pub fn diff_svg(
    a: &[Profile],
    b: &[Profile],
    kind: EventKind,
    normalize: bool,
    out: impl Write,
) -> Result<()> {
    let (before, after) = (summed_folded(a, kind)?, summed_folded(b, kind)?);
    if after.is_empty() {
        bail!("no {kind} stacks in the B runs to draw");
    }
    let title = format!(
        "{kind} — {} — B ({} runs) against A ({} runs)",
        kind.unit(),
        b.len(),
        a.len()
    );
    write_diff_svg(
        &before,
        &after,
        normalize,
        title,
        kind.unit(),
        &GraphOptions::default(),
        out,
    )?;
    Ok(())
}

/// How the comparison was made, in one sentence per point (text, HTML and web pages alike).
pub fn method_note(r: &DiffReport) -> String {
    format!(
        "A: {} run(s), B: {} run(s). Intervals: {:.0}% for all {} metrics together (Holm); Welch's t over runs, \
         a phase's wall time over its calls when the runs agree, bootstrap where a side is skewed; \
         changes under {:.1}% are noise. Phase metrics are per call; (total) rows per second of recording.",
        r.a_runs,
        r.b_runs,
        r.confidence * 100.0,
        r.compared,
        r.threshold * 100.0
    )
}

fn fmt_p(p: Option<f64>) -> String {
    match p {
        Some(p) if p < 1e-4 => "<0.0001".into(),
        Some(p) => format!("{p:.4}"),
        None => String::new(),
    }
}

pub fn write_text(r: &DiffReport, mut out: impl Write) -> std::io::Result<()> {
    for w in &r.warnings {
        writeln!(out, "warning: {w}")?;
    }
    writeln!(out, "{}", method_note(r))?;
    writeln!(
        out,
        "{:<14} {:<16} {:>24} {:>24} {:>14} {:>28} {:>9}  verdict",
        "phase", "metric", "A", "B", "B-A", "interval", "change"
    )?;
    for m in &r.metrics {
        writeln!(
            out,
            "{:<14} {:<16} {:>24} {:>24} {:>14} {:>28} {:>9}  {}",
            m.phase,
            m.metric,
            fmt_side(m, false),
            fmt_side(m, true),
            fmt_delta(m),
            fmt_interval(m),
            m.relative
                .map(|r| format!("{:+.1}%", r * 100.0))
                .unwrap_or_default(),
            m.verdict
        )?;
    }
    if !r.stacks.is_empty() {
        writeln!(
            out,
            "\nstacks whose share changed: significant (*, Holm over each kind's stacks) first, by size of change; whole stacks, root first:"
        )?;
        writeln!(
            out,
            "{:<10} {:>8} {:>8} {:>8} {:>8}",
            "event", "A %", "B %", "Δ pts", "p"
        )?;
        for s in &r.stacks {
            writeln!(
                out,
                "{:<10} {:>8.2} {:>8.2} {:>+8.2} {:>8} {}\n    {}",
                s.event.name(),
                s.a_share * 100.0,
                s.b_share * 100.0,
                s.diff.delta * 100.0,
                fmt_p(s.p),
                if s.significant { "*" } else { "" },
                s.stack
            )?;
        }
    }
    Ok(())
}

/// The CSS class a verdict is shown with.
pub fn verdict_class(v: &Verdict) -> &'static str {
    match v {
        Verdict::Improved => "improved",
        Verdict::Regressed => "regressed",
        Verdict::Inconclusive { .. } => "inconclusive",
        _ => "",
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A self-contained page: the verdict table and the differential graph inline (the graph's own
/// script needs it to be the page's first SVG).
pub fn write_html(r: &DiffReport, svg: &str, mut out: impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>phaseprof diff</title>"
    )?;
    writeln!(out, "<style>body{{font-family:sans-serif;margin:1em}}table{{border-collapse:collapse;font-size:13px}}td,th{{padding:2px 8px;border-bottom:1px solid #ddd;text-align:right}}td:nth-child(-n+2){{text-align:left}}.improved{{color:#070}}.regressed{{color:#b00}}.inconclusive{{color:#a60}}.warning{{color:#b00;font-weight:bold}}#graph>svg{{width:100%;height:auto;display:block}}</style></head><body>")?;
    writeln!(out, "<div id=\"graph\">{svg}</div>")?;
    writeln!(
        out,
        "<h2>A: {} run(s) vs B: {} run(s)</h2>",
        r.a_runs, r.b_runs
    )?;
    for w in &r.warnings {
        writeln!(out, "<p class=\"warning\">warning: {}</p>", html_escape(w))?;
    }
    writeln!(out, "<p>{}</p>", html_escape(&method_note(r)))?;
    writeln!(out, "<table id=\"verdicts\"><tr><th>phase</th><th>metric</th><th>A</th><th>B</th><th>B−A</th><th>interval</th><th>change</th><th>verdict</th></tr>")?;
    for m in &r.metrics {
        let class = verdict_class(&m.verdict);
        writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td></tr>",
            html_escape(&m.phase),
            html_escape(&m.metric),
            fmt_side(m, false),
            fmt_side(m, true),
            fmt_delta(m),
            fmt_interval(m),
            m.relative.map(|r| format!("{:+.1}%", r * 100.0)).unwrap_or_default(),
            m.verdict
        )?;
    }
    writeln!(out, "</table></body></html>")
}

/// Runs the comparison and writes it as `opts` says.
pub fn compare(
    a: &[Profile],
    b: &[Profile],
    opts: &CompareOptions,
    mut out: impl Write,
) -> Result<()> {
    if a.is_empty() || b.is_empty() {
        bail!("diff needs at least one profile on each side: A.phaseprof... --vs B.phaseprof...");
    }
    let mut report = diff(a, b, &opts.diff);
    if let Some(kind) = opts.event {
        report.stacks.retain(|s| s.event == kind);
    }
    let kind = opts.event.unwrap_or(EventKind::Cpu);
    match opts.output {
        CompareOutput::Text => write_text(&report, &mut out)?,
        CompareOutput::Json => {
            serde_json::to_writer_pretty(&mut out, &report)?;
            writeln!(out)?;
        }
        CompareOutput::Svg => diff_svg(a, b, kind, opts.normalize, &mut out)?,
        CompareOutput::Html => {
            let mut svg = Vec::new();
            diff_svg(a, b, kind, opts.normalize, &mut svg)?;
            write_html(&report, &String::from_utf8_lossy(&svg), &mut out)?;
        }
    }
    out.flush()?;
    Ok(())
}
