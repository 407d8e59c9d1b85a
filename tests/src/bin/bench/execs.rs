//! Commands that exec many programs (`record -- ./build.sh`, `-- make`): a shell loop running
//! `cat` 100 times, its own elapsed time (measured by the loop, so that neither tool's start
//! nor its end counts) bare, under `perf record -g`, `record --unwind fp` and `record` (the
//! default `auto`: tables installed at each exec, the command held until they are in).
use std::process::Command;

use super::*;

/// The loop: prints the ns it took.
const LOOP: &str = "s=$(date +%s%N); i=0; while [ $i -lt 100 ]; do cat /etc/hostname >/dev/null; \
                    i=$((i+1)); done; e=$(date +%s%N); echo $((e - s))";

pub fn execs_bench(pp: &std::path::Path, tmp: &str, rounds: usize) {
    let has_perf = Command::new("perf").arg("--version").output().is_ok();
    let perf_data = format!("{tmp}.perf");
    let sh = |mut c: Command| {
        c.args(["sh", "-c", LOOP]);
        ns_per_call(&run(&mut c)) / 1e6
    };
    let mut variants: Vec<Variant<'_>> = vec![("bare", Box::new(|| sh(Command::new("env"))))];
    if has_perf {
        variants.push((
            "perf record -g",
            Box::new(|| {
                let mut c = Command::new("perf");
                c.args(["record", "-q", "-g", "-o", &perf_data, "--"]);
                sh(c)
            }),
        ));
    }
    for (label, extra) in [
        ("record --unwind fp", &["--unwind", "fp"][..]),
        ("record (auto)", &[][..]),
    ] {
        variants.push((
            label,
            Box::new(move || {
                let mut c = Command::new(pp);
                c.arg("record").args(extra).args(["-o", tmp, "--"]);
                sh(c)
            }),
        ));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, (_, variant)) in variants.iter_mut().enumerate() {
            samples[i].push(variant());
        }
    }
    let medians: Vec<f64> = samples.into_iter().map(median).collect();
    let perf = if has_perf { medians[1] } else { f64::NAN };
    println!(
        "a shell loop exec'ing cat 100 times, its own time, median of {rounds} alternating rounds:"
    );
    for ((label, _), m) in variants.iter().zip(&medians) {
        println!(
            "  {label:<22} {m:7.1} ms  {:.2}x bare  {:.2}x perf record -g",
            m / medians[0],
            m / perf
        );
    }
    let _ = std::fs::remove_file(&perf_data);
}
