//! `report --json`: the documented summary, then who did the work and each kind's top functions.
use phaseprof_model::threads;
use phaseprof_model::{EventKind, Profile, Summary};

use super::{top_functions, ReportOptions};

/// The JSON summary (the documented contract, its members first), plus per-process and
/// per-thread rows and each recorded event kind's top functions, inside `--phase` when given.
#[derive(serde::Serialize)]
pub(super) struct JsonReport {
    #[serde(flatten)]
    summary: Summary,
    processes: Vec<threads::ProcessRow>,
    threads: Vec<threads::ThreadRow>,
    top_functions: std::collections::BTreeMap<&'static str, TopFunctions>,
}

#[derive(serde::Serialize)]
struct TopFunctions {
    unit: &'static str,
    total: u64,
    functions: Vec<serde_json::Value>,
}

pub(super) fn json_report(profile: &Profile, opts: &ReportOptions) -> JsonReport {
    let top = if opts.top == 0 { 20 } else { opts.top };
    let mut tops = std::collections::BTreeMap::new();
    for kind in EventKind::ALL.into_iter().filter(|&k| profile.recorded(k)) {
        let (funcs, total) = top_functions(profile, kind, opts.phase);
        let functions = funcs
            .iter()
            .take(top)
            .map(|f| serde_json::json!({"name": f.name, "self": f.self_value, "total": f.total_value}))
            .collect();
        tops.insert(
            kind.name(),
            TopFunctions {
                unit: kind.unit(),
                total,
                functions,
            },
        );
    }
    JsonReport {
        summary: Summary::of(profile),
        processes: threads::processes(profile, opts.phase),
        threads: threads::threads(profile, opts.phase),
        top_functions: tops,
    }
}
