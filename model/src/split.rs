//! A window cut in two: what an agent does when the collector refuses a window as too large
//! (413). Each half keeps the metadata and phase names and takes half of every sampled list,
//! with only the stacks and frames its samples use; the exact totals (phase stats, allocation
//! totals, costs, losses) go with the first half. Merging the halves gives the window back.
use std::collections::HashMap;

use crate::{Frame, Profile, Sample, Stack, Stacks};

/// The two halves, or None when there is nothing left to cut (fewer than two samples).
pub fn halves(p: &Profile) -> Option<(Profile, Profile)> {
    // Totals without stacks are exact: they stay whole, in the first half.
    let (totals, sampled): (Vec<&Sample>, Vec<&Sample>) =
        (p.samples.iter()).partition(|s| s.kind.spec().stacks == Stacks::Never);
    if sampled.len() < 2 {
        return None;
    }
    let mut first = Part::new(p);
    let mut second = Part::new(p);
    first.out.phase_stats = p.phase_stats.clone();
    first.out.samples = totals.into_iter().cloned().collect();
    first.out.costs = p.costs.clone();
    first.out.lost = p.lost.clone();
    let (a, b) = sampled.split_at(sampled.len() / 2);
    for (part, half) in [(&mut first, a), (&mut second, b)] {
        for &s in half {
            let mut s = s.clone();
            s.stack = s.stack.map(|st| part.stack(st));
            part.out.samples.push(s);
        }
    }
    Some((first.out, second.out))
}

/// One half being built: the source's stacks and frames it uses, renumbered.
struct Part<'a> {
    src: &'a Profile,
    out: Profile,
    stacks: HashMap<u32, u32>,
    frames: HashMap<u32, u32>,
}

impl<'a> Part<'a> {
    fn new(src: &'a Profile) -> Self {
        Part {
            src,
            out: Profile {
                meta: src.meta.clone(),
                phases: src.phases.clone(),
                ..Profile::default()
            },
            stacks: HashMap::new(),
            frames: HashMap::new(),
        }
    }

    fn stack(&mut self, old: u32) -> u32 {
        if let Some(&new) = self.stacks.get(&old) {
            return new;
        }
        let frames: Vec<u32> = self.src.stacks[old as usize]
            .frames
            .iter()
            .map(|&f| self.frame(f))
            .collect();
        self.out.stacks.push(Stack { frames });
        let new = (self.out.stacks.len() - 1) as u32;
        self.stacks.insert(old, new);
        new
    }

    fn frame(&mut self, old: u32) -> u32 {
        if let Some(&new) = self.frames.get(&old) {
            return new;
        }
        let f: &Frame = &self.src.frames[old as usize];
        self.out.frames.push(f.clone());
        let new = (self.out.frames.len() - 1) as u32;
        self.frames.insert(old, new);
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::Summary;
    use crate::*;

    // Checks that the halves validate, each holds only the stacks it uses, and that merging
    // them gives the window's totals back exactly; a window of one sample cannot be cut.
    #[test]
    fn halves_merge_back_to_the_window() {
        let mut b = ProfileBuilder::new(
            Meta {
                pids: vec![7],
                events: vec![EventKind::Cpu, EventKind::Syscall],
                ..Meta::default()
            },
            vec!["verify".into()],
        );
        for i in 0..10u32 {
            let f = b.intern_frame(Frame {
                function: format!("f{i}"),
                module: "m".into(),
                kind: FrameKind::User,
                inlined: false,
            });
            let s = b.intern_stack(vec![f]);
            b.add(
                Sample::new(
                    SampleKind::Cpu,
                    (7, 7),
                    PhaseAt { phase: 1, mask: 2 },
                    vec![u64::from(i) + 1],
                )
                .on(s),
            );
            b.add(
                Sample::new(SampleKind::Syscall, (7, 7), PhaseAt::NONE, vec![2, 100])
                    .on(Some(s))
                    .syscall(i),
            );
        }
        let p = b.finish();
        p.validate().unwrap();
        let (x, y) = halves(&p).unwrap();
        x.validate().unwrap();
        y.validate().unwrap();
        assert!(x.stacks.len() < p.stacks.len() && y.stacks.len() < p.stacks.len());
        let back = merge::merge(&[&x, &y]);
        let (want, got) = (Summary::of(&p), Summary::of(&back));
        assert_eq!(
            serde_json::to_value(&want.events).unwrap(),
            serde_json::to_value(&got.events).unwrap()
        );
        let mut one = p.clone();
        one.samples.retain(|s| s.kind == crate::SampleKind::Cpu);
        one.samples.truncate(1);
        assert!(halves(&one).is_none());
    }
}
