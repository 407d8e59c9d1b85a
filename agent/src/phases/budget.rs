//! The phase probes under a budget (`--phase-budget 1%`): attached for slices, as much of the
//! time as the budget allows, their cost per slice estimated from the calls counted (see
//! `probe_overhead`). The named phases' totals are extrapolated from the slices (by the targets'
//! syscalls, else their own CPU time: see `PhaseBudgetInfo`), per window (the agent, `attach`)
//! or over the whole recording.
use std::time::{Duration, Instant};

use anyhow::Result;
use phaseprof_model::PhaseBudgetInfo;

use super::probe_overhead::PhaseProbeOverhead;
use crate::duty_cycle::DutyCycle;
use crate::engine::{Engine, SlicedSyscalls};
use crate::targets::CpuClock;

/// The targets' CPU time, the probes' estimated time and the targets' syscalls by number (all,
/// and in slices), as counters.
#[derive(Clone, Default)]
struct Marks {
    cpu_ns: u64,
    probe_ns: f64,
    syscalls: SlicedSyscalls,
}

impl Marks {
    /// The targets' own CPU time from `self` to `now` (the probes' time left out).
    fn own_until(&self, now: &Marks) -> u64 {
        let probe = (now.probe_ns - self.probe_ns).max(0.0) as u64;
        now.cpu_ns.saturating_sub(self.cpu_ns).saturating_sub(probe)
    }
}

/// What has been counted since a mark: the whole recording's, or a window's.
#[derive(Clone, Copy, Default)]
struct Tally {
    counted_own_ns: u64,
    slices: u64,
    shortest: Option<Duration>,
}

impl Tally {
    fn slice(&mut self, length: Duration) {
        self.slices += 1;
        self.shortest = Some(self.shortest.map_or(length, |s| s.min(length)));
    }
}

pub struct PhaseBudget {
    duty: DutyCycle,
    started: Instant,
    in_force: bool,
    /// When the current slice's spending began (before attaching), and its counting (every
    /// probe in force).
    slice_start: Instant,
    counting_since: Instant,
    /// Counters at the start of the counted stretch in progress (moved by windows).
    at_count: Marks,
    /// Counters at the start of the slice in progress (its cost is measured over it).
    at_slice: Marks,
    first: Option<Marks>,
    total: Tally,
    /// A session cut in windows: the window's marks and tally, and the own time of earlier
    /// windows that counted nothing (extrapolated in the next that does).
    window_mark: Option<Marks>,
    window: Tally,
    cpu: CpuClock,
}

impl PhaseBudget {
    pub fn new(budget: f64) -> Self {
        let now = Instant::now();
        PhaseBudget {
            duty: DutyCycle::new(budget),
            started: now,
            in_force: false,
            slice_start: now,
            counting_since: now,
            at_count: Marks::default(),
            at_slice: Marks::default(),
            first: None,
            total: Tally::default(),
            window_mark: None,
            window: Tally::default(),
            cpu: CpuClock::default(),
        }
    }

    fn marks(
        &mut self,
        engine: &Engine<'_>,
        cost: &PhaseProbeOverhead,
        pids: &[u32],
    ) -> Result<Marks> {
        let m = Marks {
            cpu_ns: self.cpu.read(pids.iter().copied()),
            probe_ns: cost.probe_ns(engine)?,
            syscalls: engine.sliced_syscalls()?,
        };
        self.first.get_or_insert_with(|| m.clone());
        self.window_mark.get_or_insert_with(|| m.clone());
        Ok(m)
    }

    /// When `tick` next has something to do, so the recording loop wakes up for it.
    pub fn next_deadline(&self) -> Instant {
        if self.in_force {
            self.counting_since + self.duty.slice()
        } else {
            Instant::now() + Duration::from_millis(10)
        }
    }

    /// Adds the counted stretch since `at_count` up to `now` (a slice in force).
    fn count_until(&mut self, now: &Marks) {
        let own = self.at_count.own_until(now);
        self.total.counted_own_ns += own;
        self.window.counted_own_ns += own;
        self.at_count = now.clone();
    }

    /// Called often while recording: ends the slice in force when it is over, or starts the
    /// next when the budget allows.
    pub fn tick(
        &mut self,
        engine: &mut Engine<'_>,
        cost: &PhaseProbeOverhead,
        pids: &[u32],
    ) -> Result<()> {
        if self.first.is_none() {
            // The origin of the totals (the targets' CPU time counts from here).
            self.marks(engine, cost, pids)?;
        }
        let now = Instant::now();
        if self.in_force && now - self.counting_since >= self.duty.slice() {
            engine.end_phase_slice();
            let m = self.marks(engine, cost, pids)?;
            self.count_until(&m);
            let probe_ns = (m.probe_ns - self.at_slice.probe_ns).max(0.0);
            let own = self.at_slice.own_until(&m);
            let length = now - self.counting_since;
            self.total.slice(length);
            self.window.slice(length);
            self.in_force = false;
            // Spending covers the whole slice, attaching included.
            let slowdown = if own == 0 { 0.0 } else { probe_ns / own as f64 };
            self.duty
                .slice_done(self.slice_start.elapsed(), slowdown, own);
            self.duty.on_ns += length.as_nanos() as u64;
        } else if !self.in_force && self.duty.may_attach(now - self.started) {
            self.slice_start = now;
            engine.start_phase_slice()?;
            let m = self.marks(engine, cost, pids)?;
            (self.at_slice, self.at_count) = (m.clone(), m);
            self.counting_since = Instant::now();
            self.in_force = true;
        }
        Ok(())
    }

    /// A window ends (the agent, `attach`): what it counted (`scale` takes its named phases'
    /// totals up to the whole window).
    pub fn window_info(
        &mut self,
        engine: &Engine<'_>,
        cost: &PhaseProbeOverhead,
        pids: &[u32],
    ) -> Result<PhaseBudgetInfo> {
        let from = self.window_mark.clone().unwrap_or_default();
        let m = self.marks(engine, cost, pids)?;
        if self.in_force {
            self.count_until(&m);
        }
        let w = std::mem::take(&mut self.window);
        let mut info = self.info(w, &from, &m);
        if info.counted_own_ns == 0 && info.syscalls_in_slices == 0 {
            // Nothing counted: the window's time and syscalls are left to the next that counts
            // (its span starts at the same mark), so that sums over windows stay unbiased.
            (info.own_ns, info.syscalls) = (0, 0);
        } else {
            self.window_mark = Some(m);
        }
        Ok(info)
    }

    /// At the end of the recording: what was counted (`scale` takes the named phases' totals up
    /// to the whole recording).
    pub fn finish(
        &mut self,
        engine: &Engine<'_>,
        cost: &PhaseProbeOverhead,
        pids: &[u32],
    ) -> Result<PhaseBudgetInfo> {
        let m = self.marks(engine, cost, pids)?;
        if self.in_force {
            self.count_until(&m);
            let length = self.counting_since.elapsed();
            self.total.slice(length);
            self.duty.on_ns += length.as_nanos() as u64;
        }
        let first = self.first.clone().unwrap_or_default();
        let info = self.info(self.total, &first, &m);
        if info.counted_own_ns == 0 {
            eprintln!("phaseprof: the phase budget allowed no slice in so short a recording: no phase totals (record longer or raise --phase-budget)");
        }
        Ok(info)
    }

    /// What `t` counted between the marks `from` and `to`. The syscall counted by is the one
    /// the targets made most inside slices: a server makes its commonest syscalls per request
    /// (a read, a write), where others vary with how its work batches up, which a slowdown
    /// changes (fewer `epoll_wait`s per request while the probes are in force).
    fn info(&self, t: Tally, from: &Marks, to: &Marks) -> PhaseBudgetInfo {
        let delta = |to: &[u64], from: &[u64], nr: usize| {
            to.get(nr)
                .copied()
                .unwrap_or(0)
                .saturating_sub(from.get(nr).copied().unwrap_or(0))
        };
        let (s, f) = (&to.syscalls, &from.syscalls);
        let nr = (0..s.in_slices.len())
            .max_by_key(|&nr| delta(&s.in_slices, &f.in_slices, nr))
            .unwrap_or(0);
        PhaseBudgetInfo {
            budget: self.duty.budget,
            counted_own_ns: t.counted_own_ns,
            own_ns: from.own_until(to),
            syscall: phaseprof_model::syscall_name(nr as u32),
            syscalls_in_slices: delta(&s.in_slices, &f.in_slices, nr),
            syscalls: delta(&s.all, &f.all, nr),
            slices: t.slices,
            shortest_slice_ns: t.shortest.map_or(0, |d| d.as_nanos() as u64),
            overhead_while_attached: self.duty.cost,
        }
    }
}
