//! A recording session: the attached engine, the targets it follows, and the profile its
//! windows fold into. `record` drives one to a file; `attach` and the fleet agent
//! drive the same windows.
use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use phaseprof_model::Meta;

use crate::aggregate::Aggregator;
use crate::alloc::recorder::AllocRecorder;
use crate::engine::{Drain, Engine, TargetEvent};
use crate::phases::probe_overhead::PhaseProbeOverhead;
use crate::phases::{PhaseConfig, PhasePlan};
use crate::processes::Processes;
use crate::symbolize::{BlazeSymbolizer, Naming};
use crate::targets;
use crate::unwind::StackWalks;
use crate::window::{fold_identical, RawSample, RawWindow};

/// How long a session turn waits for process events at most: the latency of noticing a stop,
/// a deadline or a window's end.
mod deferred_phases;
mod finish;
mod phase_budget;
mod probe_calibration;
mod stacks;
mod syscall_budget;
mod windows;

pub use deferred_phases::DeferredPhases;

use stacks::Choice;

const POLL: Duration = Duration::from_millis(20);

/// How a target joined the session.
#[derive(Clone, Copy, PartialEq)]
enum Joined {
    /// Found running (`-p`, a name that matched).
    Attached,
    /// Forked by a target.
    Forked,
    /// Forked by a target, and exec'd since (its exec is among the same events).
    ForkedThenExec,
}

/// What a turn of `Session::run_until` reports to its caller.
pub enum Turn {
    /// Events handled; the caller checks its own stop conditions.
    Polled,
    /// A window of `start..end` is due: drain or take it.
    Window { start: SystemTime, end: SystemTime },
}

pub struct Session<'obj> {
    engine: Engine<'obj>,
    /// The targets' mappings: read here once per change, told to the rest.
    processes: Processes,
    sym: BlazeSymbolizer,
    agg: Aggregator,
    /// Target processes still running.
    live: BTreeSet<u32>,
    seen_tids: HashSet<u32>,
    /// Threads that exited since the last window (forgotten at the next, see `forget_gone`).
    exited_tids: Vec<u32>,
    /// Phase names (ids 1..) and the syscall cost rules counted per phase, when phases are on.
    phase_names: Vec<String>,
    cost_names: Vec<String>,
    /// A phases config to resolve in the first target's objects (`--name`: unknown at start).
    deferred_phases: Option<DeferredPhases>,
    /// Allocation probes, when `alloc` events are recorded.
    alloc: Option<AllocRecorder>,
    /// Allocation cost rules: (name, frame globs), computed from allocation stacks.
    alloc_costs: Vec<(String, Vec<String>)>,
    /// When the targets' mappings were last re-read (see `handle_events`).
    maps_read: std::time::Instant,
    /// Whether the session was cut in windows (`take_window`); the drops at the last one.
    took_windows: bool,
    window_lost: phaseprof_model::Lost,
    /// The engine stops targets at their exec (see `exec_seen`).
    hold_execs: bool,
    /// Per target: frame pointers, unwind tables or stack copies (None: frame pointers for all).
    walks: Option<StackWalks>,
    /// Samples unwound from stack copies since the last drain (cpu samples, page faults).
    unwound: Vec<RawSample>,
    /// The phase probes' estimated cost, printed while recording.
    phase_cost: PhaseProbeOverhead,
    /// The phase probes' duty cycle, under a phase budget.
    phase_budget: Option<crate::phases::budget::PhaseBudget>,
    syscall_budget: Option<crate::syscall_budget::SyscallBudget>,
    /// Each target's CPU time (ns, its threads' schedstat) when it was added or at the last
    /// window: with the time at the end, how many cpu samples the recording should hold.
    cpu_at_add: std::collections::BTreeMap<u32, u64>,
    /// The CPU time of targets gone, as the kernel counted it at their exit (their parent may
    /// have reaped them since).
    cpu_at_exit: std::collections::BTreeMap<u32, u64>,
    /// The uprobes' measured cost per hit, and the targets' CPU time it is measured over.
    uprobe_cost: crate::probe_costs::UprobeHitCost,
    calibration_cpu: crate::target_clocks::CpuClock,
    verbose: bool,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl<'obj> Session<'obj> {
    pub fn new(engine: Engine<'obj>, meta: Meta, plan: &PhasePlan, verbose: bool) -> Self {
        let phases_on = !plan.names.is_empty();
        let mut phase_cost = PhaseProbeOverhead::new(plan.names.len());
        phase_cost.note(&engine, plan, |p| p);
        Session {
            engine,
            processes: Processes::default(),
            sym: BlazeSymbolizer::default(),
            agg: Aggregator::new(meta, plan.names.clone()),
            live: BTreeSet::new(),
            seen_tids: HashSet::new(),
            exited_tids: Vec::new(),
            phase_names: if phases_on {
                plan.names.clone()
            } else {
                vec![]
            },
            cost_names: plan.syscall_costs.iter().map(|(n, _)| n.clone()).collect(),
            deferred_phases: None,
            alloc: None,
            alloc_costs: plan.alloc_costs.clone(),
            maps_read: std::time::Instant::now(),
            took_windows: false,
            window_lost: phaseprof_model::Lost::default(),
            walks: None,
            hold_execs: false,
            cpu_at_add: Default::default(),
            cpu_at_exit: Default::default(),
            unwound: Vec::new(),
            phase_cost,
            phase_budget: None,
            syscall_budget: None,
            uprobe_cost: Default::default(),
            calibration_cpu: Default::default(),
            verbose,
        }
    }

    /// Unwinds the stack copies the engine has received (the ring is read by every poll and
    /// drain); their samples join the next drained window.
    fn unwind_received(&mut self) {
        let Some(walks) = &mut self.walks else {
            return;
        };
        for s in self.engine.take_stack_samples() {
            self.unwound.push(walks.unwind_copy(&s));
        }
    }

    /// Drains the kernel maps (`Drain::Final` after detach) with the samples unwound meanwhile.
    fn drain(&mut self, how: Drain) -> Result<RawWindow> {
        let mut w = self.engine.drain(how)?;
        self.unwind_received();
        w.samples
            .extend(fold_identical(std::mem::take(&mut self.unwound)));
        Ok(w)
    }

    /// The unwind counts since the last `take_window`, written into `meta`.
    fn unwind_since_last_window(&mut self, meta: &mut phaseprof_model::Meta) {
        if let (Some(walks), Some(u)) = (&mut self.walks, &mut meta.unwind) {
            walks.window_info(&self.engine, u);
        }
    }

    /// Records allocations of every target added from now on.
    pub fn record_allocations(&mut self, recorder: AllocRecorder) {
        self.alloc = Some(recorder);
    }

    /// Where each allocator probe went (empty without `alloc` events or before a target).
    pub fn alloc_probes(&self) -> &[String] {
        self.alloc.as_ref().map(|a| a.probes()).unwrap_or(&[])
    }

    /// When periodic work is next due (an allocation-probe slice ending), if sooner than usual.
    pub fn next_deadline(&self) -> Option<std::time::Instant> {
        let alloc = self.alloc.as_ref().and_then(|a| a.next_deadline());
        let phases = self.phase_budget.as_ref().map(|b| b.slices.next_deadline());
        let syscalls = self
            .syscall_budget
            .as_ref()
            .map(|b| b.slices.next_deadline());
        alloc.into_iter().chain(phases).chain(syscalls).min()
    }

    /// Periodic work between drains: the probes' overhead estimates, the allocation probes'
    /// duty cycle.
    pub fn tick(&mut self) -> Result<()> {
        if let Some(alloc) = &mut self.alloc {
            alloc.tick(&mut self.engine)?;
        }
        // Under both budgets, the syscall programs are in force throughout each phase slice that
        // is to end (attached before its probes, detached after): the phases' syscalls are
        // counted in their slices, and extrapolated with the rest of the phases' totals. Phase
        // probes cheap enough to stay attached hold nothing: the syscalls' own slices count
        // the phases' syscalls then, extrapolated as the other syscalls are.
        if let (Some(p), Some(s)) = (&self.phase_budget, &mut self.syscall_budget) {
            let p = &p.slices;
            s.slices.hold((p.in_force() && !p.cheap()) || p.due());
        }
        self.syscall_budget_tick()?;
        self.phase_budget_tick()?;
        let pids: Vec<u32> = self.live.iter().copied().collect();
        if let Some(line) = self.phase_cost.tick(&self.engine, &pids, false)? {
            eprintln!("{line}");
        }
        Ok(())
    }

    /// Resolves and attaches `phases` (config, file name) when the first target is added.
    pub fn resolve_phases_later(&mut self, phases: Option<DeferredPhases>) {
        self.deferred_phases = phases;
    }

    /// Resolves `cfg`'s phases in `pid`'s executable and libraries and attaches their probes,
    /// phase `i` of `cfg` counted as the session's phase `ids[i]` (an agent's targets each have
    /// their own phases file, merged into one list of names). Uprobes sit on the file: other
    /// processes of the same executable are covered too.
    pub fn attach_phases(
        &mut self,
        pid: u32,
        cfg: &PhaseConfig,
        file: &str,
        ids: &[u32],
    ) -> Result<()> {
        let mut plan = PhasePlan::default();
        plan.resolve(cfg, file, &self.code_objects(pid)?)?;
        self.phase_cost
            .note(&self.engine, &plan, |p| ids[p as usize - 1]);
        plan.attach(&mut self.engine, |p| ids[p as usize - 1])
    }

    pub fn engine(&self) -> &Engine<'obj> {
        &self.engine
    }

    pub fn meta_mut(&mut self) -> &mut Meta {
        self.agg.builder_mut().meta_mut()
    }

    /// Shows the file mapped at `mapped` as `run`, the symlink the user ran it by.
    pub fn name_as_run(&mut self, mapped: &str, run: &str) {
        self.sym.name_as_run(mapped, run);
    }

    /// The stack maps' use (see `Engine::stack_usage`).
    pub fn stack_usage(&self) -> crate::engine::StackUsage {
        self.engine.stack_usage()
    }

    pub fn live(&self) -> &BTreeSet<u32> {
        &self.live
    }

    /// Forgets targets that are gone (or zombies); returns how many are left.
    pub fn prune_exited(&mut self) -> usize {
        self.live.retain(|&pid| targets::process_alive(pid));
        self.live.len()
    }

    /// Records `pid` from now on, all its threads included, and caches its mappings.
    pub fn add_target(&mut self, pid: u32) -> Result<()> {
        self.add(pid, Joined::Attached)
    }

    /// `add_target`, for a target found running or a target's child the kernel made a target at
    /// its birth (its CPU time counts from 0, not from a mark read now).
    fn add(&mut self, pid: u32, joined: Joined) -> Result<()> {
        if let Some(DeferredPhases::FirstTarget(cfg, file)) = &self.deferred_phases {
            // Probes first, so the target's phases are seen from its first moment as a target.
            let (cfg, file) = (cfg.clone(), file.clone());
            self.deferred_phases = None;
            self.attach_phases_in(pid, &cfg, &file)?;
        }
        if self.alloc.is_some() {
            let objects = self.code_objects(pid)?;
            if let Some(alloc) = &mut self.alloc {
                alloc.add_target(&mut self.engine, pid, &objects)?;
            }
        }
        // A child that exec'd already (a shell's vfork) is read and walked for its new program
        // by `exec_seen`; until then the kernel walks it as its parent.
        if joined != Joined::ForkedThenExec {
            self.read_maps(pid);
            self.choose_unwind(pid, &targets::exe_link(pid), Choice::Running)?;
        }
        self.engine.add_target(pid)?;
        self.cpu_at_exit.remove(&pid); // a pid reused
        let mark = match joined {
            Joined::Attached => crate::target_clocks::cpu_ns(std::iter::once(pid)),
            Joined::Forked | Joined::ForkedThenExec => 0,
        };
        self.cpu_at_add.insert(pid, mark);
        for b in self.budgets() {
            b.target_added(pid, joined != Joined::Attached);
        }
        let meta = self.agg.builder_mut().meta_mut();
        if meta.pids.is_empty() {
            // The first target names the profile (unless it is already gone again).
            if let Ok(info) = targets::describe(pid) {
                meta.comm = info.comm;
                meta.build_id = info.build_id;
                meta.exe = info.exe;
                if let Some(run) = crate::run_name::of_process(pid, std::path::Path::new(&meta.exe))
                {
                    let run = run.to_string_lossy().into_owned();
                    self.sym.name_as_run(&meta.exe, &run);
                    meta.exe = run;
                }
            }
        }
        if !meta.pids.contains(&pid) {
            meta.pids.push(pid);
        }
        self.live.insert(pid);
        Ok(())
    }

    /// The budgets' slices (phases', syscalls'), which follow the targets' CPU time and syscalls.
    fn budgets(&mut self) -> impl Iterator<Item = &mut crate::slice_budget::SliceBudget> {
        let phases = self.phase_budget.as_mut().map(|b| &mut b.slices);
        let syscalls = self.syscall_budget.as_mut().map(|b| &mut b.slices);
        phases.into_iter().chain(syscalls)
    }

    /// Registers a `record -- CMD` child held before its execve of `exe` (see
    /// `targets::HeldChild`).
    pub fn add_held_child(&mut self, pid: u32, exe: &std::path::Path) -> Result<()> {
        if let Some(alloc) = &mut self.alloc {
            alloc.add_target(&mut self.engine, pid, &targets::command_code_objects(exe))?;
        }
        self.choose_unwind(pid, exe, Choice::BeforeExec)?;
        self.engine.arm_target(pid)?;
        self.cpu_at_add.insert(pid, 0);
        for b in self.budgets() {
            b.target_added(pid, true);
        }
        let meta = self.agg.builder_mut().meta_mut();
        meta.pids.push(pid);
        self.live.insert(pid);
        Ok(())
    }

    /// Handles process events for up to `timeout`: processes matching `name` that exec are
    /// added; execs, forks and new code mappings of targets refresh their cached mappings.
    pub fn handle_events(
        &mut self,
        timeout: Duration,
        name: Option<&crate::targets::NameMatch>,
    ) -> Result<()> {
        // New code mappings are announced from syscall events only; without them (and for
        // libraries mapped between two events) mappings are re-read often enough to catch a
        // short-lived process's libraries before it exits.
        if self.maps_read.elapsed() >= Duration::from_millis(100) {
            let live: Vec<u32> = self.live.iter().copied().collect();
            for pid in live {
                self.read_maps(pid);
            }
            self.tell_changed_maps();
            // A hold whose event was lost (its ring full): the command is stopped all the same.
            let held: Vec<u32> = self
                .live
                .iter()
                .copied()
                .filter(|&p| self.engine.held_at_entry(p))
                .collect();
            for pid in held {
                if targets::process_state(pid) == Some('T') {
                    self.entry_reached(pid, None);
                }
            }
            self.maps_read = std::time::Instant::now();
        }
        let events = self.engine.poll_events(timeout);
        let execs: BTreeSet<u32> = events
            .iter()
            .filter_map(|e| match e {
                TargetEvent::Exec { pid, .. } => Some(*pid),
                _ => None,
            })
            .collect();
        // Before the events: an exec or exit below makes the process's modules unknown.
        self.unwind_received();
        // New code mappings come in bursts (a loader maps each library's segments): each
        // process's are re-read once, after the batch, unless an exec or its entry re-read them.
        let mut mapped = BTreeSet::new();
        for ev in events {
            match ev {
                TargetEvent::Exec { pid, stopped, .. } if !self.live.contains(&pid) => {
                    // A target we have not seen (its fork's event lost) is held all the same.
                    let _ = self.engine.unwant_entry(pid);
                    if stopped {
                        self.engine.resume(pid);
                    }
                    if let Some(name) = name.filter(|n| n.matches(pid)) {
                        self.add_target(pid)?;
                        let pick = targets::NameMatch::describe_pick(pid);
                        eprintln!("phaseprof: recording {pick} (its {name} started)");
                    }
                }
                TargetEvent::Exec { pid, stopped, .. } => {
                    mapped.remove(&pid);
                    // A new program: inspected afresh.
                    self.exec_seen(pid, stopped)?;
                }
                TargetEvent::Entry { pid, block } => {
                    mapped.remove(&pid);
                    self.entry_reached(pid, block);
                }
                TargetEvent::ThreadExit { tid, comm } => {
                    self.exited_tids.push(tid);
                    if self.seen_tids.insert(tid) {
                        self.agg.builder_mut().meta_mut().threads.insert(tid, comm);
                    }
                }
                TargetEvent::MapsChanged { pid } => {
                    mapped.insert(pid);
                }
                // The kernel made the child a target already; we add its mappings.
                TargetEvent::Fork { pid, parent } => {
                    // A child gone by now (or exec'd: its mappings are read for its new
                    // program) ran its parent's code, in its parent's mappings.
                    self.processes.inherit(pid, parent);
                    let joined = if execs.contains(&pid) {
                        Joined::ForkedThenExec
                    } else {
                        Joined::Forked
                    };
                    self.add(pid, joined)?
                }
                TargetEvent::Exit {
                    pid,
                    cpu_ns,
                    io_syscalls,
                } => {
                    self.cpu_at_exit.insert(pid, cpu_ns);
                    // Its pid may be reused by an unrelated process: stop matching it.
                    if mapped.remove(&pid) {
                        self.read_maps(pid); // what it mapped last, if it is still there
                    }
                    self.live.remove(&pid);
                    self.engine.remove_target(pid);
                    if let Some(w) = &mut self.walks {
                        w.exited(&self.engine, pid);
                    }
                    if let Some(alloc) = &mut self.alloc {
                        alloc.remove_target(pid);
                    }
                    for b in self.budgets() {
                        b.target_exited(pid, cpu_ns, io_syscalls);
                    }
                }
            }
        }
        for pid in mapped {
            // A command held until its entry point re-reads everything there.
            if self.hold_execs && self.engine.held_at_entry(pid) {
                continue;
            }
            self.maps_changed(pid);
        }
        self.tell_changed_maps();
        Ok(())
    }

    /// `pid` mapped new code: its mappings are read again, and told to the unwinders.
    fn maps_changed(&mut self, pid: u32) {
        self.read_maps(pid);
        if let Some(w) = &mut self.walks {
            w.maps_changed(&mut self.engine, pid, self.processes.vmas(pid));
        }
    }

    /// Reads `pid`'s mappings (again); the symbolizer opens the files they map while it lives.
    /// The unwinders hear of a change from `tell_changed_maps`, or from the caller.
    fn read_maps(&mut self, pid: u32) {
        self.processes.read(pid);
        self.sym.mapped(pid, self.processes.vmas(pid));
    }

    /// Tells the unwinders the mappings that changed since the last call (read periodically,
    /// or for an address the symbolizer found outside them), for targets still running: one
    /// gone has been forgotten by them already, and is not to come back.
    fn tell_changed_maps(&mut self) {
        for pid in self.processes.take_changed() {
            if !self.live.contains(&pid) {
                continue;
            }
            if let Some(w) = &mut self.walks {
                w.maps_changed(&mut self.engine, pid, self.processes.vmas(pid));
            }
        }
    }

    /// The ELF files with code in `pid` (for phase and allocator probes), its mappings read now.
    fn code_objects(&mut self, pid: u32) -> Result<Vec<std::path::PathBuf>> {
        self.processes.read(pid);
        targets::code_objects(pid, self.processes.vmas(pid))
    }

    /// The session loop of `record`, `attach` and the agent. Each turn handles process events
    /// for up to POLL (sooner when periodic work is due; with `name`, matching processes that
    /// start are added) and calls `on(Turn::Polled)`; then does the periodic work, and every
    /// `every` calls `on(Turn::Window { start, end })`. Stops at the first `Some` `on` returns,
    /// with it and the start of the window in progress.
    pub fn run_until<T>(
        &mut self,
        every: Duration,
        name: Option<&crate::targets::NameMatch>,
        mut on: impl FnMut(&mut Self, Turn) -> Result<Option<T>>,
    ) -> Result<(T, SystemTime)> {
        let mut start = SystemTime::now();
        let mut next = Instant::now() + every;
        loop {
            let wait = self
                .next_deadline()
                .map(|d| d.saturating_duration_since(Instant::now()))
                .unwrap_or(POLL)
                .min(POLL);
            self.handle_events(wait, name)?;
            if let Some(v) = on(self, Turn::Polled)? {
                return Ok((v, start));
            }
            self.tick()?;
            if Instant::now() >= next {
                let end = SystemTime::now();
                let done = on(self, Turn::Window { start, end })?;
                start = end;
                next += every;
                if let Some(v) = done {
                    return Ok((v, start));
                }
            }
        }
    }

    /// Drains one window of the kernel maps into the profile.
    pub fn drain_window(&mut self) -> Result<()> {
        let w = self.drain(Drain::Window)?;
        self.fold(&w);
        Ok(())
    }

    fn fold(&mut self, w: &RawWindow) {
        // Name threads the first time they appear, while they are alive to be asked.
        let tids = (w.samples.iter())
            .filter(|s| s.kind.spec().per_thread)
            .map(|s| (s.pid, s.tid));
        // A thread already gone is named by its exit event instead (`TargetEvent::ThreadExit`).
        for (pid, tid) in tids {
            if !self.seen_tids.contains(&tid) {
                if let Some(name) = targets::read_comm(pid, tid) {
                    self.seen_tids.insert(tid);
                    self.agg.builder_mut().meta_mut().threads.insert(tid, name);
                }
            }
        }
        let mut naming = Naming {
            sym: &mut self.sym,
            processes: &mut self.processes,
            probe_resumes: &self.engine.probe_resumes,
        };
        self.agg.add_window(w, &mut naming);
        self.tell_changed_maps();
        let modules = &mut self.agg.builder_mut().meta_mut().modules;
        for (name, m) in &self.sym.modules {
            if !modules.contains_key(name) {
                modules.insert(name.clone(), m.clone());
            }
        }
        self.calibrate_alloc_cost();
    }
}
