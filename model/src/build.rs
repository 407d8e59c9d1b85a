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

/// What samples are summed by: kind, pid, tid, phase, phase mask, stack, syscall.
type SampleKey = (SampleKind, u32, u32, u32, u64, Option<u32>, u32);

fn key_of(s: &Sample) -> SampleKey {
    (s.kind, s.pid, s.tid, s.phase, s.phase_mask, s.stack, s.nr)
}

impl Sample {
    /// A sample of `kind` with `values`, without a stack or a syscall number.
    pub fn new(kind: SampleKind, (pid, tid): (u32, u32), at: PhaseAt, values: Vec<u64>) -> Self {
        Sample {
            kind,
            pid,
            tid,
            phase: at.phase,
            phase_mask: at.mask,
            stack: None,
            nr: 0,
            values,
        }
    }

    pub fn on(mut self, stack: impl Into<Option<u32>>) -> Self {
        self.stack = stack.into();
        self
    }

    pub fn syscall(mut self, nr: u32) -> Self {
        self.nr = nr;
        self
    }

    pub fn at(&self) -> PhaseAt {
        PhaseAt {
            phase: self.phase,
            mask: self.phase_mask,
        }
    }
}

/// Builds a [`Profile`] from samples added in any order and any number of windows.
#[derive(Default)]
pub struct ProfileBuilder {
    profile: Profile,
    frame_index: HashMap<Frame, u32>,
    stack_index: HashMap<Vec<u32>, u32>,
    sample_index: HashMap<SampleKey, usize>,
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

    /// Adds `s`, summed into the sample of the same key if there is one.
    pub fn add(&mut self, s: Sample) {
        let samples = &mut self.profile.samples;
        match self.sample_index.get(&key_of(&s)) {
            Some(&i) => s.kind.absorb(&mut samples[i].values, &s.values),
            None => {
                self.sample_index.insert(key_of(&s), samples.len());
                samples.push(s);
            }
        }
    }

    /// Replaces the samples of `kind` (a state such as the live heap, read once at the end,
    /// not a sum over windows).
    pub fn replace(&mut self, kind: SampleKind, samples: Vec<Sample>) {
        self.profile.samples.retain(|s| s.kind != kind);
        self.sample_index = (self.profile.samples.iter().enumerate())
            .map(|(i, s)| (key_of(s), i))
            .collect();
        for s in samples {
            self.add(s);
        }
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
        let cpu = |n| Sample::new(SampleKind::Cpu, (1, 2), PhaseAt::NONE, vec![n]).on(s1);
        let write =
            |n, ns| Sample::new(SampleKind::Syscall, (1, 1), PhaseAt::NONE, vec![n, ns]).syscall(1);
        b.add(cpu(3));
        b.add(cpu(4));
        b.add(write(5, 50));
        b.add(write(2, 20));
        let p = b.finish();
        assert_eq!(p.phases, vec!["(none)"]);
        assert_eq!(p.samples.len(), 2);
        assert_eq!(p.samples[0].values, vec![7]);
        assert_eq!(p.samples[1].values, vec![7, 70]);
        assert_eq!(p.samples[1].syscall_name(), "write");
    }
}
