//! pprof import: a `profile.proto` (gzipped or not) that another agent pushed (Pyroscope's SDKs,
//! Grafana Alloy) as a phaseprof window (see `import` for what each sample type becomes). A
//! `phase` label on a sample (as phaseprof's own pprof export writes) puts it in that phase.
use std::collections::HashMap;

use phaseprof_model::{Frame, Meta, PhaseAt, ProfileBuilder, MAX_WINDOW_PHASES};
use prost::Message;

use super::{inflate, location_frames, measure_of, ImportError, Imported, Measure, Samples};
use crate::pprof::{Location, PprofProfile};

/// `raw` (a pprof profile, gzipped or not, inflating to at most `max_inflated` bytes) as a
/// window with `meta` (its labels, time range and names; its events and sampling frequency are
/// set here, and its time range from the profile's where `meta` has none).
pub fn window_from_pprof(
    raw: &[u8],
    max_inflated: u64,
    meta: Meta,
) -> Result<Imported, ImportError> {
    let bytes = inflate(raw, max_inflated)?;
    let p = PprofProfile::decode(&bytes[..]).map_err(|e| ImportError::Malformed(e.to_string()))?;
    let strings = Strings(&p.string_table);
    let types = (p.sample_type.iter())
        .map(|t| Ok((strings.get(t.r#type)?, strings.get(t.unit)?)))
        .collect::<Result<Vec<_>, ImportError>>()?;
    let mut columns: Vec<Option<Measure>> = (types.iter())
        .map(|(t, u)| measure_of(t, u, p.period))
        .collect();
    let names = |keep: &dyn Fn(usize) -> bool| -> Vec<String> {
        (types.iter().enumerate())
            .filter(|(i, _)| keep(*i))
            .map(|(_, (t, u))| format!("{t}/{u}"))
            .collect()
    };
    let ignored = names(&|i| columns[i].is_none());
    if ignored.len() == types.len() {
        return Err(ImportError::NothingStored(names(&|_| true)));
    }
    // Go's CPU profile has the same samples as a count and as CPU time: the count is kept.
    let counted = |c: &Option<Measure>| matches!(c, Some(Measure::Cpu { per: 1 }));
    if columns.iter().any(counted) {
        for c in columns
            .iter_mut()
            .filter(|c| matches!(c, Some(Measure::Cpu { .. })))
        {
            if !counted(c) {
                *c = None;
            }
        }
    }
    let period_unit = (p.period_type.as_ref()).and_then(|t| strings.get(t.unit).ok());
    let mut meta = meta;
    super::set_events(&mut meta, columns.iter().flatten(), p.period, period_unit);
    if meta.start_unix_ns == 0 && p.time_nanos > 0 {
        meta.start_unix_ns = p.time_nanos as u64;
        meta.end_unix_ns = (p.time_nanos as u64).saturating_add(p.duration_nanos.max(0) as u64);
    }

    let labels = SampleLabels::of(&p, &strings)?;
    let mut b = ProfileBuilder::new(meta, labels.phase_names.clone());
    let mut frames = FrameTable::new(&p, strings);
    let mut samples = Samples::default();
    for s in &p.sample {
        let stack = frames.stack(&mut b, &s.location_id)?;
        let (pid, tid, at) = labels.read(s);
        for (m, v) in columns.iter().zip(&s.value) {
            if let Some(m) = m {
                samples.add(&mut b, m, (*v).max(0) as u64, (pid, tid), at, stack);
            }
        }
    }
    Ok(Imported {
        profile: samples.finish(b),
        ignored,
    })
}

/// The profile's string table, checked at each index.
#[derive(Clone, Copy)]
struct Strings<'a>(&'a [String]);

impl<'a> Strings<'a> {
    fn get(&self, i: i64) -> Result<&'a str, ImportError> {
        (usize::try_from(i).ok())
            .and_then(|i| self.0.get(i))
            .map(String::as_str)
            .ok_or_else(|| ImportError::Malformed(format!("string {i} is not in the table")))
    }

    fn find(&self, s: &str) -> Option<i64> {
        self.0.iter().position(|x| x == s).map(|i| i as i64)
    }
}

/// The labels samples carry that phaseprof reads: `phase` (a name), `pid` and `tid` (numbers).
struct SampleLabels {
    keys: [Option<i64>; 3],
    /// Phase ids by their name's string index; names by id (0: none).
    phases: HashMap<i64, u32>,
    phase_names: Vec<String>,
}

impl SampleLabels {
    fn of(p: &PprofProfile, strings: &Strings<'_>) -> Result<Self, ImportError> {
        let keys = ["phase", "pid", "tid"].map(|k| strings.find(k));
        let mut phases = HashMap::new();
        let mut phase_names = vec![phaseprof_model::PHASE_NONE_NAME.to_string()];
        let labels = p.sample.iter().flat_map(|s| &s.label);
        for l in labels.filter(|l| keys[0] == Some(l.key) && l.str != 0) {
            let name = strings.get(l.str)?;
            if name == phaseprof_model::PHASE_NONE_NAME || phases.contains_key(&l.str) {
                continue;
            }
            if phase_names.len() >= MAX_WINDOW_PHASES {
                return Err(ImportError::Malformed(format!(
                    "more than {} phases",
                    MAX_WINDOW_PHASES - 1
                )));
            }
            phases.insert(l.str, phase_names.len() as u32);
            phase_names.push(name.to_string());
        }
        Ok(SampleLabels {
            keys,
            phases,
            phase_names,
        })
    }

    /// A sample's process, thread and phase.
    fn read(&self, s: &crate::pprof::Sample) -> (u32, u32, PhaseAt) {
        let (mut pid, mut tid, mut at) = (0, 0, PhaseAt::NONE);
        let num = |n: i64| n.clamp(0, u32::MAX as i64) as u32;
        for l in &s.label {
            if self.keys[0] == Some(l.key) {
                if let Some(&id) = self.phases.get(&l.str) {
                    at = PhaseAt {
                        phase: id,
                        mask: 1 << id,
                    };
                }
            } else if self.keys[1] == Some(l.key) {
                pid = num(l.num);
            } else if self.keys[2] == Some(l.key) {
                tid = num(l.num);
            }
        }
        (pid, tid, at)
    }
}

/// The locations' frames, interned once each.
struct FrameTable<'a> {
    strings: Strings<'a>,
    locations: HashMap<u64, &'a Location>,
    functions: HashMap<u64, (i64, i64)>,
    mappings: HashMap<u64, i64>,
    /// A location's frames as interned, leaf first (its inlined functions first).
    interned: HashMap<u64, Vec<u32>>,
}

impl<'a> FrameTable<'a> {
    fn new(p: &'a PprofProfile, strings: Strings<'a>) -> Self {
        FrameTable {
            strings,
            locations: p.location.iter().map(|l| (l.id, l)).collect(),
            functions: (p.function.iter())
                .map(|f| (f.id, (f.name, f.system_name)))
                .collect(),
            mappings: p.mapping.iter().map(|m| (m.id, m.filename)).collect(),
            interned: HashMap::new(),
        }
    }

    /// A sample's stack (its location ids leaf first, as pprof orders them), interned in `b`;
    /// cut at the model's deepest stack.
    fn stack(&mut self, b: &mut ProfileBuilder, ids: &[u64]) -> Result<u32, ImportError> {
        let mut frames = Vec::new();
        for &id in ids {
            if !self.interned.contains_key(&id) {
                let located = self.location_frames(id)?;
                let ids = located.into_iter().map(|f| b.intern_frame(f)).collect();
                self.interned.insert(id, ids);
            }
            frames.extend_from_slice(&self.interned[&id]);
            if frames.len() >= phaseprof_model::window_limits::MAX_STACK_FRAMES {
                frames.truncate(phaseprof_model::window_limits::MAX_STACK_FRAMES);
                break;
            }
        }
        Ok(b.intern_stack(frames))
    }

    /// Location `id`'s frames, leaf first (see `import::location_frames`).
    fn location_frames(&self, id: u64) -> Result<Vec<Frame>, ImportError> {
        let l = (self.locations.get(&id))
            .ok_or_else(|| ImportError::Malformed(format!("a sample names location {id}")))?;
        let path = match self.mappings.get(&l.mapping_id) {
            Some(&f) => self.strings.get(f)?,
            None => "",
        };
        let mut names = Vec::with_capacity(l.line.len());
        for line in &l.line {
            let &(name, system) = (self.functions.get(&line.function_id)).ok_or_else(|| {
                ImportError::Malformed(format!("location {id} names function {}", line.function_id))
            })?;
            names.push(match self.strings.get(name)? {
                "" => self.strings.get(system)?,
                n => n,
            });
        }
        Ok(location_frames(path, l.address, &names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{to_pprof, Function, Line, ValueType};
    use phaseprof_model::{EventKind, Profile, SampleKind};

    fn gzipped(p: &PprofProfile) -> Vec<u8> {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &p.encode_to_vec()).unwrap();
        gz.finish().unwrap()
    }

    // Checks a round trip through phaseprof's own pprof export: the cpu samples, per phase
    // (its `phase` label) and per stack, and the frequency from the period.
    #[test]
    fn cpu_samples_come_back_per_phase() {
        let original = crate::fixture::two_phases(1);
        let raw = gzipped(&to_pprof(&original, EventKind::Cpu, None));
        let got = window_from_pprof(&raw, 1 << 20, Meta::default()).unwrap();
        let p = got.profile;
        assert_eq!(p.meta.events, vec![EventKind::Cpu]);
        assert_eq!(p.meta.frequency_hz, 99);
        assert_eq!(got.ignored, Vec::<String>::new());
        assert_eq!(p.total(SampleKind::Cpu, 0), 100);
        for name in ["propose", "finalize"] {
            let (a, b) = (original.phase_index(name), p.phase_index(name));
            let sum = |p: &Profile, i: Option<u32>| -> u64 {
                (p.samples.iter())
                    .filter(|s| s.kind == SampleKind::Cpu && Some(s.phase) == i)
                    .map(|s| s.value(0))
                    .sum()
            };
            assert_eq!(sum(&p, b), sum(&original, a), "{name}");
        }
        let folded = |p: &Profile| {
            let mut v: Vec<_> = (p.weighted_stacks(EventKind::Cpu, None).into_iter())
                .map(|w| (crate::pprof::frames_leaf_first(p, &w), w.value))
                .collect();
            v.sort();
            v
        };
        assert_eq!(folded(&p), folded(&original));
        p.validate().unwrap();
    }

    /// A heap profile as Go writes it (alloc and inuse, objects and bytes), one stack of two
    /// locations, the leaf with a function inlined into it.
    fn go_heap() -> PprofProfile {
        let strings: Vec<String> = [
            "",
            "alloc_objects",
            "count",
            "alloc_space",
            "bytes",
            "inuse_objects",
            "inuse_space",
            "main.churn",
            "main.grow",
            "main.main",
            "/usr/bin/app",
            "space",
        ]
        .map(String::from)
        .to_vec();
        let vt = |t, u| ValueType { r#type: t, unit: u };
        let line = |f| Line {
            function_id: f,
            line: 0,
        };
        PprofProfile {
            sample_type: vec![vt(1, 2), vt(3, 4), vt(5, 2), vt(6, 4)],
            sample: vec![crate::pprof::Sample {
                location_id: vec![1, 2],
                value: vec![10, 40960, 3, 12288],
                label: vec![],
            }],
            mapping: vec![crate::pprof::Mapping {
                id: 1,
                filename: 10,
                ..Default::default()
            }],
            location: vec![
                Location {
                    id: 1,
                    mapping_id: 1,
                    address: 0x1000,
                    line: vec![line(2), line(1)],
                },
                Location {
                    id: 2,
                    mapping_id: 1,
                    address: 0x2000,
                    line: vec![line(3)],
                },
            ],
            function: [(1, 7), (2, 8), (3, 9)]
                .map(|(id, name)| Function {
                    id,
                    name,
                    system_name: name,
                })
                .to_vec(),
            string_table: strings,
            time_nanos: 5_000_000_000,
            duration_nanos: 1_000_000_000,
            period_type: Some(vt(11, 4)),
            period: 524288,
            comment: vec![],
        }
    }

    // Checks a Go heap profile: allocations stored (bytes, objects, and the totals), in-use
    // named as ignored; the inlined function first and marked; the module from the mapping's
    // path; the time range from the profile.
    #[test]
    fn a_go_heap_profile_stores_its_allocations() {
        let got = window_from_pprof(&gzipped(&go_heap()), 1 << 20, Meta::default()).unwrap();
        let p = &got.profile;
        assert_eq!(
            got.ignored,
            vec!["inuse_objects/count", "inuse_space/bytes"]
        );
        assert_eq!(p.meta.events, vec![EventKind::Alloc]);
        let info = p.meta.alloc.as_ref().unwrap();
        assert!(info.go_sampled && info.sample_bytes == 524288, "{info:?}");
        assert_eq!(p.total(SampleKind::Alloc, 0), 40960);
        assert_eq!(p.total(SampleKind::Alloc, 1), 10);
        assert_eq!(p.total(SampleKind::AllocTotal, 0), 40960);
        assert_eq!(p.total(SampleKind::AllocTotal, 1), 10);
        let stack = &p.stacks[p.samples[0].stack.unwrap() as usize];
        let names: Vec<_> = (stack.frames.iter())
            .map(|&f| &p.frames[f as usize])
            .map(|f| (f.function.as_str(), f.module.as_str(), f.inlined))
            .collect();
        assert_eq!(
            names,
            vec![
                ("main.grow", "app", true),
                ("main.churn", "app", false),
                ("main.main", "app", false)
            ]
        );
        assert_eq!(
            (p.meta.start_unix_ns, p.meta.end_unix_ns),
            (5_000_000_000, 6_000_000_000)
        );
        p.validate().unwrap();
    }

    // Checks the refusals: only types nothing stores (named), a bomb past the limit, garbage,
    // a sample naming a location that is not there.
    #[test]
    fn what_cannot_be_stored_is_refused_by_name() {
        let mut p = go_heap();
        p.sample_type.truncate(0);
        p.sample_type.push(ValueType { r#type: 5, unit: 2 });
        let e = window_from_pprof(&p.encode_to_vec(), 1 << 20, Meta::default()).err();
        assert!(
            e.as_ref()
                .is_some_and(|e| e.to_string().contains("(inuse_objects/count)")),
            "{e:?}"
        );
        let big = gzipped(&PprofProfile {
            string_table: vec!["x".repeat(1 << 20)],
            ..Default::default()
        });
        let e = window_from_pprof(&big, 1 << 16, Meta::default()).err();
        assert!(matches!(e, Some(ImportError::TooLarge(_))), "{e:?}");
        let e = window_from_pprof(b"\x1f\x8bnot gzip", 1 << 16, Meta::default()).err();
        assert!(matches!(e, Some(ImportError::Malformed(_))), "{e:?}");
        let mut p = go_heap();
        p.sample[0].location_id.push(9);
        let e = window_from_pprof(&p.encode_to_vec(), 1 << 20, Meta::default()).err();
        assert!(e.is_some_and(|e| e.to_string().contains("location 9")));
    }
}
