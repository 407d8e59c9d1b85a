//! OpenTelemetry profiles (OTLP `profiles/v1development`, as `go.opentelemetry.io/collector/pdata/pprofile`
//! v0.165 reads it): a `ProfilesData` with one resource (the target's process), one scope
//! (phaseprof) and one profile of the chosen event kind, its stacks, locations, functions,
//! mappings, strings and attributes in the shared dictionary (index 0 of every table is the
//! empty entry, as the format asks). Samples carry the thread and phase as attributes. Messages
//! are declared with prost's derive, field numbers as in the collector's generated code.
use std::collections::HashMap;
use std::io::Write;

use phaseprof_model::{threads, EventKind, Profile};
use prost::Message;

#[derive(Clone, PartialEq, Message)]
pub struct ProfilesData {
    #[prost(message, repeated, tag = "1")]
    pub resource_profiles: Vec<ResourceProfiles>,
    #[prost(message, optional, tag = "2")]
    pub dictionary: Option<Dictionary>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Dictionary {
    #[prost(message, repeated, tag = "1")]
    pub mapping_table: Vec<Mapping>,
    #[prost(message, repeated, tag = "2")]
    pub location_table: Vec<Location>,
    #[prost(message, repeated, tag = "3")]
    pub function_table: Vec<Function>,
    #[prost(message, repeated, tag = "4")]
    pub link_table: Vec<Link>,
    #[prost(string, repeated, tag = "5")]
    pub string_table: Vec<String>,
    #[prost(message, repeated, tag = "6")]
    pub attribute_table: Vec<KeyValueAndUnit>,
    #[prost(message, repeated, tag = "7")]
    pub stack_table: Vec<Stack>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceProfiles {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_profiles: Vec<ScopeProfiles>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
    /// The key as a string table index (the collector's encoder writes keys so).
    #[prost(int32, tag = "3")]
    pub key_strindex: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(string, optional, tag = "1")]
    pub string_value: Option<String>,
    #[prost(int64, optional, tag = "3")]
    pub int_value: Option<i64>,
    /// A string value as a string table index (the collector's encoder writes strings so).
    #[prost(int32, optional, tag = "8")]
    pub string_value_strindex: Option<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeProfiles {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<Scope>,
    #[prost(message, repeated, tag = "2")]
    pub profiles: Vec<OtlpProfile>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Scope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct OtlpProfile {
    #[prost(message, optional, tag = "1")]
    pub sample_type: Option<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
    #[prost(fixed64, tag = "3")]
    pub time_unix_nano: u64,
    #[prost(uint64, tag = "4")]
    pub duration_nano: u64,
    #[prost(message, optional, tag = "5")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "6")]
    pub period: i64,
    #[prost(bytes = "vec", tag = "7")]
    pub profile_id: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int32, tag = "1")]
    pub type_strindex: i32,
    #[prost(int32, tag = "2")]
    pub unit_strindex: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(int32, tag = "1")]
    pub stack_index: i32,
    #[prost(int32, repeated, tag = "2")]
    pub attribute_indices: Vec<i32>,
    #[prost(int64, repeated, tag = "4")]
    pub values: Vec<i64>,
    /// When values are absent, each timestamp is one sample.
    #[prost(fixed64, repeated, tag = "5")]
    pub timestamps_unix_nano: Vec<u64>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Stack {
    #[prost(int32, repeated, tag = "1")]
    pub location_indices: Vec<i32>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(int32, tag = "1")]
    pub mapping_index: i32,
    #[prost(uint64, tag = "2")]
    pub address: u64,
    #[prost(message, repeated, tag = "3")]
    pub lines: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(int32, tag = "1")]
    pub function_index: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(int32, tag = "1")]
    pub name_strindex: i32,
    #[prost(int32, tag = "2")]
    pub system_name_strindex: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub memory_start: u64,
    #[prost(uint64, tag = "2")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "3")]
    pub file_offset: u64,
    #[prost(int32, tag = "4")]
    pub filename_strindex: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct Link {}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValueAndUnit {
    #[prost(int32, tag = "1")]
    pub key_strindex: i32,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

/// Interning into the dictionary's tables; every table starts with its empty entry.
struct Tables {
    d: Dictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<String, i32>,
    mappings: HashMap<String, i32>,
    locations: HashMap<(String, String), i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(String, String), i32>,
}

impl Tables {
    fn new() -> Self {
        let mut t = Tables {
            d: Dictionary {
                mapping_table: vec![Mapping::default()],
                location_table: vec![Location::default()],
                function_table: vec![Function::default()],
                link_table: vec![Link::default()],
                string_table: vec![String::new()],
                attribute_table: vec![KeyValueAndUnit::default()],
                stack_table: vec![Stack::default()],
            },
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            attributes: HashMap::new(),
        };
        t.strings.insert(String::new(), 0);
        t
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        self.d.string_table.push(s.to_string());
        let i = self.d.string_table.len() as i32 - 1;
        self.strings.insert(s.to_string(), i);
        i
    }

    fn mapping(&mut self, p: &Profile, module: &str) -> i32 {
        if let Some(&i) = self.mappings.get(module) {
            return i;
        }
        let m = p.meta.modules.get(module);
        let path = m.map(|m| m.path.as_str()).unwrap_or(module);
        let filename_strindex = self.string(path);
        self.d.mapping_table.push(Mapping {
            memory_start: m.map(|m| m.start).unwrap_or(0),
            memory_limit: m.map(|m| m.limit).unwrap_or(0),
            file_offset: m.map(|m| m.offset).unwrap_or(0),
            filename_strindex,
        });
        let i = self.d.mapping_table.len() as i32 - 1;
        self.mappings.insert(module.to_string(), i);
        i
    }

    fn location(&mut self, p: &Profile, name: &str, module: &str) -> i32 {
        let key = (name.to_string(), module.to_string());
        if let Some(&i) = self.locations.get(&key) {
            return i;
        }
        let function_index = match self.functions.get(name) {
            Some(&f) => f,
            None => {
                let n = self.string(name);
                self.d.function_table.push(Function {
                    name_strindex: n,
                    system_name_strindex: n,
                });
                let f = self.d.function_table.len() as i32 - 1;
                self.functions.insert(name.to_string(), f);
                f
            }
        };
        let mapping_index = self.mapping(p, module);
        self.d.location_table.push(Location {
            mapping_index,
            address: 0,
            lines: vec![Line { function_index }],
        });
        let i = self.d.location_table.len() as i32 - 1;
        self.locations.insert(key, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        self.d.stack_table.push(Stack {
            location_indices: locations.clone(),
        });
        let i = self.d.stack_table.len() as i32 - 1;
        self.stacks.insert(locations, i);
        i
    }

    fn attribute(&mut self, key: &str, value: AnyValue) -> i32 {
        let id = (key.to_string(), format!("{value:?}"));
        if let Some(&i) = self.attributes.get(&id) {
            return i;
        }
        let key_strindex = self.string(key);
        self.d.attribute_table.push(KeyValueAndUnit {
            key_strindex,
            value: Some(value),
        });
        let i = self.d.attribute_table.len() as i32 - 1;
        self.attributes.insert(id, i);
        i
    }
}

fn text(s: &str) -> AnyValue {
    AnyValue {
        string_value: Some(s.to_string()),
        ..AnyValue::default()
    }
}

fn int(v: i64) -> AnyValue {
    AnyValue {
        int_value: Some(v),
        ..AnyValue::default()
    }
}

/// `kind`'s stacks (inside `phase`) as an OTLP `ProfilesData`.
pub fn to_otlp(p: &Profile, kind: EventKind, phase: Option<u32>) -> ProfilesData {
    let mut t = Tables::new();
    // cpu samples as CPU time at the sampling period; the others as their kind's type.
    let (type_name, unit, period) = match kind {
        EventKind::Cpu => (
            "cpu",
            "nanoseconds",
            1_000_000_000 / p.meta.frequency_hz.max(1),
        ),
        _ => {
            let (t, u) = kind.samples().spec().pprof;
            (t, u, 0)
        }
    };
    let scale = if kind == EventKind::Cpu { period } else { 1 };
    let value_type = |t: &mut Tables| ValueType {
        type_strindex: t.string(type_name),
        unit_strindex: t.string(unit),
    };
    let sample_type = Some(value_type(&mut t));
    let mut samples = Vec::new();
    for w in p.weighted_stacks(kind, phase) {
        let locations = crate::pprof::frames_leaf_first(p, &w)
            .iter()
            .map(|(name, module)| t.location(p, name, module))
            .collect();
        let stack_index = t.stack(locations);
        let mut attribute_indices = vec![
            t.attribute("process.pid", int(w.pid as i64)),
            t.attribute("phaseprof.phase", text(p.phase_name(w.phase))),
        ];
        if w.tid != 0 {
            attribute_indices.push(t.attribute("thread.id", int(w.tid as i64)));
            let name = threads::thread_name(p, w.tid);
            attribute_indices.push(t.attribute("thread.name", text(&name)));
        }
        samples.push(Sample {
            stack_index,
            attribute_indices,
            values: vec![(w.value * scale) as i64],
            timestamps_unix_nano: Vec::new(),
        });
    }
    let period_type = (kind == EventKind::Cpu).then(|| value_type(&mut t));
    let m = &p.meta;
    let resource = Resource {
        attributes: vec![
            KeyValue {
                key: "process.executable.name".into(),
                value: Some(text(&m.comm)),
                key_strindex: 0,
            },
            KeyValue {
                key: "process.executable.path".into(),
                value: Some(text(&m.exe)),
                key_strindex: 0,
            },
            KeyValue {
                key: "host.name".into(),
                value: Some(text(&m.host)),
                key_strindex: 0,
            },
        ],
    };
    let profile = OtlpProfile {
        sample_type,
        samples,
        time_unix_nano: m.start_unix_ns,
        duration_nano: p.duration_ns(),
        period_type,
        period: period as i64,
        profile_id: m.start_unix_ns.to_be_bytes().repeat(2),
    };
    ProfilesData {
        resource_profiles: vec![ResourceProfiles {
            resource: Some(resource),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(Scope {
                    name: "phaseprof".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                }),
                profiles: vec![profile],
            }],
        }],
        dictionary: Some(t.d),
    }
}

/// Writes the OTLP protobuf (what an OTLP/HTTP exporter posts to `/v1development/profiles`).
pub fn write_otlp(
    p: &Profile,
    kind: EventKind,
    phase: Option<u32>,
    mut out: impl Write,
) -> std::io::Result<()> {
    out.write_all(&to_otlp(p, kind, phase).encode_to_vec())
}
