//! A decoded window split into rows (at ingest, on the decoding worker).
use phaseprof_model::{EventKind, FrameFields, FrameKind, Profile};

use super::{
    id_of, id_of_words, phase_id, Aggregate, Dictionary, Head, IdMap, SampleKey, SampleVals,
    StackRow, Stored, StoredView, Table, WindowRows,
};

/// The flags of a frame in a `StackRow`.
pub fn frame_flags(kind: FrameKind, inlined: bool) -> u8 {
    let k = match kind {
        FrameKind::User => 0,
        FrameKind::Kernel => 1,
        FrameKind::Synthetic => 2,
    };
    k | (u8::from(inlined) << 2)
}

/// The event kinds of `p` as a bit mask (bit = position in `EventKind::ALL`).
pub fn events_mask(events: &[EventKind]) -> u8 {
    (EventKind::ALL.iter().enumerate())
        .filter(|(_, k)| events.contains(k))
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// `p` (validated) as rows; dictionary rows `stored` has are left out.
pub fn split<F: FrameFields>(p: &Profile<F>, stored: &Stored) -> WindowRows {
    let stored = stored.read();
    let mut dict = Dictionary::default();
    let stack_ids = stack_ids(p, &stored, &mut dict);
    let phase_ids: Vec<u64> = p.phases.iter().map(|n| phase_id(n)).collect();
    for (n, &id) in p.phases.iter().zip(&phase_ids) {
        if id != 0 && !stored.has(Table::Functions, id) {
            dict.functions.entry(id).or_insert_with(|| n.clone());
        }
    }
    let mut agg = Aggregate::default();
    add_samples(p, &stack_ids, &phase_ids, &stored, &mut dict, &mut agg);
    for (s, &id) in p.phase_stats.iter().zip(&phase_ids) {
        agg.add_phase_stats(id, s);
    }
    super::counters::add(&mut agg, p);
    let m = &p.meta;
    agg.absorb_window_stats(1, m.start_unix_ns, m.end_unix_ns, events_mask(&m.events));
    agg.offer_head(&Head {
        meta: m.clone(),
        phases: p.phases.clone(),
    });
    let labels = serde_json::to_string(&m.labels).unwrap_or_else(|_| "{}".into());
    WindowRows {
        labelset: id_of(labels.as_bytes()),
        labels,
        start_ns: m.start_unix_ns,
        end_ns: m.end_unix_ns,
        dict,
        agg,
    }
}

/// The id of each of `p`'s stacks (by index), with the names and stacks not stored yet.
fn stack_ids<F: FrameFields>(
    p: &Profile<F>,
    stored: &StoredView,
    dict: &mut Dictionary,
) -> Vec<u64> {
    // Each frame's (function, mapping, flags) ids, hashed once however many stacks hold it.
    let frame_ids: Vec<(u64, u64, u8)> = (p.frames.iter())
        .map(|f| {
            let (func, module) = (id_of(f.function().as_bytes()), id_of(f.module().as_bytes()));
            if !stored.has(Table::Functions, func) {
                dict.functions
                    .entry(func)
                    .or_insert_with(|| f.function().to_string());
            }
            if !stored.has(Table::Mappings, module) {
                dict.mappings
                    .entry(module)
                    .or_insert_with(|| f.module().to_string());
            }
            (func, module, frame_flags(f.kind(), f.inlined()))
        })
        .collect();
    (p.stacks.iter())
        .map(|s| {
            // Hashed from the frames' ids as they are; collected only for a stack not stored
            // yet (most are: a vector per stack was a fifth of a split).
            let frames = (s.frames.iter()).filter_map(|&f| frame_ids.get(f as usize).copied());
            let id = id_of_words(frames.clone().flat_map(|(f, m, fl)| [f, m, u64::from(fl)]));
            if stored.has(Table::Stacks, id) {
                return id;
            }
            dict.stacks.entry(id).or_insert_with(|| StackRow {
                functions: frames.clone().map(|f| f.0).collect(),
                mappings: frames.clone().map(|f| f.1).collect(),
                flags: frames.map(|f| f.2).collect(),
            });
            id
        })
        .collect()
}

/// Every sample of `p` as a sample row of `agg`.
fn add_samples<F>(
    p: &Profile<F>,
    stack_ids: &[u64],
    phase_ids: &[u64],
    stored: &StoredView,
    dict: &mut Dictionary,
    agg: &mut Aggregate,
) {
    // (innermost phase, phase set) ids by (phase index, mask): few distinct per window.
    let mut seen: IdMap<(u32, u64), (u64, u64)> = IdMap::default();
    let mut at = |phase: u32, mask: u64| -> (u64, u64) {
        *seen.entry((phase, mask)).or_insert_with(|| {
            let phase = phase_ids.get(phase as usize).copied().unwrap_or(0);
            let mut set: Vec<u64> = (0..phase_ids.len().min(64))
                .filter(|&i| mask & (1 << i) != 0)
                .map(|i| phase_ids[i])
                .collect();
            if set.is_empty() {
                set.push(0);
            }
            set.sort_unstable();
            set.dedup();
            let id = id_of_words(set.iter().copied());
            if !stored.has(Table::Phasesets, id) {
                dict.phasesets.entry(id).or_insert(set);
            }
            (phase, id)
        })
    };
    let mut rows: Vec<(SampleKey, SampleVals)> = Vec::new();
    for s in &p.samples {
        // A state read once at the end (the live heap) is not stored: windows do not sum it.
        let Some(kind) = s.kind.spec().stored_as else {
            continue;
        };
        let (phase, phaseset) = at(s.phase, s.phase_mask);
        let stack = s.stack.and_then(|st| stack_ids.get(st as usize).copied());
        let key = SampleKey {
            kind,
            pid: s.pid,
            phase,
            phaseset,
            stack: stack.unwrap_or(0),
            nr: s.nr,
        };
        rows.push((key, SampleVals::of(&s.values)));
    }
    for (k, vals) in rows {
        agg.add_sample(k, &vals);
    }
}
