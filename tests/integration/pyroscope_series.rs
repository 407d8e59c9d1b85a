//! Pyroscope's own Go API client (github.com/grafana/pyroscope/api v1.6.0, what Grafana's
//! Pyroscope data source speaks) reading an hour of the store's windows: time series by minute
//! (the store's minute rollups), grouped by host and by phase, the merged pprof and a diff,
//! each held to the windows the test posted.
use std::collections::BTreeMap;

use phaseprof_e2e::go_binary;
use phaseprof_model::{EventKind, Profile};

const CPU: &str = "cpu:samples:count:cpu:nanoseconds";

/// `p`'s CPU samples (in `phase`, if named), as a flame graph counts them.
fn cpu(p: &Profile, phase: Option<&str>) -> u64 {
    let phase = match phase {
        Some(name) => match p.phase_index(name) {
            Some(i) => Some(i),
            None => return 0,
        },
        None => None,
    };
    (p.weighted_stacks(EventKind::Cpu, phase).iter())
        .map(|w| w.value)
        .sum()
}

/// The points of the time series labelled `labels` in the client's answer, by ms.
fn points(answer: &serde_json::Value, labels: &[(&str, &str)]) -> BTreeMap<i64, f64> {
    let series = answer["time_series"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let want: serde_json::Value = (labels.iter())
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let one = (series.iter())
        .find(|s| s["labels"] == want)
        .unwrap_or_else(|| panic!("no series {want} in {answer}"));
    (one["points"].as_array().unwrap().iter())
        .map(|p| (p[0].as_f64().unwrap() as i64, p[1].as_f64().unwrap()))
        .collect()
}

/// Each minute's sum of `value` over the `windows` starting in [from, to) (ns) that `keep`
/// selects, by the minute's start in ms: a minute with windows has a point, even of 0.
fn by_minute(
    windows: &[Profile],
    from: u64,
    to: u64,
    keep: impl Fn(&Profile) -> bool,
    value: impl Fn(&Profile) -> u64,
) -> BTreeMap<i64, f64> {
    let mut out = BTreeMap::new();
    for p in windows.iter().filter(|p| keep(p)) {
        let t = p.meta.start_unix_ns;
        if t >= from && t < to {
            let minute = (t / 60_000_000_000 * 60_000) as i64;
            *out.entry(minute).or_insert(0.0) += value(p) as f64;
        }
    }
    out
}

/// Checks, on the collector at `port` that stored `windows`, the hour [from, to) (ns, on whole
/// minutes): the CPU time series by minute of the service, per host, in phase `verify` (as a
/// selection and as a group), the merged pprof's total, and the diff of version 1.4 against 1.5,
/// all equal to the sums of the windows posted.
pub(crate) fn series_equal_windows(name: &str, port: u16, windows: &[Profile], from: u64, to: u64) {
    if go_binary().is_none() {
        eprintln!("{name}: Pyroscope's client SKIPPED: Go is not installed");
        return;
    }
    let (start, end) = ((from / 1_000_000).to_string(), (to / 1_000_000).to_string());
    let ask = |selector: &str, extra: &[&str]| {
        let mut args = vec![
            "-selector",
            selector,
            "-type",
            CPU,
            "-start",
            &start,
            "-end",
            &end,
            "-step",
            "60",
        ];
        args.extend(extra);
        crate::foreign_agents::send("pyroscope-query", port, &args)
    };
    let all = |_: &Profile| true;
    let whole = ask(
        r#"{service_name="node"}"#,
        &["-right", r#"{version="1.5"}"#],
    );
    let want = by_minute(windows, from, to, all, |p| cpu(p, None));
    assert!(want.len() > 30, "{name}: windows in most minutes: {want:?}");
    assert_eq!(points(&whole, &[]), want, "{name}: the service's series");
    let total: f64 = want.values().sum();
    assert_eq!(whole["pprof_total"].as_f64(), Some(total), "{name}: pprof");
    assert_eq!(whole["total"].as_f64(), Some(total), "{name}: flame graph");

    // The diff: left the whole service, right version 1.5; each side's selves sum to its ticks.
    let v15 = |p: &Profile| p.meta.labels["version"] == "1.5";
    let right: f64 = by_minute(windows, from, to, v15, |p| cpu(p, None))
        .values()
        .sum();
    let d = &whole["diff"];
    assert_eq!(d["left_ticks"].as_f64(), Some(total), "{name}: {d}");
    assert_eq!(d["right_ticks"].as_f64(), Some(right), "{name}: {d}");
    assert_eq!(d["left_self_sum"], d["left_ticks"], "{name}: {d}");
    assert_eq!(d["right_self_sum"], d["right_ticks"], "{name}: {d}");
    assert_eq!(d["total"].as_f64(), Some(total + right), "{name}: {d}");

    let hosts = ask(r#"{service_name="node"}"#, &["-group-by", "host"]);
    for host in ["host-a", "host-b", "host-c"] {
        let keep = |p: &Profile| p.meta.labels["host"] == host;
        let want = by_minute(windows, from, to, keep, |p| cpu(p, None));
        assert_eq!(points(&hosts, &[("host", host)]), want, "{name}: {host}");
    }

    let verify = |p: &Profile| cpu(p, Some("verify"));
    let want = by_minute(windows, from, to, all, verify);
    let selected = ask(r#"{service_name="node", phase="verify"}"#, &[]);
    assert_eq!(points(&selected, &[]), want, "{name}: phase verify");
    // Grouped by phase, a phase's series has points where its windows had it.
    let grouped = ask(r#"{service_name="node"}"#, &["-group-by", "phase"]);
    let has_verify = |p: &Profile| p.phase_index("verify").is_some();
    let want = by_minute(windows, from, to, has_verify, verify);
    assert_eq!(
        points(&grouped, &[("phase", "verify")]),
        want,
        "{name}: grouped by phase"
    );
    eprintln!(
        "{name}: Pyroscope's client: {} minutes with windows, {total} CPU samples, each equal to its windows",
        want.len()
    );
}
