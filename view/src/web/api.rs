//! The JSON API and the downloads (graphs, folded stacks, pprof, .phaseprof).
use std::sync::Arc;

use axum::extract::{Path, Query, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use phaseprof_flamegraphs::{write_folded, write_svg_with, GraphOptions, Selection};
use phaseprof_model::diff::{diff as diff_runs, DiffOptions, DiffReport};
use phaseprof_model::summary::{phase_summaries, Summary};
use phaseprof_model::{EventKind, Profile};
use serde::Deserialize;

use super::{AppState, ProfileEntry, WebError};
use crate::report::{syscall_rows, top_functions};

/// What a page or route shows: an event kind, a phase, icicle or flame, how many rows.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct View {
    pub event: Option<String>,
    pub phase: Option<String>,
    pub icicle: Option<String>,
    pub n: Option<usize>,
    /// `process` or `thread`: tables and graphs split that way (default: by phase).
    pub by: Option<String>,
}

/// The grouping a `by=` parameter asks for.
pub fn group_of(v: &View) -> Option<phaseprof_model::threads::GroupBy> {
    v.by.as_deref()
        .and_then(phaseprof_model::threads::GroupBy::parse)
}

pub fn load(state: &AppState, id: &str) -> Result<Arc<Profile>, WebError> {
    state
        .source
        .get(id)
        .ok_or_else(|| WebError::not_found(format!("no profile `{id}`")))
}

pub fn phase_of(p: &Profile, name: Option<&str>) -> Result<Option<u32>, WebError> {
    match name.filter(|n| !n.is_empty()) {
        None => Ok(None),
        Some(n) => p.phase_index(n).map(Some).ok_or_else(|| {
            WebError::bad_request(format!("no phase `{n}`; phases: {}", p.phases.join(", ")))
        }),
    }
}

pub fn event_of(s: Option<&str>, default: EventKind) -> Result<EventKind, WebError> {
    match s.filter(|s| !s.is_empty()) {
        None => Ok(default),
        Some(s) => EventKind::parse(s).ok_or_else(|| {
            WebError::bad_request(format!(
                "unknown event `{s}` (cpu, offcpu, syscall, alloc, pagefault)"
            ))
        }),
    }
}

pub async fn profiles(State(state): State<AppState>) -> Json<Vec<ProfileEntry>> {
    Json(state.source.list())
}

pub async fn summary(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Summary>, WebError> {
    let p = load(&state, &id)?;
    Ok(Json(Summary::of(&p)))
}

pub async fn phases(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<serde_json::Value>>, WebError> {
    let p = load(&state, &id)?;
    Ok(Json(phase_summaries(&p)))
}

pub async fn top(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(v): Query<View>,
) -> Result<Json<serde_json::Value>, WebError> {
    let p = load(&state, &id)?;
    let kind = event_of(v.event.as_deref(), EventKind::Cpu)?;
    if !p.recorded(kind) {
        return Err(WebError::not_found(format!("{kind} was not recorded")));
    }
    let phase = phase_of(&p, v.phase.as_deref())?;
    let (funcs, total) = top_functions(&p, kind, phase);
    let functions: Vec<_> = funcs
        .iter()
        .take(v.n.unwrap_or(20))
        .map(|f| serde_json::json!({"name": f.name, "self": f.self_value, "total": f.total_value}))
        .collect();
    Ok(Json(serde_json::json!({
        "event": kind, "unit": kind.unit(), "phase": v.phase, "total": total, "functions": functions,
    })))
}

pub async fn syscalls(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(v): Query<View>,
) -> Result<Json<Vec<serde_json::Value>>, WebError> {
    let p = load(&state, &id)?;
    if !p.recorded(EventKind::Syscall) {
        return Err(WebError::not_found("syscalls were not recorded"));
    }
    let phase = phase_of(&p, v.phase.as_deref())?;
    Ok(Json(
        syscall_rows(&p, phase)
            .into_iter()
            .map(|(name, c)| serde_json::json!({"name": name, "count": c.count, "total_ns": c.total_ns}))
            .collect(),
    ))
}

fn svg_response(svg: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response()
}

/// `/profile/{id}/flamegraph/{kind}.svg[?phase=&icicle=1]`
pub async fn flamegraph(
    State(state): State<AppState>,
    Path((id, file)): Path<(String, String)>,
    Query(v): Query<View>,
) -> Result<Response, WebError> {
    let p = load(&state, &id)?;
    let kind = file
        .strip_suffix(".svg")
        .and_then(EventKind::parse)
        .ok_or_else(|| WebError::not_found(format!("no graph `{file}` (cpu.svg, offcpu.svg …)")))?;
    let sel = Selection {
        group: group_of(&v),
        kind,
        phase: phase_of(&p, v.phase.as_deref())?,
    };
    let g = GraphOptions {
        icicle: matches!(v.icicle.as_deref(), Some("1" | "true")),
        ..GraphOptions::default()
    };
    let mut svg = Vec::new();
    write_svg_with(&p, &sel, &g, &mut svg).map_err(|e| WebError::not_found(e.to_string()))?;
    Ok(svg_response(svg))
}

/// `/profile/{id}/download.phaseprof`, `download.folded?event=&phase=`, `download.pb.gz?…`
pub async fn download(
    State(state): State<AppState>,
    Path((id, file)): Path<(String, String)>,
    Query(v): Query<View>,
) -> Result<Response, WebError> {
    let p = load(&state, &id)?;
    let kind = event_of(v.event.as_deref(), EventKind::Cpu)?;
    let phase = phase_of(&p, v.phase.as_deref())?;
    let mut body = Vec::new();
    let (mime, name) = match file.as_str() {
        "download.phaseprof" => {
            phaseprof_model::write_profile(&p, &mut body).map_err(WebError::internal)?;
            (
                "application/octet-stream",
                format!("profile-{id}.phaseprof"),
            )
        }
        "download.folded" => {
            write_folded(
                &p,
                &Selection {
                    kind,
                    phase,
                    group: group_of(&v),
                },
                &mut body,
            )
            .map_err(|e| WebError::not_found(e.to_string()))?;
            (
                "text/plain; charset=utf-8",
                format!("profile-{id}.{kind}.folded"),
            )
        }
        "download.pb.gz" => {
            if !p.recorded(kind) {
                return Err(WebError::not_found(format!("{kind} was not recorded")));
            }
            crate::pprof::write_pprof(&p, kind, phase, &mut body).map_err(WebError::internal)?;
            (
                "application/octet-stream",
                format!("profile-{id}.{kind}.pb.gz"),
            )
        }
        _ => return Err(WebError::not_found(format!("no download `{file}`"))),
    };
    Ok((
        [
            (header::CONTENT_TYPE, mime.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        body,
    )
        .into_response())
}

/// The two sides of a diff from `a=ID&a=ID&b=ID` (or comma-separated ids) and the event kind.
pub struct DiffQuery {
    pub a: Vec<String>,
    pub b: Vec<String>,
    pub event: Option<String>,
    /// Draw volumes as recorded instead of scaling A to B's total.
    pub absolute: bool,
}

pub fn parse_diff_query(raw: Option<&str>) -> DiffQuery {
    let mut q = DiffQuery {
        a: vec![],
        b: vec![],
        event: None,
        absolute: false,
    };
    for kv in raw.unwrap_or("").split('&') {
        let Some((k, v)) = kv.split_once('=') else {
            continue;
        };
        // Split on the separators as sent, then decode each id: an id holding a comma (a
        // collector's label selection) arrives as %2C and stays whole.
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8_lossy()
                .into_owned()
        };
        let ids = v.split([',', '+']).filter(|s| !s.is_empty()).map(decode);
        match k {
            "a" => q.a.extend(ids),
            "b" => q.b.extend(ids),
            "event" => q.event = Some(decode(v)),
            "absolute" => q.absolute = matches!(v, "1" | "true" | "on"),
            _ => {}
        }
    }
    q
}

pub fn load_runs(state: &AppState, ids: &[String], side: &str) -> Result<Vec<Profile>, WebError> {
    if ids.is_empty() {
        return Err(WebError::bad_request(format!(
            "choose at least one profile for {side}"
        )));
    }
    ids.iter()
        .map(|id| load(state, id).map(|p| (*p).clone()))
        .collect()
}

pub fn run_diff(
    state: &AppState,
    q: &DiffQuery,
) -> Result<(Vec<Profile>, Vec<Profile>, DiffReport), WebError> {
    let a = load_runs(state, &q.a, "A")?;
    let b = load_runs(state, &q.b, "B")?;
    let report = diff_runs(&a, &b, &DiffOptions::default());
    Ok((a, b, report))
}

pub async fn diff(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<DiffReport>, WebError> {
    let q = parse_diff_query(raw.as_deref());
    Ok(Json(run_diff(&state, &q)?.2))
}

pub async fn diff_svg(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, WebError> {
    let q = parse_diff_query(raw.as_deref());
    let kind = event_of(q.event.as_deref(), EventKind::Cpu)?;
    let a = load_runs(&state, &q.a, "A")?;
    let b = load_runs(&state, &q.b, "B")?;
    let mut svg = Vec::new();
    crate::compare::diff_svg(&a, &b, kind, !q.absolute, &mut svg)
        .map_err(|e| WebError::not_found(e.to_string()))?;
    Ok(svg_response(svg))
}

/// `/range/{from}/{to}/download.phaseprof`: the profiles with ids from..=to (windows of a live
/// attach, or saved files by position) merged into one.
pub async fn range_download(
    State(state): State<AppState>,
    Path((from, to)): Path<(u64, u64)>,
) -> Result<Response, WebError> {
    let mut picked: Vec<(u64, Arc<Profile>)> = state
        .source
        .list()
        .into_iter()
        .filter_map(|e| {
            let n: u64 = e.id.parse().ok()?;
            (from..=to)
                .contains(&n)
                .then_some(n)
                .zip(state.source.get(&e.id))
        })
        .collect();
    if picked.is_empty() {
        return Err(WebError::not_found(format!(
            "no profiles with ids {from} to {to}"
        )));
    }
    picked.sort_by_key(|(n, _)| *n);
    let refs: Vec<&Profile> = picked.iter().map(|(_, p)| p.as_ref()).collect();
    let merged = phaseprof_model::merge::merge(&refs);
    let mut body = Vec::new();
    phaseprof_model::write_profile(&merged, &mut body).map_err(WebError::internal)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"range-{from}-{to}.phaseprof\""),
            ),
        ],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that ids are split on the separators as sent and then percent-decoded: an encoded
    // comma stays inside its id (a collector's label selection), encoded characters decode.
    #[test]
    fn diff_ids_are_percent_decoded() {
        let q = parse_diff_query(Some(
            "a=host%3Dn1%2Cservice%3Drelay%7C1h,run%201&b=x+y&event=cpu",
        ));
        assert_eq!(q.a, vec!["host=n1,service=relay|1h", "run 1"]);
        assert_eq!(q.b, vec!["x", "y"]);
        assert_eq!(q.event.as_deref(), Some("cpu"));
    }
}
