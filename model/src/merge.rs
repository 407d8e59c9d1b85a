//! Several profiles as one: windows of a live attach saved as a range, runs summed. Frames and
//! stacks are re-interned; samples with equal keys are summed; phase totals are added.
use crate::build::{PhaseAt, ProfileBuilder};
use crate::phase_stats::PhaseStats;
use crate::profile::*;

/// One profile holding everything of `profiles` (which should share their phases; phases are
/// matched by name). Metadata comes from the first, its time range spans all.
pub fn merge(profiles: &[&Profile]) -> Profile {
    let mut m = Merger::default();
    for p in profiles {
        m.add(p);
    }
    m.finish()
}

/// A window's metadata folded into the merge's: the span covers both, pids, events and threads
/// unite, unwind counts add (the first window's are already there).
fn merge_meta(meta: &mut Meta, p: &Meta, first: bool) {
    meta.start_unix_ns = meta.start_unix_ns.min(p.start_unix_ns);
    meta.end_unix_ns = meta.end_unix_ns.max(p.end_unix_ns);
    for pid in &p.pids {
        if !meta.pids.contains(pid) {
            meta.pids.push(*pid);
        }
    }
    for k in &p.events {
        if !meta.events.contains(k) {
            meta.events.push(*k);
        }
    }
    meta.threads
        .extend(p.threads.iter().map(|(t, n)| (*t, n.clone())));
    for (name, m) in &p.modules {
        meta.modules
            .entry(name.clone())
            .or_insert_with(|| m.clone());
    }
    // Any window with sampled off-CPU stacks has stackless time to spread when shown by stack.
    meta.offcpu_stack_walks_per_sec = meta
        .offcpu_stack_walks_per_sec
        .max(p.offcpu_stack_walks_per_sec);
    if !first {
        // The targets' CPU time adds up over windows, known only if known in every one.
        meta.targets_cpu_ns = match (meta.targets_cpu_ns, p.targets_cpu_ns) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
        meta.switch_probe_ns = meta.switch_probe_ns.saturating_add(p.switch_probe_ns);
        meta.offcpu_own_stack_ns = (meta.offcpu_own_stack_ns).saturating_add(p.offcpu_own_stack_ns);
        meta.sample_probe_ns = meta.sample_probe_ns.saturating_add(p.sample_probe_ns);
        if let (Some(into), Some(u)) = (&mut meta.unwind, &p.unwind) {
            into.absorb(u);
        }
        meta.phase_probes = match (meta.phase_probes, p.phase_probes) {
            (Some(a), Some(b)) => Some(PhaseProbeCost {
                calls: a.calls + b.calls,
                switch_hits: a.switch_hits + b.switch_hits,
                probe_ns: a.probe_ns + b.probe_ns,
                target_cpu_ns: a.target_cpu_ns + b.target_cpu_ns,
            }),
            (a, b) => a.or(b),
        };
        for (into, from) in [
            (&mut meta.phase_budget, &p.phase_budget),
            (&mut meta.syscall_budget, &p.syscall_budget),
        ] {
            match (into, from) {
                (Some(a), Some(b)) => a.absorb(b),
                (a @ None, b) => *a = b.clone(),
                (Some(_), None) => {}
            }
        }
        // Measured against one stretch before attaching: the stretches recorded after it add up;
        // against different ones, or in some windows only, it is not one measurement.
        meta.targets_slowdown = match (meta.targets_slowdown, p.targets_slowdown) {
            (Some(a), Some(b)) if a.unit == b.unit && a.before == b.before => {
                Some(a.and_after(&b.during))
            }
            _ => None,
        };
        // Addresses named late (see the agent's windows) add up.
        meta.names_late = meta.names_late.saturating_add(p.names_late);
    }
}

/// Merges profiles one at a time, so that thousands of stored windows can be folded in as they
/// are decoded instead of all being held at once.
#[derive(Default)]
pub struct Merger {
    /// None until the first profile, whose metadata the result keeps.
    b: Option<ProfileBuilder>,
    stats: Vec<PhaseStats>,
    /// Index of each merged phase by name: found in constant time, so merging windows with many
    /// phases stays linear.
    phase_index: std::collections::HashMap<String, u32>,
    /// Time covered by the windows whose allocation info is merged so far (its weight).
    alloc_ns: f64,
}

/// How allocations were taken over two spans, `a` of `wa` ns and `b` of `wb`: the attached
/// share and the estimated slowdown as time-weighted means, the budget of either.
fn merge_alloc_info(a: &mut Option<AllocInfo>, wa: f64, b: &Option<AllocInfo>, wb: f64) {
    let Some(b) = b else { return };
    let Some(a) = a else {
        *a = Some(b.clone());
        return;
    };
    let mean = |x: f64, y: f64| (x * wa + y * wb) / (wa + wb).max(1.0);
    a.attached_fraction = mean(a.attached_fraction, b.attached_fraction);
    a.estimated_overhead = mean(a.estimated_overhead, b.estimated_overhead);
    a.budget = a.budget.or(b.budget);
    a.go_sampled |= b.go_sampled;
    a.syscalls_in_slices += b.syscalls_in_slices;
    a.counted_own_ns += b.counted_own_ns;
    a.syscalls += b.syscalls;
}

impl Merger {
    pub fn add(&mut self, p: &Profile) {
        let first = self.b.is_none();
        let b = self
            .b
            .get_or_insert_with(|| ProfileBuilder::new(p.meta.clone(), p.phases.clone()));
        let merged = b.profile_mut();
        let span = p
            .meta
            .end_unix_ns
            .saturating_sub(p.meta.start_unix_ns)
            .max(1) as f64;
        if first {
            self.alloc_ns = if p.meta.alloc.is_some() { span } else { 0.0 };
        } else if p.meta.alloc.is_some() {
            merge_alloc_info(&mut merged.meta.alloc, self.alloc_ns, &p.meta.alloc, span);
            self.alloc_ns += span;
        }
        merge_meta(&mut merged.meta, &p.meta, first);
        // Phases new to the merge are appended; indices are remapped below.
        if self.phase_index.len() != merged.phases.len() {
            // The first profile's phases came in with the builder.
            self.phase_index = (merged.phases.iter().enumerate())
                .map(|(i, n)| (n.clone(), i as u32))
                .collect();
        }
        let index = &mut self.phase_index;
        let phase_map: Vec<u32> = p
            .phases
            .iter()
            .map(|n| {
                *index.entry(n.clone()).or_insert_with(|| {
                    merged.phases.push(n.clone());
                    (merged.phases.len() - 1) as u32
                })
            })
            .collect();
        if !p.phase_stats.is_empty() {
            self.stats.resize(
                merged.phases.len().max(self.stats.len()),
                PhaseStats::default(),
            );
        }
        for (i, s) in p.phase_stats.iter().enumerate() {
            if let Some(into) = phase_map
                .get(i)
                .and_then(|&to| self.stats.get_mut(to as usize))
            {
                into.absorb(s);
            }
        }
        merged.lost.absorb(&p.lost);
        for (k, v) in &p.costs {
            let e = merged.costs.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
        let frame_map: Vec<u32> = p.frames.iter().map(|f| b.intern_frame_ref(f)).collect();
        let stack_map: Vec<u32> = p
            .stacks
            .iter()
            .map(|s| b.intern_stack(s.frames.iter().map(|&f| frame_map[f as usize]).collect()))
            .collect();
        // Masks are remapped bit by bit, as phase indices may differ between profiles.
        let at = |phase: u32, mask: u64| {
            let mut m = 0u64;
            for (i, &to) in phase_map.iter().enumerate().take(64) {
                if mask & (1 << i) != 0 && to < 64 {
                    m |= 1 << to;
                }
            }
            PhaseAt {
                phase: phase_map.get(phase as usize).copied().unwrap_or(0),
                mask: if m == 0 { 1 } else { m },
            }
        };
        // A state read once at the end (the live heap) is not a sum over windows: left out.
        for s in p
            .samples
            .iter()
            .filter(|s| s.kind.spec().stored_as.is_some())
        {
            let at = at(s.phase, s.phase_mask);
            let stack = s.stack.map(|st| stack_map[st as usize]);
            b.add(
                Sample::new(s.kind, (s.pid, s.tid), at, s.values.clone())
                    .on(stack)
                    .syscall(s.nr),
            );
        }
    }

    /// The merged profile (empty when nothing was added).
    pub fn finish(self) -> Profile {
        let Some(mut b) = self.b else {
            return Profile::default();
        };
        let mut stats = self.stats;
        if !stats.is_empty() {
            stats.resize(b.profile_mut().phases.len(), PhaseStats::default());
        }
        *b.phase_stats_mut() = stats;
        b.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(count: u64, calls: u64) -> Profile {
        let mut b = ProfileBuilder::new(
            Meta {
                pids: vec![1],
                events: vec![EventKind::Cpu],
                start_unix_ns: count,
                end_unix_ns: count + 10,
                ..Meta::default()
            },
            vec!["p".into()],
        );
        let f = b.intern_frame(Frame {
            function: format!("f{count}"),
            module: "m".into(),
            kind: FrameKind::User,
            inlined: false,
        });
        let g = b.intern_frame(Frame {
            function: "shared".into(),
            module: "m".into(),
            kind: FrameKind::User,
            inlined: false,
        });
        let s = b.intern_stack(vec![g, f]);
        let at = PhaseAt {
            phase: 1,
            mask: 0b10,
        };
        b.add(Sample::new(SampleKind::Cpu, (1, 1), at, vec![count]).on(s));
        let mut st = PhaseStats {
            calls,
            wall_ns: calls * 100,
            wall_hist: vec![(5, calls)],
            ..PhaseStats::default()
        };
        st.costs.insert("flush_syscalls".into(), calls);
        *b.phase_stats_mut() = vec![PhaseStats::default(), st];
        b.finish()
    }

    // Checks merging: frames re-interned (a shared frame stays one), samples and phase totals
    // summed, the time range spanning both; and a cumulative delta recovers one window.
    #[test]
    fn merge_and_delta() {
        let (a, mut b) = (window(3, 10), window(5, 4));
        b.meta.names_late = 7;
        let m = merge(&[&a, &b, &b]);
        assert_eq!(m.meta.names_late, 14, "late names add up");
        let m = merge(&[&a, &b]);
        assert_eq!(
            m.frames.iter().filter(|f| f.function == "shared").count(),
            1
        );
        // Allocation info: the attached share weighted by each window's time.
        let (mut c, mut d) = (window(0, 1), window(10, 3));
        assert_eq!((c.meta.end_unix_ns, d.meta.start_unix_ns), (10, 10));
        let info = |f: f64| AllocInfo {
            sample_bytes: 1,
            probes: vec![],
            budget: Some(0.01),
            attached_fraction: f,
            estimated_overhead: 0.0,
            ns_per_hit: 1_000.0,
            ns_per_hit_measured: false,
            go_sampled: false,
            syscalls_in_slices: 0,
            syscalls: 0,
            counted_own_ns: 0,
        };
        (c.meta.alloc, d.meta.alloc) = (Some(info(1.0)), Some(info(0.2)));
        d.meta.end_unix_ns = 40; // 10 ns attached throughout, then 30 ns a fifth of the time
        let fraction = merge(&[&c, &d]).meta.alloc.unwrap().attached_fraction;
        assert!((fraction - 0.4).abs() < 1e-9, "{fraction}");
        assert_eq!(m.total(SampleKind::Cpu, 0), 8);
        assert_eq!(m.phase_stats[1].calls, 14);
        assert_eq!(m.phase_stats[1].costs["flush_syscalls"], 14);
        assert_eq!(m.phase_stats[1].wall_hist, vec![(5, 14)]);
        assert_eq!((m.meta.start_unix_ns, m.meta.end_unix_ns), (3, 15));
    }

    // Checks that merged counters saturate instead of wrapping: two windows near u64::MAX
    // (a hostile upload can claim anything) sum to u64::MAX, not to a small number.
    #[test]
    fn merged_counters_saturate() {
        let (mut a, mut b) = (window(3, 10), window(5, 4));
        for p in [&mut a, &mut b] {
            p.samples[0].values = vec![u64::MAX - 1];
            p.phase_stats[1].calls = u64::MAX - 1;
            p.phase_stats[1].wall_hist = vec![(5, u64::MAX - 1)];
            p.lost.events = u64::MAX - 1;
        }
        let m = merge(&[&a, &b]);
        assert_eq!(m.total(SampleKind::Cpu, 0), u64::MAX);
        assert_eq!(m.phase_stats[1].calls, u64::MAX);
        assert_eq!(m.phase_stats[1].wall_hist, vec![(5, u64::MAX)]);
        assert_eq!(m.lost.events, u64::MAX);
    }

    // Checks that phases are matched by name whatever their order, new ones appended: windows
    // of different phase lists (in other orders) sum into the right phases.
    #[test]
    fn phases_match_by_name_across_windows() {
        let mut a = window(1, 2);
        let mut b = window(2, 3);
        a.phases = vec!["(none)".into(), "commit".into()];
        b.phases = vec!["(none)".into(), "verify".into(), "commit".into()];
        b.phase_stats = vec![
            PhaseStats::default(),
            PhaseStats {
                calls: 7,
                ..PhaseStats::default()
            },
            b.phase_stats[1].clone(),
        ];
        let m = merge(&[&a, &b, &b]);
        assert_eq!(m.phases, vec!["(none)", "commit", "verify"]);
        assert_eq!(m.phase_stats[1].calls, 2 + 3 + 3);
        assert_eq!(m.phase_stats[2].calls, 14);
    }
}
