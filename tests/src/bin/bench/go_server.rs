//! The phase probes' cost on a real Go server (`--only go-server`): nats-server v2.15.2 from the
//! Go module proxy, driven by NATS's own benchmark (`nats bench` of natscli v0.5.0, also from the
//! proxy: 8 publishing clients, 2 subscribing), the server's CPU time per message measured from
//! its threads' schedstat over the benchmark's run, in rounds
//! alternating three ways: bare, `record -p` with cpu samples only, and the same with goroutine
//! phases on two hot functions. The phases' extra CPU (third against second, medians) is set
//! against what `report` prints: the probes' time measured from the cpu samples in the
//! `[phaseprof probes]` tower, and the model's hits × cost per hit.
use std::process::{Command, Stdio};

use phaseprof_e2e::{go_third_party, http_get, read_until, root, NatsServer};

use super::measure::{cpu_exact, median};

/// Messages published per round (8 clients; 2 subscribers: 64,000 delivered).
const MSGS: &str = "32000";

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
}

/// Runs the benchmark once against the server, under `record -p` with `flags` when given.
fn round(pp: &std::path::Path, tmp: &str, srv: &Server, flags: Option<&[&str]>) -> Round {
    let pid = srv.pid;
    let mut rec = flags.map(|flags| {
        let mut c = Command::new(pp)
            .args(["record", "-v", "-p", &pid.to_string()])
            .args(flags)
            .args(["-o", tmp])
            .stderr(Stdio::piped())
            .spawn()
            .expect("phaseprof");
        let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
        read_until(&mut err, "probes attached");
        (c, err)
    });
    // Subscribers first (the server's own count says when they are in), then the publishers.
    let (subs, in0) = (srv.varz("subscriptions"), srv.varz("in_msgs"));
    let subject = "phaseprof.bench";
    let mut sub = (srv.bench(&["sub", subject, "--msgs", MSGS, "--clients", "2"]))
        .spawn()
        .expect("nats bench sub");
    while srv.varz("subscriptions") < subs + 2 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let c0 = cpu_exact(pid);
    let publish = [
        "pub",
        subject,
        "--msgs",
        MSGS,
        "--clients",
        "8",
        "--size",
        "128",
    ];
    assert!(srv
        .bench(&publish)
        .status()
        .expect("nats bench pub")
        .success());
    assert!(sub.wait().unwrap().success());
    let published = MSGS.parse::<f64>().unwrap();
    let cpu_per_msg = (cpu_exact(pid) - c0) * 1e9 / published;
    // The server's own count: every message arrived (besides a few of its own events).
    assert!((srv.varz("in_msgs") - in0) as f64 >= published);
    let mut r = Round {
        cpu_per_msg,
        measured_per_msg: None,
        model_per_msg: None,
        probe_samples: None,
    };
    if let Some((mut c, mut err)) = rec.take() {
        // SAFETY: signalling a child we spawned; SIGINT makes it write its file.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        std::io::Read::read_to_string(&mut err, &mut String::new()).unwrap();
        assert!(c.wait().unwrap().success());
        let out = Command::new(pp)
            .args(["report", "--json", tmp])
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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

pub fn go_server_bench(pp: &std::path::Path, tmp: &str, rounds: usize) {
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
    let (mut bare, mut cpu_only, mut phased) = (vec![], vec![], vec![]);
    let (mut measured, mut model, mut own, mut all) = (vec![], vec![], 0, 0);
    for _ in 0..rounds {
        bare.push(round(pp, tmp, &srv, None).cpu_per_msg);
        cpu_only.push(round(pp, tmp, &srv, Some(&["--events", "cpu"])).cpu_per_msg);
        let r = round(
            pp,
            tmp,
            &srv,
            Some(&["--events", "cpu", "--phases", phases]),
        );
        phased.push(r.cpu_per_msg);
        measured.extend(r.measured_per_msg);
        model.extend(r.model_per_msg);
        if let Some((o, a)) = r.probe_samples {
            (own, all) = (own + o, all + a);
        }
    }
    drop(server);
    let (b, c, p) = (median(bare), median(cpu_only), median(phased));
    let extra = p - c;
    println!(
        "nats-server v2.15.2 driven by `nats bench` (natscli v0.5.0; 32,000 messages in, 64,000 \
         delivered per round), server CPU per message, median of {rounds} alternating rounds:"
    );
    println!("  bare                               {:>9.0} ns", b);
    println!(
        "  record -p --events cpu             {:>9.0} ns  {:.2}x bare",
        c,
        c / b
    );
    println!(
        "  + goroutine phases (2 functions)   {:>9.0} ns  {:.2}x bare",
        p,
        p / b
    );
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
}
