//! Folds raw windows into a [`Profile`]: symbolizes new addresses (batched, cached across
//! windows) and sums samples with equal keys.
use std::collections::{HashMap, HashSet};

use phaseprof_model::{Frame, FrameKind, LiveSample, Meta, PhaseAt, Profile, ProfileBuilder};

use crate::window::{RawLive, RawWindow};

/// Turns addresses into frames. Implemented over blazesym for live recording and by hand in
/// tests.
pub trait Symbolize {
    /// For each address of process `pid`, its frames innermost first (inlined callees before the
    /// function that contains them). Addresses are already adjusted to point into the call
    /// instruction for return addresses.
    fn user(&mut self, pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>>;
    /// The same for kernel addresses.
    fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>>;
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
        "__uprobe_",
        "uprobe_",
        "uretprobe_",
        "handle_swbp",
        "arch_uprobe_",
    ];
    f.kind == phaseprof_model::FrameKind::Kernel
        && PREFIXES.iter().any(|p| f.function.starts_with(p))
}

/// The stack every cpu sample taken inside phaseprof's own probes is counted under: the
/// profiler's cost in the target's threads, as a tower of its own, never inside the target's.
pub const OWN_COST_FRAME: &str = "[phaseprof probes]";

/// Accumulates windows into one profile.
pub struct Aggregator {
    builder: ProfileBuilder,
    user_frames: HashMap<(u32, u64), Vec<u32>>,
    kernel_frames: HashMap<u64, Vec<u32>>,
    /// Go allocation estimates per phase id (inclusive), added to the phase totals at the end.
    go_phase_allocs: HashMap<u32, (f64, f64)>,
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
            kernel_frames: HashMap::new(),
            go_phase_allocs: HashMap::new(),
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
        for s in &w.cpu {
            let stack = self.cpu_stack(s.pid, s.user.as_deref(), s.kernel.as_deref());
            self.builder
                .add_cpu(s.pid, s.tid, at(s.phase, s.phase_mask), stack, s.count);
        }
        for s in &w.offcpu {
            let stack = self.stack(s.pid, s.user.as_deref(), s.kernel.as_deref());
            self.builder
                .add_offcpu(s.pid, s.tid, at(s.phase, s.phase_mask), stack, s.ns);
        }
        for s in &w.syscalls {
            let stack = s.user.as_deref().map(|u| self.stack(s.pid, Some(u), None));
            self.builder.add_syscall(
                s.pid,
                at(s.phase, s.phase_mask),
                s.nr,
                stack,
                s.count,
                s.total_ns,
            );
        }
        for t in &w.alloc_totals {
            self.builder.add_alloc_total(
                t.pid,
                at(t.phase, t.phase_mask),
                t.bytes,
                t.count,
                t.frees,
            );
        }
        for s in &w.allocs {
            let stack = self.stack(s.pid, s.user.as_deref(), None);
            // Ratio estimate of the allocations: samples scaled as their bytes were.
            let count = if s.sampled_bytes == 0 {
                s.samples as f64
            } else {
                s.samples as f64 * s.est_bytes as f64 / s.sampled_bytes as f64
            };
            self.builder.add_alloc(
                s.pid,
                at(s.phase, s.phase_mask),
                stack,
                s.est_bytes,
                count,
                s.samples,
            );
        }
        for g in &w.go_allocs {
            let stack = self.stack(g.pid, g.user.as_deref(), None);
            let (bytes, count) = go_sample_weight(g.size, g.rate);
            let at = at(g.phase, g.phase_mask);
            self.builder
                .add_alloc(g.pid, at, stack, bytes.round() as u64, count, 1);
            self.builder
                .add_alloc_total(g.pid, at, bytes.round() as u64, count.round() as u64, 0);
            let mut mask = g.phase_mask;
            while mask != 0 {
                let id = mask.trailing_zeros();
                mask &= mask - 1;
                let e = self.go_phase_allocs.entry(id).or_default();
                e.0 += bytes;
                e.1 += count;
            }
        }
        for s in &w.page_faults {
            let stack = self.stack(s.pid, s.user.as_deref(), None);
            self.builder
                .add_page_faults(s.pid, s.tid, at(s.phase, s.phase_mask), stack, s.count);
        }
    }

    /// Folds the live heap read at CLOCK_MONOTONIC `now_ns` into per-stack totals with ages.
    pub fn set_live(&mut self, live: &[RawLive], now_ns: u64, sym: &mut dyn Symbolize) {
        let as_window = RawWindow {
            allocs: live
                .iter()
                .map(|l| crate::window::RawAlloc {
                    pid: l.pid,
                    phase: l.phase,
                    phase_mask: l.phase_mask,
                    user: l.user.clone(),
                    est_bytes: 0,
                    samples: 0,
                    sampled_bytes: 0,
                })
                .collect(),
            ..RawWindow::default()
        };
        self.symbolize_new(&as_window, sym);
        let mut by_key: HashMap<(u32, u32, u64, u32), LiveSample> = HashMap::new();
        for l in live {
            let stack = self.stack(l.pid, l.user.as_deref(), None);
            let age = now_ns.saturating_sub(l.allocated_at_ns);
            let e = by_key
                .entry((l.pid, l.phase, l.phase_mask, stack))
                .or_insert(LiveSample {
                    pid: l.pid,
                    phase: l.phase,
                    phase_mask: l.phase_mask,
                    stack,
                    bytes: 0,
                    samples: 0,
                    oldest_ns: 0,
                    mean_age_ns: 0,
                });
            e.bytes += l.est_bytes;
            e.samples += 1;
            e.oldest_ns = e.oldest_ns.max(age);
            let n = e.samples as u128;
            e.mean_age_ns = ((e.mean_age_ns as u128 * (n - 1) + age as u128) / n) as u64;
        }
        let mut live: Vec<LiveSample> = by_key.into_values().collect();
        live.sort_by_key(|l| std::cmp::Reverse(l.bytes));
        self.builder.set_live(live);
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
        for s in &w.cpu {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.offcpu {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.syscalls {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.allocs {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.go_allocs {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        for s in &w.page_faults {
            note_user(s.pid, &s.user, &self.user_frames);
        }
        let kernel_addrs = w
            .cpu
            .iter()
            .map(|s| &s.kernel)
            .chain(w.offcpu.iter().map(|s| &s.kernel));
        for addrs in kernel_addrs {
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
                let ids = fs
                    .into_iter()
                    .map(|f| self.builder.intern_frame(f))
                    .collect();
                self.user_frames.insert((pid, a), ids);
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

    /// The stack of a cpu sample: the combined stack, or, when the sample interrupted one of
    /// phaseprof's probes (a probe frame anywhere in its kernel stack), [`OWN_COST_FRAME`].
    fn cpu_stack(&mut self, pid: u32, user: Option<&[u64]>, kernel: Option<&[u64]>) -> u32 {
        let in_probe = kernel
            .unwrap_or_default()
            .iter()
            .enumerate()
            .any(|(i, &a)| {
                self.kernel_frames[&lookup_addr(i, a)]
                    .iter()
                    .any(|&f| self.builder.frame(f).is_some_and(is_probe_frame))
            });
        if !in_probe {
            return self.stack(pid, user, kernel);
        }
        let own = self.builder.intern_frame(Frame {
            function: OWN_COST_FRAME.into(),
            module: "phaseprof".into(),
            kind: FrameKind::Synthetic,
            inlined: false,
        });
        self.builder.intern_stack(vec![own])
    }

    /// Interns the combined stack, leaf first: kernel frames, then user frames. The probe's own
    /// frames at the leaf (the program that took the stack and the glue that ran it, such as
    /// `__traceiter_sched_switch` at a switch-out) are left out.
    fn stack(&mut self, pid: u32, user: Option<&[u64]>, kernel: Option<&[u64]>) -> u32 {
        let mut frames = Vec::new();
        let profile_frames = &self.builder;
        for (i, &a) in kernel.unwrap_or_default().iter().enumerate() {
            let ids = &self.kernel_frames[&lookup_addr(i, a)];
            if frames.is_empty()
                && ids
                    .iter()
                    .all(|&f| profile_frames.frame(f).is_some_and(is_probe_frame))
            {
                continue;
            }
            frames.extend_from_slice(ids);
        }
        for (i, &a) in user.unwrap_or_default().iter().enumerate() {
            frames.extend_from_slice(&self.user_frames[&(pid, lookup_addr(i, a))]);
        }
        self.builder.intern_stack(frames)
    }

    pub fn snapshot(&self) -> Profile {
        self.builder.snapshot()
    }

    pub fn finish(self) -> Profile {
        self.builder.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::window::*;
    use phaseprof_model::{EventKind, FrameKind};

    /// Names each address after itself, and counts how often it was asked.
    #[derive(Default)]
    struct FakeSymbolizer {
        user_calls: usize,
        asked: Vec<u64>,
    }

    fn frame(name: String, kind: FrameKind, inlined: bool) -> Frame {
        Frame {
            function: name,
            module: "fake".into(),
            kind,
            inlined,
        }
    }

    impl Symbolize for FakeSymbolizer {
        fn user(&mut self, _pid: u32, addrs: &[u64]) -> Vec<Vec<Frame>> {
            self.user_calls += 1;
            self.asked.extend_from_slice(addrs);
            addrs
                .iter()
                .map(|a| {
                    if *a == 0x2000 {
                        // 0x2000 is `inner` inlined into `outer`.
                        vec![
                            frame("inner".into(), FrameKind::User, true),
                            frame("outer".into(), FrameKind::User, false),
                        ]
                    } else {
                        vec![frame(format!("u{a:x}"), FrameKind::User, false)]
                    }
                })
                .collect()
        }
        fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>> {
            // 0xbf00 is the probe's own BPF program, which must not show in stacks.
            addrs
                .iter()
                .map(|&a| match a {
                    0xbf00 => vec![frame("bpf_prog_123_x".into(), FrameKind::Kernel, false)],
                    0x76ff => vec![frame(
                        "__traceiter_sched_switch".into(),
                        FrameKind::Kernel,
                        false,
                    )],
                    _ => vec![frame(format!("k{a:x}"), FrameKind::Kernel, false)],
                })
                .collect()
        }
    }

    fn window() -> RawWindow {
        RawWindow {
            cpu: vec![RawCpu {
                pid: 1,
                tid: 1,
                phase: 0,
                phase_mask: 1,
                user: Some(vec![0x1000, 0x2001, 0x3001]),
                kernel: Some(vec![0xff00]),
                count: 3,
            }],
            offcpu: vec![RawOffCpu {
                pid: 1,
                tid: 1,
                phase: 0,
                phase_mask: 1,
                user: Some(vec![0x1000]),
                kernel: Some(vec![0xbf00, 0x7700, 0xfe00]),
                ns: 50,
            }],
            syscalls: vec![RawSyscall {
                pid: 1,
                phase: 0,
                phase_mask: 1,
                nr: 1,
                user: Some(vec![0x1000]),
                count: 2,
                total_ns: 20,
            }],
            ..RawWindow::default()
        }
    }

    // Checks that cpu samples taken inside phaseprof's own probes (a BPF program, a helper's
    // stack walk, a tracepoint iterator anywhere in the kernel stack) are counted, all of them,
    // under the one own-cost frame, apart from the target's stacks.
    #[test]
    fn samples_in_our_probes_are_our_own_line() {
        let meta = Meta {
            events: vec![EventKind::Cpu],
            ..Meta::default()
        };
        let mut agg = Aggregator::new(meta, vec![]);
        let mut sym = FakeSymbolizer::default();
        let sample = |kernel: Vec<u64>, count| RawCpu {
            pid: 1,
            tid: 1,
            phase: 0,
            phase_mask: 1,
            user: Some(vec![0x1000]),
            kernel: Some(kernel),
            count,
        };
        let w = RawWindow {
            cpu: vec![
                sample(vec![0xbf00, 0xff00], 2),
                sample(vec![0xff00, 0x7700], 3),
                sample(vec![0xff00], 5),
            ],
            ..RawWindow::default()
        };
        agg.add_window(&w, &mut sym);
        let p = agg.finish();
        let by_leaf: HashMap<&str, u64> = p
            .cpu
            .iter()
            .map(|s| {
                let leaf = p.stacks[s.stack as usize].frames[0];
                (p.frames[leaf as usize].function.as_str(), s.count)
            })
            .collect();
        assert_eq!(by_leaf[OWN_COST_FRAME], 5);
        assert_eq!(by_leaf["kff00"], 5);
        assert_eq!(p.cpu.iter().map(|s| s.count).sum::<u64>(), 10);
    }

    // Checks Go sample weights: a sample of size s at rate r stands for s / (1 - e^(-s/r))
    // bytes; rate 1 (every allocation) and unknown rates (Go's default) are handled.
    #[test]
    fn go_sample_weights() {
        let (b, n) = go_sample_weight(512 * 1024, 512 * 1024);
        let p = 1.0 - (-1.0f64).exp();
        assert!((b - 512.0 * 1024.0 / p).abs() < 1e-6);
        assert!((n - 1.0 / p).abs() < 1e-9);
        assert_eq!(go_sample_weight(100, 1), (100.0, 1.0));
        assert_eq!(go_sample_weight(64, 0), go_sample_weight(64, 512 * 1024));
        // Huge objects are always sampled: weight -> size.
        let (b, _) = go_sample_weight(1 << 30, 512 * 1024);
        assert!((b - (1u64 << 30) as f64).abs() < 1.0);
    }

    // Checks that allocation samples fold with ratio-estimated counts, Go samples add to the
    // per-phase estimates inclusively, and the live heap aggregates by stack with ages.
    #[test]
    fn allocations_fold_with_estimates_and_ages() {
        let meta = Meta {
            events: vec![EventKind::Alloc],
            ..Meta::default()
        };
        let mut agg = Aggregator::new(meta, vec!["outer".into(), "inner".into()]);
        let mut sym = FakeSymbolizer::default();
        let w = RawWindow {
            allocs: vec![RawAlloc {
                pid: 1,
                phase: 2,
                phase_mask: 0b110,
                user: Some(vec![0x1000]),
                est_bytes: 1000,
                samples: 2,
                sampled_bytes: 500,
            }],
            go_allocs: vec![RawGoAlloc {
                pid: 1,
                phase: 2,
                phase_mask: 0b110,
                user: Some(vec![0x1000]),
                size: 100,
                rate: 1,
            }],
            ..RawWindow::default()
        };
        agg.add_window(&w, &mut sym);
        assert_eq!(agg.go_phase_allocs()[&1], (100.0, 1.0));
        assert_eq!(agg.go_phase_allocs()[&2], (100.0, 1.0));
        let live = |ts| RawLive {
            pid: 1,
            phase: 2,
            phase_mask: 0b110,
            user: Some(vec![0x1000]),
            est_bytes: 10,
            size: 10,
            allocated_at_ns: ts,
        };
        agg.set_live(&[live(100), live(400)], 1000, &mut sym);
        let p = agg.finish();
        assert_eq!(p.allocs.len(), 1);
        assert_eq!(p.allocs[0].bytes, 1100);
        assert_eq!(p.allocs[0].count, 4.0 + 1.0);
        assert_eq!(p.live.len(), 1);
        assert_eq!(
            (
                p.live[0].bytes,
                p.live[0].samples,
                p.live[0].oldest_ns,
                p.live[0].mean_age_ns
            ),
            (20, 2, 900, 750)
        );
    }

    // Checks stack assembly from a recorded-style window: kernel frames before user frames,
    // return addresses adjusted, inlined frames expanded, the probe's own frames at the leaf of
    // an off-CPU stack dropped (its program and `__traceiter_sched_switch`), and no address
    // symbolized twice.
    #[test]
    fn windows_fold_into_one_profile_with_cached_symbols() {
        let meta = Meta {
            events: vec![EventKind::Cpu, EventKind::Syscall],
            ..Meta::default()
        };
        let mut agg = Aggregator::new(meta, vec![]);
        let mut sym = FakeSymbolizer::default();
        agg.add_window(&window(), &mut sym);
        agg.add_window(&window(), &mut sym);
        let p = agg.finish();
        assert_eq!(sym.user_calls, 1, "second window must hit the cache");
        let mut asked = sym.asked.clone();
        asked.sort();
        assert_eq!(asked, vec![0x1000, 0x2000, 0x3000]);
        assert_eq!(p.cpu.len(), 1);
        assert_eq!(p.cpu[0].count, 6);
        let names: Vec<&str> = p.stacks[p.cpu[0].stack as usize]
            .frames
            .iter()
            .map(|&f| p.frames[f as usize].function.as_str())
            .collect();
        assert_eq!(names, vec!["kff00", "u1000", "inner", "outer", "u3000"]);
        let names: Vec<&str> = p.stacks[p.offcpu[0].stack as usize]
            .frames
            .iter()
            .map(|&f| p.frames[f as usize].function.as_str())
            .collect();
        assert_eq!(names, vec!["kfdff", "u1000"]);
        assert_eq!(p.offcpu[0].ns, 100);
        assert_eq!(p.syscalls[0].count, 4);
        assert_eq!(p.syscalls[0].total_ns, 40);
    }
}
