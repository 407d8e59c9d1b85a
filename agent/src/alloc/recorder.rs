//! Allocation probes over a recording: found and attached per target, their cost estimated
//! from probe hits and the targets' CPU time, and duty-cycled when a budget is set.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use phaseprof_model::AllocInfo;

use super::budget::{overhead, DutyCycle};
use super::go_rate::GoRate;
use super::sites::{self, AllocKind, AllocSite};
use crate::engine::Engine;

/// How often the estimated overhead is printed while recording.
const REPORT_EVERY: Duration = Duration::from_secs(5);

pub struct AllocRecorder {
    at_entry: bool,
    sample_bytes: u64,
    sites: HashMap<u32, Vec<AllocSite>>,
    probes: Vec<String>,
    duty: Option<DutyCycle>,
    attached: bool,
    /// Start of the current on- or off-slice (duty cycling) or report interval.
    slice_start: Instant,
    hits_at_slice: u64,
    cpu_at_slice: u64,
    last_report: Instant,
    hits_at_report: u64,
    cpu_at_report: u64,
    /// Probe hits and the targets' CPU time (probes included) while attached, so far.
    hits_total: u64,
    cpu_while_on: u64,
    go_sampled: bool,
    go_rates: Vec<GoRate>,
}

/// CPU time of every thread of `pids`, in ns (exact: schedstat, not clock ticks).
fn targets_cpu_ns(pids: impl Iterator<Item = u32>) -> u64 {
    let mut total = 0;
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let path = t.path().join("schedstat");
            if let Ok(s) = std::fs::read_to_string(path) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

impl AllocRecorder {
    pub fn new(sample_bytes: u64, budget: Option<f64>, at_entry: bool) -> Self {
        let now = Instant::now();
        AllocRecorder {
            at_entry,
            sample_bytes,
            sites: HashMap::new(),
            probes: Vec::new(),
            duty: budget.map(DutyCycle::new),
            attached: true,
            slice_start: now,
            hits_at_slice: 0,
            cpu_at_slice: 0,
            last_report: now,
            hits_at_report: 0,
            cpu_at_report: 0,
            hits_total: 0,
            cpu_while_on: 0,
            go_sampled: false,
            go_rates: Vec::new(),
        }
    }

    /// Finds the allocator functions of `pid` in `objects` and attaches their probes.
    pub fn add_target(&mut self, engine: &mut Engine<'_>, pid: u32, objects: &[PathBuf]) -> Result<()> {
        let mut found = sites::find(objects)?;
        if self.at_entry {
            found = sites::at_entry(found);
        }
        if found.is_empty() {
            eprintln!("phaseprof: pid {pid}: no allocator functions found (malloc/free, jemalloc, mimalloc, Go); no allocations will be recorded");
        }
        if self.probes.is_empty() {
            self.probes = sites::describe(&found).split("; ").map(String::from).collect();
            self.go_sampled = found
                .iter()
                .any(|s| matches!(s.kind, AllocKind::GoSample { .. }));
        }
        for s in &found {
            if let AllocKind::GoSample { rate_addr, .. } = s.kind {
                if rate_addr != 0 {
                    self.go_rates.push(GoRate { pid, addr: rate_addr, replaced: None });
                }
            }
        }
        if self.attached {
            engine.attach_alloc(pid, &found)?;
        }
        self.sites.insert(pid, found);
        Ok(())
    }

    pub fn remove_target(&mut self, pid: u32) {
        self.sites.remove(&pid);
        self.go_rates.retain(|g| g.pid != pid);
    }

    pub fn probes(&self) -> &[String] {
        &self.probes
    }

    /// Called often while recording: prints the estimated overhead every few seconds and,
    /// with a budget, detaches or re-attaches the probes at slice boundaries.
    pub fn tick(&mut self, engine: &mut Engine<'_>) -> Result<()> {
        let now = Instant::now();
        let pids: Vec<u32> = self.sites.keys().copied().collect();
        for g in &mut self.go_rates {
            g.ensure_sampling();
        }
        if let Some(duty) = &mut self.duty {
            let elapsed = now - self.slice_start;
            if self.attached && elapsed >= duty.on_time() {
                let hits = engine.alloc_probe_hits()? - self.hits_at_slice;
                let cpu = targets_cpu_ns(pids.iter().copied()).saturating_sub(self.cpu_at_slice);
                let own = cpu.saturating_sub((hits as f64 * super::budget::NS_PER_HIT) as u64);
                let cost = overhead(hits, own);
                self.hits_total += hits;
                self.cpu_while_on += cpu;
                duty.on_ns += elapsed.as_nanos() as u64;
                duty.adapt(cost);
                if duty.on_fraction < 1.0 {
                    engine.detach_alloc();
                    self.attached = false;
                }
                self.start_slice(engine, &pids)?;
            } else if !self.attached && elapsed >= duty.off_time() {
                for (&pid, found) in &self.sites {
                    engine.attach_alloc(pid, found)?;
                }
                self.attached = true;
                self.start_slice(engine, &pids)?;
            }
        }
        if now - self.last_report >= REPORT_EVERY {
            let hits = engine.alloc_probe_hits()?;
            let cpu = targets_cpu_ns(pids.iter().copied());
            let d_hits = hits - self.hits_at_report;
            let d_cpu = cpu.saturating_sub(self.cpu_at_report);
            let secs = (now - self.last_report).as_secs_f64();
            let own = d_cpu.saturating_sub((d_hits as f64 * super::budget::NS_PER_HIT) as u64);
            let mut line = format!(
                "phaseprof: alloc probes: {:.0} hits/s, estimated overhead {:.2}% of the target's CPU",
                d_hits as f64 / secs,
                overhead(d_hits, own) * 100.0
            );
            if let Some(d) = &self.duty {
                line += &format!(
                    " (budget {:.2}%: attached {:.1}% of the time)",
                    d.budget * 100.0,
                    d.on_fraction * 100.0
                );
            }
            eprintln!("{line}");
            if self.duty.is_none() {
                self.hits_total += d_hits;
                self.cpu_while_on += d_cpu;
            }
            self.last_report = now;
            self.hits_at_report = hits;
            self.cpu_at_report = cpu;
        }
        Ok(())
    }

    fn start_slice(&mut self, engine: &Engine<'_>, pids: &[u32]) -> Result<()> {
        self.slice_start = Instant::now();
        self.hits_at_slice = engine.alloc_probe_hits()?;
        self.cpu_at_slice = targets_cpu_ns(pids.iter().copied());
        Ok(())
    }

    /// At the end of the recording (`total` long): the record of how allocations were taken,
    /// and the factor that scales what was counted while attached up to the whole recording.
    pub fn finish(&mut self, engine: &Engine<'_>, total: Duration) -> Result<(AllocInfo, f64)> {
        let now = Instant::now();
        for g in &mut self.go_rates {
            g.restore();
        }
        let pids: Vec<u32> = self.sites.keys().copied().collect();
        let (hits, cpu) = if self.duty.is_some() {
            if self.attached {
                let h = engine.alloc_probe_hits()? - self.hits_at_slice;
                let c = targets_cpu_ns(pids.iter().copied()).saturating_sub(self.cpu_at_slice);
                if let Some(d) = &mut self.duty {
                    d.on_ns += (now - self.slice_start).as_nanos() as u64;
                }
                (self.hits_total + h, self.cpu_while_on + c)
            } else {
                (self.hits_total, self.cpu_while_on)
            }
        } else {
            let h = engine.alloc_probe_hits()? - self.hits_at_report;
            let c = targets_cpu_ns(pids.iter().copied()).saturating_sub(self.cpu_at_report);
            (self.hits_total + h, self.cpu_while_on + c)
        };
        let (fraction, scale) = match &mut self.duty {
            Some(d) => {
                d.total_ns = total.as_nanos() as u64;
                let f = (d.on_ns as f64 / d.total_ns.max(1) as f64).min(1.0);
                (f, if f > 0.0 { 1.0 / f } else { 1.0 })
            }
            None => (1.0, 1.0),
        };
        let info = AllocInfo {
            sample_bytes: self.sample_bytes,
            probes: self.probes.clone(),
            budget: self.duty.as_ref().map(|d| d.budget),
            attached_fraction: fraction,
            estimated_overhead: overhead(
                hits,
                cpu.saturating_sub((hits as f64 * super::budget::NS_PER_HIT) as u64),
            ),
            go_sampled: self.go_sampled,
        };
        Ok((info, scale))
    }
}
