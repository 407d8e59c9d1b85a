//! `phaseprof agent --config agent.toml`: runs continuously, finds targets by name, exe or
//! cgroup (re-discovered when they restart or new ones appear), records windows, labels them
//! and pushes them to the collector; `/metrics` for Prometheus; SIGTERM or Ctrl-C flushes the
//! current window before exiting.
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use phaseprof_model::{write_profile_binary, Profile};

use super::config::AgentConfig;
use super::delivery::Delivery;
use super::metrics::{self, AgentMetrics};
use super::phases::FleetPhases;
use super::push::Sender;
use crate::engine::EngineConfig;
use crate::phases::PhasePlan;
use crate::record::{open_session, RecordOptions};
use crate::session::Turn;
use crate::targets::TargetSpec;

/// How often /proc is scanned for new targets.
const SCAN_EVERY: Duration = Duration::from_secs(1);

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
            stack_entries: cfg.stack_entries,
            offcpu_stacks: cfg.offcpu_stacks,
            ..EngineConfig::default()
        },
        unwind: cfg.unwind,
        output: Default::default(),
        phases: None,
        window: cfg.window,
        alloc_budget: cfg.alloc_budget,
        phase_budget: cfg.phase_budget,
        syscall_budget: cfg.syscall_budget,
        alloc_at_entry: false,
        baseline: std::time::Duration::ZERO,
        verbose: false,
    };
    let delivery = Delivery::start(Sender::new(
        &cfg.collector,
        cfg.ca_file.as_deref(),
        &cfg.token,
        cfg.spool_dir.clone(),
        cfg.spool_limit,
    )?)?;
    let agent_metrics = Arc::new(AgentMetrics::default());
    if let Some(addr) = cfg.metrics_listen {
        let token = cfg.metrics_token.clone();
        metrics::serve_metrics(addr, token, agent_metrics.clone(), delivery.metrics.clone())?;
    }
    let mut storage = MaybeUninit::uninit();
    let (mut session, _) = open_session(&opts, plan, None, &mut storage)?;
    session.name_in_background();
    eprintln!(
        "phaseprof: agent pushing {}-s windows to {}",
        cfg.window.as_secs_f64(),
        cfg.collector
    );
    let me = std::process::id();
    // Targets and their CPU time at the start of the window (for the overhead estimate).
    let mut known: BTreeMap<u32, u64> = BTreeMap::new();
    let mut next_scan = Instant::now();
    let submit = |p: &mut Profile, known: &mut BTreeMap<u32, u64>| -> Result<()> {
        let mut cpu_ns = 0;
        for (&pid, mark) in known.iter_mut() {
            let now = crate::target_clocks::cpu_ns(std::iter::once(pid));
            cpu_ns += now.saturating_sub(*mark);
            *mark = now;
        }
        if p.meta.pids.is_empty() {
            return Ok(()); // no target yet: nothing to say
        }
        metrics::count_window(&agent_metrics, p, cpu_ns);
        label(p, cfg);
        let mut body = Vec::new();
        write_profile_binary(p, &mut body)?;
        agent_metrics
            .windows_recorded
            .fetch_add(1, Ordering::Relaxed);
        metrics::count_losses(&agent_metrics, &p.lost);
        delivery.hand_over(body);
        Ok(())
    };
    let ((), start) = session.run_until(cfg.window, None, |session, turn| {
        if let Turn::Window { start, end } = turn {
            let mut p = session.take_window(start, end)?;
            metrics::stack_usage(&agent_metrics, session.stack_usage());
            submit(&mut p, &mut known)?;
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
                        known.insert(pid, crate::target_clocks::cpu_ns(std::iter::once(pid)));
                    }
                    // Gone between the scan and the attach, or not ours to read: try again later.
                    Err(e) => eprintln!("phaseprof: pid {pid}: {e:#}"),
                }
            }
            agent_metrics
                .targets
                .store(known.len() as u64, Ordering::Relaxed);
        }
        Ok(None)
    })?;
    // SIGTERM: the current window is recorded and delivered (or spooled) before exiting.
    let mut last = session.finish(start, SystemTime::now())?;
    submit(&mut last, &mut known)?;
    delivery.finish();
    eprintln!("phaseprof: agent stopped");
    Ok(())
}
