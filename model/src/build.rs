//! Incremental construction of a [`Profile`]: interning of frames and stacks and summing of
//! samples that share a key, so windows drained one after another fold into one profile.
use std::collections::HashMap;

use crate::lost::Lost;
use crate::phase_stats::PhaseStats;
use crate::profile::*;

/// The phase an event happened in: the innermost phase and every phase on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhaseAt {
    pub phase: u32,
    pub mask: u64,
}

impl PhaseAt {
    /// Outside any phase.
    pub const NONE: PhaseAt = PhaseAt {
        phase: PHASE_NONE,
        mask: 1,
    };
}

/// A syscall sample's identity: pid, tid, phase, phase mask, number, stack.
type SyscallKey = (u32, u32, u32, u64, u32, Option<u32>);

/// Builds a [`Profile`] from samples added in any order and any number of windows.
#[derive(Default)]
pub struct ProfileBuilder {
    profile: Profile,
    frame_index: HashMap<Frame, u32>,
    stack_index: HashMap<Vec<u32>, u32>,
    cpu_index: HashMap<(u32, u32, u32, u64, u32), usize>,
    offcpu_index: HashMap<(u32, u32, u32, u64, u32), usize>,
    syscall_index: HashMap<SyscallKey, usize>,
    alloc_index: HashMap<(u32, u32, u64, u32), usize>,
    alloc_total_index: HashMap<(u32, u32, u64), usize>,
    fault_index: HashMap<(u32, u32, u32, u64, u32), usize>,
}

impl ProfileBuilder {
    pub fn new(meta: Meta, phases: Vec<String>) -> Self {
        let mut phases = phases;
        if phases.first().map(String::as_str) != Some(PHASE_NONE_NAME) {
            phases.insert(0, PHASE_NONE_NAME.to_string());
        }
        ProfileBuilder {
            profile: Profile {
                meta,
                phases,
                ..Profile::default()
            },
            ..ProfileBuilder::default()
        }
    }

    pub fn meta_mut(&mut self) -> &mut Meta {
        &mut self.profile.meta
    }

    pub fn phase_stats_mut(&mut self) -> &mut Vec<PhaseStats> {
        &mut self.profile.phase_stats
    }

    pub fn lost_mut(&mut self) -> &mut Lost {
        &mut self.profile.lost
    }

    pub fn intern_frame(&mut self, frame: Frame) -> u32 {
        if let Some(&i) = self.frame_index.get(&frame) {
            return i;
        }
        let i = self.profile.frames.len() as u32;
        self.profile.frames.push(frame.clone());
        self.frame_index.insert(frame, i);
        i
    }

    /// `intern_frame` for a borrowed frame, cloned only when new (merging thousands of windows
    /// that share their frames).
    pub fn intern_frame_ref(&mut self, frame: &Frame) -> u32 {
        match self.frame_index.get(frame) {
            Some(&i) => i,
            None => self.intern_frame(frame.clone()),
        }
    }

    pub fn frame(&self, index: u32) -> Option<&Frame> {
        self.profile.frames.get(index as usize)
    }

    /// Interns a stack given as frame indices, leaf first.
    pub fn intern_stack(&mut self, frames: Vec<u32>) -> u32 {
        if let Some(&i) = self.stack_index.get(&frames) {
            return i;
        }
        let i = self.profile.stacks.len() as u32;
        self.profile.stacks.push(Stack {
            frames: frames.clone(),
        });
        self.stack_index.insert(frames, i);
        i
    }

    pub fn add_cpu(&mut self, pid: u32, tid: u32, at: PhaseAt, stack: u32, count: u64) {
        let samples = &mut self.profile.cpu;
        let key = (pid, tid, at.phase, at.mask, stack);
        let i = *self.cpu_index.entry(key).or_insert_with(|| {
            samples.push(CpuSample {
                pid,
                tid,
                phase: at.phase,
                phase_mask: at.mask,
                stack,
                count: 0,
            });
            samples.len() - 1
        });
        samples[i].count = samples[i].count.saturating_add(count);
    }

    pub fn add_offcpu(&mut self, pid: u32, tid: u32, at: PhaseAt, stack: u32, ns: u64) {
        let samples = &mut self.profile.offcpu;
        let key = (pid, tid, at.phase, at.mask, stack);
        let i = *self.offcpu_index.entry(key).or_insert_with(|| {
            samples.push(OffCpuSample {
                pid,
                tid,
                phase: at.phase,
                phase_mask: at.mask,
                stack,
                ns: 0,
            });
            samples.len() - 1
        });
        samples[i].ns = samples[i].ns.saturating_add(ns);
    }

    pub fn add_syscall(
        &mut self,
        (pid, tid): (u32, u32),
        at: PhaseAt,
        nr: u32,
        stack: Option<u32>,
        count: u64,
        total_ns: u64,
    ) {
        let samples = &mut self.profile.syscalls;
        let key = (pid, tid, at.phase, at.mask, nr, stack);
        let i = *self.syscall_index.entry(key).or_insert_with(|| {
            samples.push(SyscallSample {
                pid,
                tid,
                phase: at.phase,
                phase_mask: at.mask,
                nr,
                name: crate::syscall_name(nr),
                stack,
                count: 0,
                total_ns: 0,
            });
            samples.len() - 1
        });
        samples[i].count = samples[i].count.saturating_add(count);
        samples[i].total_ns = samples[i].total_ns.saturating_add(total_ns);
    }

    /// Sampled allocations: `bytes` estimated bytes, `count` estimated allocations.
    pub fn add_alloc(
        &mut self,
        pid: u32,
        at: PhaseAt,
        stack: u32,
        bytes: u64,
        count: f64,
        samples: u64,
    ) {
        let v = &mut self.profile.allocs;
        let i = *self
            .alloc_index
            .entry((pid, at.phase, at.mask, stack))
            .or_insert_with(|| {
                v.push(AllocSample {
                    pid,
                    phase: at.phase,
                    phase_mask: at.mask,
                    stack,
                    bytes: 0,
                    count: 0.0,
                    samples: 0,
                });
                v.len() - 1
            });
        v[i].bytes = v[i].bytes.saturating_add(bytes);
        v[i].count += count;
        v[i].samples = v[i].samples.saturating_add(samples);
    }

    pub fn add_alloc_total(&mut self, pid: u32, at: PhaseAt, bytes: u64, count: u64, frees: u64) {
        let v = &mut self.profile.alloc_totals;
        let i = *self
            .alloc_total_index
            .entry((pid, at.phase, at.mask))
            .or_insert_with(|| {
                v.push(AllocTotal {
                    pid,
                    phase: at.phase,
                    phase_mask: at.mask,
                    bytes: 0,
                    count: 0,
                    frees: 0,
                });
                v.len() - 1
            });
        v[i].bytes = v[i].bytes.saturating_add(bytes);
        v[i].count = v[i].count.saturating_add(count);
        v[i].frees = v[i].frees.saturating_add(frees);
    }

    pub fn add_page_faults(&mut self, pid: u32, tid: u32, at: PhaseAt, stack: u32, count: u64) {
        let v = &mut self.profile.page_faults;
        let i = *self
            .fault_index
            .entry((pid, tid, at.phase, at.mask, stack))
            .or_insert_with(|| {
                v.push(PageFaultSample {
                    pid,
                    tid,
                    phase: at.phase,
                    phase_mask: at.mask,
                    stack,
                    count: 0,
                });
                v.len() - 1
            });
        v[i].count = v[i].count.saturating_add(count);
    }

    /// Replaces the live heap (it is a state, read once at the end, not a sum over windows).
    pub fn set_live(&mut self, live: Vec<LiveSample>) {
        self.profile.live = live;
    }

    /// The profile so far, for computations over its values before it is finished. Values may
    /// change; keys (pids, phases, stacks) must not, or later samples would not fold in.
    pub fn profile_mut(&mut self) -> &mut Profile {
        &mut self.profile
    }

    /// A copy of the profile so far (the builder keeps accumulating).
    pub fn snapshot(&self) -> Profile {
        self.profile.clone()
    }

    pub fn finish(self) -> Profile {
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str) -> Frame {
        Frame {
            function: name.into(),
            module: "m".into(),
            kind: FrameKind::User,
            inlined: false,
        }
    }

    // Checks that equal frames, stacks and sample keys fold together across windows.
    #[test]
    fn samples_with_equal_keys_are_summed() {
        let mut b = ProfileBuilder::new(Meta::default(), vec![]);
        let (a, c) = (b.intern_frame(frame("a")), b.intern_frame(frame("c")));
        assert_eq!(b.intern_frame(frame("a")), a);
        let s1 = b.intern_stack(vec![c, a]);
        assert_eq!(b.intern_stack(vec![c, a]), s1);
        b.add_cpu(1, 2, PhaseAt::NONE, s1, 3);
        b.add_cpu(1, 2, PhaseAt::NONE, s1, 4);
        b.add_syscall((1, 1), PhaseAt::NONE, 1, None, 5, 50);
        b.add_syscall((1, 1), PhaseAt::NONE, 1, None, 2, 20);
        let p = b.finish();
        assert_eq!(p.phases, vec!["(none)"]);
        assert_eq!(p.cpu.len(), 1);
        assert_eq!(p.cpu[0].count, 7);
        assert_eq!(p.syscalls[0].count, 7);
        assert_eq!(p.syscalls[0].total_ns, 70);
        assert_eq!(p.syscalls[0].name, "write");
    }
}
