//! Allocation-derived numbers computed once a recording ends: named costs from the frames of
//! allocation stacks (`clone_bytes`), and the extrapolation of duty-cycled totals.
use phaseprof_model::{PhaseStats, Profile, ProfileBuilder};

use crate::elf::glob_match;

/// Computes each rule (name, frame globs) over the profile's allocation stacks: the bytes of
/// every sampled allocation with a frame (inlined ones included) matching a glob, in total
/// and per phase (inclusive, as all phase totals are). Exact with a sample period of 1.
pub fn compute(b: &mut ProfileBuilder, rules: &[(String, Vec<String>)]) {
    let p: &mut Profile = b.profile_mut();
    for (name, globs) in rules {
        let mut total = 0u64;
        let mut per_phase = vec![0u64; p.phase_stats.len()];
        for s in &p.allocs {
            let matches = p.stack_has_frame(s.stack, |f| globs.iter().any(|g| glob_match(g, f)));
            if !matches {
                continue;
            }
            total += s.bytes;
            for (id, v) in per_phase.iter_mut().enumerate() {
                if id < 64 && s.phase_mask & (1 << id) != 0 {
                    *v += s.bytes;
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
    for t in &mut p.alloc_totals {
        t.bytes = up(t.bytes);
        t.count = up(t.count);
        t.frees = up(t.frees);
    }
    for s in &mut p.allocs {
        s.bytes = up(s.bytes);
        s.count *= scale;
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
    use phaseprof_model::{Frame, FrameKind, Meta, PhaseAt};

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
        b.add_alloc(1, replay, cloned, 1000, 1.0, 1);
        b.add_alloc(1, replay, leaked, 500, 1.0, 1);
        b.add_alloc(1, PhaseAt::NONE, cloned, 7, 1.0, 1);
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
