//! OTLP profiles import: an `ExportProfilesServiceRequest` (profiles/v1development, protobuf,
//! gzipped or not, as an OTLP/HTTP exporter posts it to `/v1development/profiles`; its fields
//! are those of `ProfilesData`) as phaseprof windows, one per resource. A window's labels come
//! from its resource's attributes (`service.name` as `service`, `service.version` as `version`,
//! `host.name` as `host`); its samples from its profiles by their sample type (see `import`); a
//! sample's `phaseprof.phase`, `process.pid` and `thread.id` attributes, as phaseprof's own
//! export writes them, give its phase, process and thread.
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use phaseprof_model::{Frame, Meta, PhaseAt, ProfileBuilder, MAX_WINDOW_PHASES};
use prost::Message;

use super::{inflate, location_frames, measure_of, ImportError, Imported, Samples};
use crate::otlp::{AnyValue, Dictionary, ProfilesData, ResourceProfiles, Sample};

/// Resource attributes taken as labels (OpenTelemetry's names, phaseprof's).
const LABELS: &[(&str, &str)] = &[
    ("service.name", "service"),
    ("service.version", "version"),
    ("host.name", "host"),
    ("deployment.environment.name", "env"),
];

/// `raw` (inflating to at most `max_inflated` bytes) as one window per resource whose profiles
/// have a type phaseprof stores, labelled by its attributes; `meta` is each window's start.
pub fn windows_from_otlp(
    raw: &[u8],
    max_inflated: u64,
    meta: &Meta,
) -> Result<Vec<Imported>, ImportError> {
    let bytes = inflate(raw, max_inflated)?;
    let data =
        ProfilesData::decode(&bytes[..]).map_err(|e| ImportError::Malformed(e.to_string()))?;
    let empty = Dictionary::default();
    let dict = Dict(data.dictionary.as_ref().unwrap_or(&empty));
    let mut windows = Vec::new();
    let mut types = Vec::new();
    for r in &data.resource_profiles {
        match resource_window(r, dict, meta.clone())? {
            Ok(w) => windows.push(w),
            Err(seen) => types.extend(seen),
        }
    }
    if windows.is_empty() {
        return Err(ImportError::NothingStored(types));
    }
    Ok(windows)
}

/// Resource `r`'s window, or (Err) the sample types it had where none is stored.
fn resource_window(
    r: &ResourceProfiles,
    dict: Dict<'_>,
    mut meta: Meta,
) -> Result<Result<Imported, Vec<String>>, ImportError> {
    let mut labels = BTreeMap::new();
    for a in r.resource.iter().flat_map(|r| &r.attributes) {
        let key = match a.key.as_str() {
            "" => dict.string(a.key_strindex)?,
            k => k,
        };
        let value = a
            .value
            .as_ref()
            .map(|v| dict.text(v))
            .transpose()?
            .flatten();
        if let (Some((_, label)), Some(v)) = (LABELS.iter().find(|(k, _)| *k == key), value) {
            labels.insert(label.to_string(), v.to_string());
        }
        if key == "process.executable.name" {
            meta.comm = value.unwrap_or_default().to_string();
        }
    }
    let profiles: Vec<_> = r.scope_profiles.iter().flat_map(|s| &s.profiles).collect();
    let mut measures = Vec::new();
    let (mut ignored, mut types) = (Vec::new(), Vec::new());
    for p in &profiles {
        let t = p.sample_type.clone().unwrap_or_default();
        let (name, unit) = (dict.string(t.type_strindex)?, dict.string(t.unit_strindex)?);
        let m = measure_of(name, unit, p.period);
        if m.is_none() {
            ignored.push(format!("{name}/{unit}"));
        }
        types.push(format!("{name}/{unit}"));
        measures.push(m);
    }
    if measures.iter().all(Option::is_none) {
        return Ok(Err(types));
    }
    for (p, m) in profiles.iter().zip(&measures) {
        let Some(m) = m else { continue };
        let unit = p
            .period_type
            .as_ref()
            .map(|t| dict.string(t.unit_strindex))
            .transpose()?;
        super::set_events(&mut meta, std::iter::once(m), p.period, unit);
        let end = p.time_unix_nano.saturating_add(p.duration_nano);
        if meta.start_unix_ns == 0
            || (p.time_unix_nano > 0 && p.time_unix_nano < meta.start_unix_ns)
        {
            meta.start_unix_ns = p.time_unix_nano;
        }
        meta.end_unix_ns = meta.end_unix_ns.max(end);
    }
    if meta.comm.is_empty() {
        meta.comm = labels.get("service").cloned().unwrap_or_default();
    }
    meta.labels.extend(labels);

    let all_samples = || profiles.iter().flat_map(|p| &p.samples);
    let attrs = SampleAttributes::of(dict, all_samples())?;
    let mut b = ProfileBuilder::new(meta, attrs.phase_names.clone());
    let mut frames: HashMap<i32, Vec<u32>> = HashMap::new();
    let mut samples = Samples::default();
    for (p, m) in profiles.iter().zip(&measures) {
        let Some(m) = m else { continue };
        for s in &p.samples {
            let value = if s.values.is_empty() {
                s.timestamps_unix_nano.len() as u64
            } else {
                s.values
                    .iter()
                    .map(|&v| v.max(0) as u64)
                    .fold(0, u64::saturating_add)
            };
            let stack = dict.stack(&mut b, &mut frames, s.stack_index)?;
            let (pid, tid, at) = attrs.read(dict, s);
            samples.add(&mut b, m, value, (pid, tid), at, stack);
        }
    }
    Ok(Ok(Imported {
        profile: samples.finish(b),
        ignored,
    }))
}

/// The request's dictionary, checked at each index.
#[derive(Clone, Copy)]
struct Dict<'a>(&'a Dictionary);

impl<'a> Dict<'a> {
    fn at<T>(table: &'a [T], i: i32, what: &str) -> Result<&'a T, ImportError> {
        (usize::try_from(i).ok())
            .and_then(|i| table.get(i))
            .ok_or_else(|| ImportError::Malformed(format!("{what} {i} is not in the dictionary")))
    }

    fn string(&self, i: i32) -> Result<&'a str, ImportError> {
        Dict::at(&self.0.string_table, i, "string").map(String::as_str)
    }

    /// Stack `i`, interned in `b` (its locations' frames kept in `frames`), leaf first and cut
    /// at the model's deepest stack.
    fn stack(
        &self,
        b: &mut ProfileBuilder,
        frames: &mut HashMap<i32, Vec<u32>>,
        i: i32,
    ) -> Result<u32, ImportError> {
        let stack = Dict::at(&self.0.stack_table, i, "stack")?;
        let mut ids = Vec::new();
        for &l in &stack.location_indices {
            let located = match frames.entry(l) {
                Entry::Occupied(e) => e.into_mut(),
                Entry::Vacant(v) => {
                    let frames = self.location_frames(l)?.into_iter();
                    v.insert(frames.map(|f| b.intern_frame(f)).collect())
                }
            };
            ids.extend_from_slice(located);
            if ids.len() >= phaseprof_model::window_limits::MAX_STACK_FRAMES {
                ids.truncate(phaseprof_model::window_limits::MAX_STACK_FRAMES);
                break;
            }
        }
        Ok(b.intern_stack(ids))
    }

    /// Location `i`'s frames, leaf first (see `import::location_frames`).
    fn location_frames(&self, i: i32) -> Result<Vec<Frame>, ImportError> {
        let l = Dict::at(&self.0.location_table, i, "location")?;
        let m = Dict::at(&self.0.mapping_table, l.mapping_index, "mapping")?;
        let path = self.string(m.filename_strindex)?;
        let mut names = Vec::with_capacity(l.lines.len());
        for line in &l.lines {
            let f = Dict::at(&self.0.function_table, line.function_index, "function")?;
            names.push(match self.string(f.name_strindex)? {
                "" => self.string(f.system_name_strindex)?,
                n => n,
            });
        }
        Ok(location_frames(path, l.address, &names))
    }

    /// A string value, inline or as a string table index (None: not a string).
    fn text(&self, v: &'a AnyValue) -> Result<Option<&'a str>, ImportError> {
        match (&v.string_value, v.string_value_strindex) {
            (Some(s), _) => Ok(Some(s)),
            (None, Some(i)) => self.string(i).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// Attribute `i` as (key, value).
    fn attribute(&self, i: i32) -> Result<(&'a str, Option<&'a AnyValue>), ImportError> {
        let a = Dict::at(&self.0.attribute_table, i, "attribute")?;
        Ok((self.string(a.key_strindex)?, a.value.as_ref()))
    }
}

/// The sample attributes phaseprof reads: `phaseprof.phase` (a name), `process.pid` and
/// `thread.id` (numbers).
struct SampleAttributes {
    /// Phase ids by their attribute's index; names by id (0: none).
    phases: HashMap<i32, u32>,
    phase_names: Vec<String>,
}

impl SampleAttributes {
    fn of<'a>(
        dict: Dict<'_>,
        samples: impl Iterator<Item = &'a Sample>,
    ) -> Result<Self, ImportError> {
        let mut phases = HashMap::new();
        let mut phase_names = vec![phaseprof_model::PHASE_NONE_NAME.to_string()];
        let mut by_name: HashMap<String, u32> = HashMap::new();
        for &i in samples.flat_map(|s| &s.attribute_indices) {
            let (key, value) = dict.attribute(i)?;
            let name = value.map(|v| dict.text(v)).transpose()?.flatten();
            let (Some(name), "phaseprof.phase") = (name, key) else {
                continue;
            };
            if name == phaseprof_model::PHASE_NONE_NAME || phases.contains_key(&i) {
                continue;
            }
            let id = match by_name.get(name) {
                Some(&id) => id,
                None if phase_names.len() >= MAX_WINDOW_PHASES => {
                    return Err(ImportError::Malformed(format!(
                        "more than {} phases",
                        MAX_WINDOW_PHASES - 1
                    )))
                }
                None => {
                    phase_names.push(name.to_string());
                    let id = phase_names.len() as u32 - 1;
                    by_name.insert(name.to_string(), id);
                    id
                }
            };
            phases.insert(i, id);
        }
        Ok(SampleAttributes {
            phases,
            phase_names,
        })
    }

    /// A sample's process, thread and phase (its attributes were checked by `of`).
    fn read(&self, dict: Dict<'_>, s: &Sample) -> (u32, u32, PhaseAt) {
        let (mut pid, mut tid, mut at) = (0, 0, PhaseAt::NONE);
        let num = |v: Option<&AnyValue>| {
            (v.and_then(|v| v.int_value)).map_or(0, |n| n.clamp(0, u32::MAX as i64) as u32)
        };
        for &i in &s.attribute_indices {
            if let Some(&id) = self.phases.get(&i) {
                at = PhaseAt {
                    phase: id,
                    mask: 1 << id,
                };
                continue;
            }
            match dict.attribute(i) {
                Ok(("process.pid", v)) => pid = num(v),
                Ok(("thread.id", v)) => tid = num(v),
                _ => {}
            }
        }
        (pid, tid, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::to_otlp;
    use phaseprof_model::{EventKind, SampleKind};

    // Checks a round trip through phaseprof's own OTLP export: the cpu samples (its CPU time
    // over the period) per phase and per stack, the host and service from the resource.
    #[test]
    fn cpu_samples_come_back_per_phase() {
        let mut original = crate::fixture::two_phases(1);
        original.meta.host = "node-7".into();
        let raw = to_otlp(&original, EventKind::Cpu, None).encode_to_vec();
        let got = windows_from_otlp(&raw, 1 << 20, &Meta::default()).unwrap();
        assert_eq!(got.len(), 1);
        let p = &got[0].profile;
        assert_eq!(
            p.meta.labels.get("host").map(String::as_str),
            Some("node-7")
        );
        assert_eq!(p.meta.frequency_hz, 99);
        assert_eq!(p.meta.comm, "validator");
        assert_eq!(
            p.total(SampleKind::Cpu, 0),
            original.total(SampleKind::Cpu, 0)
        );
        let folded = |p: &phaseprof_model::Profile| {
            let mut v: Vec<_> = (p.weighted_stacks(EventKind::Cpu, None).into_iter())
                .map(|w| {
                    let phase = p.phase_name(w.phase).to_string();
                    (crate::pprof::frames_leaf_first(p, &w), phase, w.value)
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(folded(p), folded(&original));
        p.validate().unwrap();
    }

    // Checks the refusals: a dictionary index out of range, a request with no stored type.
    #[test]
    fn bad_indices_and_unstored_types_are_refused() {
        let original = crate::fixture::two_phases(1);
        let mut data = to_otlp(&original, EventKind::Cpu, None);
        let profile = &mut data.resource_profiles[0].scope_profiles[0].profiles[0];
        profile.samples[0].stack_index = 999;
        let e = windows_from_otlp(&data.encode_to_vec(), 1 << 20, &Meta::default()).err();
        assert!(e.is_some_and(|e| e.to_string().contains("stack 999")));
        let data = to_otlp(&original, EventKind::Syscall, None);
        let e = windows_from_otlp(&data.encode_to_vec(), 1 << 20, &Meta::default()).err();
        assert!(matches!(e, Some(ImportError::NothingStored(_))), "{e:?}");
    }
}
