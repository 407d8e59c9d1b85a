//! phaseprof's cost on Debian's redis-server (`--only redis`), driven by its own benchmark
//! (`redis-benchmark` SET and GET at once, 5 clients each, over a unix socket; server and
//! clients pinned to CPUs 0 and 1; the load runs across the attach, as on a live node): the
//! server's CPU time per command from its threads' schedstat, in rounds alternating bare,
//! bpftrace doing the same work, and `record -p`: the default events, the defaults plus six
//! phases (exact, and at a 1% budget), allocations (exact) and allocations at a 1% budget.
//! Beside each measured slowdown, what phaseprof printed: the probes' cost it measured
//! (`report --json` `probe_cost.ns`: its cpu samples in the probes, the programs no sample sees
//! timed by themselves, the syscall budget's slices), the slowdown it measured in the server
//! against its work before attaching (`probe_cost.in_targets`), for exact phases the phase
//! probes' hits × their cost per hit beside what they added to the default events, and for
//! allocations its estimate; under a budget, the totals per command beside the exact run's. The default
//! events' cost, a few % and within one row's noise, is measured again over paired alternating
//! rounds, with an interval, and so is each budget's against the same recording without its
//! probes.
use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use phaseprof_e2e::{read_until, root};

use super::defaults::BPFTRACE_DEFAULTS;
use super::measure::{budget_line, cpu_exact, median, paired_line, paired_rounds, Printed};

/// Requests per round: 2 × this many commands (SET and GET).
const REQUESTS: &str = "100000";
/// Requests of a round under a budget: at 1%, probes that cost the server 2-2.4x its CPU may be
/// attached for one 20 ms slice in about 7 s (allocations: the first after 9 s).
const BUDGET_REQUESTS: &str = "2000000";

/// Requests of the paired rounds that measure the default events' cost.
const PAIR_REQUESTS: &str = "500000";

/// Pairs of long rounds (BUDGET_REQUESTS, and the Go server's BUDGET_MSGS) that measure each
/// budget's cost: 6, whose widest interval (lowest to highest) covers the median at 96.9%.
pub(super) const BUDGET_PAIRS: usize = 6;

/// The server, killed when dropped.
struct Redis {
    child: Child,
    socket: String,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Redis {
    fn start() -> Option<Redis> {
        let socket =
            std::env::temp_dir().join(format!("phaseprof-bench-redis-{}.sock", std::process::id()));
        let socket = socket.to_str()?.to_string();
        let child = Command::new("taskset")
            .args([
                "-c",
                "0",
                "redis-server",
                "--port",
                "0",
                "--unixsocket",
                &socket,
            ])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let r = Redis { child, socket };
        for _ in 0..100 {
            if r.cli(&["ping"]).is_some_and(|o| o.trim() == "PONG") {
                return Some(r);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    fn cli(&self, args: &[&str]) -> Option<String> {
        // On the clients' CPU, away from the server's.
        let o = Command::new("taskset")
            .args(["-c", "1", "redis-cli", "-s", &self.socket])
            .args(args)
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    }

    /// The server's own count of commands processed (INFO stats).
    fn commands(&self) -> u64 {
        let info = self.cli(&["info", "stats"]).unwrap_or_default();
        info.lines()
            .find_map(|l| {
                l.strip_prefix("total_commands_processed:")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

/// A way of running a round.
#[derive(Clone, Copy)]
pub(super) enum Under<'a> {
    Bare,
    Bpftrace(&'a str),
    Phaseprof(&'a [&'a str]),
}

impl Under<'_> {
    /// A side of the paired rounds: the default events, or bare.
    pub(super) fn defaults_if(with: bool) -> Self {
        if with {
            Under::Phaseprof(&[])
        } else {
            Under::Bare
        }
    }
}

/// One round's numbers: server CPU ns per command; with phaseprof, its `report --json`.
struct Round {
    cpu_per_cmd: f64,
    report: Option<serde_json::Value>,
}

/// A tracer attached to the server for a round: phaseprof or bpftrace, stopped by SIGINT.
pub(super) fn attach(pp: &std::path::Path, tmp: &str, pid: u32, how: Under) -> Option<Child> {
    let pid_s = pid.to_string();
    match how {
        Under::Bare => None,
        Under::Phaseprof(flags) => {
            let mut c = Command::new(pp)
                .args(["record", "-v", "-p", &pid_s])
                .args(flags)
                .args(["-o", tmp])
                .stderr(Stdio::piped())
                .spawn()
                .expect("phaseprof");
            let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
            read_until(&mut err, "probes attached");
            // Keep its stderr flowing (its live lines) so that it never blocks on a full pipe.
            std::thread::spawn(move || for _ in err.lines() {});
            Some(c)
        }
        Under::Bpftrace(script) => {
            let script = script.replace("cpid", &pid_s);
            let mut c = Command::new("bpftrace")
                .args(["-p", &pid_s, "-e", &script])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("bpftrace");
            let mut out = std::io::BufReader::new(c.stdout.take().unwrap());
            let mut line = String::new();
            while out.read_line(&mut line).unwrap_or(0) > 0 && !line.contains("Attaching") {
                line.clear();
            }
            std::thread::spawn(move || for _ in out.lines() {});
            // Attaching N probes is printed before they are all in force.
            std::thread::sleep(std::time::Duration::from_secs(1));
            Some(c)
        }
    }
}

/// Whether a row's flags set a budget (its totals are estimated).
pub(super) fn is_budget(flags: &[&str]) -> bool {
    flags.contains(&"--alloc-budget") || flags.contains(&"--phase-budget")
}

/// redis-benchmark on CPU 1 looping SET and GET at once (5 clients each, so that every stretch
/// of the round holds both alike), killed when dropped.
struct Load(Vec<Child>);

impl Load {
    fn start(srv: &Redis) -> Load {
        let one = |test: &str| {
            Command::new("taskset")
                .args(["-c", "1", "redis-benchmark", "-s", &srv.socket])
                .args(["-c", "5", "-n", "1000000000", "-l", "-q", "-t", test])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-benchmark")
        };
        Load(vec![one("set"), one("get")])
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A round: the load runs across the tracer's attach, as on a live node (and phaseprof watches
/// the server's work before it attaches, `--baseline`); the server's CPU per command is taken
/// from the tracer's attach on, over 2 × `requests` commands.
fn round(pp: &std::path::Path, tmp: &str, srv: &Redis, how: Under, requests: &str) -> Round {
    let pid = srv.child.id();
    let load = Load::start(srv);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let tracer = attach(pp, tmp, pid, how);
    let (c0, n0) = (cpu_exact(pid), srv.commands());
    let want = 2 * requests.parse::<u64>().unwrap();
    let mut n1 = n0;
    while n1 < n0 + want {
        std::thread::sleep(std::time::Duration::from_millis(200));
        n1 = srv.commands();
    }
    let cpu_per_cmd = (cpu_exact(pid) - c0) * 1e9 / (n1 - n0) as f64;
    let commands = (n1 - n0) as f64;
    let mut report = None;
    if let Some(mut t) = tracer {
        // SAFETY: signalling a child we spawned; SIGINT makes it write its file / print maps.
        unsafe { libc::kill(t.id() as i32, libc::SIGINT) };
        let status = t.wait().unwrap();
        if let Under::Phaseprof(_) = how {
            assert!(status.success(), "phaseprof record failed");
            let out = Command::new(pp)
                .args(["report", "--json", tmp])
                .output()
                .unwrap();
            let mut r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            r["commands"] = commands.into();
            report = Some(r);
        }
    }
    drop(load);
    Round {
        cpu_per_cmd,
        report,
    }
}

/// bpftrace doing what `--phases` does for the six functions: a call count and the time
/// between entry and return of each, per thread.
fn bpftrace_phases(exe: &str) -> String {
    let mut s = String::from(BPFTRACE_DEFAULTS);
    for f in [
        "processCommand",
        "call",
        "_writeToClient",
        "beforeSleep",
        "flushAppendOnlyFile",
        "readQueryFromClient",
    ] {
        s += &format!(
            " uprobe:{exe}:{f} {{ @in_{f}[tid] = nsecs; }} uretprobe:{exe}:{f} /@in_{f}[tid]/ \
             {{ @calls[\"{f}\"] = count(); @ns[\"{f}\"] = sum(nsecs - @in_{f}[tid]); \
             delete(@in_{f}[tid]); }}"
        );
    }
    s
}

/// bpftrace doing what `--events alloc` does: bytes and counts of jemalloc's allocations (size
/// at entry, pointer at return) and its frees.
fn bpftrace_alloc(lib: &str) -> String {
    let mut s = String::from("profile:hz:99 /pid == cpid/ { @cpu[ustack, kstack] = count(); } ");
    for f in ["malloc", "calloc", "realloc", "mallocx", "rallocx"] {
        let size = if f == "calloc" {
            "arg0 * arg1"
        } else if f.starts_with('r') || f == "realloc" {
            "arg1"
        } else {
            "arg0"
        };
        s += &format!(
            "uprobe:{lib}:{f} {{ @sz[tid] = {size}; }} uretprobe:{lib}:{f} /@sz[tid]/ \
             {{ @bytes = sum(@sz[tid]); @n = count(); @live[retval] = @sz[tid]; delete(@sz[tid]); }} "
        );
    }
    for f in ["free", "sdallocx", "dallocx"] {
        s += &format!("uprobe:{lib}:{f} {{ @frees = count(); delete(@live[arg0]); }} ");
    }
    s
}

pub fn redis_bench(pp: &std::path::Path, tmp: &str, rounds: usize, has_bpftrace: bool) {
    let Some(srv) = Redis::start() else {
        println!("redis: skipped (no redis-server: apt install redis-server redis-tools)");
        return;
    };
    let exe = std::fs::read_link(format!("/proc/{}/exe", srv.child.id()))
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let lib = "/lib/x86_64-linux-gnu/libjemalloc.so.2";
    let phases = root().join("tests/workloads/redis/phases.toml");
    let phases = phases.to_str().unwrap();
    let (bt_phases, bt_alloc) = (bpftrace_phases(&exe), bpftrace_alloc(lib));
    let with_phases = ["--phases", phases];
    let phases_budget = ["--phases", phases, "--phase-budget", "1%"];
    let alloc_budget = ["--events", "cpu,alloc", "--alloc-budget", "1%"];
    // Budgets need long rounds (BUDGET_REQUESTS), whose CPU per command differs from short
    // ones' (the server warms up): their rows are set against long rows of their own.
    let row = |name, how, long, against| Row {
        name,
        how,
        long,
        against,
    };
    let rows: Vec<Row> = [
        row("bare", Under::Bare, false, None),
        row(
            "record -p (default events)",
            Under::Phaseprof(&[]),
            false,
            None,
        ),
        row(
            "record -p --syscall-budget exact",
            Under::Phaseprof(&["--syscall-budget", "exact"]),
            false,
            None,
        ),
        row(
            "  bpftrace, the same events",
            Under::Bpftrace(BPFTRACE_DEFAULTS),
            false,
            None,
        ),
        row(
            "+ --phases (6 functions, exact)",
            Under::Phaseprof(&with_phases),
            false,
            None,
        ),
        row(
            "  bpftrace, the same events and uprobes",
            Under::Bpftrace(&bt_phases),
            false,
            None,
        ),
        row(
            "--events cpu,alloc (exact)",
            Under::Phaseprof(&["--events", "cpu,alloc"]),
            false,
            None,
        ),
        row(
            "  bpftrace, the same allocator probes",
            Under::Bpftrace(&bt_alloc),
            false,
            None,
        ),
        row("bare", Under::Bare, true, None),
        row(
            "record -p (default events)",
            Under::Phaseprof(&[]),
            true,
            None,
        ),
        row(
            "+ --phases --phase-budget 1%",
            Under::Phaseprof(&phases_budget),
            true,
            Some("record -p (default events)"),
        ),
        row(
            "record -p --events cpu",
            Under::Phaseprof(&["--events", "cpu"]),
            true,
            None,
        ),
        row(
            "--events cpu,alloc --alloc-budget 1%",
            Under::Phaseprof(&alloc_budget),
            true,
            Some("record -p --events cpu"),
        ),
    ]
    .into_iter()
    .filter(|r| has_bpftrace || !matches!(r.how, Under::Bpftrace(_)))
    .collect();
    let mut cpu: Vec<Vec<f64>> = vec![vec![]; rows.len()];
    let mut reports: Vec<Vec<serde_json::Value>> = vec![vec![]; rows.len()];
    for _ in 0..rounds {
        for (i, r) in rows.iter().enumerate() {
            let requests = if r.long { BUDGET_REQUESTS } else { REQUESTS };
            let r = round(pp, tmp, &srv, r.how, requests);
            cpu[i].push(r.cpu_per_cmd);
            reports[i].extend(r.report);
        }
    }
    print_rows(&rows, cpu, &reports, rounds);
    // The defaults' few % are within a row's noise: measured again as paired rounds.
    let pairs = paired_rounds((3 * rounds).max(10), |with| {
        let how = Under::defaults_if(with);
        let r = round(pp, tmp, &srv, how, PAIR_REQUESTS);
        let printed = r.report.map_or(Printed::NONE, |rep| {
            Printed::of(
                &rep,
                rep["commands"].as_f64().unwrap_or(f64::NAN),
                r.cpu_per_cmd,
            )
        });
        (r.cpu_per_cmd, printed)
    });
    println!(
        "  record -p (default events), {PAIR_REQUESTS} requests a round: {}",
        paired_line(&pairs, "command")
    );
    // A budget's 1.5 points are within one long round's noise too: paired long rounds, each
    // budget against the same recording without its probes.
    for (name, budgeted, against) in [
        (
            "+ --phases --phase-budget 1%, against the default events",
            &phases_budget[..],
            &[][..],
        ),
        (
            "--events cpu,alloc --alloc-budget 1%, against --events cpu",
            &alloc_budget[..],
            &["--events", "cpu"][..],
        ),
    ] {
        let pairs = paired_rounds(BUDGET_PAIRS, |with| {
            let how = Under::Phaseprof(if with { budgeted } else { against });
            let r = round(pp, tmp, &srv, how, BUDGET_REQUESTS);
            (r.cpu_per_cmd, Printed::NONE)
        });
        println!(
            "  {name}, {BUDGET_REQUESTS} requests a round: {}",
            budget_line(&pairs, 1.5)
        );
    }
}

/// A row of the table: how the server runs, in short or long rounds, and the row (of the same
/// length) a budget's cost is set against.
struct Row<'a> {
    name: &'a str,
    how: Under<'a>,
    long: bool,
    against: Option<&'a str>,
}

/// The rows: CPU per command and × the bare row of the same length; phaseprof's printed
/// estimates beside the measured slowdown; under a budget, the slowdown against its row and the
/// totals per command against the exact run's.
fn print_rows(rows: &[Row], cpu: Vec<Vec<f64>>, reports: &[Vec<serde_json::Value>], rounds: usize) {
    println!(
        "redis-server 7.0 (Debian) driven by redis-benchmark (SET and GET at once, 5 clients \
         each, unix socket, running across the attach), server CPU per command from the attach \
         on, median of {rounds} alternating rounds; {REQUESTS} requests a round, then \
         {BUDGET_REQUESTS} a round for the budgets:"
    );
    let medians: Vec<f64> = cpu.into_iter().map(median).collect();
    let find = |name: &str, long: bool| {
        let i = rows.iter().position(|r| r.name == name && r.long == long)?;
        Some(medians[i])
    };
    let mut exact_allocs_per_cmd = None;
    let mut exact_calls_per_cmd = None;
    for (i, row) in rows.iter().enumerate() {
        if row.long && matches!(row.how, Under::Bare) {
            println!("  {BUDGET_REQUESTS} requests a round:");
        }
        let m = medians[i];
        let bare = find("bare", row.long).unwrap_or(f64::NAN);
        let name = row.name;
        let mut line = format!("  {name:<42} {m:>7.0} ns  {:.3}x bare", m / bare);
        let Under::Phaseprof(flags) = row.how else {
            println!("{line}");
            continue;
        };
        if let Some(base) = row.against.and_then(|a| find(a, row.long)) {
            line += &format!(
                " ({:+.1}% vs {})",
                100.0 * (m / base - 1.0),
                row.against.unwrap()
            );
        }
        let med = |f: &dyn Fn(&serde_json::Value) -> Option<f64>| {
            let v: Vec<f64> = reports[i].iter().filter_map(f).collect();
            (!v.is_empty()).then(|| median(v))
        };
        if let Some(printed) =
            med(&|r| Some(r["probe_cost"]["ns"].as_f64()? / r["commands"].as_f64()?))
        {
            line += &format!(
                "; printed: probes {printed:.0} ns (probe_cost), {:+.0}% vs the {:.0} ns measured",
                100.0 * (printed / (m - bare) - 1.0),
                m - bare
            );
        }
        // The slowdown phaseprof measured in the server against its work before attaching.
        if let Some(s) = med(&|r| r["probe_cost"]["in_targets"]["slowdown"].as_f64()) {
            let measured = m / bare - 1.0;
            line += &format!(
                "; measured in the target {:+.1}%, {:+.0}% vs the {:+.1}% measured",
                100.0 * s,
                100.0 * (s / measured - 1.0),
                100.0 * measured
            );
        }
        // Exact phases: the phase probes' modelled time (hits × the cost per hit measured at the
        // start) against what they added to the default events.
        let model = |r: &serde_json::Value| r["phase_probes"]["model_ns"].as_f64();
        let defaults = find("record -p (default events)", row.long);
        if let (Some(model), Some(d), false) = (
            med(&|r| Some(model(r)? / r["commands"].as_f64()?)),
            defaults,
            is_budget(flags),
        ) {
            line += &format!(
                "; phase probes: hits × cost {model:.0} ns, {:+.0}% vs the {:.0} ns over the \
                 default events",
                100.0 * (model / (m - d) - 1.0),
                m - d
            );
        }
        let alloc = |r: &serde_json::Value| r["events"]["alloc"].clone();
        if let Some(est) = med(&|r| alloc(r)["estimated_overhead"].as_f64()) {
            let attached = med(&|r| alloc(r)["attached_fraction"].as_f64()).unwrap_or(1.0);
            line += &format!(
                "; alloc estimate {:+.1}% while attached ({:.1}% of the time)",
                100.0 * est,
                100.0 * attached
            );
        }
        if let Some(per_cmd) = med(&|r| Some(phase_calls(r)? / r["commands"].as_f64()?)) {
            line += &versus_exact(&mut exact_calls_per_cmd, per_cmd, "phase calls", flags);
            let budget = |r: &serde_json::Value| r["phase_budget"].clone();
            if let Some(c) = med(&|r| budget(r)["coverage"].as_f64()) {
                let slow = med(&|r| budget(r)["overhead_while_attached"].as_f64()).unwrap_or(0.0);
                line += &format!(
                    " (slices saw {:.2}% of its work, slowed {:+.0}% while attached)",
                    100.0 * c,
                    100.0 * slow
                );
            }
        }
        if let Some(per_cmd) = med(&|r| Some(alloc(r)["count"].as_f64()? / r["commands"].as_f64()?))
        {
            line += &versus_exact(&mut exact_allocs_per_cmd, per_cmd, "allocations", flags);
        }
        println!("{line}");
    }
}

/// The named phases' calls of a report (None without phases).
pub(super) fn phase_calls(r: &serde_json::Value) -> Option<f64> {
    let phases = r["phases"].as_array()?;
    let named = phases.iter().filter(|p| p["name"] != "(none)");
    let calls: f64 = named.filter_map(|p| p["calls"].as_f64()).sum();
    (calls > 0.0).then_some(calls)
}

/// `per_cmd` of `what` in words: the exact run's (the first row without a budget, kept in
/// `exact`), or a budgeted run's beside it.
pub(super) fn versus_exact(
    exact: &mut Option<f64>,
    per_cmd: f64,
    what: &str,
    flags: &[&str],
) -> String {
    match *exact {
        None if !is_budget(flags) => {
            *exact = Some(per_cmd);
            format!("; {per_cmd:.3} {what} a request")
        }
        Some(e) => format!(
            "; {per_cmd:.3} {what} a request, {:+.1}% vs exact",
            100.0 * (per_cmd / e - 1.0)
        ),
        None => String::new(),
    }
}
