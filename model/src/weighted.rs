//! A profile's samples as weighted stacks, one shape for every event kind: what flamegraphs,
//! tables and exports read.
use crate::frames::display_name;
use crate::profile::{EventKind, Profile, Sample, SampleKind, PHASE_NONE};

/// Whether an event of innermost phase `p` and phase set `mask` counts for a `want`ed phase
/// (None: every event): inside it, or inside a phase nested in it; `(none)` only outside all.
pub fn in_phase(want: Option<u32>, p: u32, mask: u64) -> bool {
    want.is_none_or(|want| {
        if want == PHASE_NONE {
            p == PHASE_NONE
        } else {
            want == p || (want < 64 && mask & (1u64 << want) != 0)
        }
    })
}

/// A stack with a value, for one event kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Weighted {
    /// The process, and the thread (0 where the kind is counted per process: allocations).
    pub pid: u32,
    pub tid: u32,
    /// Frame indices, leaf first.
    pub frames: Vec<u32>,
    /// A synthetic leaf to show above `frames` (the syscall name for syscall stacks).
    pub leaf_label: Option<String>,
    pub phase: u32,
    pub phase_mask: u64,
    /// The kind's first value (syscalls counted without a stack spread over the sampled ones).
    pub value: u64,
    /// Its other values, as recorded (exports that carry several values per sample: pprof).
    pub more: Vec<u64>,
}

/// The leaf an off-CPU stack's time runnable and waiting for a CPU is shown under.
pub const CPU_WAIT_LEAF: &str = "[cpu wait]";

/// An off-CPU stack as a tower per reason: its blocked time as recorded, its time waiting for a
/// CPU under a [`CPU_WAIT_LEAF`] of its own (each with the cpu-wait value it holds, so that
/// exports summing either value get the recording's totals).
fn split_cpu_wait(w: Weighted) -> Vec<Weighted> {
    let wait = w.more.first().copied().unwrap_or(0).min(w.value);
    let blocked = Weighted {
        value: w.value - wait,
        more: vec![0],
        ..w.clone()
    };
    let waiting = Weighted {
        leaf_label: Some(CPU_WAIT_LEAF.to_string()),
        value: wait,
        more: vec![wait],
        ..w
    };
    [blocked, waiting]
        .into_iter()
        .filter(|w| w.value > 0)
        .collect()
}

impl Profile {
    fn stack_frames(&self, stack: u32) -> Vec<u32> {
        self.stacks
            .get(stack as usize)
            .map(|s| s.frames.clone())
            .unwrap_or_default()
    }

    /// Every stack of `kind` with its value (the first of its flamegraph kind's), optionally
    /// only those recorded inside `phase` (inclusive: also while a phase nested in it was
    /// running).
    pub fn weighted_stacks(&self, kind: EventKind, phase: Option<u32>) -> Vec<Weighted> {
        let kind = kind.samples();
        let samples: Vec<&Sample> = self.samples_of(kind).collect();
        // Syscalls counted without a stack go to the stacks sampled for the same syscall.
        let spread = kind == SampleKind::Syscall && self.meta.syscall_stack_every > 1;
        let values: Vec<u64> = if spread {
            crate::stack_spread::counts_by_stack(&samples, |st| self.stack_content(st))
        } else {
            samples.iter().map(|s| s.value(0)).collect()
        };
        let mut out = Vec::with_capacity(samples.len());
        for (s, n) in samples.into_iter().zip(values) {
            if !in_phase(phase, s.phase, s.phase_mask) || n == 0 {
                continue;
            }
            let w = Weighted {
                pid: s.pid,
                tid: s.tid,
                frames: s.stack.map(|st| self.stack_frames(st)).unwrap_or_default(),
                leaf_label: (kind == SampleKind::Syscall)
                    .then(|| format!("syscall:{}", s.syscall_name())),
                phase: s.phase,
                phase_mask: s.phase_mask,
                value: n,
                more: s.values.iter().skip(1).copied().collect(),
            };
            if kind == SampleKind::Offcpu {
                out.extend(split_cpu_wait(w));
            } else {
                out.push(w);
            }
        }
        out
    }

    /// A stack's frames, for comparing stacks by what they hold.
    fn stack_content(&self, stack: u32) -> Vec<&crate::profile::Frame> {
        let frames = self.stack_frames(stack);
        let frame = |f: &u32| self.frames.get(*f as usize);
        frames.iter().filter_map(frame).collect()
    }

    /// Whether any frame of `stack` (a function name, inlined frames included) matches `pred`.
    pub fn stack_has_frame(&self, stack: u32, pred: impl Fn(&str) -> bool) -> bool {
        self.stacks.get(stack as usize).is_some_and(|s| {
            s.frames
                .iter()
                .filter_map(|&f| self.frames.get(f as usize))
                .any(|f| pred(&f.function))
        })
    }

    /// Frame names of a weighted stack, root first, with its synthetic leaf last.
    pub fn names_root_first(&self, w: &Weighted) -> Vec<String> {
        let mut names: Vec<String> = w
            .frames
            .iter()
            .rev()
            .map(|&f| {
                self.frames
                    .get(f as usize)
                    .map(display_name)
                    .unwrap_or_else(|| "[bad frame]".into())
            })
            .collect();
        if let Some(label) = &w.leaf_label {
            names.push(label.clone());
        }
        if names.is_empty() {
            names.push("[no stack]".into());
        }
        names
    }
}
