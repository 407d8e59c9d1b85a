//! The HTML pages: the list of profiles, a profile (phase table, a tab per event kind with its
//! graph and top functions, syscalls, `lost`, target), and the diff of any two sets of profiles.
use askama::Template;
use axum::extract::{Path, Query, RawQuery, State};
use axum::response::Html;
use phaseprof_model::EventKind;

use super::api::{load, parse_diff_query, phase_of, run_diff, View};
use super::{AppState, WebError};
use crate::compare::verdict_class;
use crate::format::{fmt_delta, fmt_interval, fmt_ns, fmt_side, fmt_value, pct};
use crate::report::{phase_cells, syscall_rows, top_functions};

fn render(t: &impl Template) -> Result<Html<String>, WebError> {
    t.render().map(Html).map_err(WebError::internal)
}

/// Everything but RFC 3986's unreserved characters.
const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// A value escaped for a URL query or path segment (phase names have `(none)`, selections `=`).
fn query_escape(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, RESERVED).to_string()
}

fn unix_time(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    let (h, m, s) = ((secs / 3600) % 24, (secs / 60) % 60, secs % 60);
    format!("{h:02}:{m:02}:{s:02} UTC")
}

pub struct IndexRow {
    pub id: String,
    pub name: String,
    pub comm: String,
    pub pids: String,
    pub start: String,
    pub duration: String,
    pub events: String,
}

#[derive(Template)]
#[template(path = "index.html")]
struct IndexPage {
    heading: String,
    refresh: u32,
    entries: Vec<IndexRow>,
    pickers: Vec<super::LabelPicker>,
}

pub async fn index(State(state): State<AppState>) -> Result<Html<String>, WebError> {
    let entries = state
        .source
        .list()
        .into_iter()
        .map(|e| IndexRow {
            pids: e
                .pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            start: unix_time(e.start_unix_ns),
            duration: fmt_ns(e.duration_ns),
            events: e
                .events
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(","),
            id: e.id,
            name: e.name,
            comm: e.comm,
        })
        .collect();
    render(&IndexPage {
        heading: state.source.heading(),
        refresh: state.source.refresh_s(),
        entries,
        pickers: state.source.pickers(),
    })
}

/// The label pickers' form: opens the profile of the selection (every non-empty label, and
/// `last`, the time range).
pub async fn select(
    State(state): State<AppState>,
    Query(q): Query<Vec<(String, String)>>,
) -> Result<axum::response::Redirect, WebError> {
    let last = q
        .iter()
        .find(|(k, _)| k == "last")
        .map_or("1h", |(_, v)| v.as_str())
        .to_string();
    let labels: Vec<(String, String)> = q
        .into_iter()
        .filter(|(k, v)| k != "last" && !v.is_empty())
        .collect();
    let id = state
        .source
        .select(&labels, &last)
        .ok_or_else(|| WebError::not_found("these profiles have no label pickers"))?;
    Ok(axum::response::Redirect::to(&format!(
        "/profile/{}",
        query_escape(&id)
    )))
}

pub struct PhaseRow {
    pub name: String,
    pub query: String,
    pub cells: Vec<String>,
}

pub struct TopRow {
    pub name: String,
    pub self_pct: String,
    pub total_pct: String,
    pub self_value: String,
    pub total_value: String,
}

pub struct KindTab {
    pub kind: String,
    pub total: String,
    pub empty: bool,
    pub top: Vec<TopRow>,
}

pub struct SyscallRow {
    pub name: String,
    pub count: u64,
    pub total: String,
    pub mean: String,
}

#[derive(Template)]
#[template(path = "profile.html")]
struct ProfilePage {
    refresh: u32,
    id: String,
    name: String,
    target: String,
    host: String,
    kernel: String,
    duration: String,
    events: String,
    build_id: String,
    lost: String,
    complete: bool,
    /// Whether every phase entry matched its return, and if not why.
    phases_complete: bool,
    phase_completeness: String,
    /// How user stacks were walked (empty for files recorded before `--unwind`).
    stacks: String,
    phase: String,
    phase_query: String,
    phase_amp: String,
    icicle_query: String,
    cost_names: Vec<String>,
    phases: Vec<PhaseRow>,
    /// `phase`, `process` or `thread`: which table the page shows, how graphs split.
    by: String,
    group_links: Vec<GroupLink>,
    /// The process or thread table's rows (for `by` process or thread).
    who: Vec<WhoRow>,
    kinds: Vec<KindTab>,
    syscalls: Vec<SyscallRow>,
}

struct GroupLink {
    by: &'static str,
    href: String,
}

/// A row of the process or thread table, formatted.
struct WhoRow {
    id: String,
    name: String,
    pid: u32,
    cpu: u64,
    offcpu: String,
    cpu_wait: String,
    syscalls: u64,
    syscall_time: String,
    faults: u64,
}

/// The group-by switch's links (each keeping the phase filter `q`), and the query every link
/// and graph of the page carries (`phase=…&by=…`).
fn grouping(id: &str, q: &str, by: &str) -> (Vec<GroupLink>, String) {
    let phase = (!q.is_empty()).then(|| format!("phase={q}"));
    let query = |b: &str| {
        let by = (b != "phase").then(|| format!("by={b}"));
        phase
            .iter()
            .cloned()
            .chain(by)
            .collect::<Vec<_>>()
            .join("&")
    };
    let links = ["phase", "process", "thread"]
        .into_iter()
        .map(|b| GroupLink {
            by: b,
            href: format!("/profile/{id}?{}", query(b)),
        })
        .collect();
    (links, query(by))
}

impl WhoRow {
    fn new(id: u32, name: String, pid: u32, t: &phaseprof_model::threads::Totals) -> WhoRow {
        WhoRow {
            id: id.to_string(),
            name,
            pid,
            cpu: t.cpu_samples,
            offcpu: fmt_ns(t.offcpu_ns),
            cpu_wait: fmt_ns(t.cpu_wait_ns),
            syscalls: t.syscalls,
            syscall_time: fmt_ns(t.syscall_ns),
            faults: t.page_faults,
        }
    }
}

/// The process and the thread tables' rows.
fn who_rows(p: &phaseprof_model::Profile, phase: Option<u32>) -> (Vec<WhoRow>, Vec<WhoRow>) {
    use phaseprof_model::threads;
    let processes = threads::processes(p, phase)
        .into_iter()
        .map(|r| {
            let name = format!("{} ({} threads)", r.name, r.threads);
            WhoRow::new(r.pid, name, r.pid, &r.totals)
        })
        .collect();
    let threads = threads::threads(p, phase)
        .into_iter()
        .map(|r| WhoRow::new(r.tid, r.name, r.pid, &r.totals))
        .collect();
    (processes, threads)
}

/// The phase table's rows: each phase's cells and its cost columns, `(none)` last.
fn phase_rows(p: &phaseprof_model::Profile, cost_names: &[String]) -> Vec<PhaseRow> {
    let order = (1..p.phase_stats.len()).chain(std::iter::once(0));
    let shares = p.phase_probe_shares();
    order
        .filter_map(|i| p.phase_stats.get(i).map(|st| (i as u32, st)))
        .map(|(i, st)| {
            let name = p.phase_name(i).to_string();
            let mut cells = phase_cells(st);
            cells.push(shares[i as usize].describe().unwrap_or_else(|| "-".into()));
            cells.extend(
                cost_names
                    .iter()
                    .map(|c| st.costs.get(c).copied().unwrap_or(0).to_string()),
            );
            PhaseRow {
                query: query_escape(&name),
                name,
                cells,
            }
        })
        .collect()
}

/// One tab per recorded event kind: its total and its `top` functions.
fn kind_tabs(p: &phaseprof_model::Profile, phase: Option<u32>, top: usize) -> Vec<KindTab> {
    EventKind::ALL
        .into_iter()
        .filter(|k| p.recorded(*k))
        .map(|kind| {
            let (funcs, total) = top_functions(p, kind, phase);
            KindTab {
                kind: kind.name().to_string(),
                total: format!(
                    "{} {}",
                    fmt_value(kind, total),
                    if kind == EventKind::Alloc || kind == EventKind::Offcpu {
                        ""
                    } else {
                        kind.unit()
                    }
                ),
                empty: total == 0,
                top: funcs
                    .iter()
                    .take(top)
                    .map(|f| TopRow {
                        name: f.name.clone(),
                        self_pct: format!("{:.2}", pct(f.self_value, total)),
                        total_pct: format!("{:.2}", pct(f.total_value, total)),
                        self_value: fmt_value(kind, f.self_value),
                        total_value: fmt_value(kind, f.total_value),
                    })
                    .collect(),
            }
        })
        .collect()
}

pub async fn profile(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(v): Query<View>,
) -> Result<Html<String>, WebError> {
    let p = load(&state, &id)?;
    let phase = phase_of(&p, v.phase.as_deref())?;
    let phase_name = phase
        .map(|i| p.phase_name(i).to_string())
        .unwrap_or_default();
    let q = query_escape(&phase_name);
    let m = &p.meta;
    let cost_names: Vec<String> = p
        .phase_stats
        .first()
        .map(|s| s.costs.keys().cloned().collect())
        .unwrap_or_default();
    let phases = phase_rows(&p, &cost_names);
    let kinds = kind_tabs(&p, phase, v.n.unwrap_or(25));
    let group = super::api::group_of(&v);
    let by = match group {
        Some(phaseprof_model::threads::GroupBy::Process) => "process",
        Some(phaseprof_model::threads::GroupBy::Thread) => "thread",
        None => "phase",
    };
    let (processes, threads) = who_rows(&p, phase);
    let (group_links, joined) = grouping(&id, &q, by);
    let syscalls = if p.recorded(EventKind::Syscall) {
        syscall_rows(&p, phase)
            .into_iter()
            .map(|(name, c)| SyscallRow {
                name,
                count: c.count,
                total: fmt_ns(c.total_ns),
                mean: fmt_ns(c.total_ns.checked_div(c.count).unwrap_or(0)),
            })
            .collect()
    } else {
        vec![]
    };
    let l = &p.lost;
    let page = ProfilePage {
        refresh: 0,
        name: state
            .source
            .list()
            .into_iter()
            .find(|e| e.id == id)
            .map(|e| e.name)
            .unwrap_or_else(|| id.clone()),
        target: format!(
            "{} (pids {})",
            if m.exe.is_empty() { &m.comm } else { &m.exe },
            m.pids
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        host: m.host.clone(),
        kernel: m.kernel.clone(),
        duration: fmt_ns(p.duration_ns()),
        events: m
            .events
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(","),
        build_id: m.build_id.clone().unwrap_or_default(),
        lost: format!(
            "{} events, {} stacks{}",
            l.events,
            l.stacks,
            if l.is_empty() {
                " (complete profile)"
            } else {
                " (partial profile)"
            }
        ),
        complete: l.is_empty(),
        phases_complete: l.phase_issues().is_empty(),
        phase_completeness: p.describe_phases(),
        stacks: m.unwind.as_ref().map(|u| u.describe()).unwrap_or_default(),
        phase_query: if joined.is_empty() {
            String::new()
        } else {
            format!("?{joined}")
        },
        phase_amp: if joined.is_empty() {
            String::new()
        } else {
            format!("&{joined}")
        },
        icicle_query: if joined.is_empty() {
            "?icicle=1".into()
        } else {
            format!("?{joined}&icicle=1")
        },
        phase: phase_name,
        cost_names,
        phases,
        by: by.into(),
        group_links,
        who: if by == "thread" { threads } else { processes },
        kinds,
        syscalls,
        id,
    };
    render(&page)
}

pub struct DiffOption {
    pub id: String,
    pub name: String,
    pub in_a: bool,
    pub in_b: bool,
}

pub struct VerdictRow {
    pub phase: String,
    pub metric: String,
    pub a: String,
    pub b: String,
    pub delta: String,
    pub interval: String,
    pub change: String,
    pub verdict: String,
    pub class: String,
}

#[derive(Template)]
#[template(path = "diff.html")]
struct DiffPage {
    refresh: u32,
    options: Vec<DiffOption>,
    event_options: Vec<String>,
    event: String,
    absolute: bool,
    has_result: bool,
    graph_ok: bool,
    query: String,
    note: String,
    warnings: Vec<String>,
    rows: Vec<VerdictRow>,
}

pub async fn diff(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Html<String>, WebError> {
    let q = parse_diff_query(raw.as_deref());
    let event = q.event.clone().unwrap_or_else(|| "cpu".into());
    let options = state
        .source
        .list()
        .into_iter()
        .map(|e| DiffOption {
            in_a: q.a.contains(&e.id),
            in_b: q.b.contains(&e.id),
            id: e.id,
            name: e.name,
        })
        .collect();
    let mut page = DiffPage {
        refresh: 0,
        options,
        event_options: EventKind::ALL
            .iter()
            .map(|k| k.name().to_string())
            .collect(),
        event: event.clone(),
        absolute: false,
        has_result: false,
        graph_ok: false,
        query: String::new(),
        note: String::new(),
        warnings: vec![],
        rows: vec![],
    };
    if !q.a.is_empty() || !q.b.is_empty() {
        let (a, b, r) = run_diff(&state, &q)?;
        let kind = EventKind::parse(&event).unwrap_or(EventKind::Cpu);
        page.graph_ok = b.iter().all(|p| p.recorded(kind)) && a.iter().all(|p| p.recorded(kind));
        page.has_result = true;
        page.query = format!(
            "a={}&b={}&event={}",
            q.a.join(","),
            q.b.join(","),
            kind.name()
        );
        page.note = crate::compare::method_note(&r);
        page.warnings = r.warnings.clone();
        page.rows = r
            .metrics
            .iter()
            .map(|m| VerdictRow {
                phase: m.phase.clone(),
                metric: m.metric.clone(),
                a: fmt_side(m, false),
                b: fmt_side(m, true),
                delta: fmt_delta(m),
                interval: fmt_interval(m),
                change: m
                    .relative
                    .map(|r| format!("{:+.1}%", r * 100.0))
                    .unwrap_or_default(),
                verdict: m.verdict.to_string(),
                class: verdict_class(&m.verdict).into(),
            })
            .collect();
    }
    render(&page)
}
