//! speedscope's file format (https://www.speedscope.app/file-format-schema.json): one sampled
//! profile per thread (per process for allocations, which have no thread), each distinct stack
//! one sample weighted by its value, frames shared. speedscope.app opens it as is, with its
//! thread picker and left-heavy and sandwich views.
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use phaseprof_model::threads::{process_name, thread_name};
use phaseprof_model::{EventKind, Profile};
use serde::Serialize;

#[derive(Serialize)]
struct File {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<Sampled>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<Frame>,
}

#[derive(Serialize)]
struct Frame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
}

#[derive(Serialize)]
struct Sampled {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// speedscope's unit for `kind`, and the factor from our values to it (cpu samples become
/// nanoseconds of CPU at the sampling period, so speedscope shows times).
fn unit_of(p: &Profile, kind: EventKind) -> (&'static str, u64) {
    match (kind, kind.unit()) {
        (EventKind::Cpu, _) => ("nanoseconds", 1_000_000_000 / p.meta.frequency_hz.max(1)),
        (_, "nanoseconds") => ("nanoseconds", 1),
        (_, "bytes") => ("bytes", 1),
        _ => ("none", 1),
    }
}

/// Writes `kind`'s stacks (inside `phase`, when given) as a speedscope file.
pub fn write_speedscope(
    p: &Profile,
    kind: EventKind,
    phase: Option<u32>,
    out: impl Write,
) -> std::io::Result<()> {
    let (unit, scale) = unit_of(p, kind);
    let mut frames: Vec<Frame> = Vec::new();
    let mut frame_index: HashMap<String, usize> = HashMap::new();
    // (pid, tid) → stack (frame indices, root first) → value
    let mut by_thread: BTreeMap<(u32, u32), BTreeMap<Vec<usize>, u64>> = BTreeMap::new();
    for w in p.weighted_stacks(kind, phase) {
        let modules = w
            .frames
            .iter()
            .rev()
            .map(|&f| p.frames.get(f as usize).map(|f| f.module.clone()));
        let names = p.names_root_first(&w);
        let stack: Vec<usize> = names
            .into_iter()
            .zip(modules.chain(std::iter::repeat(None)))
            .map(|(name, module)| {
                *frame_index.entry(name.clone()).or_insert_with(|| {
                    frames.push(Frame {
                        name,
                        file: module.filter(|m| !m.is_empty()),
                    });
                    frames.len() - 1
                })
            })
            .collect();
        *by_thread
            .entry((w.pid, w.tid))
            .or_default()
            .entry(stack)
            .or_default() += w.value * scale;
    }
    let profiles: Vec<Sampled> = by_thread
        .into_iter()
        .map(|((pid, tid), stacks)| {
            let name = match tid {
                0 => format!("pid {pid} ({})", process_name(p, pid)),
                _ => format!("{} (tid {tid}, pid {pid})", thread_name(p, tid)),
            };
            let total: u64 = stacks.values().sum();
            let (samples, weights) = stacks.into_iter().unzip();
            Sampled {
                kind: "sampled",
                name,
                unit,
                start_value: 0,
                end_value: total,
                samples,
                weights,
            }
        })
        .collect();
    let phase_note = phase
        .map(|i| format!(", phase {}", p.phase_name(i)))
        .unwrap_or_default();
    let file = File {
        schema: "https://www.speedscope.app/file-format-schema.json",
        shared: Shared { frames },
        profiles,
        name: format!("{} — {kind}{phase_note}", p.meta.comm),
        active_profile_index: 0,
        exporter: format!("phaseprof {}", env!("CARGO_PKG_VERSION")),
    };
    serde_json::to_writer(out, &file).map_err(std::io::Error::other)
}
