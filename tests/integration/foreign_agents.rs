//! Other agents' profiles in the collector, held to what the senders say they sent:
//! - Pyroscope's own Go SDK (grafana/pyroscope-go v1.5.0, from the Go module proxy) pushes a Go
//!   program's CPU and heap profiles to `POST /ingest`, as it would to a Pyroscope server; the
//!   program keeps a copy of every profile the collector accepted and sums its sample types
//!   with Go's own pprof library (google/pprof).
//! - OTLP profiles built and encoded by the OpenTelemetry Collector's own data model (pdata
//!   pprofile v0.165.0) are posted to `POST /v1development/profiles`; the sender sums its
//!   samples back from what it encoded.
use std::process::Command;

use phaseprof_e2e::*;

use crate::fleet::sqlite_collector;

const TOKEN: &str = "pyroscope-sdk-token-0123456789";

/// pyroscope-push run against the collector on `port` with `token`: its truth line.
fn push(port: u16, token: &str, seconds: u32) -> serde_json::Value {
    let seconds = seconds.to_string();
    send(
        "pyroscope-push",
        port,
        &["-token", token, "-seconds", &seconds],
    )
}

/// The Go program `name` run against the collector on `port` with `args`: its JSON line.
pub(crate) fn send(name: &str, port: u16, args: &[&str]) -> serde_json::Value {
    let bin = go_workload(name).expect("Go is installed");
    let o = Command::new(bin)
        .args(["-url", &format!("http://127.0.0.1:{port}")])
        .args(args)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {out}"))
}

// Checks that what the SDK pushed lands in the merged views with the totals its own profiles
// sum to: CPU samples, allocated bytes and objects, for the service and for a label selection;
// that the program's burn function holds most of the CPU samples; that the in-use heap types
// the SDK sends too are left out by name; and that a wrong token stores nothing.
#[test]
fn a_pyroscope_sdk_push_is_merged_with_its_own_totals() {
    if go_binary().is_none() {
        eprintln!("SKIPPED: Go is not installed");
        return;
    }
    let dir = scratch("pyroscope-push");
    let (port, _collector) = sqlite_collector(&dir, "pushers", TOKEN);
    let truth = push(port, TOKEN, 3);
    eprintln!("pyroscope-push: {truth}");
    assert_eq!(truth["refused"], serde_json::Value::Null, "{truth}");
    assert!(num(&truth["accepted"]) >= 2, "{truth}");
    let sums = &truth["sums"];
    for t in ["inuse_space/bytes", "inuse_objects/count"] {
        assert_eq!(truth["ignored"][t], true, "{truth}");
    }
    for sel in [
        "service%3Dpyroscope-push",
        "service%3Dpyroscope-push,version%3D1.2.3",
    ] {
        let (status, body) = http_get(&format!("http://127.0.0.1:{port}/api/v1/merged?sel={sel}"));
        assert_eq!(status, 200, "{body}");
        let m: serde_json::Value = serde_json::from_str(&body).unwrap();
        let e = &m["events"];
        assert_eq!(
            e["cpu"]["samples"], sums["samples/count"],
            "{sel}: {}",
            e["cpu"]
        );
        assert_eq!(
            e["alloc"]["bytes"], sums["alloc_space/bytes"],
            "{sel}: {}",
            e["alloc"]
        );
        assert_eq!(
            e["alloc"]["count"], sums["alloc_objects/count"],
            "{sel}: {}",
            e["alloc"]
        );
        assert_eq!(
            e["alloc"]["exact"], false,
            "Go's heap samples are estimates"
        );
        assert_eq!(m["labels"]["host"], "pushers", "{}", m["labels"]);
    }

    let p = merged_window(port, "service%3Dpyroscope-push");
    let stacks = p.weighted_stacks(phaseprof_model::EventKind::Cpu, None);
    let in_burn: u64 = (stacks.iter())
        .filter(|w| (w.frames.iter()).any(|&f| p.frames[f as usize].function == "main.burn"))
        .map(|w| w.value)
        .sum();
    let all: u64 = stacks.iter().map(|w| w.value).sum();
    assert!(
        2 * in_burn > all,
        "main.burn has {in_burn} of {all} cpu samples"
    );

    let bad = push(port, "not-the-token-0123456789", 1);
    assert_eq!(bad["accepted"], 0, "{bad}");
    assert!(bad["refused"].to_string().contains("401"), "{bad}");
    let (_, body) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/merged?sel=service%3Dpyroscope-push"
    ));
    let again: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(again["events"]["cpu"]["samples"], sums["samples/count"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The merged window of `sel` on the collector at `port`, as the store sums it.
fn merged_window(port: u16, sel: &str) -> phaseprof_model::Profile {
    let url = format!("http://127.0.0.1:{port}/api/v1/merged.phaseprof?sel={sel}");
    phaseprof_model::read_profile(&mut &crate::store_sums::download(&url)[..]).unwrap()
}

// Checks OTLP profiles sent as the OpenTelemetry Collector's exporters send them (its pdata
// model and encoder, gzipped protobuf, the strings as dictionary references): one window per
// resource, labelled by its attributes; node-a's CPU samples, and those in phase `replay` (the
// samples' `phaseprof.phase` attribute), node-b's allocated bytes and objects, all equal to
// what the sender's samples hold; the goroutine profile named in the partial success. Then
// Pyroscope's own Go API client (github.com/grafana/pyroscope/api v1.6.0, what Grafana's data
// source speaks) reads the same totals back: for a label selection, for a phase, per type.
#[test]
fn otlp_profiles_are_merged_per_resource_and_read_back_by_pyroscopes_client() {
    if go_binary().is_none() {
        eprintln!("SKIPPED: Go is not installed");
        return;
    }
    let dir = scratch("otlp-push");
    let (port, _collector) = sqlite_collector(&dir, "otel", TOKEN);
    let truth = send("otlp-push", port, &["-token", TOKEN]);
    eprintln!("otlp-push: {truth}");
    assert_eq!(truth["status"], 200, "{truth}");
    assert_eq!(truth["rejected"], 1, "{truth}");
    assert!(truth["partial_message"]
        .to_string()
        .contains("goroutine/count"));
    let (a, b) = (&truth["totals"]["node-a"], &truth["totals"]["node-b"]);

    let p = merged_window(port, "service%3Dotlp-push,host%3Dnode-a,version%3D2.0");
    use phaseprof_model::SampleKind;
    assert_eq!(p.total(SampleKind::Cpu, 0), num(&a["samples/count"]));
    let replay = p.phase_index("replay").expect("phase replay");
    let in_replay: u64 = (p.samples.iter())
        .filter(|s| s.kind == SampleKind::Cpu && s.phase == replay)
        .map(|s| s.value(0))
        .sum();
    assert_eq!(in_replay, num(&a["samples/count in replay"]));
    assert_eq!(p.total(SampleKind::Alloc, 0), 0, "node-a allocated nothing");

    let p = merged_window(port, "service%3Dotlp-push,host%3Dnode-b");
    assert_eq!(p.total(SampleKind::Alloc, 0), num(&b["alloc_space/bytes"]));
    assert_eq!(
        p.total(SampleKind::Alloc, 1),
        num(&b["alloc_objects/count"])
    );
    assert_eq!(
        p.total(SampleKind::AllocTotal, 0),
        num(&b["alloc_space/bytes"])
    );
    assert_eq!(p.total(SampleKind::Cpu, 0), 0, "node-b sent no CPU samples");
    let leaf = &p.frames[p.stacks[0].frames[0] as usize];
    assert_eq!(
        (leaf.function.as_str(), leaf.module.as_str()),
        ("main.grow", "otlp-push")
    );

    // Pyroscope's own API client, as Grafana's data source asks: the same totals, for a label
    // selection and for a phase.
    let query = |selector: &str, profile_type: &str, label: &str| {
        let args = [
            "-selector",
            selector,
            "-type",
            profile_type,
            "-label",
            label,
        ];
        send("pyroscope-query", port, &args)
    };
    let cpu = "cpu:samples:count:cpu:nanoseconds";
    let replay = query(
        r#"{service_name="otlp-push", phase="replay"}"#,
        cpu,
        "phase",
    );
    eprintln!("pyroscope-query: {replay}");
    assert_eq!(replay["total"], a["samples/count in replay"], "{replay}");
    assert_eq!(replay["self_sum"], replay["total"], "{replay}");
    assert_eq!(
        replay["label_values"],
        serde_json::json!(["replay"]),
        "{replay}"
    );
    let types = replay["profile_types"].to_string();
    assert!(
        types.contains(cpu) && types.contains("alloc:alloc_space:bytes"),
        "{types}"
    );
    let names = replay["label_names"].to_string();
    assert!(
        names.contains("service_name") && names.contains("phase"),
        "{names}"
    );
    assert_eq!(
        replay["series"].as_array().map(Vec::len),
        Some(2),
        "{replay}"
    );
    let all = query(r#"{service_name="otlp-push", host="node-a"}"#, cpu, "host");
    assert_eq!(all["total"], a["samples/count"], "{all}");
    assert_eq!(all["label_values"], serde_json::json!(["node-a"]), "{all}");
    let alloc = query(
        r#"{service_name="otlp-push"}"#,
        "alloc:alloc_space:bytes::",
        "host",
    );
    assert_eq!(alloc["total"], b["alloc_space/bytes"], "{alloc}");
    assert_eq!(
        alloc["self_by_name"]["main.grow"], b["alloc_space/bytes"],
        "{alloc}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
