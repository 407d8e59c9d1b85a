//! Folds raw windows into a [`Profile`]: symbolizes new addresses (batched, cached across
//! windows) and sums samples with equal keys.
use std::collections::{HashMap, HashSet};

use phaseprof_model::{
    milli, Frame, FrameKind, Meta, PhaseAt, Profile, ProfileBuilder, Sample, SampleKind, Stacks,
};

use crate::window::{RawLive, RawSample, RawWindow};

/// Turns addresses into frames. Implemented over blazesym for live recording and by hand in
/// tests.
pub trait Symbolize {
    /// For each address of process `pid`, its frames innermost first (inlined callees before the
    /// function that contains them). Addresses are already adjusted to point into the call
    /// instruction for return addresses.
    fn user(&mut self, pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>>;
    /// The same for kernel addresses.
    fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>>;
    /// Whether `user` named the address of `pid` provisionally (`file+offset`) because its
    /// name has not come yet: it is to be asked for again, not remembered.
    fn named_later(&self, _pid: u32, _addr: u64) -> bool {
        false
    }
    /// Whether the address of `pid` is where one of phaseprof's entry probes resumes the
    /// thread after its trap (see `probe_resumes`).
    fn probe_resumes_at(&self, _pid: u32, _addr: u64) -> bool {
        false
    }
}

fn at(phase: u32, mask: u64) -> PhaseAt {
    PhaseAt { phase, mask }
}

/// Kernel frames of phaseprof's own machinery, not the target's: the BPF programs, the helpers
/// they call (stack walks, ring buffers, user memory reads), the tracepoint glue that runs them
/// (`__traceiter_*`, `bpf_trace_run*`) and the uprobe machinery that traps into them.
fn is_probe_frame(f: &Frame) -> bool {
    const PREFIXES: &[&str] = &[
        "bpf_prog_",
        "bpf_trace_run",
        "__bpf_trace_",
        "__traceiter_",
        "bpf_get_stack",
        "__bpf_get_stack",
        "get_perf_callchain",
        "perf_callchain",
        "bpf_ringbuf_",
        "bpf_probe_read",
    ];
    f.kind == phaseprof_model::FrameKind::Kernel
        && (PREFIXES
            .iter()
            .chain(UPROBE_FRAMES)
            .any(|p| f.function.starts_with(p)))
}

/// Kernel frames of the uprobe machinery that traps into phaseprof's programs.
const UPROBE_FRAMES: &[&str] = &[
    "__uprobe_",
    "uprobe_",
    "uretprobe_",
    "handle_swbp",
    "arch_uprobe_",
    // The breakpoint trap a uprobe is (a program's own int3 is a debugger's business).
    "asm_exc_int3",
    "exc_int3",
    // The single step a probe on an instruction it cannot emulate takes out of line (Go's
    // `ret`: the exit probes of Go phases), and its return to user mode.
    "asm_exc_debug",
    "exc_debug",
    "noist_exc_debug",
];

/// Which of phaseprof's probes a sample in its machinery was in, by the frames that ran them:
/// the leaf of the [`OWN_COST_FRAME`] tower, so that each mechanism's cost is measured on its
/// own (`Profile::own_samples`).
fn probe_mechanism(f: &Frame) -> Option<&'static str> {
    const SYSCALLS: &[&str] = &[
        "syscall_trace_enter",
        "syscall_exit_work",
        "__bpf_trace_sys_",
        "__traceiter_sys_",
    ];
    if f.kind != phaseprof_model::FrameKind::Kernel {
        return is_probe_user_frame(f).then_some(UPROBE_PROBES_FRAME);
    }
    let name = f.function.as_str();
    if SYSCALLS.iter().any(|p| name.starts_with(p)) || name.contains("raw_tp__sys_") {
        Some(SYSCALL_PROBES_FRAME)
    } else if UPROBE_FRAMES.iter().any(|p| name.starts_with(p)) || name.contains("uprobe__") {
        Some(UPROBE_PROBES_FRAME)
    } else {
        None
    }
}

/// A cpu sample of a thread in user mode (no kernel stack).
fn user_mode_cpu_sample(s: &RawSample) -> bool {
    s.kind == SampleKind::Cpu && s.kernel.as_ref().is_none_or(|k| k.is_empty())
}

/// User frames of phaseprof's own machinery: the kernel's uprobe page (`[uprobes]`), where a
/// return probe's trampoline runs before the function's caller gets its return.
fn is_probe_user_frame(f: &Frame) -> bool {
    f.kind != phaseprof_model::FrameKind::Kernel
        && (f.module == "[uprobes]" || f.function.starts_with("[uprobes]"))
}

/// The module the symbolizer names an address in none of the target's mappings by.
pub const UNMAPPED_MODULE: &str = "[unknown]";

pub use phaseprof_model::{
    OwnSamples, OTHER_PROBES_FRAME, OWN_COST_FRAME, SYSCALL_PROBES_FRAME, UPROBE_PROBES_FRAME,
};

/// Who took a kernel stack: our program (its leaf frames are ours, left out), or a sample that
/// interrupted the thread wherever it was (a probe frame anywhere means it was in a probe).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Taken {
    ByProbe,
    ByInterrupt,
}

/// Accumulates windows into one profile.
pub struct Aggregator {
    builder: ProfileBuilder,
    user_frames: HashMap<(u32, u64), Vec<u32>>,
    /// This window's user addresses (pid, address) where cpu samples land as an entry probe's
    /// trap resumes the thread (`Symbolize::probe_resumes_at`).
    probe_resumed: HashSet<(u32, u64)>,
    kernel_frames: HashMap<u64, Vec<u32>>,
    /// Go allocation estimates per phase id (inclusive), added to the phase totals at the end.
    go_phase_allocs: HashMap<u32, (f64, f64)>,
    /// Addresses of `user_frames` named provisionally: forgotten once the window's samples are
    /// folded, so that the next fold asks for their names again.
    provisional: Vec<(u32, u64)>,
    /// The probes' tower: its stacks by mechanism, and the cpu samples so far in each and in
    /// all (the measured cost per probe hit comes from them while recording).
    own_stacks: HashMap<u32, &'static str>,
    own: OwnSamples,
}

/// Go's default `runtime.MemProfileRate`.
const GO_DEFAULT_RATE: f64 = crate::alloc::go_rate::GO_DEFAULT_RATE as f64;

/// The bytes and allocations one Go heap-profile sample of `size` bytes stands for. Go samples
/// by a Poisson process of mean `rate` bytes, so an allocation of `size` is sampled with
/// probability 1 - exp(-size/rate); weighing by the inverse is unbiased (pprof's
/// scaleHeapSample does the same).
pub fn go_sample_weight(size: u64, rate: i64) -> (f64, f64) {
    let rate = if rate > 0 {
        rate as f64
    } else {
        GO_DEFAULT_RATE
    };
    if rate <= 1.0 || size == 0 {
        return (size as f64, 1.0);
    }
    let p = 1.0 - (-(size as f64) / rate).exp();
    (size as f64 / p, 1.0 / p)
}

/// Return addresses point after the call; symbolize the call itself (as perf does), except for
/// the leaf, which is the exact instruction pointer.
fn lookup_addr(i: usize, addr: u64) -> u64 {
    if i == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

impl Aggregator {
    pub fn new(meta: Meta, phases: Vec<String>) -> Self {
        Aggregator {
            builder: ProfileBuilder::new(meta, phases),
            user_frames: HashMap::new(),
            probe_resumed: HashSet::new(),
            kernel_frames: HashMap::new(),
            go_phase_allocs: HashMap::new(),
            provisional: Vec::new(),
            own_stacks: HashMap::new(),
            own: OwnSamples::default(),
        }
    }

    /// The cpu samples folded so far, those taken in phaseprof's probes by mechanism.
    pub fn own_samples(&self) -> OwnSamples {
        self.own
    }

    /// Counts cpu sample `s` on `stack` in `own`.
    fn count_own(&mut self, s: &RawSample, stack: Option<u32>) {
        if s.kind != SampleKind::Cpu {
            return;
        }
        let n = s.values.first().copied().unwrap_or(0);
        self.own.all += n;
        match stack.and_then(|id| self.own_stacks.get(&id)).copied() {
            Some(SYSCALL_PROBES_FRAME) => self.own.syscalls += n,
            Some(UPROBE_PROBES_FRAME) => self.own.uprobes += n,
            Some(_) => self.own.other += n,
            None => {}
        }
    }

    /// Go allocation estimates by phase id (bytes, allocations), inclusive of nested phases.
    pub fn go_phase_allocs(&self) -> &HashMap<u32, (f64, f64)> {
        &self.go_phase_allocs
    }

    pub fn builder_mut(&mut self) -> &mut ProfileBuilder {
        &mut self.builder
    }

    pub fn add_window(&mut self, w: &RawWindow, sym: &mut dyn Symbolize) {
        self.symbolize_new(w, sym);
        self.fold(w);
        self.forget_provisional();
    }

    fn forget_provisional(&mut self) {
        for key in self.provisional.drain(..) {
            self.user_frames.remove(&key);
        }
    }

    fn fold(&mut self, w: &RawWindow) {
        let meta = self.builder.meta_mut();
        meta.offcpu_own_stack_ns = (meta.offcpu_own_stack_ns).saturating_add(w.offcpu_own_stack_ns);
        for s in &w.samples {
            let spec = s.kind.spec();
            let taken = match spec.interrupted {
                true => Taken::ByInterrupt,
                false => Taken::ByProbe,
            };
            // A sampled-out event has neither stack (a failed user walk keeps the kernel's).
            let stack = match (spec.stacks, &s.user) {
                _ if self.resumed_from_probe(s) => Some(self.own_stack(UPROBE_PROBES_FRAME)),
                (Stacks::Never, _) => None,
                (Stacks::Sometimes, None) if s.kernel.is_none() => None,
                _ => Some(self.stack(s.pid, s.user.as_deref(), s.kernel.as_deref(), taken)),
            };
            self.count_own(s, stack);
            let at = at(s.phase, s.phase_mask);
            let sample = Sample::new(s.kind, (s.pid, s.tid), at, s.values.clone());
            self.builder.add(sample.on(stack).syscall(s.nr));
        }
        for g in &w.go_allocs {
            let stack = self.stack(g.pid, g.user.as_deref(), None, Taken::ByProbe);
            let (bytes, count) = go_sample_weight(g.size, g.rate);
            let at = at(g.phase, g.phase_mask);
            self.builder.add(
                Sample::new(
                    SampleKind::Alloc,
                    (g.pid, 0),
                    at,
                    vec![bytes.round() as u64, 1, milli(count)],
                )
                .on(stack),
            );
            self.builder.add(Sample::new(
                SampleKind::AllocTotal,
                (g.pid, 0),
                at,
                vec![bytes.round() as u64, count.round() as u64, 0],
            ));
            let mut mask = g.phase_mask;
            while mask != 0 {
                let id = mask.trailing_zeros();
                mask &= mask - 1;
                let e = self.go_phase_allocs.entry(id).or_default();
                e.0 += bytes;
                e.1 += count;
            }
        }
    }

    /// Folds the live heap read at CLOCK_MONOTONIC `now_ns` into per-stack totals with ages.
    pub fn set_live(&mut self, live: &[RawLive], now_ns: u64, sym: &mut dyn Symbolize) {
        let as_window = RawWindow {
            samples: (live.iter())
                .map(|l| RawSample {
                    user: l.user.clone(),
                    ..RawSample::new(SampleKind::Live, (l.pid, 0), (l.phase, l.phase_mask))
                })
                .collect(),
            ..RawWindow::default()
        };
        self.symbolize_new(&as_window, sym);
        let live: Vec<Sample> = (live.iter())
            .map(|l| {
                let stack = self.stack(l.pid, l.user.as_deref(), None, Taken::ByProbe);
                let age = now_ns.saturating_sub(l.allocated_at_ns);
                let at = at(l.phase, l.phase_mask);
                Sample::new(
                    SampleKind::Live,
                    (l.pid, 0),
                    at,
                    vec![l.est_bytes, 1, age, age],
                )
                .on(stack)
            })
            .collect();
        self.builder.replace(SampleKind::Live, live);
        self.forget_provisional();
    }

    /// Symbolizes, in one batch per process and one for the kernel, every address of `w` not
    /// seen before.
    fn symbolize_new(&mut self, w: &RawWindow, sym: &mut dyn Symbolize) {
        let mut user: HashMap<u32, HashSet<u64>> = HashMap::new();
        let mut kernel: HashSet<u64> = HashSet::new();
        let mut note_user =
            |pid: u32, addrs: &Option<Vec<u64>>, cache: &HashMap<(u32, u64), Vec<u32>>| {
                for (i, &a) in addrs.iter().flatten().enumerate() {
                    let a = lookup_addr(i, a);
                    if !cache.contains_key(&(pid, a)) {
                        user.entry(pid).or_default().insert(a);
                    }
                }
            };
        for s in &w.samples {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.go_allocs {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for addrs in w.samples.iter().map(|s| &s.kernel) {
            for (i, &a) in addrs.iter().flatten().enumerate() {
                let a = lookup_addr(i, a);
                if !self.kernel_frames.contains_key(&a) {
                    kernel.insert(a);
                }
            }
        }
        for (pid, addrs) in user {
            let addrs: Vec<u64> = addrs.into_iter().collect();
            let frames = sym.user(pid, &addrs);
            for (a, fs) in addrs.into_iter().zip(frames) {
                if sym.named_later(pid, a) {
                    self.provisional.push((pid, a));
                }
                let ids = fs
                    .into_iter()
                    .map(|f| self.builder.intern_frame(f))
                    .collect();
                self.user_frames.insert((pid, a), ids);
            }
        }
        self.probe_resumed.clear();
        for s in w.samples.iter().filter(|s| user_mode_cpu_sample(s)) {
            if let Some(&a) = s.user.as_ref().and_then(|u| u.first()) {
                if sym.probe_resumes_at(s.pid, a) {
                    self.probe_resumed.insert((s.pid, a));
                }
            }
        }
        let kernel: Vec<u64> = kernel.into_iter().collect();
        if !kernel.is_empty() {
            let frames = sym.kernel(&kernel);
            for (a, fs) in kernel.into_iter().zip(frames) {
                let ids = fs
                    .into_iter()
                    .map(|f| self.builder.intern_frame(f))
                    .collect();
                self.kernel_frames.insert(a, ids);
            }
        }
    }

    /// Interns the combined stack, leaf first: kernel frames, then user frames. With
    /// `Taken::ByProbe` (our program took it, as at a switch-out) the probe's own frames at the
    /// leaf, the program and the glue that ran it, are left out. A probe frame in the rest of the
    /// kernel stack means the thread was in phaseprof's machinery (a cpu sample that interrupted
    /// a probe; a thread waiting inside a uprobe trap), as does a user frame in the uprobe page
    /// (a return probe's trampoline): the stack is then [`OWN_COST_FRAME`], a tower of its own,
    /// never the target's code.
    fn stack(
        &mut self,
        pid: u32,
        user: Option<&[u64]>,
        kernel: Option<&[u64]>,
        taken: Taken,
    ) -> u32 {
        let mut frames = Vec::new();
        let mut ours = false;
        let mut mechanism = None;
        for (i, &a) in kernel.unwrap_or_default().iter().enumerate() {
            let ids = &self.kernel_frames[&lookup_addr(i, a)];
            let probe = ids
                .iter()
                .any(|&f| self.builder.frame(f).is_some_and(is_probe_frame));
            if probe && frames.is_empty() && taken == Taken::ByProbe {
                continue;
            }
            ours |= probe;
            mechanism = mechanism.or_else(|| {
                ids.iter()
                    .find_map(|&f| self.builder.frame(f).and_then(probe_mechanism))
            });
            frames.extend_from_slice(ids);
        }
        let user_frames = self.user_stack(pid, user.unwrap_or_default());
        if let Some(&f) = user_frames
            .iter()
            .find(|&&f| self.builder.frame(f).is_some_and(is_probe_user_frame))
        {
            ours = true;
            mechanism = mechanism.or_else(|| self.builder.frame(f).and_then(probe_mechanism));
        }
        if ours {
            return self.own_stack(mechanism.unwrap_or(OTHER_PROBES_FRAME));
        }
        frames.extend(user_frames);
        self.builder.intern_stack(frames)
    }

    /// The stack of the [`OWN_COST_FRAME`] tower with `mechanism` at its leaf.
    fn own_stack(&mut self, mechanism: &'static str) -> u32 {
        let mut synthetic = |function: &str| {
            self.builder.intern_frame(Frame {
                function: function.into(),
                module: "phaseprof".into(),
                kind: FrameKind::Synthetic,
                inlined: false,
            })
        };
        let leaf = synthetic(mechanism);
        let own = synthetic(OWN_COST_FRAME);
        let id = self.builder.intern_stack(vec![leaf, own]);
        self.own_stacks.insert(id, mechanism);
        id
    }

    /// Whether `s` is a cpu sample taken as an entry probe's trap resumed its thread.
    fn resumed_from_probe(&self, s: &RawSample) -> bool {
        user_mode_cpu_sample(s)
            && (s.user.as_ref().and_then(|u| u.first()))
                .is_some_and(|&a| self.probe_resumed.contains(&(s.pid, a)))
    }

    /// A user stack's frames, leaf first. The kernel's frame-pointer walk follows a frame that
    /// points at itself (or a loop of them) to its depth limit: an address in none of the
    /// target's mappings seen a second time is such a loop, where the stack is cut.
    fn user_stack(&self, pid: u32, addrs: &[u64]) -> Vec<u32> {
        let mut frames = Vec::with_capacity(addrs.len());
        let mut unmapped = HashSet::new();
        for (i, &a) in addrs.iter().enumerate() {
            let ids = &self.user_frames[&(pid, lookup_addr(i, a))];
            let nowhere = ids.iter().any(|&f| {
                self.builder
                    .frame(f)
                    .is_some_and(|f| f.module == UNMAPPED_MODULE)
            });
            if nowhere && !unmapped.insert(a) {
                break;
            }
            frames.extend_from_slice(ids);
        }
        frames
    }

    pub fn snapshot(&self) -> Profile {
        self.builder.snapshot()
    }

    pub fn finish(self) -> Profile {
        self.builder.finish()
    }
}

#[cfg(test)]
mod tests;
