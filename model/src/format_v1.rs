//! Profiles of format version 1, which kept one list per event kind (`cpu`, `offcpu`,
//! `syscalls`, `allocs`, `alloc_totals`, `live`, `page_faults`): read into the one list of
//! samples of version 2. Only this reader knows those lists.
use serde::Deserialize;

use crate::build::PhaseAt;
use crate::kinds::{milli, SampleKind};
use crate::profile::Sample;

/// A version-1 sample of any list: the key, and each value under its old name.
#[derive(Deserialize)]
struct Old {
    pid: u32,
    #[serde(default)]
    tid: u32,
    phase: u32,
    #[serde(default)]
    phase_mask: u64,
    stack: Option<u32>,
    #[serde(default)]
    nr: u32,
    #[serde(default)]
    count: Option<f64>,
    #[serde(default)]
    ns: u64,
    #[serde(default)]
    total_ns: u64,
    #[serde(default)]
    bytes: u64,
    #[serde(default)]
    samples: u64,
    #[serde(default)]
    frees: u64,
    #[serde(default)]
    oldest_ns: u64,
    #[serde(default)]
    mean_age_ns: u64,
}

/// A version-1 entry's values in the order its kind lists them now.
type ValuesOf = fn(&Old) -> Vec<u64>;

/// The lists of a version-1 profile.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Lists {
    #[serde(deserialize_with = "crate::window_limits::items")]
    cpu: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    offcpu: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    syscalls: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    allocs: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    alloc_totals: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    live: Vec<Old>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    page_faults: Vec<Old>,
}

impl Lists {
    /// Every list's entries as samples.
    pub fn into_samples(self) -> Vec<Sample> {
        let lists: [(SampleKind, Vec<Old>, ValuesOf); 7] = [
            (SampleKind::Cpu, self.cpu, |o| {
                vec![o.count.unwrap_or(0.0) as u64]
            }),
            (SampleKind::Offcpu, self.offcpu, |o| vec![o.ns]),
            (SampleKind::Syscall, self.syscalls, |o| {
                vec![o.count.unwrap_or(0.0) as u64, o.total_ns]
            }),
            (SampleKind::Alloc, self.allocs, |o| {
                vec![o.bytes, o.samples, milli(o.count.unwrap_or(0.0))]
            }),
            (SampleKind::AllocTotal, self.alloc_totals, |o| {
                vec![o.bytes, o.count.unwrap_or(0.0) as u64, o.frees]
            }),
            (SampleKind::Live, self.live, |o| {
                vec![
                    o.bytes,
                    o.samples,
                    o.oldest_ns,
                    o.mean_age_ns.saturating_mul(o.samples),
                ]
            }),
            (SampleKind::Pagefault, self.page_faults, |o| {
                vec![o.count.unwrap_or(0.0) as u64]
            }),
        ];
        let mut out = Vec::new();
        for (kind, list, values) in lists {
            for o in list {
                let at = PhaseAt {
                    phase: o.phase,
                    mask: o.phase_mask,
                };
                out.push(
                    Sample::new(kind, (o.pid, o.tid), at, values(&o))
                        .on(o.stack)
                        .syscall(o.nr),
                );
            }
        }
        out
    }
}
