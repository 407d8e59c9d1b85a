//! Sums of windows' rows: what a merged selection, a rollup bucket or one window holds.
use std::collections::BTreeMap;

use phaseprof_model::phase_stats::PhaseStats;
use phaseprof_model::Meta;
use serde::{Deserialize, Serialize};

use super::{IdMap, SampleKey, SampleVals};

/// What cannot be summed, kept from one window (the earliest): its metadata and its phases
/// in the order it listed them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Head {
    pub meta: Meta,
    pub phases: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Aggregate {
    pub windows: u64,
    /// Earliest start, latest end (ns since the epoch).
    pub start_ns: u64,
    pub end_ns: u64,
    /// Event kinds recorded in any window (bit = position in `EventKind::ALL`).
    pub events: u8,
    pub head: Option<Head>,
    /// Summed counters by name (the table in `counters`): drops (`lost.*`), costs (`cost.*`),
    /// unwinding (`unwind.*`), the targets' CPU time and how many windows knew it, …
    pub counters: BTreeMap<String, u64>,
    /// Per-phase totals by phase id; empty when no window had phases.
    pub phase_stats: BTreeMap<u64, PhaseStats>,
    pub samples: IdMap<SampleKey, SampleVals>,
}

impl Aggregate {
    pub fn add_sample(&mut self, key: SampleKey, vals: &SampleVals) {
        self.samples.entry(key).or_default().absorb(vals);
    }

    pub fn add_counter(&mut self, name: &str, v: u64) {
        match self.counters.get_mut(name) {
            Some(c) => *c = c.saturating_add(v),
            None => {
                self.counters.insert(name.to_string(), v);
            }
        }
    }

    pub fn add_phase_stats(&mut self, phase: u64, s: &PhaseStats) {
        self.phase_stats.entry(phase).or_default().absorb(s);
    }

    /// Adds everything of `o`; the head kept is the earlier window's.
    pub fn absorb(&mut self, o: &Aggregate) {
        if o.windows == 0 {
            return;
        }
        self.absorb_window_stats(o.windows, o.start_ns, o.end_ns, o.events);
        if let Some(h) = &o.head {
            self.offer_head(h);
        }
        for (k, v) in &o.counters {
            self.add_counter(k, *v);
        }
        for (p, s) in &o.phase_stats {
            self.add_phase_stats(*p, s);
        }
        if self.samples.is_empty() {
            // Sized once (a rollup's first window): growing row by row was a tenth of the
            // SQLite writer's time.
            self.samples.reserve(o.samples.len());
        }
        for (k, v) in &o.samples {
            self.add_sample(*k, v);
        }
    }

    /// Counts `windows` more windows spanning `[start, end)` with `events`.
    pub fn absorb_window_stats(&mut self, windows: u64, start: u64, end: u64, events: u8) {
        if self.windows == 0 {
            (self.start_ns, self.end_ns) = (start, end);
        } else {
            self.start_ns = self.start_ns.min(start);
            self.end_ns = self.end_ns.max(end);
        }
        self.windows += windows;
        self.events |= events;
    }

    /// Keeps `h` if it is of a window earlier than the head kept.
    pub fn offer_head(&mut self, h: &Head) {
        let start = h.meta.start_unix_ns;
        let earlier = self
            .head
            .as_ref()
            .is_none_or(|mine| start < mine.meta.start_unix_ns);
        if earlier {
            self.head = Some(h.clone());
        }
    }
}

/// The dictionary rows sums refer to: stacks, phase sets, names (phases; a stack's functions are
/// found with the stack).
#[derive(Default)]
pub struct References {
    pub stacks: std::collections::HashSet<u64>,
    pub phasesets: std::collections::HashSet<u64>,
    pub names: std::collections::HashSet<u64>,
}

impl References {
    pub fn of(aggs: &[&Aggregate]) -> Self {
        let mut r = References::default();
        for a in aggs {
            for k in a.samples.keys() {
                if k.stack != 0 {
                    r.stacks.insert(k.stack);
                }
                r.phasesets.insert(k.phaseset);
                r.names.insert(k.phase);
            }
            r.names.extend(a.phase_stats.keys());
        }
        r
    }
}
