//! The aggregator over recorded-style windows and a fake symbolizer.
use super::*;
use crate::window::*;
use phaseprof_model::{EventKind, FrameKind, Sample, SampleKind};

/// Names each address after itself, and counts how often it was asked; addresses in `later`
/// are named provisionally (their names have not come); in `resumes`, entry probes resume.
#[derive(Default)]
struct FakeSymbolizer {
    user_calls: usize,
    asked: Vec<u64>,
    later: Vec<u64>,
    resumes: Vec<u64>,
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
                if *a == 0x7fff_0000 {
                    // 0x7fff_0000 is in the kernel's uprobe page: a return probe's trampoline.
                    return vec![Frame {
                        function: "[uprobes]+0xd".into(),
                        module: "[uprobes]".into(),
                        kind: FrameKind::User,
                        inlined: false,
                    }];
                }
                if *a >= 0xdead_0000 {
                    // In none of the target's mappings.
                    return vec![Frame {
                        function: format!("[unknown]+{a:#x}"),
                        module: UNMAPPED_MODULE.into(),
                        kind: FrameKind::User,
                        inlined: false,
                    }];
                }
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
    fn probe_resumes_at(&self, _pid: u32, addr: u64) -> bool {
        self.resumes.contains(&addr)
    }

    fn named_later(&self, _pid: u32, addr: u64) -> bool {
        self.later.contains(&addr)
    }
    fn kernel(&mut self, addrs: &[u64]) -> Vec<Vec<Frame>> {
        // 0xbf00 is the probe's own BPF program, which must not show in stacks.
        addrs
            .iter()
            .map(|&a| match a {
                0xbf00 => vec![frame("bpf_prog_123_x".into(), FrameKind::Kernel, false)],
                0x54ff => vec![frame(
                    "uprobe_notify_resume".into(),
                    FrameKind::Kernel,
                    false,
                )],
                0xdb00 => vec![frame("exc_debug_user".into(), FrameKind::Kernel, false)],
                0x5e00 => vec![frame(
                    "bpf_prog_9a_raw_tp__sys_enter".into(),
                    FrameKind::Kernel,
                    false,
                )],
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

/// A sample of thread 1 of process 1 outside phases.
fn raw(kind: SampleKind, user: Vec<u64>, kernel: Option<Vec<u64>>, values: Vec<u64>) -> RawSample {
    RawSample {
        user: Some(user),
        kernel,
        values,
        ..RawSample::new(kind, (1, 1), (0, 1))
    }
}

fn window() -> RawWindow {
    let cpu_user = vec![0x1000, 0x2001, 0x3001];
    let wait = vec![0xbf00, 0x7700, 0xfe00];
    RawWindow {
        samples: vec![
            raw(SampleKind::Cpu, cpu_user, Some(vec![0xff00]), vec![3]),
            raw(SampleKind::Offcpu, vec![0x1000], Some(wait), vec![50]),
            RawSample {
                nr: 1,
                ..raw(SampleKind::Syscall, vec![0x1000], None, vec![2, 20])
            },
        ],
        ..RawWindow::default()
    }
}

/// Each sample of `kind` by its leaf frame's function, with its first value.
fn by_leaf(p: &Profile, kind: SampleKind) -> HashMap<&str, u64> {
    (p.samples_of(kind))
        .map(|s| (leaf_of(p, s.stack.unwrap()), s.value(0)))
        .collect()
}

/// The leaf frame's function of `stack` in `p`.
fn leaf_of(p: &Profile, stack: u32) -> &str {
    let leaf = p.stacks[stack as usize].frames[0];
    p.frames[leaf as usize].function.as_str()
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
    let sample =
        |kernel: Vec<u64>, count| raw(SampleKind::Cpu, vec![0x1000], Some(kernel), vec![count]);
    // A sample whose user stack passes through a return probe's trampoline.
    let in_trampoline = RawSample {
        user: Some(vec![0x7fff_0000, 0x1000]),
        ..sample(vec![0xff00], 7)
    };
    let w = RawWindow {
        samples: vec![
            sample(vec![0xbf00, 0xff00], 2),
            sample(vec![0xff00, 0x7700], 3),
            sample(vec![0xff00], 5),
            in_trampoline,
            // In the single-step trap of a Go exit probe.
            sample(vec![0xff00, 0xdb01], 11),
            // In the syscall entry's program.
            sample(vec![0x5e00], 13),
        ],
        ..RawWindow::default()
    };
    agg.add_window(&w, &mut sym);
    let while_recording = agg.own_samples();
    let p = agg.finish();
    let by_leaf = by_leaf(&p, SampleKind::Cpu);
    let own = p.own_samples();
    assert_eq!(
        while_recording, own,
        "the counts kept while recording are the profile's"
    );
    assert_eq!(own.own(), 5 + 7 + 11 + 13, "{own:?}");
    // The return trampoline and the single step are uprobes'; the tracepoint iterator is
    // neither a syscall's nor a uprobe's.
    assert_eq!((own.uprobes, own.other, own.syscalls), (7 + 11, 5, 13));
    assert_eq!(by_leaf["kff00"], 5);
    assert_eq!(p.total(SampleKind::Cpu, 0), 28 + 13);
}

// Checks that a cpu sample in user mode where an entry probe's trap resumes the thread is the
// probes' (the trap ran with interrupts off until then), and that neither a sample there with
// kernel frames (the thread was in a syscall) nor a page fault there is.
#[test]
fn samples_where_a_probe_resumes_are_the_probes() {
    let mut agg = Aggregator::new(Meta::default(), vec![]);
    let mut sym = FakeSymbolizer {
        resumes: vec![0x3002],
        ..FakeSymbolizer::default()
    };
    let w = RawWindow {
        samples: vec![
            raw(SampleKind::Cpu, vec![0x3002, 0x1000], None, vec![3]),
            raw(SampleKind::Cpu, vec![0x3002, 0x1000], Some(vec![]), vec![4]),
            raw(
                SampleKind::Cpu,
                vec![0x3002, 0x1000],
                Some(vec![0x5500]),
                vec![5],
            ),
            raw(SampleKind::Cpu, vec![0x3004, 0x1000], None, vec![6]),
            raw(SampleKind::Pagefault, vec![0x3002, 0x1000], None, vec![7]),
        ],
        ..RawWindow::default()
    };
    agg.add_window(&w, &mut sym);
    let p = agg.finish();
    let own = p.own_samples();
    assert_eq!(
        (own.uprobes, own.own(), own.all),
        (3 + 4, 3 + 4, 3 + 4 + 5 + 6)
    );
    let cpu = by_leaf(&p, SampleKind::Cpu);
    assert_eq!((cpu["k5500"], cpu["u3004"]), (5, 6));
    assert_eq!(by_leaf(&p, SampleKind::Pagefault)["u3002"], 7);
}

// Checks that an off-CPU stack whose thread waited inside phaseprof's machinery (a uprobe
// trap below the switch) is the own line, while the switch-out program's frames at its leaf
// alone are only left out.
#[test]
fn waits_inside_our_probes_are_our_own_line() {
    let meta = Meta {
        events: vec![EventKind::Offcpu],
        ..Meta::default()
    };
    let mut agg = Aggregator::new(meta, vec![]);
    let mut sym = FakeSymbolizer::default();
    let wait = |kernel: Vec<u64>, ns| raw(SampleKind::Offcpu, vec![0x1000], Some(kernel), vec![ns]);
    let w = RawWindow {
        samples: vec![
            wait(vec![0xbf00, 0x7700, 0xfe00], 10),
            wait(vec![0xbf00, 0x7700, 0xfe00, 0x5500], 30),
        ],
        ..RawWindow::default()
    };
    agg.add_window(&w, &mut sym);
    let p = agg.finish();
    let by_leaf = by_leaf(&p, SampleKind::Offcpu);
    assert_eq!(by_leaf["kfdff"], 10);
    assert_eq!(by_leaf[UPROBE_PROBES_FRAME], 30);
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
        samples: vec![RawSample {
            user: Some(vec![0x1000]),
            values: crate::window::alloc_values(1000, 2, 500),
            ..RawSample::new(SampleKind::Alloc, (1, 0), (2, 0b110))
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
    let allocs: Vec<&Sample> = p.samples_of(SampleKind::Alloc).collect();
    assert_eq!(allocs.len(), 1);
    // 1000 estimated bytes and 4 allocations (2 samples of 500 bytes scaled as their bytes
    // were), and the Go sample's 100 bytes and 1.
    assert_eq!(allocs[0].values, vec![1100, 3, 5000]);
    let live: Vec<&Sample> = p.samples_of(SampleKind::Live).collect();
    assert_eq!(live.len(), 1);
    // Bytes, samples, the oldest's age, the ages' sum (mean 750).
    assert_eq!(live[0].values, vec![20, 2, 900, 1500]);
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
    let cpu: Vec<&Sample> = p.samples_of(SampleKind::Cpu).collect();
    assert_eq!(cpu.len(), 1);
    assert_eq!(cpu[0].values, vec![6]);
    let names: Vec<&str> = p.stacks[cpu[0].stack.unwrap() as usize]
        .frames
        .iter()
        .map(|&f| p.frames[f as usize].function.as_str())
        .collect();
    assert_eq!(names, vec!["kff00", "u1000", "inner", "outer", "u3000"]);
    let offcpu: Vec<&Sample> = p.samples_of(SampleKind::Offcpu).collect();
    let names: Vec<&str> = p.stacks[offcpu[0].stack.unwrap() as usize]
        .frames
        .iter()
        .map(|&f| p.frames[f as usize].function.as_str())
        .collect();
    assert_eq!(names, vec!["kfdff", "u1000"]);
    assert_eq!(offcpu[0].values, vec![100]);
    let syscalls: Vec<&Sample> = p.samples_of(SampleKind::Syscall).collect();
    assert_eq!(syscalls[0].values, vec![4, 40]);
}

// Checks that an address named provisionally (its name had not come) is asked for again at
// the next fold, while the others stay cached.
#[test]
fn provisional_names_are_asked_for_again() {
    let mut agg = Aggregator::new(Meta::default(), vec![]);
    let mut sym = FakeSymbolizer {
        later: vec![0x3000],
        ..FakeSymbolizer::default()
    };
    agg.add_window(&window(), &mut sym);
    sym.later.clear();
    agg.add_window(&window(), &mut sym);
    agg.add_window(&window(), &mut sym);
    let mut asked = sym.asked.clone();
    asked.sort();
    assert_eq!(asked, vec![0x1000, 0x2000, 0x3000, 0x3000]);
    assert_eq!(sym.user_calls, 2);
}

// Checks that a user stack the kernel's frame-pointer walk took around a loop (a frame pointing
// at itself: one address in no mapping, repeated to the depth limit) is cut at the repeat, while
// a recursion (one mapped address repeated) stays whole.
#[test]
fn frame_pointer_loops_are_cut() {
    let meta = Meta {
        events: vec![EventKind::Cpu],
        ..Meta::default()
    };
    let mut agg = Aggregator::new(meta, vec![]);
    let mut sym = FakeSymbolizer::default();
    let mut looping = vec![0x1000, 0x3001, 0xdead_1001];
    looping.extend(std::iter::repeat_n(0xdead_1001, 120));
    let recursion = vec![0x1000, 0x4001, 0x4001, 0x4001, 0x5001];
    let w = RawWindow {
        samples: vec![
            raw(SampleKind::Cpu, looping, None, vec![1]),
            raw(SampleKind::Cpu, recursion, None, vec![1]),
        ],
        ..RawWindow::default()
    };
    agg.add_window(&w, &mut sym);
    let p = agg.finish();
    let depths: Vec<usize> = p
        .samples_of(SampleKind::Cpu)
        .map(|s| p.stacks[s.stack.unwrap() as usize].frames.len())
        .collect();
    assert_eq!(depths, vec![3, 5]);
}
