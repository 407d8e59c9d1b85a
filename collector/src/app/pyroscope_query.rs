//! Pyroscope's query API (`POST /querier.v1.QuerierService/{method}`, connect unary with
//! protobuf bodies, as Grafana's Pyroscope data source and Pyroscope's Go API client call it),
//! over the same store as the collector's own API: profile types, label names and values,
//! series, merged stack traces as a flame graph and as pprof, time series, and the diff of two
//! selections. Each event kind is a profile type; the windows' labels are the series' labels
//! (`service` answers as `service_name`, as Pyroscope names it), and `phase` selects the samples
//! of one phase, or groups a time series by phase, which Pyroscope itself cannot.
use std::collections::{BTreeMap, BTreeSet};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use phaseprof_model::{EventKind, Profile, KINDS};
use prost::Message;

use super::queries::{blocking, check_read};
use super::AppState;
use crate::merged::merged_profile;
use crate::store::Selector;

mod flame_graph;
mod messages;
mod series;
use flame_graph::{Tree, LEFT, RIGHT};
use messages::*;

/// A connect error: its code (as connect names it) and message, with the HTTP status connect
/// maps the code to.
struct ConnectError(StatusCode, &'static str, String);

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.1, "message": self.2}).to_string();
        (self.0, [(header::CONTENT_TYPE, "application/json")], body).into_response()
    }
}

fn invalid(why: String) -> ConnectError {
    ConnectError(StatusCode::BAD_REQUEST, "invalid_argument", why)
}

pub(super) async fn pyroscope_query(
    State(s): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(e) = check_read(&s, &headers) {
        return e.into_response();
    }
    let proto = (headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/proto"));
    if !proto {
        let why = "the collector answers Pyroscope's API in protobuf (Content-Type: \
                   application/proto), as its connect clients send by default";
        return ConnectError(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unimplemented",
            why.into(),
        )
        .into_response();
    }
    let answer = blocking(&s.clone(), move || Ok(answer(&s, &method, &body))).await;
    match answer {
        Ok(Ok(bytes)) => ([(header::CONTENT_TYPE, "application/proto")], bytes).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Method `method`'s answer to `body`, encoded.
fn answer(s: &AppState, method: &str, body: &[u8]) -> Result<Vec<u8>, ConnectError> {
    match method {
        "ProfileTypes" => call(method, body, |q: ProfileTypesRequest| {
            profile_types(s, q.start, q.end)
        }),
        "LabelNames" => call(method, body, |q| label_names(s, q)),
        "LabelValues" => call(method, body, |q| label_values(s, q)),
        "Series" => call(method, body, |q| series(s, q)),
        "SelectMergeStacktraces" => call(method, body, |q| merge_stacktraces(s, q)),
        "SelectMergeProfile" => call(method, body, |q| merge_profile(s, q)),
        "SelectSeries" => call(method, body, |q| series::select_series(s, q)),
        "Diff" => call(method, body, |q| diff(s, q)),
        other => Err(unimplemented(&format!("`{other}`"))),
    }
}

/// `body` decoded as `method`'s request, answered by `f`, encoded.
fn call<Q: Message + Default, A: Message>(
    method: &str,
    body: &[u8],
    f: impl FnOnce(Q) -> Result<A, ConnectError>,
) -> Result<Vec<u8>, ConnectError> {
    let q = Q::decode(body).map_err(|e| invalid(format!("{method}: {e}")))?;
    Ok(f(q)?.encode_to_vec())
}

fn label_names(s: &AppState, q: LabelNamesRequest) -> Result<LabelNamesResponse, ConnectError> {
    let sel = Query::of(&q.matchers, q.start, q.end)?;
    let mut names: BTreeSet<String> = BTreeSet::new();
    for labels in sel.label_sets(s)? {
        names.extend(labels.keys().map(|k| pyroscope_name(k).to_string()));
    }
    names.insert("phase".into());
    Ok(LabelNamesResponse {
        names: names.into_iter().collect(),
    })
}

/// A label's values; `phase`'s are the selected windows' phase names.
fn label_values(s: &AppState, q: LabelValuesRequest) -> Result<LabelValuesResponse, ConnectError> {
    let sel = Query::of(&q.matchers, q.start, q.end)?;
    let names: BTreeSet<String> = if q.name == "phase" {
        let merged = sel.merged(s)?;
        (merged.iter().flat_map(|p| p.phases.iter().skip(1)).cloned()).collect()
    } else {
        let name = store_name(&q.name);
        let sets = sel.label_sets(s)?;
        sets.into_iter()
            .filter_map(|mut l| l.remove(name))
            .collect()
    };
    Ok(LabelValuesResponse {
        names: names.into_iter().collect(),
    })
}

/// The selected label sets, each cut to `label_names` where the request names some.
fn series(s: &AppState, q: SeriesRequest) -> Result<SeriesResponse, ConnectError> {
    let sel = Query::of(&q.matchers, q.start, q.end)?;
    let keep = |k: &String| {
        let name = pyroscope_name(k).to_string();
        q.label_names.is_empty() || q.label_names.contains(&name)
    };
    let mut sets: BTreeSet<Vec<(String, String)>> = BTreeSet::new();
    for labels in sel.label_sets(s)? {
        sets.insert(labels.into_iter().filter(|(k, _)| keep(k)).collect());
    }
    Ok(SeriesResponse {
        labels_set: sets.into_iter().map(labels).collect(),
    })
}

/// The selected windows' stacks of one kind (in one phase), merged, as a flame graph.
fn merge_stacktraces(
    s: &AppState,
    q: SelectMergeStacktracesRequest,
) -> Result<SelectMergeStacktracesResponse, ConnectError> {
    if q.format > 1 {
        return Err(unimplemented("formats other than the flame graph"));
    }
    let mut tree = Tree::new();
    add_selection(s, &q, &mut tree, LEFT)?;
    Ok(SelectMergeStacktracesResponse {
        flamegraph: Some(tree.flame_graph(q.max_nodes)),
    })
}

/// `q`'s selection of one kind (in one phase) added to `tree` on `side`.
fn add_selection(
    s: &AppState,
    q: &SelectMergeStacktracesRequest,
    tree: &mut Tree,
    side: usize,
) -> Result<(), ConnectError> {
    let picked = selection(s, &q.profile_type_id, &q.label_selector, q.start, q.end)?;
    if let Some((p, kind, phase)) = picked {
        tree.add(&p, kind, phase, side);
    }
    Ok(())
}

/// A request's selection: its windows merged (None: none), its kind, and its phase's index.
fn selection(
    s: &AppState,
    profile_type_id: &str,
    selector: &str,
    start: i64,
    end: i64,
) -> Result<Option<(Profile, EventKind, Option<u32>)>, ConnectError> {
    let kind = kind_of(profile_type_id)?;
    let sel = Query::of(&[selector.to_string()], start, end)?;
    match sel.merged(s)? {
        Some(p) => {
            let phase = sel.phase_in(&p)?;
            Ok(Some((p, kind, phase)))
        }
        None => Ok(None),
    }
}

/// Two selections' flame graphs side by side (left: before, right: after), as Grafana's
/// comparison view asks; each side may select its own time range, labels and phase.
fn diff(s: &AppState, q: DiffRequest) -> Result<DiffResponse, ConnectError> {
    let (Some(left), Some(right)) = (q.left, q.right) else {
        return Err(invalid(
            "Diff: needs both a left and a right selection".into(),
        ));
    };
    if kind_of(&left.profile_type_id)? != kind_of(&right.profile_type_id)? {
        return Err(invalid(
            "Diff: both sides must be of one profile type".into(),
        ));
    }
    let mut tree = Tree::new();
    add_selection(s, &left, &mut tree, LEFT)?;
    add_selection(s, &right, &mut tree, RIGHT)?;
    let max_nodes = left.max_nodes.or(right.max_nodes);
    Ok(DiffResponse {
        flamegraph: Some(tree.diff(max_nodes)),
    })
}

/// The selected windows' stacks of one kind (in one phase), merged, as a pprof profile of that
/// one type (uncompressed: connect carries the message itself).
fn merge_profile(
    s: &AppState,
    q: SelectMergeProfileRequest,
) -> Result<phaseprof_view::pprof::PprofProfile, ConnectError> {
    let picked = selection(s, &q.profile_type_id, &q.label_selector, q.start, q.end)?;
    Ok(match picked {
        Some((p, kind, phase)) => phaseprof_view::pprof::to_pprof(&p, kind, phase),
        None => phaseprof_view::pprof::PprofProfile::default(),
    })
}

/// The methods served, as a refusal of any other names them.
const SERVED: &str = "ProfileTypes, LabelNames, LabelValues, Series, SelectMergeStacktraces, \
                      SelectMergeProfile, SelectSeries, Diff";

fn unimplemented(what: &str) -> ConnectError {
    ConnectError(
        StatusCode::NOT_IMPLEMENTED,
        "unimplemented",
        format!("{what}: not served by phaseprof-collector (it serves {SERVED})"),
    )
}

/// Pyroscope's name for a label, and back (`store_name`): `service` is `service_name`.
fn pyroscope_name(label: &str) -> &str {
    if label == "service" {
        "service_name"
    } else {
        label
    }
}

fn store_name(label: &str) -> &str {
    if label == "service_name" {
        "service"
    } else {
        label
    }
}

fn labels(pairs: Vec<(String, String)>) -> Labels {
    Labels {
        labels: (pairs.into_iter())
            .map(|(name, value)| LabelPair {
                name: pyroscope_name(&name).to_string(),
                value,
            })
            .collect(),
    }
}

/// A profile type ID per event kind that has a flame graph: `name:type:unit:period type:period
/// unit`, as Pyroscope writes them (`cpu:samples:count:cpu:nanoseconds`).
fn profile_type(kind: EventKind) -> ProfileType {
    let spec = kind.samples().spec();
    let (sample_type, sample_unit) = spec.pprof;
    let (period_type, period_unit) = match kind {
        EventKind::Cpu => ("cpu", "nanoseconds"),
        _ => ("", ""),
    };
    ProfileType {
        id: format!(
            "{}:{sample_type}:{sample_unit}:{period_type}:{period_unit}",
            spec.name
        ),
        name: spec.name.to_string(),
        sample_type: sample_type.into(),
        sample_unit: sample_unit.into(),
        period_type: period_type.into(),
        period_unit: period_unit.into(),
    }
}

fn kind_of(id: &str) -> Result<EventKind, ConnectError> {
    let name = id.split(':').next().unwrap_or("");
    (KINDS.iter())
        .find(|k| k.flamegraph && k.name == name)
        .map(|k| k.event)
        .ok_or_else(|| {
            invalid(format!(
                "profile type `{id}`: phaseprof's are those ProfileTypes lists"
            ))
        })
}

/// The kinds with samples in the windows of [start, end] (ms).
fn profile_types(s: &AppState, start: i64, end: i64) -> Result<ProfileTypesResponse, ConnectError> {
    let sel = Query::of(&[], start, end)?;
    let mut types = Vec::new();
    if let Some(p) = sel.merged(s)? {
        for k in KINDS.iter().filter(|k| k.flamegraph) {
            if p.samples.iter().any(|x| x.kind == k.kind) {
                types.push(profile_type(k.event));
            }
        }
    }
    Ok(ProfileTypesResponse {
        profile_types: types,
    })
}

/// A query's selection: the store's labels, a phase, the time range.
struct Query {
    selector: Selector,
    phase: Option<String>,
}

impl Query {
    /// From Pyroscope's matchers (`{service_name="relay", phase="replay"}`: equality only) and
    /// a range in ms (0: open).
    fn of(matchers: &[String], start: i64, end: i64) -> Result<Query, ConnectError> {
        let mut q = Query {
            selector: Selector {
                from_ns: (start.max(0) as u64).saturating_mul(1_000_000),
                to_ns: (end.max(0) as u64).saturating_mul(1_000_000),
                ..Selector::default()
            },
            phase: None,
        };
        for m in matchers {
            for (k, v) in parse_matcher(m).map_err(invalid)? {
                match k.as_str() {
                    // Pyroscope's own: every kind is in every window's series.
                    "__profile_type__" | "__name__" => {}
                    "phase" => q.phase = Some(v),
                    _ => {
                        q.selector.labels.insert(store_name(&k).to_string(), v);
                    }
                }
            }
        }
        Ok(q)
    }

    fn label_sets(&self, s: &AppState) -> Result<Vec<BTreeMap<String, String>>, ConnectError> {
        let sets = s.store.label_sets(&self.selector).map_err(store_error)?;
        Ok(sets.into_iter().map(|l| l.labels).collect())
    }

    fn merged(&self, s: &AppState) -> Result<Option<Profile>, ConnectError> {
        merged_profile(s.store.as_ref(), &self.selector).map_err(store_error)
    }

    /// The selected phase's index in `p` (None: all samples); a phase `p` does not have
    /// selects nothing.
    fn phase_in(&self, p: &Profile) -> Result<Option<u32>, ConnectError> {
        match &self.phase {
            None => Ok(None),
            Some(name) => Ok(Some(p.phase_index(name).unwrap_or(u32::MAX))),
        }
    }
}

fn store_error(e: crate::store::StoreError) -> ConnectError {
    ConnectError(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// `{k="v", k2="v2"}` as pairs; any operator but `=` is refused.
fn parse_matcher(m: &str) -> Result<Vec<(String, String)>, String> {
    let inner = (m.trim().strip_prefix('{').and_then(|r| r.strip_suffix('}')))
        .ok_or_else(|| format!("label selector `{m}`: expected {{name=\"value\", …}}"))?;
    let mut out = Vec::new();
    let mut rest = inner.trim();
    while !rest.is_empty() {
        let op = rest
            .find(['=', '!', '~'])
            .ok_or_else(|| format!("`{rest}`: no `=`"))?;
        let name = rest[..op].trim();
        let after = &rest[op..];
        if !after.starts_with("=\"") {
            return Err(format!(
                "label selector `{m}`: only `name=\"value\"` matchers are served (not `!=`, `=~`, `!~`)"
            ));
        }
        let value_and_rest = &after[2..];
        let close = (value_and_rest.find('"'))
            .ok_or_else(|| format!("label selector `{m}`: unclosed quote"))?;
        out.push((name.to_string(), value_and_rest[..close].to_string()));
        rest = value_and_rest[close + 1..]
            .trim_start()
            .trim_start_matches(',')
            .trim();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the matchers: equality pairs, Pyroscope's own names kept for the caller, any other
    // operator refused with the reason.
    #[test]
    fn matchers_are_equality_pairs() {
        let got = parse_matcher(r#"{service_name="relay", phase="replay"}"#).unwrap();
        assert_eq!(
            got,
            vec![
                ("service_name".to_string(), "relay".to_string()),
                ("phase".to_string(), "replay".to_string())
            ]
        );
        assert_eq!(parse_matcher("{}").unwrap(), vec![]);
        assert!(parse_matcher(r#"{a=~"x"}"#).unwrap_err().contains("only"));
        assert!(parse_matcher(r#"{a!="x"}"#).unwrap_err().contains("only"));
        assert!(parse_matcher("a=b").is_err());
    }
}
