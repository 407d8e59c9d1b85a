//! Summed rows back into a `Profile`, for everything that reads profiles (pages, the JSON
//! summary, diffs, downloads). Per-thread detail is not in the rows: samples come back with
//! tid 0, and thread names are the earliest window's.
use phaseprof_model::phase_stats::PhaseStats;
use phaseprof_model::{
    EventKind, Frame, FrameKind, PhaseAt, Profile, ProfileBuilder, Sample, SampleKind,
    PHASE_NONE_NAME,
};

use super::{Aggregate, Dictionary, SampleKey};

fn frame_kind(flags: u8) -> FrameKind {
    match flags & 3 {
        1 => FrameKind::Kernel,
        2 => FrameKind::Synthetic,
        _ => FrameKind::User,
    }
}

/// The profile `agg` sums, its stacks and names from `dict`.
pub fn rebuild(agg: &Aggregate, dict: &Dictionary) -> Profile {
    let head = agg.head.clone().unwrap_or_default();
    let mut meta = head.meta;
    meta.start_unix_ns = agg.start_ns;
    meta.end_unix_ns = agg.end_ns;
    meta.events = (EventKind::ALL.iter().enumerate())
        .filter(|(i, _)| agg.events & (1 << i) != 0)
        .map(|(_, k)| *k)
        .collect();
    // Processes: the earliest window's, then the others samples name.
    let mut more: Vec<u32> = (agg.samples.keys().map(|k| k.pid))
        .filter(|p| !meta.pids.contains(p))
        .collect();
    more.sort_unstable();
    more.dedup();
    meta.pids.extend(more);
    // Phases: the earliest window's in its order, then the others by name.
    let name_of = |id: u64| -> String {
        if id == 0 {
            PHASE_NONE_NAME.to_string()
        } else {
            (dict.functions.get(&id).cloned()).unwrap_or_else(|| format!("[phase {id:x}]"))
        }
    };
    let mut phases: Vec<String> = head.phases;
    let mut others: Vec<String> = (agg.phase_stats.keys().copied())
        .chain(agg.samples.keys().map(|k| k.phase))
        .chain(
            agg.samples
                .keys()
                .flat_map(|k| dict.phasesets.get(&k.phaseset).cloned().unwrap_or_default()),
        )
        .map(name_of)
        .filter(|n| !phases.contains(n))
        .collect();
    others.sort();
    others.dedup();
    if phases.is_empty() {
        phases.push(PHASE_NONE_NAME.into());
    }
    phases.extend(others);
    let index: std::collections::HashMap<u64, u32> = (phases.iter().enumerate())
        .map(|(i, n)| (super::phase_id(n), i as u32))
        .collect();
    let mut b = ProfileBuilder::new(meta, phases.clone());
    add_samples(&mut b, agg, dict, &index);
    if !agg.phase_stats.is_empty() {
        let mut stats = vec![PhaseStats::default(); phases.len()];
        for (id, s) in &agg.phase_stats {
            if let Some(&i) = index.get(id) {
                stats[i as usize].absorb(s);
            }
        }
        *b.phase_stats_mut() = stats;
    }
    let mut p = b.finish();
    super::counters::restore(&mut p, agg);
    p
}

/// Every sample row into `b`, in key order (the same rows always build the same profile).
fn add_samples(
    b: &mut ProfileBuilder,
    agg: &Aggregate,
    dict: &Dictionary,
    index: &std::collections::HashMap<u64, u32>,
) {
    let mut keys: Vec<&SampleKey> = agg.samples.keys().collect();
    keys.sort();
    let mut stacks = std::collections::HashMap::new();
    for k in keys {
        let v = &agg.samples[k];
        let mut mask = 0u64;
        for id in dict.phasesets.get(&k.phaseset).into_iter().flatten() {
            if let Some(&i) = index.get(id).filter(|&&i| i < 64) {
                mask |= 1 << i;
            }
        }
        let at = PhaseAt {
            phase: index.get(&k.phase).copied().unwrap_or(0),
            mask: if mask == 0 { 1 } else { mask },
        };
        let stack = (k.stack != 0).then(|| {
            *stacks
                .entry(k.stack)
                .or_insert_with(|| intern_stack(b, dict, k.stack))
        });
        // A kind this build does not know (stored by a newer collector) is left out.
        let Some(kind) = SampleKind::from_stored(k.kind) else {
            continue;
        };
        let values = v.0[..kind.spec().values.len().min(v.0.len())].to_vec();
        let sample = Sample::new(kind, (k.pid, 0), at, values);
        b.add(sample.on(stack).syscall(k.nr));
    }
}

fn intern_stack(b: &mut ProfileBuilder, dict: &Dictionary, id: u64) -> u32 {
    let Some(row) = dict.stacks.get(&id) else {
        let f = b.intern_frame(Frame {
            function: format!("[stack {id:x} not stored]"),
            module: String::new(),
            kind: FrameKind::Synthetic,
            inlined: false,
        });
        return b.intern_stack(vec![f]);
    };
    let frames = (row.functions.iter().zip(&row.mappings).zip(&row.flags))
        .map(|((f, map), &flags)| {
            b.intern_frame(Frame {
                function: (dict.functions.get(f).cloned()).unwrap_or_else(|| format!("{f:x}")),
                module: dict.mappings.get(map).cloned().unwrap_or_default(),
                kind: frame_kind(flags),
                inlined: flags & 4 != 0,
            })
        })
        .collect();
    b.intern_stack(frames)
}
