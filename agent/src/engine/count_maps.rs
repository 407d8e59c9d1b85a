//! Kinds the kernel counts with `count_event` (bpf/src/events.bpf.h): a map of `struct
//! event_key` → count per kind, and the programs that count into it. Loading, attaching and
//! draining them is the same for each, so a new kind of this shape is a row here, a row in the
//! kinds' table (`phaseprof_model::kinds`) and its BPF program.
use std::collections::HashMap;

use anyhow::{Context, Result};
use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, MapCore, OpenObject};
use phaseprof_bpf::types;
use phaseprof_model::SampleKind;

use super::drain::Counters;
use super::{pod, Engine, EngineConfig};
use crate::window::RawSample;

/// One kind counted by `count_event`.
pub struct CountMap {
    pub kind: SampleKind,
    /// Its map of `struct event_key` → u64.
    pub map: &'static str,
    /// Its programs, attached by their section (tracepoints), loaded only with its event.
    pub programs: &'static [&'static str],
}

/// Every kind counted by `count_event`.
pub const COUNT_MAPS: &[CountMap] = &[CountMap {
    kind: SampleKind::Signal,
    map: "signal_counts",
    programs: &["raw_tp__signal_deliver"],
}];

/// Whether program `name` belongs to a kind of `COUNT_MAPS`, and then whether its event is
/// recorded (it is loaded only then).
pub fn wanted(cfg: &EngineConfig, name: &str) -> Option<bool> {
    (COUNT_MAPS.iter())
        .find(|c| c.programs.contains(&name))
        .map(|c| cfg.events.contains(&c.kind.spec().event))
}

/// Sizes the maps as every counts map is sized.
pub fn size_maps(open: &mut OpenObject, entries: u32) -> Result<()> {
    for mut map in open.maps_mut() {
        let name = map.name().to_string_lossy().into_owned();
        if COUNT_MAPS.iter().any(|c| c.map == name) {
            map.set_max_entries(entries)
                .with_context(|| format!("sizing map {name}"))?;
        }
    }
    Ok(())
}

impl Engine<'_> {
    /// Attaches the programs of the kinds recorded.
    pub(super) fn attach_count_maps(&mut self, cfg: &EngineConfig) -> Result<Vec<Link>> {
        let mut links = Vec::new();
        for prog in self.skel.object().progs_mut() {
            let name = prog.name().to_string_lossy().into_owned();
            if wanted(cfg, &name) == Some(true) {
                links.push(prog.attach().with_context(|| format!("attaching {name}"))?);
            }
        }
        Ok(links)
    }

    /// The counts of each kind's map since the last drain (see `Counters`), as samples.
    pub(super) fn take_count_maps(
        &mut self,
        take: impl Fn(u32) -> bool,
        everything: bool,
    ) -> Result<Vec<RawSample>> {
        let mut out = Vec::new();
        for c in COUNT_MAPS {
            let name = std::ffi::OsStr::new(c.map);
            let Some(map) = (self.skel.object().maps()).find(|m| m.name() == name) else {
                continue;
            };
            let counters = self.count_maps.entry(c.map).or_default();
            let taken = counters.take_raw(
                &map,
                |k| take(pod::<types::event_key>(k).window),
                everything,
            )?;
            for (key, values) in taken {
                let k: types::event_key = pod(&key);
                out.push(RawSample {
                    nr: k.nr,
                    user: self.stack(k.user_stack),
                    values: (values.chunks_exact(8))
                        .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                        .collect(),
                    ..RawSample::new(c.kind, (k.tgid, k.tid), (k.phase, k.phase_mask))
                });
            }
        }
        Ok(out)
    }
}

/// The drain state of each counts map, by map name.
pub type CountMapCounters = HashMap<&'static str, Counters>;
