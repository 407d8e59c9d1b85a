//! Profiles other agents send, as phaseprof windows: pprof (Pyroscope's push API: `pprof`) and
//! OTLP profiles (`otlp`). Each sample type maps to the kind that measures the same thing: CPU
//! samples (`samples`/`count`, else `cpu`/`nanoseconds` over the period) to `cpu`, allocations
//! (`alloc_space`, `alloc_objects`) to `alloc`, marked as estimates (the sender's own samples,
//! weighed by its rate). Types no stored view shows (in-use heap, goroutines, mutex and block
//! contention) are named in `ignored`, not stored.
use std::collections::BTreeMap;
use std::io::Read;

use phaseprof_model::{
    AllocInfo, EventKind, Frame, FrameKind, Meta, PhaseAt, Profile, ProfileBuilder, Sample,
    SampleKind,
};

pub mod otlp;
pub mod pprof;

/// Why a pushed profile was refused.
#[derive(Debug)]
pub enum ImportError {
    /// Inflated past the limit (bytes).
    TooLarge(u64),
    Malformed(String),
    /// Nothing in it is a type phaseprof stores (the types it has).
    NothingStored(Vec<String>),
}

impl std::fmt::Display for ImportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImportError::TooLarge(max) => {
                write!(f, "the profile inflates to more than {max} bytes")
            }
            ImportError::Malformed(why) => write!(f, "not a profile phaseprof reads: {why}"),
            ImportError::NothingStored(types) => write!(
                f,
                "none of the profile's sample types ({}) is one the collector stores: \
                 samples/count or cpu/nanoseconds (CPU), alloc_space and alloc_objects \
                 (allocations)",
                types.join(", ")
            ),
        }
    }
}

/// A pushed profile as a window, and the sample types left out ("type/unit").
pub struct Imported {
    pub profile: Profile,
    pub ignored: Vec<String>,
}

/// What a sample type's values are, in phaseprof's kinds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Measure {
    /// CPU samples: the value over `per` (1 for a count; the period for CPU time in ns).
    Cpu {
        per: u64,
    },
    AllocBytes,
    AllocObjects,
}

/// What sample type `t` in `unit` measures, at `period` (None: nothing phaseprof stores).
pub(crate) fn measure_of(t: &str, unit: &str, period: i64) -> Option<Measure> {
    match (t, unit) {
        ("samples", "count") => Some(Measure::Cpu { per: 1 }),
        ("cpu", "nanoseconds") if period > 0 => Some(Measure::Cpu { per: period as u64 }),
        ("alloc_space", _) => Some(Measure::AllocBytes),
        ("alloc_objects", _) => Some(Measure::AllocObjects),
        _ => None,
    }
}

/// Sets `meta`'s events for `measures`, its sampling frequency from a CPU profile's period (in
/// `period_unit`), and for allocations that they are the sender's samples (estimates).
pub(crate) fn set_events<'a>(
    meta: &mut Meta,
    measures: impl Iterator<Item = &'a Measure>,
    period: i64,
    period_unit: Option<&str>,
) {
    for m in measures {
        let event = match m {
            Measure::Cpu { .. } => EventKind::Cpu,
            Measure::AllocBytes | Measure::AllocObjects => EventKind::Alloc,
        };
        if !meta.events.contains(&event) {
            meta.events.push(event);
        }
    }
    if meta.events.contains(&EventKind::Cpu) && period > 0 && period_unit == Some("nanoseconds") {
        meta.frequency_hz = (1_000_000_000 / period as u64).max(1);
    }
    if meta.events.contains(&EventKind::Alloc) && meta.alloc.is_none() {
        // The sender's own samples, weighed by its rate (Go: one per 512 KiB): estimates.
        let per_bytes = period_unit == Some("bytes");
        meta.alloc = Some(AllocInfo {
            sample_bytes: if per_bytes { period.max(0) as u64 } else { 0 },
            attached_fraction: 1.0,
            go_sampled: true,
            ..AllocInfo::default()
        });
    }
}

/// Samples added to a window, with the allocation totals they come to.
#[derive(Default)]
pub(crate) struct Samples {
    alloc_totals: BTreeMap<(u32, u32, u64), [u64; 2]>,
}

impl Samples {
    /// Adds `value` of `m` for the process and thread at `at` on `stack`. Allocated bytes and
    /// objects of one stack, sent as two types, sum into one sample.
    pub(crate) fn add(
        &mut self,
        b: &mut ProfileBuilder,
        m: &Measure,
        value: u64,
        (pid, tid): (u32, u32),
        at: PhaseAt,
        stack: u32,
    ) {
        let (kind, values, tid) = match *m {
            Measure::Cpu { per } => (SampleKind::Cpu, vec![value / per.max(1)], tid),
            Measure::AllocBytes => (SampleKind::Alloc, vec![value, 0, 0], 0),
            Measure::AllocObjects => {
                let milli = value.saturating_mul(1000);
                (SampleKind::Alloc, vec![0, value, milli], 0)
            }
        };
        if values.iter().all(|&v| v == 0) {
            return;
        }
        if kind == SampleKind::Alloc {
            let t = self
                .alloc_totals
                .entry((pid, at.phase, at.mask))
                .or_default();
            t[0] = t[0].saturating_add(values[0]);
            t[1] = t[1].saturating_add(values[1]);
        }
        b.add(Sample::new(kind, (pid, tid), at, values).on(stack));
    }

    /// The window, with the allocation totals (their own kind, without stacks, as the agent
    /// writes them).
    pub(crate) fn finish(self, mut b: ProfileBuilder) -> Profile {
        for ((pid, phase, mask), [bytes, objects]) in self.alloc_totals {
            let at = PhaseAt { phase, mask };
            b.add(Sample::new(
                SampleKind::AllocTotal,
                (pid, 0),
                at,
                vec![bytes, objects, 0],
            ));
        }
        b.finish()
    }
}

/// A location's frames, leaf first, from its mapping's `path` (the module is its file name), its
/// `address` and its lines' function `names`: the last line is the caller the others were
/// inlined into; `module+0xaddress` where it has no lines.
pub(crate) fn location_frames(path: &str, address: u64, names: &[&str]) -> Vec<Frame> {
    let module = path.rsplit('/').next().unwrap_or(path);
    let module = if module.is_empty() { "?" } else { module };
    if names.is_empty() {
        return vec![frame(&format!("{module}+0x{address:x}"), module, false)];
    }
    let last = names.len() - 1;
    (names.iter().enumerate())
        .map(|(i, name)| frame(name, module, i < last))
        .collect()
}

/// A frame as phaseprof's pprof export names them: kernel functions end in `_[k]`, its own
/// labels (a syscall's name) are in module `[phaseprof]`.
fn frame(name: &str, module: &str, inlined: bool) -> Frame {
    let (function, kind) = match (name.strip_suffix("_[k]"), module) {
        (Some(f), _) => (f, FrameKind::Kernel),
        (None, "[kernel]") => (name, FrameKind::Kernel),
        (None, "[phaseprof]") => (name, FrameKind::Synthetic),
        _ => (name, FrameKind::User),
    };
    Frame {
        function: function.to_string(),
        module: module.to_string(),
        kind,
        inlined,
    }
}

/// `raw` inflated when gzipped, within `max` bytes.
pub(crate) fn inflate(raw: &[u8], max: u64) -> Result<Vec<u8>, ImportError> {
    if !raw.starts_with(&[0x1f, 0x8b]) {
        if raw.len() as u64 > max {
            return Err(ImportError::TooLarge(max));
        }
        return Ok(raw.to_vec());
    }
    let mut out = Vec::new();
    let mut gz = flate2::read::GzDecoder::new(raw).take(max + 1);
    gz.read_to_end(&mut out)
        .map_err(|e| ImportError::Malformed(format!("gzip: {e}")))?;
    if out.len() as u64 > max {
        return Err(ImportError::TooLarge(max));
    }
    Ok(out)
}
