//! The agent's `/metrics` for Prometheus: windows recorded and delivered, targets, what the
//! kernel side lost (every reason, stacks included), the stack maps' use, the agent's own
//! memory, probe hits and the estimated overhead.
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use phaseprof_model::{Profile, SampleKind, CPU_COUNT, SYSCALL_COUNT};

use super::push::PushMetrics;

use crate::probe_costs::{NATIVE_PHASE_CALL_NS, SYSCALL_NS};

#[derive(Default)]
pub struct AgentMetrics {
    pub windows_recorded: AtomicU64,
    pub targets: AtomicU64,
    lost_events: AtomicU64,
    /// Events recorded without (part of) their stack.
    lost_stacks: AtomicU64,
    /// Every loss counter by its reason (`lost.by_reason` of the windows), summed.
    lost_by_reason: Mutex<BTreeMap<String, u64>>,
    /// The stack maps after the last window: kernel entries, stacks cached in user space,
    /// kernel entries recycled so far.
    stack_map_entries: AtomicU64,
    stacks_cached: AtomicU64,
    stacks_pruned: AtomicU64,
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

/// What the kernel side lost in a window, by reason (stacks included).
pub fn count_losses(m: &AgentMetrics, lost: &phaseprof_model::Lost) {
    m.lost_events.fetch_add(lost.events, Ordering::Relaxed);
    m.lost_stacks.fetch_add(lost.stacks, Ordering::Relaxed);
    let mut by = m.lost_by_reason.lock().unwrap_or_else(|e| e.into_inner());
    for (reason, &n) in &lost.by_reason {
        *by.entry(reason.clone()).or_default() += n;
    }
}

/// The stack maps' use after a window.
pub fn stack_usage(m: &AgentMetrics, u: crate::engine::StackUsage) {
    m.stack_map_entries.store(u.kernel, Ordering::Relaxed);
    m.stacks_cached.store(u.cached, Ordering::Relaxed);
    m.stacks_pruned.store(u.pruned, Ordering::Relaxed);
}

/// The agent's resident memory, bytes (0 if /proc cannot tell).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(0) as u64
}

/// A window's probe hits by kind, and the slowdown of targets that ran `cpu_ns`: measured from
/// the window's cpu samples in the probes (`[phaseprof probes]`), or without cpu samples
/// estimated from the hits at the costs assumed per hit.
pub fn count_window(m: &AgentMetrics, p: &Profile, cpu_ns: u64) {
    // Phase statistics are inclusive: a call of a nested phase counts in its own phase only.
    let calls: u64 = p.phase_stats.iter().map(|s| s.calls).sum();
    let syscalls = p.total(SampleKind::Syscall, SYSCALL_COUNT);
    m.phase_probe_hits.fetch_add(2 * calls, Ordering::Relaxed);
    m.syscall_probe_hits
        .fetch_add(2 * syscalls, Ordering::Relaxed);
    m.cpu_samples
        .fetch_add(p.total(SampleKind::Cpu, CPU_COUNT), Ordering::Relaxed);
    if let Some(u) = &p.meta.unwind {
        m.unwound_samples
            .fetch_add(u.unwound_samples, Ordering::Relaxed);
        m.stack_copy_bytes
            .fetch_add(u.copied_bytes, Ordering::Relaxed);
    }
    // The window's cost at the agent's own reading of the targets' CPU time.
    let slowdown = if cpu_ns == 0 {
        0.0
    } else if let Some(cost) = p.probe_cost_over(cpu_ns) {
        cost.slowdown()
    } else {
        // Every phase call is costed as a native one (the assumed cost): a window does not
        // say which phases are Go's, whose single-stepped exits cost several times more.
        let probe_ns = calls as f64 * NATIVE_PHASE_CALL_NS + syscalls as f64 * SYSCALL_NS;
        probe_ns / (cpu_ns as f64 - probe_ns).max(1.0)
    };
    m.overhead_ppm
        .store((slowdown * 1e6) as u64, Ordering::Relaxed);
}

fn metrics_text(a: &AgentMetrics, p: &PushMetrics) -> String {
    let g = |v: &AtomicU64| v.load(Ordering::Relaxed);
    let mut text = format!(
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
         # HELP phaseprof_agent_lost_events_total Events the kernel side could not record at all.\n\
         # TYPE phaseprof_agent_lost_events_total counter\nphaseprof_agent_lost_events_total {}\n\
         # HELP phaseprof_agent_lost_stacks_total Events recorded without (part of) their stack.\n\
         # TYPE phaseprof_agent_lost_stacks_total counter\nphaseprof_agent_lost_stacks_total {}\n\
         # TYPE phaseprof_agent_stack_map_entries gauge\nphaseprof_agent_stack_map_entries {}\n\
         # TYPE phaseprof_agent_stacks_cached gauge\nphaseprof_agent_stacks_cached {}\n\
         # HELP phaseprof_agent_stacks_recycled_total Kernel stack entries no recent event used, deleted.\n\
         # TYPE phaseprof_agent_stacks_recycled_total counter\nphaseprof_agent_stacks_recycled_total {}\n\
         # TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n\
         # TYPE phaseprof_agent_probe_hits_total counter\n\
         phaseprof_agent_probe_hits_total{{probe=\"phase\"}} {}\n\
         phaseprof_agent_probe_hits_total{{probe=\"syscall\"}} {}\n\
         # TYPE phaseprof_agent_cpu_samples_total counter\nphaseprof_agent_cpu_samples_total {}\n\
         # TYPE phaseprof_agent_unwound_samples_total counter\nphaseprof_agent_unwound_samples_total {}\n\
         # TYPE phaseprof_agent_stack_copy_bytes_total counter\nphaseprof_agent_stack_copy_bytes_total {}\n\
         # HELP phaseprof_agent_estimated_overhead Probe time over the targets' own CPU time in the last window: measured from its cpu samples in the probes, else from probe hits at assumed costs.\n\
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
        g(&a.lost_stacks),
        g(&a.stack_map_entries),
        g(&a.stacks_cached),
        g(&a.stacks_pruned),
        resident_bytes(),
        g(&a.phase_probe_hits),
        g(&a.syscall_probe_hits),
        g(&a.cpu_samples),
        g(&a.unwound_samples),
        g(&a.stack_copy_bytes),
        g(&a.overhead_ppm) as f64 / 1e6,
    );
    let by = a.lost_by_reason.lock().unwrap_or_else(|e| e.into_inner());
    if !by.is_empty() {
        text.push_str("# HELP phaseprof_agent_lost_total Losses by reason (lost.by_reason of the windows).\n# TYPE phaseprof_agent_lost_total counter\n");
        for (reason, n) in by.iter() {
            text.push_str(&format!(
                "phaseprof_agent_lost_total{{reason=\"{reason}\"}} {n}\n"
            ));
        }
    }
    text
}

/// Requests of `/metrics` answered at once; more connections are closed unanswered.
const METRICS_CONNECTIONS: usize = 16;
/// A scraper has this long to send its request and read the answer.
const METRICS_TIMEOUT: Duration = Duration::from_secs(2);

/// A minimal Prometheus endpoint: every request gets the metrics. Each connection is answered
/// on its own thread under a read and write deadline, so a client that connects and sends
/// nothing delays no one.
pub fn serve_metrics(
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
