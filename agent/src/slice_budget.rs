//! Probes under a budget (`--phase-budget 1%`, `--syscall-budget 1%`): attached for slices, as
//! much of the time as the budget allows, their cost measured by the targets' CPU time per
//! syscall in and out of slices (or estimated from their hits). What they count is extrapolated
//! from the slices (by the bytes the targets read, their read and write syscalls or their own
//! CPU time, whichever errs less: see `slice_basis`; the calls set against the reads they
//! worked on where they can be: `slice_align`), per window (the agent, `attach`) or over the
//! whole recording.
use std::time::{Duration, Instant};

use anyhow::Result;
use phaseprof_model::BudgetInfo;

use crate::duty_cycle::{slowdown_by_syscalls, slowdown_by_work, DutyCycle, MIN_READS_TO_MEASURE};
use crate::engine::Engine;
use crate::slice_align::{slice_calls_and_bytes, Aligned};
use crate::slice_tally::{Marks, Tally};
use crate::target_clocks::{CpuClock, IoSyscallClock, ReadClock};
use phaseprof_model::slice_basis::Io;

/// Probes a budget attaches for slices (the phase probes, the syscall programs).
pub trait SlicedProbes {
    /// What they are, for messages ("phase", "syscall").
    fn what(&self) -> &'static str;
    /// Attaches them, paused (`count` starts counting).
    fn start_slice(&self, engine: &mut Engine<'_>) -> Result<()>;
    /// Starts or stops counting, at once (a slice's edges).
    fn count(&self, engine: &mut Engine<'_>, on: bool);
    /// Stops counting (if not stopped already) and detaches them.
    fn end_slice(&self, engine: &mut Engine<'_>);
    /// What the calls they counted so far added to the targets' read and write syscalls, for
    /// probes that see them (the syscall programs; the phase probes while those count); None
    /// for others.
    fn io_syscalls_counted(&self, engine: &Engine<'_>) -> Result<Option<u64>>;
    /// Their estimated time in the targets so far, ns.
    fn probe_ns(&self, engine: &Engine<'_>) -> Result<f64>;
    /// What they counted so far (calls, syscalls), and what a slice's start or end cut.
    fn counted(&self, engine: &Engine<'_>) -> Result<u64>;
    fn voided(&self, engine: &Engine<'_>) -> Result<u64>;
    /// Whether their totals may be extrapolated by the bytes the targets' reads returned
    /// (phases: see `slice_basis`); the syscall programs' are by the syscalls themselves, which
    /// they count.
    fn by_read_bytes(&self) -> bool {
        false
    }
    /// The calls counted so far that aligned with the reads they worked on (`slice_align`).
    fn aligned(&self, _engine: &Engine<'_>) -> Result<Aligned> {
        Ok(Aligned::default())
    }
}

/// A slice in which the targets ran less than MIN_SLICE_CPU_NS, the probes' estimated time
/// less than IDLE_PROBE_NS of it, found them idle: it spends nothing, and goes on. A server
/// waiting for its first requests makes a few syscalls and calls, and must not spend a slice's
/// cost at the assumed slowdown on them (then wait for seconds while the requests come); a
/// lightly loaded target whose probes take more than 5% of a core over a 20 ms slice spends.
const MIN_SLICE_CPU_NS: u64 = 2_000_000;
const IDLE_PROBE_NS: f64 = 1_000_000.0;

/// Reads a slice sees, where they carry the targets' work, below which slices lengthen
/// (`lengthen_if_reads_few`): a slice's edges cut about one read's work each.
const MIN_READS_A_SLICE: u64 = 16;

/// The longest a slice is made for calls that outlast shorter ones.
const MAX_SLICE: Duration = Duration::from_secs(2);

pub struct SliceBudget {
    duty: DutyCycle,
    /// The shortest slice: grows while calls outlast slices.
    min_slice: Duration,
    /// When the slice in force next has its cost checked (it ends there unless cheap enough).
    check_at: Instant,
    /// The voided calls and the calls counted at the last look (`lengthen_if_calls_voided`).
    voided_seen: (u64, u64),
    started: Instant,
    in_force: bool,
    /// The counters, the calls counted and those aligned, when the slice in force began
    /// counting.
    began: (Marks, u64, Aligned),
    /// When the current slice's spending began (before attaching), and its counting (every
    /// probe in force).
    slice_start: Instant,
    counting_since: Instant,
    /// Counters at the start of the counted stretch in progress (moved by windows).
    at_count: Marks,
    /// Counters at the start of the slice in progress (its cost is measured over it).
    at_slice: Marks,
    /// The counters' origin (zeros: each target's CPU time and syscalls count from when it
    /// was added, `target_added`; the engine's counters from its load).
    first: Marks,
    /// The targets' CPU time at the last tick (from the counters' origin), and where the slice
    /// in force last spent (`spend`).
    cpu_now: u64,
    spend_from: u64,
    total: Tally,
    /// A session cut in windows: where the window's span starts (a window that counted nothing
    /// leaves it where it was, for the next that does) and what it counted.
    window_mark: Marks,
    window: Tally,
    /// Whether the slowdown has been measured by syscalls (else estimated from the calls).
    slowdown_measured: bool,
    /// Whether the window in progress began with a slice in force (the first one does: its
    /// slice starts at the first tick).
    window_began_in_force: bool,
    /// Whether a window has counted (a window no slice falls in after one carries its rates).
    window_counted: bool,
    /// Another budget's slice holds these probes in force (`hold`).
    held: bool,
    /// A slice failed to start (said once).
    start_failed: bool,
    cpu: CpuClock,
    io: IoSyscallClock,
    reads: ReadClock,
}

impl SliceBudget {
    pub fn new(budget: f64) -> Self {
        let now = Instant::now();
        SliceBudget {
            duty: DutyCycle::new(budget),
            min_slice: Duration::ZERO,
            check_at: now,
            voided_seen: (0, 0),
            started: now,
            in_force: false,
            began: (Marks::default(), 0, Aligned::default()),
            slice_start: now,
            counting_since: now,
            at_count: Marks::default(),
            at_slice: Marks::default(),
            first: Marks::default(),
            cpu_now: 0,
            spend_from: 0,
            total: Tally::default(),
            window_mark: Marks::default(),
            window: Tally::default(),
            window_began_in_force: true,
            slowdown_measured: false,
            window_counted: false,
            held: false,
            start_failed: false,
            cpu: CpuClock::default(),
            io: IoSyscallClock::default(),
            reads: ReadClock::default(),
        }
    }

    fn marks(
        &mut self,
        engine: &Engine<'_>,
        probes: &dyn SlicedProbes,
        pids: &[u32],
    ) -> Result<Marks> {
        let (reads, read_bytes) = self.reads.read(pids.iter().copied());
        let m = Marks {
            cpu_ns: self.cpu.read(pids.iter().copied()),
            probe_ns: probes.probe_ns(engine)?,
            syscalls: self.io.read(pids.iter().copied()),
            reads,
            read_bytes,
            voided: probes.voided(engine)?,
            mono_ns: crate::engine::monotonic_ns(),
        };
        Ok(m)
    }

    /// A target added: its CPU time and syscalls count from now, or from its birth (a
    /// command held before its exec, a target's child).
    pub fn target_added(&mut self, pid: u32, from_birth: bool) {
        self.cpu.add(pid, from_birth);
        self.io.add(pid, from_birth);
        self.reads.add(pid, from_birth);
    }

    /// A target exited: its last counts, as the kernel took them at its exit (0: not counted
    /// by this kernel, read from /proc while its entry is still there).
    pub fn target_exited(&mut self, pid: u32, cpu_ns: u64, io_syscalls: u64) {
        self.cpu.exited(pid, cpu_ns);
        self.io.exited(pid, io_syscalls);
        self.reads.exited(pid);
    }

    /// When `tick` next has something to do, so the recording loop wakes up for it (the
    /// budget accrues with the targets' CPU time: when it holds a slice at their pace so far).
    pub fn next_deadline(&self) -> Instant {
        if self.in_force {
            self.check_at
        } else {
            let (rate, length) = (self.cpu_rate(), self.slice_length());
            let wait = (self.duty).attach_in(self.cpu_now, rate, length, Duration::from_secs(1));
            Instant::now() + wait
        }
    }

    /// The targets' CPU time per ns of the recording so far.
    fn cpu_rate(&self) -> f64 {
        self.cpu_now as f64 / self.started.elapsed().as_nanos().max(1) as f64
    }

    /// Adds the counted stretch since `at_count` up to `now` (a slice in force).
    fn count_until(&mut self, now: &Marks) {
        let own = self.at_count.own_until(now);
        let cpu = now.cpu_ns.saturating_sub(self.at_count.cpu_ns);
        let counted = now.mono_ns.saturating_sub(self.at_count.mono_ns);
        self.total.counted_own_ns += own;
        self.window.counted_own_ns += own;
        self.total.counted_ns += counted;
        self.window.counted_ns += counted;
        self.total.cpu_in_ns += cpu;
        self.window.cpu_in_ns += cpu;
        let sys = now.syscalls.saturating_sub(self.at_count.syscalls);
        self.total.sys_in += sys;
        self.window.sys_in += sys;
        let reads = now.reads.saturating_sub(self.at_count.reads);
        self.total.reads_in += reads;
        self.window.reads_in += reads;
        let bytes = now.read_bytes.saturating_sub(self.at_count.read_bytes);
        self.total.read_bytes_in += bytes;
        self.window.read_bytes_in += bytes;
        self.at_count = now.clone();
    }

    /// Called often while recording: ends the slice in force when it is over, or starts the
    /// next when the budget allows.
    pub fn tick(
        &mut self,
        engine: &mut Engine<'_>,
        probes: &dyn SlicedProbes,
        pids: &[u32],
    ) -> Result<()> {
        // Every tick: a target that exits takes its counts with it.
        self.cpu_now = self.cpu.read(pids.iter().copied());
        self.io.read(pids.iter().copied());
        self.reads.read(pids.iter().copied());
        let now = Instant::now();
        if self.in_force && now >= self.check_at {
            let m = self.marks(engine, probes, pids)?;
            let probe = m.probe_ns - self.at_slice.probe_ns;
            let slice_cpu = m.cpu_ns.saturating_sub(self.at_slice.cpu_ns);
            let idle = slice_cpu < MIN_SLICE_CPU_NS && probe < IDLE_PROBE_NS;
            // At the slowdown over every slice so far: a lightly loaded target runs too little
            // in one slice to tell it, and must not be sliced for free.
            if !idle {
                let (slowdown, cpu_in) = self.slowdown_so_far(&m, probes.by_read_bytes());
                self.duty.take_cost(slowdown, cpu_in);
            }
            let on = self.slice_start.elapsed();
            (self.at_slice, self.slice_start) = (m.clone(), now);
            if idle || self.held || self.cheap() {
                // Cheap enough to stay, or free while the targets are idle (a slice that found
                // a program still starting up must not end its exact count), or held by
                // another budget's slice: the slice goes on, its calls all counted, and is
                // checked again a slice later, or after twice as long as it went since the last
                // look, if sooner: a cost first measured over a command's start (its loader's
                // CPU time, few syscalls) may not hold once it works, and a slice judged cheap
                // there went on for 1 s while dd's syscalls cost 4x (1.2 s of its 1.3 s).
                self.spend(!idle, on, m.cpu_ns);
                let next = self.slice_length().min(on * 2).max(self.duty.short_slice());
                self.check_at = now + next;
                return Ok(());
            }
            let m = self.edge(engine, probes, pids, false)?;
            probes.end_slice(engine);
            let detached = self.cpu.read(pids.iter().copied());
            self.spend(!idle, on, detached);
            (self.total.detached, self.window.detached) = (true, true);
            self.count_until(&m);
            let length = now - self.counting_since;
            self.total.slice(length);
            self.window.slice(length);
            self.spread_slice(engine, probes, &m)?;
            self.in_force = false;
            self.lengthen_if_calls_voided(engine, probes)?;
            if probes.by_read_bytes() {
                self.lengthen_if_reads_few(&m);
            }
        } else if self.due() || (self.held && !self.in_force) {
            self.slice_start = now;
            self.spend_from = self.cpu_now;
            if let Err(e) = probes.start_slice(engine) {
                // The recording goes on without this slice; the next waits for the budget as
                // if it had been spent.
                if !self.start_failed {
                    let what = probes.what();
                    eprintln!("phaseprof: a {what} slice could not start: {e:#} (later ones will try again)");
                    self.start_failed = true;
                }
                self.duty.slice_failed(self.cpu_rate(), self.slice_length());
                return Ok(());
            }
            let m = self.edge(engine, probes, pids, true)?;
            self.began = (m.clone(), probes.counted(engine)?, probes.aligned(engine)?);
            (self.at_slice, self.at_count) = (m.clone(), m);
            self.counting_since = Instant::now();
            self.check_at = self.counting_since + self.slice_length();
            self.in_force = true;
        }
        Ok(())
    }

    /// Spends the targets' CPU time from the last spending (or the slice's attaching) up to
    /// `cpu_to`, for a slice in force for `on`, at the probes' slowdown; nothing where the
    /// slice found the targets idle (`busy` false). The probes trap while attached but not yet
    /// counting, and until detached: those stretches are spent too (nats-server under a 1%
    /// budget, spending from the start of counting to its end only, lost 1.3-1.4% of its CPU
    /// time to the probes by their cpu samples; 0.8-0.9% after).
    fn spend(&mut self, busy: bool, on: Duration, cpu_to: u64) {
        let cpu = cpu_to.saturating_sub(self.spend_from);
        self.spend_from = cpu_to;
        if busy {
            self.duty.spend(on, cpu);
        }
    }

    /// Turns counting on or off (a slice's edge) and returns the counters there. The agent
    /// shares the CPUs with its targets: preempted between its reading of the counters and
    /// the edge, it left the targets' work in between on the wrong side of the edge (2,800 of
    /// a 40 ms slice's 13,000 writes, validator-sim on this 2-core machine). The edge is put
    /// halfway between a reading before it and one after; where the probes count the targets'
    /// read and write syscalls themselves (the syscall programs, and the phase probes while
    /// those are in force), exactly on the kernel's count of those: the reading after a start less what they counted since, the reading before an
    /// end plus what they counted until it.
    fn edge(
        &mut self,
        engine: &mut Engine<'_>,
        probes: &dyn SlicedProbes,
        pids: &[u32],
        on: bool,
    ) -> Result<Marks> {
        let before = self.marks(engine, probes, pids)?;
        let io_before = probes.io_syscalls_counted(engine)?;
        probes.count(engine, on);
        let after = self.marks(engine, probes, pids)?;
        let io_after = probes.io_syscalls_counted(engine)?;
        let mut m = before.halfway(&after);
        if let (Some(b), Some(a)) = (io_before, io_after) {
            let counted = a.saturating_sub(b);
            m.syscalls = if on {
                after.syscalls.saturating_sub(counted).max(before.syscalls)
            } else {
                (before.syscalls + counted).min(after.syscalls)
            };
        }
        Ok(m)
    }

    /// Whether a slice starts at the next tick: the first one at once (it measures the probes'
    /// cost), later ones when the budget has accrued theirs.
    pub fn due(&self) -> bool {
        !self.in_force
            && (self.total.slices == 0
                || self
                    .duty
                    .may_attach(self.cpu_now, self.cpu_rate(), self.slice_length()))
    }

    pub fn in_force(&self) -> bool {
        self.in_force
    }

    /// Whether the probes were measured to cost no more than the budget (their slice goes on).
    pub fn cheap(&self) -> bool {
        self.duty.measured && self.duty.cost <= self.duty.budget
    }

    /// Whether another budget's slice needs these probes in force too (the syscall programs
    /// during a phase slice: a phase's syscalls are counted only while both are attached). A
    /// held slice starts at the next tick and goes on while held; it spends its cost as any
    /// other, so the slices of this budget's own wait the longer for it.
    pub fn hold(&mut self, held: bool) {
        self.held = held;
    }

    /// The probes' slowdown of the targets over every slice so far (up to `now`, a slice in
    /// force), with the targets' CPU time in slices it was told from: measured where the
    /// syscalls or the bytes read allow (`measured_slowdown`), else estimated from the calls at
    /// their cost per call (probes estimated to take nearly all of the CPU count as at least
    /// 100x). Never less than that estimate: the probes' own time is a floor, and a measurement
    /// under it compared the slices with something else than their work (an idle stretch
    /// outside them, whose CPU time per byte is the timers', would do it). A 1% run on
    /// nats-server measured 0x: the probes, cheap by that, stayed attached for all of its 60 s.
    fn slowdown_so_far(&mut self, now: &Marks, by_read_bytes: bool) -> (f64, u64) {
        let cpu_in = self.total.cpu_in_ns + now.cpu_ns.saturating_sub(self.at_count.cpu_ns);
        let own_in = self.total.counted_own_ns + self.at_count.own_until(now);
        let probe_in = cpu_in.saturating_sub(own_in);
        let estimated = probe_in as f64 / own_in.max(cpu_in / 100).max(1) as f64;
        if let Some(s) = self.measured_slowdown(now, by_read_bytes) {
            self.slowdown_measured = true;
            return (s.max(estimated), cpu_in);
        }
        (estimated, cpu_in)
    }

    /// After a slice that ended at `end`, where the reads carry the targets' work (the totals
    /// are counted by the bytes read): when it saw fewer than MIN_READS_A_SLICE of them,
    /// slices double, up to MAX_SLICE. A read's bytes are worked on after it returns, so a
    /// slice's end cuts the last read's work, and the start the work of the one before it, read
    /// at the unslowed pace, in smaller pieces: nats-server, slowed ~15x in 20 ms slices that
    /// each saw about one 64 KB read, was estimated 24% and 31% under. Not before the reads
    /// carry the work (25 in slices): doubling from the first slice, nats-server's slices at
    /// 1% grew to hold 140-270 reads, and its `inbound` totals came out 5-26% under in five
    /// runs (once with `deliver` within 0.5%: the mix of calls moves in slices that long),
    /// against 10% under to 1% over when the doubling waits.
    fn lengthen_if_reads_few(&mut self, end: &Marks) {
        let reads = end.reads.saturating_sub(self.began.0.reads);
        let io = self.io_so_far(end);
        if io.reads_carry_the_work() && reads < MIN_READS_A_SLICE && self.min_slice < MAX_SLICE {
            self.min_slice = (self.slice_length() * 2).min(MAX_SLICE);
        }
    }

    /// The slice that ended at `end`: its calls against the targets' bytes read and syscalls.
    fn spread_slice(
        &mut self,
        engine: &Engine<'_>,
        probes: &dyn SlicedProbes,
        end: &Marks,
    ) -> Result<()> {
        let (began, calls_before, aligned_before) = &self.began;
        let calls = probes.counted(engine)?.saturating_sub(*calls_before);
        let aligned = probes.aligned(engine)?.since(aligned_before);
        let bytes = end.read_bytes.saturating_sub(began.read_bytes);
        let syscalls = end.syscalls.saturating_sub(began.syscalls);
        let (c, b) = slice_calls_and_bytes(calls, bytes, &aligned);
        for t in [&mut self.total, &mut self.window] {
            t.spread.add(c, b, syscalls);
            t.align.add(calls, bytes, &aligned);
        }
        Ok(())
    }

    /// The targets' reads and writes in slices and in all, up to `now` (a slice in force).
    fn io_so_far(&self, now: &Marks) -> Io {
        let since = |at: u64, first: u64| at.saturating_sub(first);
        let (first, at) = (&self.first, &self.at_count);
        let in_force =
            |total: u64, now: u64, at: u64| total + if self.in_force { since(now, at) } else { 0 };
        Io {
            syscalls_in_slices: in_force(self.total.sys_in, now.syscalls, at.syscalls),
            syscalls: since(now.syscalls, first.syscalls),
            reads_in_slices: in_force(self.total.reads_in, now.reads, at.reads),
            reads: since(now.reads, first.reads),
            read_bytes_in_slices: in_force(self.total.read_bytes_in, now.read_bytes, at.read_bytes),
            read_bytes: since(now.read_bytes, first.read_bytes),
        }
    }

    /// The probes' slowdown of the targets measured so far (up to `now`, a slice in force) by
    /// the bytes they read, where the reads carry their work and the probes' totals are counted
    /// by them (`by_read_bytes`), else by their syscalls (`slowdown_by_work`). Not by syscalls
    /// where the reads carry the work: nats-server slowed ~13x by goroutine probes made 1.5x
    /// the syscalls a message (1,391 against 907 for 200,000), a third of its slowdown hidden.
    fn measured_slowdown(&self, now: &Marks, by_read_bytes: bool) -> Option<f64> {
        let cpu_all = now.cpu_ns.saturating_sub(self.first.cpu_ns);
        let cpu_in = self.total.cpu_in_ns + now.cpu_ns.saturating_sub(self.at_count.cpu_ns);
        let io = self.io_so_far(now);
        if by_read_bytes && io.reads_carry_the_work() {
            let bytes_all = now.read_bytes.saturating_sub(self.first.read_bytes);
            let reads = (
                io.reads_in_slices,
                io.reads - io.reads_in_slices.min(io.reads),
            );
            return slowdown_by_work(
                (cpu_in, io.read_bytes_in_slices),
                (cpu_all, bytes_all),
                reads,
                MIN_READS_TO_MEASURE,
            );
        }
        let sys_all = io.syscalls;
        slowdown_by_syscalls((cpu_in, io.syscalls_in_slices), (cpu_all, sys_all))
    }

    /// How long a slice stays before its cost is checked: the duty cycle's length, or longer
    /// where calls outlast it (`lengthen_if_calls_voided`).
    fn slice_length(&self) -> Duration {
        self.duty.slice().max(self.min_slice)
    }

    /// After a slice: when slices' starts and ends cut more than 5% as many calls (never
    /// counted) as were counted since the last look, the target's calls outlast the slices,
    /// and would be undercounted: slices double, up to MAX_SLICE.
    fn lengthen_if_calls_voided(
        &mut self,
        engine: &Engine<'_>,
        probes: &dyn SlicedProbes,
    ) -> Result<()> {
        let voided = probes.voided(engine)?;
        let calls = probes.counted(engine)?;
        let (v, c) = (
            voided.saturating_sub(self.voided_seen.0),
            calls.saturating_sub(self.voided_seen.1),
        );
        self.voided_seen = (voided, calls);
        if v * 20 > c && self.min_slice < MAX_SLICE {
            self.min_slice = (self.slice_length() * 2).min(MAX_SLICE);
        }
        Ok(())
    }

    /// A window ends (the agent, `attach`): what it counted (`scale` takes its totals up to the
    /// whole window).
    pub fn window_info(
        &mut self,
        engine: &Engine<'_>,
        probes: &dyn SlicedProbes,
        pids: &[u32],
    ) -> Result<BudgetInfo> {
        let from = self.window_mark.clone();
        let m = self.marks(engine, probes, pids)?;
        if self.in_force {
            self.count_until(&m);
        }
        let mut w = std::mem::take(&mut self.window);
        if self.in_force {
            w.slices += 1; // goes on into the next window
        }
        let mut info = self.info(w, &from, &m, probes.by_read_bytes());
        info.attached_throughout = self.window_began_in_force && !w.detached;
        self.window_began_in_force = self.in_force;
        let counted = info.counted();
        if !counted && self.window_counted {
            // No slice fell in the window: it carries the last slices' rates.
            info.carried_windows = 1;
        } else if !counted {
            // Nothing counted yet: the window's time and syscalls are left to the first that
            // counts (its span starts at the same mark), so that sums over windows stay
            // unbiased.
            (info.own_ns, info.syscalls) = (0, 0);
            (info.reads, info.read_bytes) = (0, 0);
            return Ok(info);
        }
        self.window_counted |= counted;
        self.window_mark = m;
        Ok(info)
    }

    /// At the end of the recording: what was counted (`scale` takes the totals up to the whole
    /// recording).
    pub fn finish(
        &mut self,
        engine: &Engine<'_>,
        probes: &dyn SlicedProbes,
        pids: &[u32],
    ) -> Result<BudgetInfo> {
        let m = self.marks(engine, probes, pids)?;
        if self.in_force {
            self.count_until(&m);
            self.total.slice(self.counting_since.elapsed());
            self.spread_slice(engine, probes, &m)?;
        }
        let first = self.first.clone();
        let mut info = self.info(self.total, &first, &m, probes.by_read_bytes());
        // The first slice starts at the first tick: only a detach breaks the exact count.
        info.attached_throughout = !self.total.detached;
        if !info.counted() {
            let what = probes.what();
            eprintln!("phaseprof: the {what} budget allowed no slice in so short a recording: no {what} totals (record longer or raise --{what}-budget)");
        }
        Ok(info)
    }

    /// What `t` counted between the marks `from` and `to` (the bytes read, `by_read_bytes`).
    fn info(&self, t: Tally, from: &Marks, to: &Marks, by_read_bytes: bool) -> BudgetInfo {
        let bytes = |n: u64| if by_read_bytes { n } else { 0 };
        let (read_bytes_in, reads_aligned) = t
            .align
            .bytes_worked(t.read_bytes_in)
            .unwrap_or((t.read_bytes_in, 0));
        BudgetInfo {
            budget: self.duty.budget,
            counted_own_ns: t.counted_own_ns,
            counted_ns: t.counted_ns,
            own_ns: from.own_until(to),
            syscall: phaseprof_model::phase_budget::READ_WRITE.into(),
            syscalls_in_slices: t.sys_in,
            syscalls: to.syscalls.saturating_sub(from.syscalls),
            reads_in_slices: bytes(t.reads_in),
            reads: bytes(to.reads.saturating_sub(from.reads)),
            read_bytes_in_slices: bytes(read_bytes_in),
            reads_aligned: bytes(reads_aligned),
            read_bytes: bytes(to.read_bytes.saturating_sub(from.read_bytes)),
            slices: t.slices,
            spread: t.spread,
            shortest_slice_ns: t.shortest.map_or(0, |d| d.as_nanos() as u64),
            calls_voided: to.voided.saturating_sub(from.voided),
            carried_windows: 0,
            attached_throughout: false,
            slowdown_measured: self.slowdown_measured,
            overhead_while_attached: self.duty.cost,
        }
    }
}
