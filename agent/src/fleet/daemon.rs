//! `phaseprof agent --config agent.toml`: runs continuously, finds targets by name, exe or
//! cgroup (re-discovered when they restart or new ones appear), records windows, labels them
//! and pushes them to the collector; `/metrics` for Prometheus; SIGTERM or Ctrl-C flushes the
//! current window before exiting.
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use phaseprof_model::{write_profile, Profile};

use super::config::AgentConfig;
use super::phases::FleetPhases;
use super::push::{PushMetrics, Sender};
use crate::engine::EngineConfig;
use crate::phases::PhasePlan;
use crate::record::{open_session, RecordOptions};
use crate::session::Turn;
use crate::targets::TargetSpec;

/// How often /proc is scanned for new targets.
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// Probe costs as `bench` measured them on the development VM (README, Performance): a native
/// phase call (entry uprobe + uretprobe; Go's return-instruction probes cost about 2.3 times
/// more, so Go targets are underestimated), and a target's syscall counted with its latency,
/// without and with its user stack.
const NS_PER_PHASE_CALL: f64 = 7634.0;
const NS_PER_SYSCALL: f64 = 460.0;
const NS_PER_SYSCALL_WITH_STACK: f64 = 1473.0;

#[derive(Default)]
struct AgentMetrics {
    windows_recorded: AtomicU64,
    targets: AtomicU64,
    lost_events: AtomicU64,
    phase_probe_hits: AtomicU64,
    syscall_probe_hits: AtomicU64,
    cpu_samples: AtomicU64,
    /// Samples unwound from stack copies (targets without frame pointers), and the bytes of
    /// stack the kernel copied for them (the ring buffer's bandwidth).
    unwound_samples: AtomicU64,
    stack_copy_bytes: AtomicU64,
    /// Of the last window, in millionths: probe time estimated from the hits over the targets'
    /// own CPU time.
    overhead_ppm: AtomicU64,
}

/// A window's probe hits by kind, and the estimated slowdown of targets that ran `cpu_ns`.
fn count_window(m: &AgentMetrics, p: &Profile, cpu_ns: u64) {
    // Phase statistics are inclusive: a call of a nested phase counts in its own phase only.
    let calls: u64 = p.phase_stats.iter().map(|s| s.calls).sum();
    let syscalls: u64 = p.syscalls.iter().map(|s| s.count).sum();
    // Sampled stacks: one syscall in `every` pays for its stack.
    let every = p.meta.syscall_stack_every.max(1) as f64;
    let per_syscall = if p.meta.syscall_stacks {
        NS_PER_SYSCALL + (NS_PER_SYSCALL_WITH_STACK - NS_PER_SYSCALL) / every
    } else {
        NS_PER_SYSCALL
    };
    let probe_ns = calls as f64 * NS_PER_PHASE_CALL + syscalls as f64 * per_syscall;
    let own = (cpu_ns as f64 - probe_ns).max(1.0);
    m.phase_probe_hits.fetch_add(2 * calls, Ordering::Relaxed);
    m.syscall_probe_hits
        .fetch_add(2 * syscalls, Ordering::Relaxed);
    m.cpu_samples
        .fetch_add(p.cpu.iter().map(|s| s.count).sum(), Ordering::Relaxed);
    if let Some(u) = &p.meta.unwind {
        m.unwound_samples
            .fetch_add(u.unwound_samples, Ordering::Relaxed);
        m.stack_copy_bytes
            .fetch_add(u.copied_bytes, Ordering::Relaxed);
    }
    let ppm = if cpu_ns == 0 {
        0.0
    } else {
        probe_ns / own * 1e6
    };
    m.overhead_ppm.store(ppm as u64, Ordering::Relaxed);
}

fn metrics_text(a: &AgentMetrics, p: &PushMetrics) -> String {
    let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
    format!(
        "# TYPE phaseprof_agent_windows_recorded_total counter\nphaseprof_agent_windows_recorded_total {}\n\
         # TYPE phaseprof_agent_windows_sent_total counter\nphaseprof_agent_windows_sent_total {}\n\
         # TYPE phaseprof_agent_windows_spooled_total counter\nphaseprof_agent_windows_spooled_total {}\n\
         # TYPE phaseprof_agent_windows_dropped_total counter\nphaseprof_agent_windows_dropped_total {}\n\
         # TYPE phaseprof_agent_windows_rejected_total counter\nphaseprof_agent_windows_rejected_total {}\n\
         # TYPE phaseprof_agent_windows_split_total counter\nphaseprof_agent_windows_split_total {}\n\
         # HELP phaseprof_agent_collector_auth_failures_total Uploads the collector refused as unauthorized (401/403): its windows stay spooled.\n\
         # TYPE phaseprof_agent_collector_auth_failures_total counter\nphaseprof_agent_collector_auth_failures_total {}\n\
         # TYPE phaseprof_agent_spool_windows gauge\nphaseprof_agent_spool_windows {}\n\
         # TYPE phaseprof_agent_targets gauge\nphaseprof_agent_targets {}\n\
         # TYPE phaseprof_agent_lost_events_total counter\nphaseprof_agent_lost_events_total {}\n\
         # TYPE phaseprof_agent_probe_hits_total counter\n\
         phaseprof_agent_probe_hits_total{{probe=\"phase\"}} {}\n\
         phaseprof_agent_probe_hits_total{{probe=\"syscall\"}} {}\n\
         # TYPE phaseprof_agent_cpu_samples_total counter\nphaseprof_agent_cpu_samples_total {}\n\
         # TYPE phaseprof_agent_unwound_samples_total counter\nphaseprof_agent_unwound_samples_total {}\n\
         # TYPE phaseprof_agent_stack_copy_bytes_total counter\nphaseprof_agent_stack_copy_bytes_total {}\n\
         # HELP phaseprof_agent_estimated_overhead Probe time over the targets' own CPU time in the last window (phase and syscall probes, at their measured costs).\n\
         # TYPE phaseprof_agent_estimated_overhead gauge\nphaseprof_agent_estimated_overhead {}\n",
        g(&a.windows_recorded),
        g(&p.windows_sent),
        g(&p.windows_spooled),
        g(&p.windows_dropped),
        g(&p.windows_rejected),
        g(&p.windows_split),
        g(&p.auth_failures),
        g(&p.spool_files),
        g(&a.targets),
        g(&a.lost_events),
        g(&a.phase_probe_hits),
        g(&a.syscall_probe_hits),
        g(&a.cpu_samples),
        g(&a.unwound_samples),
        g(&a.stack_copy_bytes),
        g(&a.overhead_ppm) as f64 / 1e6,
    )
}

/// Requests of `/metrics` answered at once; more connections are closed unanswered.
const METRICS_CONNECTIONS: usize = 16;
/// A scraper has this long to send its request and read the answer.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// A minimal Prometheus endpoint: every request gets the metrics. Each connection is answered
/// on its own thread under a read and write deadline, so a client that connects and sends
/// nothing delays no one.
fn serve_metrics(
    addr: std::net::SocketAddr,
    token: Option<String>,
    a: Arc<AgentMetrics>,
    p: Arc<PushMetrics>,
) -> Result<()> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("metrics: cannot listen on {addr}"))?;
    eprintln!(
        "phaseprof: metrics on http://{}/metrics",
        listener.local_addr()?
    );
    let busy = Arc::new(AtomicU64::new(0));
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            if busy.load(Ordering::Relaxed) >= METRICS_CONNECTIONS as u64 {
                continue; // dropped: closed
            }
            busy.fetch_add(1, Ordering::Relaxed);
            let (a, p, done, token) = (a.clone(), p.clone(), busy.clone(), token.clone());
            let spawned = std::thread::Builder::new()
                .name("metrics".into())
                .spawn(move || {
                    answer_metrics(conn, token.as_deref(), &a, &p);
                    done.fetch_sub(1, Ordering::Relaxed);
                });
            if spawned.is_err() {
                busy.fetch_sub(1, Ordering::Relaxed);
            }
        }
    });
    Ok(())
}

/// The value of header `name` in a request head.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// Whether a request may read the metrics: its bearer token where one is set, else a loopback
/// Host (a page elsewhere that rebinds its name to 127.0.0.1 names its own host).
fn allowed(head: &str, token: Option<&str>) -> Result<(), &'static str> {
    use phaseprof_view::web::auth;
    match token {
        Some(t) => header(head, "authorization")
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|got| auth::same(got, t))
            .then_some(())
            .ok_or("401 Unauthorized"),
        None => {
            let host = header(head, "host").and_then(|h| axum::http::HeaderValue::from_str(h).ok());
            auth::is_loopback_host(host.as_ref())
                .then_some(())
                .ok_or("403 Forbidden")
        }
    }
}

fn answer_metrics(
    mut conn: std::net::TcpStream,
    token: Option<&str>,
    a: &AgentMetrics,
    p: &PushMetrics,
) {
    let _ = conn.set_read_timeout(Some(METRICS_TIMEOUT));
    let _ = conn.set_write_timeout(Some(METRICS_TIMEOUT));
    // The request head, up to its blank line (or the deadline, or 8 KiB).
    let deadline = Instant::now() + METRICS_TIMEOUT;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if Instant::now() > deadline {
            return;
        }
    }
    if let Err(status) = allowed(&String::from_utf8_lossy(&head), token) {
        let _ = write!(conn, "HTTP/1.0 {status}\r\nContent-Length: 0\r\n\r\n");
        return;
    }
    let body = metrics_text(a, p);
    let _ = write!(
        conn,
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
}

/// Labels of a window: the config's, `host` (default: the hostname), `build_id` of the target.
fn label(p: &mut Profile, cfg: &AgentConfig) {
    let mut labels = cfg.labels.clone();
    labels
        .entry("host".into())
        .or_insert_with(|| p.meta.host.clone());
    if let Some(b) = &p.meta.build_id {
        labels.entry("build_id".into()).or_insert_with(|| b.clone());
    }
    p.meta.labels = labels;
}

pub fn run(cfg: &AgentConfig, stop: Arc<AtomicBool>) -> Result<()> {
    crate::preflight::check_can_record()?;
    let mut phases = FleetPhases::load(&cfg.targets)?;
    let plan = PhasePlan::from_config(&phases.merged, "agent phases")?;
    let opts = RecordOptions {
        target: TargetSpec::Pids(vec![]),
        duration: None,
        engine: EngineConfig {
            events: cfg.events.clone(),
            stack_copy_bytes: cfg.stack_copy_bytes,
            ..EngineConfig::default()
        },
        unwind: cfg.unwind,
        output: Default::default(),
        phases: None,
        window: cfg.window,
        alloc_budget: None,
        alloc_at_entry: false,
        verbose: false,
    };
    let mut sender = Sender::new(
        &cfg.collector,
        cfg.ca_file.as_deref(),
        &cfg.token,
        cfg.spool_dir.clone(),
        cfg.spool_limit,
    )?;
    let agent_metrics = Arc::new(AgentMetrics::default());
    if let Some(addr) = cfg.metrics_listen {
        let token = cfg.metrics_token.clone();
        serve_metrics(addr, token, agent_metrics.clone(), sender.metrics.clone())?;
    }
    let mut storage = MaybeUninit::uninit();
    let (mut session, _) = open_session(&opts, plan, None, &mut storage)?;
    eprintln!(
        "phaseprof: agent pushing {}-s windows to {}",
        cfg.window.as_secs_f64(),
        cfg.collector
    );
    let me = std::process::id();
    // Targets and their CPU time at the start of the window (for the overhead estimate).
    let mut known: BTreeMap<u32, u64> = BTreeMap::new();
    let mut next_scan = Instant::now();
    let submit = |p: &mut Profile, sender: &mut Sender, known: &mut BTreeMap<u32, u64>| {
        let mut cpu_ns = 0;
        for (&pid, mark) in known.iter_mut() {
            let now = crate::targets::cpu_ns(std::iter::once(pid));
            cpu_ns += now.saturating_sub(*mark);
            *mark = now;
        }
        if p.meta.pids.is_empty() {
            return Ok(()); // no target yet: nothing to say
        }
        count_window(&agent_metrics, p, cpu_ns);
        label(p, cfg);
        let mut body = Vec::new();
        write_profile(p, &mut body)?;
        agent_metrics
            .windows_recorded
            .fetch_add(1, Ordering::Relaxed);
        agent_metrics
            .lost_events
            .fetch_add(p.lost.events, Ordering::Relaxed);
        sender.submit(body)
    };
    let ((), start) = session.run_until(cfg.window, None, |session, turn| {
        if let Turn::Window { start, end } = turn {
            let mut p = session.take_window(start, end)?;
            submit(&mut p, &mut sender, &mut known)?;
            return Ok(None);
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(Some(()));
        }
        if Instant::now() >= next_scan {
            next_scan += SCAN_EVERY;
            session.prune_exited();
            known.retain(|pid, _| session.live().contains(pid));
            for pid in crate::targets::all_pids() {
                // A zombie still matches by name but has nothing left to record.
                if pid == me || known.contains_key(&pid) || !crate::targets::process_alive(pid) {
                    continue;
                }
                let Some(target) = cfg.targets.iter().position(|t| t.rule.matches(pid)) else {
                    continue;
                };
                let comm = crate::targets::read_comm(pid, pid).unwrap_or_default();
                if let Some((config, file, ids)) = phases.to_probe(target, pid) {
                    // A phases file that does not fit this build is reported; the target is
                    // still recorded, without phases.
                    if let Err(e) = session.attach_phases(pid, config, file, ids) {
                        eprintln!("phaseprof: pid {pid} ({comm}): no phases: {e:#}");
                    }
                }
                match session.add_target(pid) {
                    Ok(()) => {
                        eprintln!("phaseprof: recording pid {pid} ({comm})");
                        known.insert(pid, crate::targets::cpu_ns(std::iter::once(pid)));
                    }
                    // Gone between the scan and the attach, or not ours to read: try again later.
                    Err(e) => eprintln!("phaseprof: pid {pid}: {e:#}"),
                }
            }
            agent_metrics
                .targets
                .store(known.len() as u64, Ordering::Relaxed);
            sender.flush_spool(false);
        }
        Ok(None)
    })?;
    // SIGTERM: the current window is recorded and delivered (or spooled) before exiting.
    let mut last = session.finish(start, SystemTime::now())?;
    submit(&mut last, &mut sender, &mut known)?;
    sender.flush_spool(true);
    eprintln!("phaseprof: agent stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks who may read /metrics: with a token only its bearer; without one only requests
    // naming a loopback host (a rebinding page names its own).
    #[test]
    fn metrics_need_the_token_or_a_loopback_host() {
        let head = |extra: &str| format!("GET /metrics HTTP/1.1\r\n{extra}\r\n");
        assert!(allowed(&head("Host: 127.0.0.1:9464\r\n"), None).is_ok());
        assert!(allowed(&head("Host: localhost\r\n"), None).is_ok());
        assert!(allowed(&head("Host: evil.example:9464\r\n"), None).is_err());
        let t = Some("s3cret-token-s3cret");
        assert!(allowed(&head("Host: localhost\r\n"), t).is_err());
        let ok = "Host: x\r\nAuthorization: Bearer s3cret-token-s3cret\r\n";
        assert!(allowed(&head(ok), t).is_ok());
        let bad = "Host: x\r\nAuthorization: Bearer wrong\r\n";
        assert!(allowed(&head(bad), t).is_err());
    }
}
