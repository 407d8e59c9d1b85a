//! Golden files of what views print: the report (text and JSON), `diff --json` and a decoded
//! pprof export, from the shared fixture. `PHASEPROF_BLESS=1 cargo test -p phaseprof-view`
//! rewrites them after an intended change (review the diff of `view/tests/data/`).
use phaseprof_model::diff::DiffOptions;
use phaseprof_model::EventKind;

use crate::compare::{compare, CompareOptions, CompareOutput};
use crate::fixture::two_phases;
use crate::report::{write_report, ReportOptions};

/// Compares `got` with `view/tests/data/<name>` (PHASEPROF_BLESS=1 rewrites it).
fn golden(name: &str, got: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    phaseprof_testkit::golden::check(&dir.join(name), got);
}

fn report(json: bool) -> String {
    let opts = ReportOptions {
        json,
        event: None,
        phase: None,
        top: 10,
        live: false,
        verbose: true,
        tree: None,
        min_percent: 1.0,
    };
    let mut out = Vec::new();
    write_report(&two_phases(10), &opts, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

// Checks the report's text and its JSON summary against their golden files.
#[test]
fn report_text_and_json() {
    golden("report.txt", &report(false));
    golden("report.json", &report(true));
}

// Checks `diff --json` of 3 runs a side (10 vs 20 flushes per call) against its golden file.
#[test]
fn diff_json() {
    let a = vec![two_phases(10); 3];
    let b = vec![two_phases(20); 3];
    let opts = CompareOptions {
        output: CompareOutput::Json,
        event: None,
        normalize: true,
        diff: DiffOptions::default(),
    };
    let mut out = Vec::new();
    compare(&a, &b, &opts, &mut out).unwrap();
    golden("diff.json", &String::from_utf8(out).unwrap());
}

// Checks the pprof export, decoded, against its golden file.
#[test]
fn pprof_decoded() {
    let p = crate::pprof::to_pprof(&two_phases(10), EventKind::Cpu, None);
    golden("pprof.txt", &format!("{p:#?}\n"));
}
