//! phaseprof's cost on a real Go server (`--only go-server`): nats-server v2.15.2 from the Go
//! module proxy, driven by NATS's own benchmark (`nats bench` of natscli v0.5.0, also from the
//! proxy: 8 publishing clients, 2 subscribing, running across the attach as on a live node), the
//! server's CPU time per message measured from its threads' schedstat from the attach on, in
//! rounds alternating bare, `record -p` with
//! the default events, with cpu samples only, with goroutine phases on two hot functions, with
//! those at a 1% phase budget, with Go's sampled allocations, and those at a 1% budget; beside
//! each, the probes' cost phaseprof printed (`probe_cost.ns`: its cpu samples in the probes,
//! the programs no sample sees timed by themselves, the syscall budget's slices) and the
//! slowdown it measured in the server against its work before attaching
//! (`probe_cost.in_targets`), and under a
//! phase budget its estimated phase calls per message beside the exact run's. The phases' extra
//! CPU (against cpu samples only) is also set against the phase probes' time `report` prints
//! and the model's hits × cost per hit. The default events' cost, a few % and within one row's
//! noise, is measured again over paired alternating rounds, with an interval, and so is the
//! phase budget's against the default events.
use std::process::{Command, Stdio};

use phaseprof_e2e::{go_third_party, http_get, root, Killed, NatsServer};

use super::defaults::BPFTRACE_DEFAULTS;
use super::redis::{attach, phase_calls, versus_exact, Under, BUDGET_PAIRS};

use super::measure::{budget_line, cpu_exact, median, paired_line, paired_rounds, Printed};

/// Messages published per round (8 clients; 2 subscribers: 400,000 delivered): ~0.2 s of the
/// server's CPU bare, so that a few % stand out of the rounds' noise.
const MSGS: &str = "200000";
/// Messages of a round under a budget (~40 s bare): at 1%, goroutine phase probes that slow the
/// server ~15x are attached for a few slices of ~20 ms, with ~60 of its reads in them (±13%).
const BUDGET_MSGS: &str = "20000000";

/// Messages of the paired rounds that measure the default events' cost.
const PAIR_MSGS: &str = "1000000";

/// The server: its pid, client port and monitoring port, and natscli's `nats`.
struct Server {
    pid: u32,
    port: u16,
    http: u16,
    nats: std::path::PathBuf,
}

impl Server {
    /// A member of the server's `/varz` (its own counters).
    fn varz(&self, member: &str) -> u64 {
        let (_, body) = http_get(&format!("http://127.0.0.1:{}/varz", self.http));
        let v: serde_json::Value = serde_json::from_str(&body).expect("varz is JSON");
        v[member].as_u64().unwrap_or(0)
    }

    /// `nats bench` `args` against this server.
    fn bench(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.nats);
        c.args(["-s", &format!("nats://127.0.0.1:{}", self.port), "bench"])
            .args(args)
            .arg("--no-progress")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }
}

/// One round's numbers: server CPU ns per published message, and with a recording its
/// `report --json` `phase_probes` (per message).
struct Round {
    cpu_per_msg: f64,
    measured_per_msg: Option<f64>,
    model_per_msg: Option<f64>,
    probe_samples: Option<(u64, u64)>,
    /// What phaseprof printed of its cost, per message.
    printed: Printed,
    /// Phase calls per message (estimated under a budget).
    calls_per_msg: Option<f64>,
}

/// A round's load: `nats bench` clients, killed when dropped; then the server is waited for
/// until it has let their subscriptions go (killed, they leave it to notice), so that the
/// next round counts its own.
struct Load<'a> {
    srv: &'a Server,
    subs: u64,
    clients: Vec<Killed>,
}

impl Drop for Load<'_> {
    fn drop(&mut self) {
        self.clients.clear();
        for _ in 0..200 {
            if self.srv.varz("subscriptions") <= self.subs {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Runs the benchmark once against the server, bare or under `how`. The load runs across the
/// tracer's attach, as on a live node (and phaseprof watches the server's work before it
/// attaches, `--baseline`): subscribers first (the server's own count says when they are in),
/// then publishers with more messages than the round needs, both killed after it. The server's
/// CPU per message is taken from the attach on, over `msgs` messages in by its own count.
fn round(pp: &std::path::Path, tmp: &str, srv: &Server, how: Under, msgs: &str) -> Round {
    let pid = srv.pid;
    let wanted = msgs.parse::<u64>().unwrap();
    // More than any round and what comes before it take (bpftrace's attach under this load:
    // a minute): the publishers would be done and the round stalled (~1M messages a second).
    let count = (wanted + 300_000_000).to_string();
    let subs = srv.varz("subscriptions");
    let subject = "phaseprof.bench";
    let sub = (srv.bench(&["sub", subject, "--msgs", &count, "--clients", "2"]))
        .spawn()
        .expect("nats bench sub");
    let mut load = Load {
        srv,
        subs,
        clients: vec![Killed(sub)],
    };
    while srv.varz("subscriptions") < subs + 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let publish = [
        "pub",
        subject,
        "--msgs",
        &count,
        "--clients",
        "8",
        "--size",
        "128",
    ];
    (load.clients).push(Killed(srv.bench(&publish).spawn().expect("nats bench pub")));
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut rec = attach(pp, tmp, pid, how);
    let (c0, in0) = (cpu_exact(pid), srv.varz("in_msgs"));
    let (mut seen, mut stalled) = (in0, 0);
    while seen < in0 + wanted {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let now = srv.varz("in_msgs");
        stalled = if now == seen { stalled + 1 } else { 0 };
        assert!(
            stalled < 50,
            "no message in for 10 s ({} of {wanted})",
            now - in0
        );
        seen = now;
    }
    let published = (seen - in0) as f64;
    let cpu_per_msg = (cpu_exact(pid) - c0) * 1e9 / published;
    let mut r = Round {
        cpu_per_msg,
        measured_per_msg: None,
        model_per_msg: None,
        probe_samples: None,
        printed: Printed::NONE,
        calls_per_msg: None,
    };
    if let Some(mut c) = rec.take() {
        // SAFETY: signalling a child we spawned; SIGINT makes it write its file.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        let ok = c.wait().unwrap().success();
        let Under::Phaseprof(_) = how else {
            return r;
        };
        assert!(ok, "phaseprof record failed");
        let out = Command::new(pp)
            .args(["report", "--json", tmp])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        r.printed = Printed::of(&report, published, cpu_per_msg);
        r.calls_per_msg = phase_calls(&report).map(|n| n / published);
        let probes = &report["phase_probes"];
        r.measured_per_msg = probes["measured_ns"].as_f64().map(|ns| ns / published);
        r.model_per_msg = probes["model_ns"].as_f64().map(|ns| ns / published);
        if let (Some(own), Some(all)) = (
            probes["cpu_samples_in_probes"].as_u64(),
            probes["cpu_samples"].as_u64(),
        ) {
            r.probe_samples = Some((own, all));
        }
    }
    r
}

pub fn go_server_bench(pp: &std::path::Path, tmp: &str, rounds: usize, has_bpftrace: bool) {
    let (Some(server), Some(nats)) = (
        NatsServer::start(),
        go_third_party("github.com/nats-io/natscli/nats", "v0.5.0", "nats"),
    ) else {
        println!("go-server: skipped (Go is not installed)");
        return;
    };
    let srv = Server {
        pid: server.process.0.id(),
        port: server.port,
        http: server.http,
        nats,
    };
    let phases = root().join("tests/workloads/nats-driver/phases.toml");
    let phases = phases.to_str().unwrap();
    let with_phases = ["--events", "cpu", "--phases", phases];
    // Under a budget, with the default events (the row it is set against).
    let phases_budget = ["--phases", phases, "--phase-budget", "1%"];
    // The last rows run long rounds (BUDGET_MSGS): a budget's cost is set against the same
    // recording without phases in rounds of the same length.
    let long_from = 7;
    let rows: [(&str, Under); 10] = [
        ("bare", Under::Bare),
        ("record -p (default events)", Under::Phaseprof(&[])),
        (
            "  bpftrace, the same events",
            Under::Bpftrace(BPFTRACE_DEFAULTS),
        ),
        (
            "record -p --events cpu",
            Under::Phaseprof(&["--events", "cpu"]),
        ),
        (
            "+ goroutine phases (2 functions)",
            Under::Phaseprof(&with_phases),
        ),
        (
            "--events cpu,alloc (Go's sampled heap profile)",
            Under::Phaseprof(&["--events", "cpu,alloc"]),
        ),
        (
            "--events cpu,alloc --alloc-budget 1%",
            Under::Phaseprof(&["--events", "cpu,alloc", "--alloc-budget", "1%"]),
        ),
        ("bare", Under::Bare),
        ("record -p (default events)", Under::Phaseprof(&[])),
        (
            "+ goroutine phases, --phase-budget 1%",
            Under::Phaseprof(&phases_budget),
        ),
    ];
    let mut cpu: Vec<Vec<f64>> = vec![vec![]; rows.len()];
    let mut printed: Vec<Vec<Printed>> = vec![vec![]; rows.len()];
    let mut calls: Vec<Vec<f64>> = vec![vec![]; rows.len()];
    let (mut measured, mut model, mut own, mut all) = (vec![], vec![], 0, 0);
    for _ in 0..rounds {
        for (i, (_, how)) in rows.iter().enumerate() {
            if matches!(how, Under::Bpftrace(_)) && !has_bpftrace {
                continue;
            }
            let msgs = if i >= long_from { BUDGET_MSGS } else { MSGS };
            let r = round(pp, tmp, &srv, *how, msgs);
            cpu[i].push(r.cpu_per_msg);
            if matches!(how, Under::Phaseprof(_)) {
                printed[i].push(r.printed);
            }
            calls[i].extend(r.calls_per_msg);
            if i == 4 {
                measured.extend(r.measured_per_msg);
                model.extend(r.model_per_msg);
                if let Some((o, a)) = r.probe_samples {
                    (own, all) = (own + o, all + a);
                }
            }
        }
    }
    // The defaults' few % are within a row's noise: measured again as paired rounds.
    let pairs = paired_rounds((3 * rounds).max(10), |with| {
        let how = Under::defaults_if(with);
        let r = round(pp, tmp, &srv, how, PAIR_MSGS);
        (r.cpu_per_msg, r.printed)
    });
    // A budget's 1.5 points are within one long round's noise too: paired long rounds, with
    // the phases at 1% against the same recording without them.
    let budget_pairs = paired_rounds(BUDGET_PAIRS, |with| {
        let how = Under::Phaseprof(if with { &phases_budget } else { &[] });
        (
            round(pp, tmp, &srv, how, BUDGET_MSGS).cpu_per_msg,
            Printed::NONE,
        )
    });
    drop(server);
    println!(
        "nats-server v2.15.2 driven by `nats bench` (natscli v0.5.0, running across the attach; \
         200,000 messages in, 400,000 delivered per round), server CPU per message from the \
         attach on, median of {rounds} alternating rounds:"
    );
    let medians: Vec<f64> = (cpu.into_iter())
        .map(|v| if v.is_empty() { f64::NAN } else { median(v) })
        .collect();
    let mut exact_calls = None;
    for (i, (name, how)) in rows.iter().enumerate() {
        let m = medians[i];
        if m.is_nan() {
            continue;
        }
        if i == long_from {
            println!("  {BUDGET_MSGS} messages a round:");
        }
        let b = medians[if i >= long_from { long_from } else { 0 }];
        let mut line = format!("  {name:<48} {m:>7.0} ns  {:.3}x bare", m / b);
        if i == long_from + 2 {
            let base = medians[long_from + 1];
            line += &format!(" ({:+.1}% vs the default events)", 100.0 * (m / base - 1.0));
        }
        let of = |f: fn(&Printed) -> f64| {
            let v: Vec<f64> = printed[i].iter().map(f).filter(|v| !v.is_nan()).collect();
            (!v.is_empty()).then(|| median(v))
        };
        if let Some(p) = of(|p| p.probes) {
            line += &format!(
                "; printed: probes {p:.0} ns (probe_cost), {:+.0}% vs the {:.0} ns measured",
                100.0 * (p / (m - b) - 1.0),
                m - b
            );
        }
        if let Some(p) = of(|p| p.in_targets) {
            line += &format!(
                "; measured in the target {p:.0} ns, {:+.0}% vs measured",
                100.0 * (p / (m - b) - 1.0)
            );
        }
        if let (false, Under::Phaseprof(flags)) = (calls[i].is_empty(), how) {
            let c = median(calls[i].clone());
            line += &versus_exact(&mut exact_calls, c, "phase calls", flags);
        }
        println!("{line}");
    }
    let extra = medians[4] - medians[3];
    println!("  phases' extra CPU (measured)       {:>9.0} ns", extra);
    if !measured.is_empty() {
        let m = median(measured);
        println!(
            "  printed: from cpu samples         {:>9.0} ns  {:+.1}% vs measured ({own} of {all} \
             samples in [phaseprof probes])",
            m,
            100.0 * (m / extra - 1.0)
        );
    }
    if !model.is_empty() {
        let m = median(model);
        println!(
            "  printed: hits × cost per hit      {:>9.0} ns  {:+.1}% vs measured",
            m,
            100.0 * (m / extra - 1.0)
        );
    }
    println!(
        "  record -p (default events), {PAIR_MSGS} messages a round: {}",
        paired_line(&pairs, "message")
    );
    println!(
        "  + goroutine phases, --phase-budget 1%, {BUDGET_MSGS} messages a round, against the \
         default events: {}",
        budget_line(&budget_pairs, 1.5)
    );
}
