//! Allocation probes over a recording: found and attached per target, their cost estimated
//! from probe hits and the targets' CPU time, and duty-cycled when a budget is set.
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use phaseprof_model::AllocInfo;

use super::go_rate::GoRate;
use super::sites::{self, AllocKind, AllocSite};
use crate::duty_cycle::{overhead, own_cpu_ns, slowdown_by_syscalls, DutyCycle};
use crate::engine::Engine;
use crate::probe_costs::ALLOC_HIT_NS;

/// How often the estimated overhead is printed while recording.
const REPORT_EVERY: Duration = Duration::from_secs(5);

pub struct AllocRecorder {
    at_entry: bool,
    sample_bytes: u64,
    sites: HashMap<u32, Vec<AllocSite>>,
    probes: Vec<String>,
    duty: Option<DutyCycle>,
    attached: bool,
    started: Instant,
    /// Start of the current attached slice (duty cycling), and of its measurement (once every
    /// probe is in force).
    slice_start: Instant,
    measure_start: Instant,
    hits_at_slice: u64,
    cpu_at_slice: u64,
    /// The targets' CPU time when the slice in force began attaching (it spends from there).
    spend_from: u64,
    last_report: Instant,
    hits_at_report: u64,
    cpu_at_report: u64,
    /// Probe hits and the targets' CPU time (probes included) while attached, so far.
    hits_total: u64,
    cpu_while_on: u64,
    /// Duty cycling: the targets' own CPU time (probes excluded) while allocations were
    /// counted, and their CPU time at the latest tick (the counter starts at 0 as each target
    /// is added, as the syscalls' does). Totals are extrapolated by CPU time (or syscalls), not
    /// wall time: while attached the target runs slower, so it allocates less per second than
    /// it does unprobed.
    counted_own_ns: u64,
    cpu_last: u64,
    go_sampled: bool,
    go_rates: Vec<GoRate>,
    /// Probe hits and the targets' CPU time at the last window (`window_info`).
    hits_at_window: u64,
    cpu_at_window: u64,
    /// Duty cycling in a session cut in windows: what the current window counted.
    window: WindowDuty,
    /// The targets' CPU time (every mark above is of this counter).
    cpu: crate::target_clocks::CpuClock,
    /// The targets' read and write syscalls: at the latest tick, the slice in force's start
    /// and the last window, and those made while counted (a budget's totals are extrapolated
    /// by them when they err less than the CPU time: `AllocInfo::basis`).
    io: crate::target_clocks::IoSyscallClock,
    sys_last: u64,
    sys_at_slice: u64,
    sys_at_window: u64,
    sys_in_slices: u64,
    /// The probes' slowdown while attached, measured by the syscalls (`slowdown_by_syscalls`).
    slowdown: Option<f64>,
    /// What a probe hit costs, in ns of the targets' CPU: measured while recording
    /// (`calibrate`), ALLOC_HIT_NS until then.
    ns_per_hit: f64,
    measured_cost: bool,
}

/// Duty cycling over a window (the agent, `attach`): its attached time, probe hits and the
/// targets' own CPU time while counted, from marks set where a slice or the window began.
#[derive(Default)]
struct WindowDuty {
    on_ns: u64,
    hits: u64,
    counted_own_ns: u64,
    /// The targets' own CPU time of earlier windows in which no slice counted anything: their
    /// allocations are extrapolated in the next window that counted some, so that sums over
    /// windows (the collector's merged views) stay unbiased; the same for their syscalls.
    uncounted_own_ns: u64,
    uncounted_sys: u64,
    /// The targets' read and write syscalls while counted.
    sys_in: u64,
    hits_mark: u64,
    cpu_mark: u64,
    sys_mark: u64,
    on_mark: Option<Instant>,
    started: Option<Instant>,
}

impl WindowDuty {
    /// Adds what the attached stretch since the marks counted, `hits`, `cpu` and `sys` being
    /// the counters now; the marks move to now.
    fn count_until(&mut self, (hits, cpu, sys): (u64, u64, u64), now: Instant, ns_per_hit: f64) {
        let (h, c) = (
            hits.saturating_sub(self.hits_mark),
            cpu.saturating_sub(self.cpu_mark),
        );
        self.hits += h;
        self.counted_own_ns += own_cpu_ns(c, h, ns_per_hit);
        self.sys_in += sys.saturating_sub(self.sys_mark);
        if let Some(on) = self.on_mark {
            self.on_ns += (now - on).as_nanos() as u64;
        }
        (self.hits_mark, self.cpu_mark, self.sys_mark) = (hits, cpu, sys);
        self.on_mark = Some(now);
    }
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
            // With a budget, probes wait for the budget to accrue a first slice.
            attached: budget.is_none(),
            started: now,
            slice_start: now,
            measure_start: now,
            hits_at_slice: 0,
            cpu_at_slice: 0,
            spend_from: 0,
            last_report: now,
            hits_at_report: 0,
            cpu_at_report: 0,
            hits_total: 0,
            cpu_while_on: 0,
            counted_own_ns: 0,
            cpu_last: 0,
            go_sampled: false,
            go_rates: Vec::new(),
            hits_at_window: 0,
            cpu_at_window: 0,
            window: WindowDuty::default(),
            cpu: crate::target_clocks::CpuClock::default(),
            io: crate::target_clocks::IoSyscallClock::default(),
            sys_last: 0,
            sys_at_slice: 0,
            sys_at_window: 0,
            sys_in_slices: 0,
            slowdown: None,
            ns_per_hit: ALLOC_HIT_NS,
            measured_cost: false,
        }
    }

    /// The targets' CPU time so far (see `CpuClock`).
    fn cpu_now(&mut self) -> u64 {
        let pids: Vec<u32> = self.sites.keys().copied().collect();
        self.cpu.read(pids.into_iter())
    }

    /// The targets' CPU time per ns of the recording so far, at `now`.
    fn cpu_last_rate(&self, now: Instant) -> f64 {
        self.cpu_last as f64 / (now - self.started).as_nanos().max(1) as f64
    }

    /// The targets' read and write syscalls so far (see `IoSyscallClock`).
    fn sys_now(&mut self) -> u64 {
        let pids: Vec<u32> = self.sites.keys().copied().collect();
        self.io.read(pids.into_iter())
    }

    /// A probe hit's cost as measured while recording (`UprobeHitCost`), in ns.
    pub fn calibrate(&mut self, ns_per_hit: f64) {
        self.ns_per_hit = ns_per_hit;
        self.measured_cost = true;
    }

    /// The probes' slowdown of the targets for `hits` in `cpu` ns of their CPU time.
    fn overhead(&self, hits: u64, cpu: u64) -> f64 {
        overhead(
            hits,
            own_cpu_ns(cpu, hits, self.ns_per_hit),
            self.ns_per_hit,
        )
    }

    /// Finds the allocator functions of `pid` in `objects` and attaches their probes.
    pub fn add_target(
        &mut self,
        engine: &mut Engine<'_>,
        pid: u32,
        objects: &[PathBuf],
    ) -> Result<()> {
        let found = sites::find(objects, self.at_entry)?;
        if found.is_empty() {
            eprintln!("phaseprof: pid {pid}: no allocator functions found (malloc/free, jemalloc, mimalloc, Go); no allocations will be recorded");
        }
        if self.probes.is_empty() {
            self.probes = sites::describe(&found)
                .split("; ")
                .map(String::from)
                .collect();
            self.go_sampled = found
                .iter()
                .any(|s| matches!(s.kind, AllocKind::GoSample { .. }));
        }
        for s in &found {
            if let AllocKind::GoSample { rate_addr, .. } = s.kind {
                if rate_addr != 0 {
                    match GoRate::open(pid, rate_addr) {
                        Ok(g) => self.go_rates.push(g),
                        Err(e) => eprintln!(
                            "phaseprof: pid {pid}: cannot open its memory to turn Go heap sampling on ({e}); allocation stacks only if the program samples itself"
                        ),
                    }
                }
            }
        }
        if self.attached {
            engine.attach_alloc(pid, &probe_specs(&found))?;
        }
        self.sites.insert(pid, found);
        // Its CPU time and syscalls count from now on.
        self.cpu_now();
        self.sys_now();
        Ok(())
    }

    /// How a window's allocations were taken (a session cut in windows: the agent, `attach`),
    /// and the factor that scales what it counted up to the whole window (1 without a budget:
    /// probes always attached, the estimated slowdown over the window's hits and CPU time).
    pub fn window_info(&mut self, engine: &Engine<'_>) -> Result<(AllocInfo, f64)> {
        let hits = engine.alloc_probe_hits()?;
        let cpu = self.cpu_now();
        let sys = self.sys_now();
        let sys_all = sys.saturating_sub(self.sys_at_window);
        self.sys_at_window = sys;
        let now = Instant::now();
        let (h, c) = (
            hits.saturating_sub(self.hits_at_window),
            cpu.saturating_sub(self.cpu_at_window),
        );
        (self.hits_at_window, self.cpu_at_window) = (hits, cpu);
        let mut info = AllocInfo {
            sample_bytes: self.sample_bytes,
            probes: self.probes.clone(),
            budget: None,
            attached_fraction: 1.0,
            estimated_overhead: self.overhead(h, c),
            ns_per_hit: self.ns_per_hit,
            ns_per_hit_measured: self.measured_cost,
            go_sampled: self.go_sampled,
            syscalls_in_slices: 0,
            syscalls: 0,
            counted_own_ns: 0,
        };
        let ns_per_hit = self.ns_per_hit;
        let Some(duty) = &self.duty else {
            return Ok((info, 1.0));
        };
        let w = &mut self.window;
        if self.attached {
            w.count_until((hits, cpu, sys), now, ns_per_hit);
        }
        let wall = now - w.started.unwrap_or(self.started);
        let own = own_cpu_ns(c, h, ns_per_hit) + w.uncounted_own_ns;
        info.budget = Some(duty.budget);
        info.attached_fraction = (w.on_ns as f64 / wall.as_nanos().max(1) as f64).min(1.0);
        // The slowdown while attached, as `record` says it.
        info.estimated_overhead =
            (self.slowdown).unwrap_or_else(|| overhead(w.hits, w.counted_own_ns, ns_per_hit));
        (info.syscalls_in_slices, info.syscalls) = (w.sys_in, sys_all + w.uncounted_sys);
        info.counted_own_ns = w.counted_own_ns;
        let scale = extrapolation(&info, own);
        let counted = w.counted_own_ns > 0 || w.sys_in > 0;
        *w = WindowDuty {
            uncounted_own_ns: if counted { 0 } else { own },
            uncounted_sys: if counted { 0 } else { info.syscalls },
            hits_mark: hits,
            cpu_mark: cpu,
            sys_mark: sys,
            on_mark: self.attached.then_some(now),
            started: Some(now),
            ..WindowDuty::default()
        };
        Ok((info, scale))
    }

    /// A target gone: its last counts read (while its /proc entry is still there), then it is
    /// left out.
    pub fn remove_target(&mut self, pid: u32) {
        self.cpu.read(std::iter::once(pid));
        self.sys_last = self.sys_last.max(self.io.read(std::iter::once(pid)));
        self.sites.remove(&pid);
        self.go_rates.retain(|g| g.pid != pid);
    }

    pub fn probes(&self) -> &[String] {
        &self.probes
    }

    /// When `tick` next has something to do (the end of an attached slice), so the recording
    /// loop can wake up for it.
    pub fn next_deadline(&self) -> Option<Instant> {
        match &self.duty {
            Some(d) if self.attached => Some(self.measure_start + d.slice()),
            Some(_) => Some(Instant::now() + Duration::from_millis(10)),
            None => None,
        }
    }

    /// Called often while recording: prints the estimated overhead every few seconds and,
    /// with a budget, attaches the probes for a slice when the budget allows and detaches them
    /// at its end.
    pub fn tick(&mut self, engine: &mut Engine<'_>) -> Result<()> {
        let now = Instant::now();
        for g in &mut self.go_rates {
            g.ensure_sampling();
        }
        if self.duty.is_some() {
            self.duty_tick(engine, now)?;
        }
        if now - self.last_report >= REPORT_EVERY {
            let hits = engine.alloc_probe_hits()?;
            let cpu = self.cpu_now();
            let d_hits = hits - self.hits_at_report;
            let d_cpu = cpu.saturating_sub(self.cpu_at_report);
            let secs = (now - self.last_report).as_secs_f64();
            let mut line = format!(
                "phaseprof: alloc probes: {:.0} hits/s, estimated overhead {:.2}% of the target's CPU ({})",
                d_hits as f64 / secs,
                self.overhead(d_hits, d_cpu) * 100.0,
                self.describe_cost()
            );
            if let Some(d) = &self.duty {
                line += &format!(
                    " (budget {:.2}%: probes attached {:.1}% of the time, {:.0}% overhead while attached)",
                    d.budget * 100.0,
                    100.0 * d.on_ns as f64 / (now - self.started).as_nanos().max(1) as f64,
                    d.cost * 100.0
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

    /// The cost per hit the estimates use, in words.
    fn describe_cost(&self) -> String {
        if self.measured_cost {
            format!("{:.0} ns a hit, measured", self.ns_per_hit)
        } else {
            format!(
                "{:.0} ns a hit assumed until cpu samples measure it",
                self.ns_per_hit
            )
        }
    }

    /// Duty cycling: ends the attached slice when it is over, or attaches the probes for the
    /// next when the budget allows.
    fn duty_tick(&mut self, engine: &mut Engine<'_>, now: Instant) -> Result<()> {
        let cpu_now = self.cpu_now();
        self.cpu_last = self.cpu_last.max(cpu_now);
        let rate = self.cpu_last_rate(now);
        // Every tick: a target that exits takes its counts with it.
        self.sys_last = self.sys_now();
        let ns_per_hit = self.ns_per_hit;
        let Some(duty) = &mut self.duty else {
            return Ok(());
        };
        if self.attached && now - self.measure_start >= duty.slice() {
            engine.pause_alloc(true);
            let hits = engine.alloc_probe_hits()? - self.hits_at_slice;
            let cpu = cpu_now.saturating_sub(self.cpu_at_slice);
            let own = own_cpu_ns(cpu, hits, ns_per_hit);
            let cost = overhead(hits, own, ns_per_hit);
            self.hits_total += hits;
            self.cpu_while_on += cpu;
            self.counted_own_ns += own;
            let counted = now - self.measure_start;
            let sys = self.sys_last;
            self.sys_in_slices += sys.saturating_sub(self.sys_at_slice);
            let marks = (self.hits_at_slice + hits, cpu_now, sys);
            self.window.count_until(marks, now, ns_per_hit);
            self.window.on_mark = None;
            engine.detach_alloc();
            self.attached = false;
            let pids: Vec<u32> = self.sites.keys().copied().collect();
            let detached = self.cpu.read(pids.into_iter());
            // The slowdown measured by the syscalls once they are enough, over every slice so
            // far (no cost per hit assumed); until then estimated from the hits.
            let all = (cpu_now, sys);
            let measured = slowdown_by_syscalls((self.cpu_while_on, self.sys_in_slices), all);
            self.slowdown = measured.or(self.slowdown);
            let (cost, measured_over) = match measured {
                Some(m) => (m, self.cpu_while_on),
                None => (cost, own),
            };
            // Spending covers the targets' CPU time from attaching to detaching (the probes
            // trap all along); totals are extrapolated from the counted window alone.
            duty.take_cost(cost, measured_over);
            let spent_cpu = detached.saturating_sub(self.spend_from);
            duty.spend(self.slice_start.elapsed(), spent_cpu);
            duty.on_ns += counted.as_nanos() as u64;
        } else if !self.attached && duty.may_attach(cpu_now, rate, duty.slice()) {
            // The slice (and its spending) starts before attaching, which takes milliseconds;
            // counting and the cost's measurement start when every probe is in force.
            (self.slice_start, self.spend_from) = (now, cpu_now);
            engine.pause_alloc(true);
            let mut gone = Vec::new();
            for (&pid, found) in &self.sites {
                if let Err(e) = engine.attach_alloc(pid, &probe_specs(found)) {
                    // A target that exited since the last slice (the kernel says ESRCH) is
                    // no error of the recording: it is left out from now on.
                    if crate::targets::process_alive(pid) {
                        return Err(e);
                    }
                    gone.push(pid);
                }
            }
            for pid in gone {
                self.remove_target(pid);
            }
            engine.pause_alloc(false);
            self.hits_at_slice = engine.alloc_probe_hits()?;
            self.cpu_at_slice = self.cpu_now();
            self.sys_at_slice = self.sys_now();
            self.measure_start = Instant::now();
            self.attached = true;
            let w = &mut self.window;
            (w.hits_mark, w.cpu_mark) = (self.hits_at_slice, self.cpu_at_slice);
            w.sys_mark = self.sys_at_slice;
            w.on_mark = Some(self.measure_start);
        }
        Ok(())
    }

    /// At the end of the recording (`total` long): the record of how allocations were taken,
    /// and the factor that scales what was counted while attached up to the whole recording.
    pub fn finish(&mut self, engine: &Engine<'_>, total: Duration) -> Result<(AllocInfo, f64)> {
        let now = Instant::now();
        for g in &mut self.go_rates {
            g.restore();
        }
        let ns_per_hit = self.ns_per_hit;
        let (hits, cpu) = if self.duty.is_some() {
            let cpu_now = self.cpu_now();
            self.cpu_last = self.cpu_last.max(cpu_now);
            self.sys_last = self.sys_last.max(self.sys_now());
            if self.attached {
                let h = engine.alloc_probe_hits()? - self.hits_at_slice;
                let c = self.cpu_last.saturating_sub(self.cpu_at_slice);
                self.sys_in_slices += self.sys_last.saturating_sub(self.sys_at_slice);
                if let Some(d) = &mut self.duty {
                    d.on_ns += (now - self.measure_start).as_nanos() as u64;
                }
                self.counted_own_ns += own_cpu_ns(c, h, ns_per_hit);
                self.attached = false;
                (self.hits_total + h, self.cpu_while_on + c)
            } else {
                (self.hits_total, self.cpu_while_on)
            }
        } else {
            let h = engine.alloc_probe_hits()? - self.hits_at_report;
            let c = self.cpu_now().saturating_sub(self.cpu_at_report);
            (self.hits_total + h, self.cpu_while_on + c)
        };
        let mut info = AllocInfo {
            sample_bytes: self.sample_bytes,
            probes: self.probes.clone(),
            budget: self.duty.as_ref().map(|d| d.budget),
            attached_fraction: 1.0,
            estimated_overhead: self.slowdown.unwrap_or(self.overhead(hits, cpu)),
            ns_per_hit: self.ns_per_hit,
            ns_per_hit_measured: self.measured_cost,
            go_sampled: self.go_sampled,
            syscalls_in_slices: 0,
            syscalls: 0,
            counted_own_ns: 0,
        };
        let Some(d) = &self.duty else {
            return Ok((info, 1.0));
        };
        info.attached_fraction = (d.on_ns as f64 / total.as_nanos().max(1) as f64).min(1.0);
        info.syscalls_in_slices = self.sys_in_slices;
        info.syscalls = self.sys_last;
        info.counted_own_ns = self.counted_own_ns;
        let all_own = own_cpu_ns(self.cpu_last, hits, ns_per_hit);
        if self.counted_own_ns == 0 && self.sys_in_slices == 0 {
            eprintln!("phaseprof: the allocation budget allowed no slice in so short a recording: no allocations recorded (record longer or raise --alloc-budget)");
        }
        let scale = extrapolation(&info, all_own);
        Ok((info, scale))
    }
}

/// The factor from what a budget's slices counted to the whole: by the targets' syscalls or
/// their own CPU time (`info.counted_own_ns` of `all_own`), whichever errs less
/// (`AllocInfo::basis`); 1 when nothing was counted.
fn extrapolation(info: &AllocInfo, all_own: u64) -> f64 {
    use phaseprof_model::slice_basis::Basis;
    // No bytes are given to an allocation budget's basis: never ReadBytes.
    let (part, whole) = match info.basis() {
        Basis::Syscalls | Basis::ReadBytes => (info.syscalls_in_slices, info.syscalls),
        Basis::OwnCpu => (info.counted_own_ns, all_own),
    };
    if part == 0 {
        return 1.0;
    }
    (whole as f64 / part as f64).max(1.0)
}
/// The engine's probes for a process's allocator sites.
fn probe_specs(sites: &[AllocSite]) -> Vec<crate::engine::ProbeSpec> {
    sites.iter().flat_map(AllocSite::probe_specs).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the factor: by the syscalls where the probes left no own CPU time in slices (it
    // was 1, no extrapolation at all), by the own CPU time where cheap probes make it err less,
    // and 1 when nothing was counted.
    #[test]
    fn extrapolation_by_the_basis_that_errs_less() {
        let info = |sys_in, own_in| AllocInfo {
            budget: Some(0.01),
            syscalls_in_slices: sys_in,
            syscalls: 1_000,
            counted_own_ns: own_in,
            ..AllocInfo::default()
        };
        assert_eq!(extrapolation(&info(100, 0), 5_000_000), 10.0);
        assert_eq!(extrapolation(&info(100, 1_000_000), 5_000_000), 5.0);
        assert_eq!(extrapolation(&info(0, 0), 5_000_000), 1.0);
    }
}
