//! Phase probes: ns per call and per goroutine switch, against bpftrace's floor.
use phaseprof_e2e::{go_workload, root, truth_from};
use std::process::Command;

use super::*;

/// Phase probes: ns added per phase call (entry + exit probe) on a native target (with cpu
/// samples only, and with the default events, which see any syscall the probes make) and a Go
/// one, ns per goroutine switch-point hit, and bare bpftrace probes on the same functions as
/// the kernel's floor; with `baseline`, the same for that build, alternating in each round.
pub fn phases_bench(
    pp: &std::path::Path,
    baseline: Option<&std::path::Path>,
    sim: &std::path::Path,
    tmp: &str,
    rounds: usize,
    has_bpftrace: bool,
) {
    let blocks = 200_000u64;
    let phases_native = root().join("tests/workloads/validator-sim/phases.toml");
    let relay = go_workload("relay-sim").expect("Go is needed for the Go phase benchmark");
    let go_phases = std::env::temp_dir().join("phaseprof-bench-ingest.toml");
    std::fs::write(
        &go_phases,
        "[[phase]]\nname = \"ingest\"\nfunction = \"main.ingest\"\n",
    )
    .unwrap();
    let go_calls = 1_000_000u64.to_string();
    let switches = 200_000u64.to_string();
    let blocks_arg = blocks.to_string();
    let per_block =
        |out: &str| truth_from(out.as_bytes())["elapsed_ns"].as_f64().unwrap() / blocks as f64;
    // `phaseprof record [events] --phases cfg -- program args` with the build `bin`.
    let record = |bin: &std::path::Path, events: &str, cfg: &std::path::Path| {
        let mut c = Command::new(bin);
        c.args([
            "record",
            "--events",
            events,
            "--phases",
            cfg.to_str().unwrap(),
            "-o",
            tmp,
            "--",
        ]);
        c
    };
    let builds: Vec<(&str, &std::path::Path)> = std::iter::once(("after", pp))
        .chain(baseline.map(|b| ("before", b)))
        .collect();
    // Per build: native cpu-only, native default events, Go call, Go switch (ns per unit).
    let mut m: Vec<[Vec<f64>; 4]> = builds.iter().map(|_| Default::default()).collect();
    let (mut nb, mut gb, mut sb, mut floor_native, mut floor_go) =
        (vec![], vec![], vec![], vec![], vec![]);
    let native_raw: Vec<String> = {
        let syms = std::process::Command::new("nm").arg(sim).output().unwrap();
        String::from_utf8_lossy(&syms.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|n| n.contains("13validator_sim6phases") && !n.contains("block"))
            .map(str::to_string)
            .collect()
    };
    for _ in 0..rounds {
        nb.push(per_block(&run(
            Command::new(sim).args(["--blocks", &blocks_arg])
        )));
        gb.push(ns_per_call(&run(
            Command::new(&relay).args(["-bench-calls", &go_calls])
        )));
        sb.push(ns_per_call(&run(
            Command::new(&relay).args(["-bench-switches", &switches])
        )));
        for (i, (_, bin)) in builds.iter().enumerate() {
            for (j, events) in ["cpu", "cpu,offcpu,syscall"].into_iter().enumerate() {
                m[i][j].push(per_block(&run(record(bin, events, &phases_native)
                    .arg(sim)
                    .args(["--blocks", &blocks_arg]))));
            }
            m[i][2].push(ns_per_call(&run(record(bin, "cpu", &go_phases)
                .arg(&relay)
                .args(["-bench-calls", &go_calls]))));
            m[i][3].push(ns_per_call(&run(record(bin, "cpu", &go_phases)
                .arg(&relay)
                .args(["-bench-switches", &switches]))));
        }
        if has_bpftrace {
            let probes: Vec<String> = native_raw
                .iter()
                .map(|n| {
                    format!(
                        "uprobe:{}:{n} {{}} uretprobe:{}:{n} {{}}",
                        sim.display(),
                        sim.display()
                    )
                })
                .collect();
            let out = run(Command::new("bpftrace")
                .args(["-q", "-e", &probes.join(" "), "-c"])
                .arg(format!("{} --blocks {blocks}", sim.display())));
            floor_native.push(per_block(&out));
            let script = format!("uprobe:{}:main.ingest {{}}", relay.display());
            let out = run(Command::new("bpftrace")
                .args(["-q", "-e", &script, "-c"])
                .arg(format!("{} -bench-calls {go_calls}", relay.display())));
            floor_go.push(ns_per_call(&out));
        }
    }
    let (nb, gb, sb) = (median(nb), median(gb), median(sb));
    println!("phase probes, median of {rounds} alternating rounds:");
    for (i, (name, bin)) in builds.iter().enumerate() {
        let [cpu, default, go, sw] = m[i].clone().map(median);
        println!("  {name} ({}):", bin.display());
        println!(
            "    native (validator-sim, 3 phase calls per block, uprobe + uretprobe): {:.0} ns per phase entry+exit with --events cpu, {:.0} ns with the default events",
            (cpu - nb) / 3.0,
            (default - nb) / 3.0
        );
        println!(
            "    Go (relay-sim main.ingest, uprobe at entry + uprobe on the ret): {:.0} ns per phase entry+exit",
            go - gb
        );
        println!(
            "    Go scheduler (relay-sim -bench-switches, 2 goroutine switches per pass, a stop and a start each): {:.0} ns per pass ({:.0} bare), {:.0} ns per switch-point hit",
            sw,
            sb,
            (sw - sb) / 4.0
        );
    }
    if !floor_native.is_empty() {
        println!(
            "  floor, bare bpftrace probes: native uprobe + uretprobe {:.0} ns per call; Go uprobe on main.ingest's first instruction (single-stepped `cmp`) {:.0} ns",
            (median(floor_native) - nb) / 3.0,
            median(floor_go) - gb
        );
    }
    println!("  x86 uprobes emulate relative jumps, calls, conditional branches, `push reg` and `nop`; a `ret` is single-stepped, so every exact Go exit costs a single-step");
}
