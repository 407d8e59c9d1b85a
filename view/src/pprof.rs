//! pprof export: a gzipped `profile.proto` (google/pprof, proto3) that `go tool pprof` opens.
//! The messages are declared here with prost's derive, field numbers as in pprof's
//! `proto/profile.proto`, so no protoc is needed at build time.
use std::collections::HashMap;
use std::io::Write;

use flate2::write::GzEncoder;
use flate2::Compression;
use phaseprof_model::{display_name, threads, EventKind, Profile, Weighted};
use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct PprofProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings::default();
        s.get(""); // pprof requires string_table[0] == ""
        s
    }
    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// Builds the pprof message for one event kind (and optionally one phase).
/// A stack's (function, module) pairs leaf first, as pprof and OTLP order locations, with the
/// synthetic leaf (a syscall's name) in module `[phaseprof]`.
pub fn frames_leaf_first(profile: &Profile, w: &Weighted) -> Vec<(String, String)> {
    let label = w
        .leaf_label
        .iter()
        .map(|l| (l.clone(), "[phaseprof]".into()));
    let frames = w
        .frames
        .iter()
        .filter_map(|&f| profile.frames.get(f as usize))
        .map(|f| (display_name(f), f.module.clone()));
    label.chain(frames).collect()
}

/// A sample's labels: its phase, process, and thread (id and name) where the kind has threads.
fn labels(profile: &Profile, w: &Weighted, strings: &mut Strings) -> Vec<Label> {
    let mut label = vec![
        Label {
            key: strings.get("phase"),
            str: strings.get(profile.phase_name(w.phase)),
            num: 0,
        },
        Label {
            key: strings.get("pid"),
            str: 0,
            num: w.pid as i64,
        },
    ];
    if w.tid != 0 {
        label.push(Label {
            key: strings.get("tid"),
            str: 0,
            num: w.tid as i64,
        });
        label.push(Label {
            key: strings.get("thread"),
            str: strings.get(&threads::thread_name(profile, w.tid)),
            num: 0,
        });
    }
    label
}

/// The mapping of frames whose module is `module`: where the file was mapped, its path and
/// build ID as recorded (just its name for modules recorded without them).
fn mapping_of(profile: &Profile, module: &str, id: u64, strings: &mut Strings) -> Mapping {
    match profile.meta.modules.get(module) {
        Some(m) => Mapping {
            id,
            memory_start: m.start,
            memory_limit: m.limit,
            file_offset: m.offset,
            filename: strings.get(&m.path),
            build_id: m.build_id.as_deref().map(|b| strings.get(b)).unwrap_or(0),
            has_functions: true,
        },
        None => Mapping {
            id,
            filename: strings.get(module),
            has_functions: true,
            ..Mapping::default()
        },
    }
}

pub fn to_pprof(profile: &Profile, kind: EventKind, phase: Option<u32>) -> PprofProfile {
    let mut strings = Strings::new();
    let vt = |t: &str, u: &str, s: &mut Strings| ValueType {
        r#type: s.get(t),
        unit: s.get(u),
    };
    let period_ns = 1_000_000_000 / profile.meta.frequency_hz.max(1) as i64;
    // The kind's own sample type; cpu samples also as CPU time at the sampling period.
    let (type_name, unit) = kind.samples().spec().pprof;
    let mut sample_type = vec![vt(type_name, unit, &mut strings)];
    let (period_type, period) = match kind {
        EventKind::Cpu => {
            sample_type.push(vt("cpu", "nanoseconds", &mut strings));
            (Some(vt("cpu", "nanoseconds", &mut strings)), period_ns)
        }
        _ => (None, 0),
    };
    // Then the kind's other values (a syscall's time …), as the kinds' table names them.
    let spec = kind.samples().spec();
    for v in spec.values.iter().skip(1) {
        let name = format!("{}_{}", spec.name, v.name);
        sample_type.push(vt(&name, v.unit, &mut strings));
    }

    let mut mappings: HashMap<String, u64> = HashMap::new();
    let mut mapping = Vec::new();
    // The program's own file first: pprof takes the first mapping for the main binary.
    let main = std::path::Path::new(&profile.meta.exe)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned());
    if let Some(main) = main.filter(|m| profile.meta.modules.contains_key(m)) {
        mapping.push(mapping_of(profile, &main, 1, &mut strings));
        mappings.insert(main, 1);
    }
    let mut functions: HashMap<String, u64> = HashMap::new();
    let mut function = Vec::new();
    let mut locations: HashMap<(String, String), u64> = HashMap::new();
    let mut location = Vec::new();
    let mut sample = Vec::new();

    for w in profile.weighted_stacks(kind, phase) {
        let frames = frames_leaf_first(profile, &w);
        let mut ids = Vec::with_capacity(frames.len());
        for (name, module) in frames {
            let key = (name.clone(), module.clone());
            let id = match locations.get(&key) {
                Some(&id) => id,
                None => {
                    let mapping_id = *mappings.entry(module.clone()).or_insert_with(|| {
                        let id = mapping.len() as u64 + 1;
                        mapping.push(mapping_of(profile, &module, id, &mut strings));
                        id
                    });
                    let function_id = *functions.entry(name.clone()).or_insert_with(|| {
                        let id = function.len() as u64 + 1;
                        let n = strings.get(&name);
                        function.push(Function {
                            id,
                            name: n,
                            system_name: n,
                        });
                        id
                    });
                    let id = location.len() as u64 + 1;
                    location.push(Location {
                        id,
                        mapping_id,
                        address: 0,
                        line: vec![Line {
                            function_id,
                            line: 0,
                        }],
                    });
                    locations.insert(key, id);
                    id
                }
            };
            ids.push(id);
        }
        let v = w.value as i64;
        let mut value = match kind {
            EventKind::Cpu => vec![v, v * period_ns],
            _ => vec![v],
        };
        value.extend(
            (0..spec.values.len().saturating_sub(1))
                .map(|i| w.more.get(i).copied().unwrap_or(0) as i64),
        );
        let label = labels(profile, &w, &mut strings);
        sample.push(Sample {
            location_id: ids,
            value,
            label,
        });
    }
    let comment = vec![strings.get(&format!(
        "phaseprof {} profile of {}",
        kind, profile.meta.comm
    ))];
    PprofProfile {
        sample_type,
        sample,
        mapping,
        location,
        function,
        string_table: strings.table,
        time_nanos: profile.meta.start_unix_ns as i64,
        duration_nanos: profile.duration_ns() as i64,
        period_type,
        period,
        comment,
    }
}

pub fn write_pprof(
    profile: &Profile,
    kind: EventKind,
    phase: Option<u32>,
    out: impl Write,
) -> std::io::Result<()> {
    let bytes = to_pprof(profile, kind, phase).encode_to_vec();
    let mut gz = GzEncoder::new(out, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::Sample;
    use phaseprof_model::*;

    // Checks the pprof message: leaf-first locations, cpu values scaled by the period, and that
    // it decodes back.
    #[test]
    fn cpu_profile_round_trips() {
        let mut b = ProfileBuilder::new(
            Meta {
                events: vec![EventKind::Cpu],
                frequency_hz: 100,
                ..Meta::default()
            },
            vec![],
        );
        let mut f = |n: &str| {
            b.intern_frame(Frame {
                function: n.into(),
                module: "sim".into(),
                kind: FrameKind::User,
                inlined: false,
            })
        };
        let (main, burn) = (f("main"), f("burn"));
        let s = b.intern_stack(vec![burn, main]);
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![7]).on(s));
        let p = to_pprof(&b.finish(), EventKind::Cpu, None);
        let decoded = PprofProfile::decode(&p.encode_to_vec()[..]).unwrap();
        assert_eq!(decoded, p);
        assert_eq!(p.string_table[0], "");
        assert_eq!(p.sample[0].value, vec![7, 7 * 10_000_000]);
        let leaf = &p.location[(p.sample[0].location_id[0] - 1) as usize];
        let fname = p.function[(leaf.line[0].function_id - 1) as usize].name;
        assert_eq!(p.string_table[fname as usize], "burn");
    }
}
