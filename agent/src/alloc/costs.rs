//! Allocation-derived numbers computed once a recording ends: named costs from the frames of
//! allocation stacks (`clone_bytes`), and the extrapolation of duty-cycled totals.
use phaseprof_model::{
    PhaseStats, Profile, ProfileBuilder, SampleKind, ALLOC_BYTES, ALLOC_COUNT_MILLI,
};

use crate::elf::glob_match;

/// Computes each rule (name, frame globs) over the profile's allocation stacks: the bytes of
/// every sampled allocation with a frame (inlined ones included) matching a glob, in total
/// and per phase (inclusive, as all phase totals are). Exact with a sample period of 1.
pub fn compute(b: &mut ProfileBuilder, rules: &[(String, Vec<String>)]) {
    let p: &mut Profile = b.profile_mut();
    for (name, globs) in rules {
        let mut total = 0u64;
        let mut per_phase = vec![0u64; p.phase_stats.len()];
        for s in p.samples_of(SampleKind::Alloc) {
            let matches = |st| p.stack_has_frame(st, |f| globs.iter().any(|g| glob_match(g, f)));
            if !s.stack.is_some_and(matches) {
                continue;
            }
            let bytes = s.value(ALLOC_BYTES);
            total += bytes;
            for (id, v) in per_phase.iter_mut().enumerate() {
                if id < 64 && s.phase_mask & (1 << id) != 0 {
                    *v += bytes;
                }
            }
        }
        p.costs.insert(name.clone(), total);
        for (st, v) in p.phase_stats.iter_mut().zip(per_phase) {
            st.costs.insert(name.clone(), v);
        }
    }
}

/// Scales what duty-cycled probes counted while attached up to the whole recording.
pub fn extrapolate(p: &mut Profile, phase_stats: &mut [PhaseStats], scale: f64) {
    let up = |v: u64| (v as f64 * scale).round() as u64;
    for s in &mut p.samples {
        let scaled: &[usize] = match s.kind {
            SampleKind::AllocTotal => &[0, 1, 2],
            // Not what was sampled: that stays what it was.
            SampleKind::Alloc => &[ALLOC_BYTES, ALLOC_COUNT_MILLI],
            _ => &[],
        };
        for &i in scaled {
            if let Some(v) = s.values.get_mut(i) {
                *v = up(*v);
            }
        }
    }
    for st in phase_stats {
        st.alloc_bytes = up(st.alloc_bytes);
        st.allocs = up(st.allocs);
        st.frees = up(st.frees);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::{milli, Frame, FrameKind, Meta, PhaseAt, Sample};

    fn frame(b: &mut ProfileBuilder, name: &str) -> u32 {
        b.intern_frame(Frame {
            function: name.into(),
            module: "m".into(),
            kind: FrameKind::User,
            inlined: false,
        })
    }

    // Checks clone_bytes: only stacks through a clone frame count, per phase inclusively.
    #[test]
    fn clone_bytes_from_frames() {
        let mut b = ProfileBuilder::new(Meta::default(), vec!["block".into(), "replay".into()]);
        let (malloc, clone, other) = (
            frame(&mut b, "malloc"),
            frame(
                &mut b,
                "<alloc::vec::Vec<T,A> as core::clone::Clone>::clone",
            ),
            frame(&mut b, "validator_sim::work::leak"),
        );
        let cloned = b.intern_stack(vec![malloc, clone]);
        let leaked = b.intern_stack(vec![malloc, other]);
        let replay = PhaseAt {
            phase: 2,
            mask: 0b110,
        };
        b.add(Sample::new(SampleKind::Alloc, (1, 0), replay, vec![1000, 1, milli(1.0)]).on(cloned));
        b.add(Sample::new(SampleKind::Alloc, (1, 0), replay, vec![500, 1, milli(1.0)]).on(leaked));
        b.add(
            Sample::new(
                SampleKind::Alloc,
                (1, 0),
                PhaseAt::NONE,
                vec![7, 1, milli(1.0)],
            )
            .on(cloned),
        );
        *b.phase_stats_mut() = vec![PhaseStats::default(); 3];
        compute(
            &mut b,
            &[(
                "clone_bytes".into(),
                vec!["*as core::clone::Clone>::clone*".into()],
            )],
        );
        let p = b.finish();
        assert_eq!(p.costs["clone_bytes"], 1007);
        assert_eq!(p.phase_stats[0].costs["clone_bytes"], 7);
        assert_eq!(p.phase_stats[1].costs["clone_bytes"], 1000);
        assert_eq!(p.phase_stats[2].costs["clone_bytes"], 1000);
    }
}
