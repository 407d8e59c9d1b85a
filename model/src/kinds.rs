//! The one description of what phaseprof records: each kind of sample, the values it carries
//! (name, unit, how two samples of the same key sum), whether it has a thread and a stack, and
//! the event (`--events`) that records it. A [`Sample`](crate::Sample) is the same shape for
//! every kind; merging, the collector's rows and both stores' SQL, flamegraphs and the exports
//! read this table instead of knowing the kinds. A new value or a new kind is a row here, the
//! BPF program that counts it and the drain that reads its map.
use serde::{Deserialize, Serialize};

/// The events phaseprof records (`--events`). Non-exhaustive: code outside this crate says
/// what it does with an event it does not name, so that a new one needs no change there.
#[non_exhaustive]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    Cpu,
    Offcpu,
    Syscall,
    Alloc,
    Pagefault,
    Signal,
}

/// The kinds of samples: each event's, plus the kernel's exact allocation totals (no stack)
/// and the heap still live at the end. Non-exhaustive, as events are.
#[non_exhaustive]
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SampleKind {
    Cpu,
    Offcpu,
    Syscall,
    Alloc,
    AllocTotal,
    Live,
    Pagefault,
    Signal,
}

/// How the values of two samples with the same key combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sum {
    /// Added, saturating at 2^64-1.
    Add,
    /// The larger kept (the oldest live allocation's age).
    Max,
}

/// One value a sample carries.
#[derive(Clone, Copy, Debug)]
pub struct Value {
    pub name: &'static str,
    pub unit: &'static str,
    pub sum: Sum,
    /// The name of its total per second among a diff's metrics, if it is one.
    pub metric: Option<&'static str>,
}

/// Whether samples of a kind carry a stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stacks {
    Always,
    /// Sometimes: syscalls counted without theirs (`--syscall-stacks sampled` or off), off-CPU
    /// time of switch-outs whose stacks were not sampled (`--offcpu-stacks sampled`).
    Sometimes,
    Never,
}

/// One kind of sample.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    pub kind: SampleKind,
    pub name: &'static str,
    /// The event that records it.
    pub event: EventKind,
    /// Its stacks are the event's flamegraph (weighed by its first value); one per event.
    pub flamegraph: bool,
    /// Its number in the collector's stores (never renumbered: stored rows keep it); None for
    /// a state read once at the end (the live heap), which windows do not sum.
    pub stored_as: Option<u8>,
    pub values: &'static [Value],
    /// Whether it has a thread (else counted per process: tid 0).
    pub per_thread: bool,
    pub stacks: Stacks,
    /// Its stack is where a timer interrupted the thread (a probe's frames in it mean it hit
    /// phaseprof's own probe); else phaseprof's probe took it, and the leaf frames are ours.
    pub interrupted: bool,
    /// Its pprof sample type and unit (cpu adds a second, its time).
    pub pprof: (&'static str, &'static str),
}

const fn add(name: &'static str, unit: &'static str) -> Value {
    Value {
        name,
        unit,
        sum: Sum::Add,
        metric: None,
    }
}

/// A value that adds and that diffs compare as a total per second, under `metric`.
const fn compared(name: &'static str, unit: &'static str, metric: &'static str) -> Value {
    Value {
        metric: Some(metric),
        ..add(name, unit)
    }
}

/// Indices into a sample's values, by kind.
pub const CPU_COUNT: usize = 0;
pub const OFFCPU_NS: usize = 0;
/// Of `OFFCPU_NS`: runnable, waiting for a CPU (preempted, or woken and not yet running).
pub const OFFCPU_CPU_WAIT_NS: usize = 1;
pub const SYSCALL_COUNT: usize = 0;
pub const SYSCALL_NS: usize = 1;
pub const SYSCALL_ERRORS: usize = 2;
pub const ALLOC_BYTES: usize = 0;
pub const ALLOC_SAMPLES: usize = 1;
pub const ALLOC_COUNT_MILLI: usize = 2;
pub const TOTAL_BYTES: usize = 0;
pub const TOTAL_COUNT: usize = 1;
pub const TOTAL_FREES: usize = 2;
pub const LIVE_BYTES: usize = 0;
pub const LIVE_SAMPLES: usize = 1;
pub const LIVE_OLDEST_NS: usize = 2;
pub const LIVE_AGE_NS: usize = 3;
pub const FAULT_COUNT: usize = 0;
pub const SIGNAL_COUNT: usize = 0;

/// An estimated count in thousandths, as `ALLOC_COUNT_MILLI` holds it (values are integers,
/// so that sums are exact and stores can sum them).
pub fn milli(x: f64) -> u64 {
    (x * 1000.0).round() as u64
}

/// Every kind.
pub const KINDS: &[Kind] = &[
    Kind {
        kind: SampleKind::Cpu,
        name: "cpu",
        event: EventKind::Cpu,
        flamegraph: true,
        stored_as: Some(0),
        values: &[compared("count", "samples", "cpu_samples")],
        per_thread: true,
        stacks: Stacks::Always,
        interrupted: true,
        pprof: ("samples", "count"),
    },
    Kind {
        kind: SampleKind::Offcpu,
        name: "offcpu",
        event: EventKind::Offcpu,
        flamegraph: true,
        stored_as: Some(1),
        values: &[
            compared("ns", "nanoseconds", "offcpu_ns"),
            compared("cpu_wait_ns", "nanoseconds", "cpu_wait_ns"),
        ],
        per_thread: true,
        stacks: Stacks::Sometimes,
        interrupted: false,
        pprof: ("offcpu", "nanoseconds"),
    },
    Kind {
        kind: SampleKind::Syscall,
        name: "syscall",
        event: EventKind::Syscall,
        flamegraph: true,
        stored_as: Some(2),
        values: &[
            compared("count", "calls", "syscalls"),
            add("ns", "nanoseconds"),
            compared("errors", "calls", "syscall_errors"),
        ],
        per_thread: true,
        stacks: Stacks::Sometimes,
        interrupted: false,
        pprof: ("syscalls", "count"),
    },
    Kind {
        kind: SampleKind::Alloc,
        name: "alloc",
        event: EventKind::Alloc,
        flamegraph: true,
        stored_as: Some(3),
        values: &[
            add("bytes", "bytes"),
            add("samples", "allocations"),
            add("count_milli", "allocations/1000"),
        ],
        per_thread: false,
        stacks: Stacks::Always,
        interrupted: false,
        pprof: ("alloc_space", "bytes"),
    },
    Kind {
        kind: SampleKind::AllocTotal,
        name: "alloc_total",
        event: EventKind::Alloc,
        flamegraph: false,
        stored_as: Some(5),
        values: &[
            compared("bytes", "bytes", "alloc_bytes"),
            compared("count", "allocations", "allocs"),
            add("frees", "frees"),
        ],
        per_thread: false,
        stacks: Stacks::Never,
        interrupted: false,
        pprof: ("alloc_space", "bytes"),
    },
    Kind {
        kind: SampleKind::Live,
        name: "live",
        event: EventKind::Alloc,
        flamegraph: false,
        stored_as: None,
        values: &[
            add("bytes", "bytes"),
            add("samples", "allocations"),
            Value {
                sum: Sum::Max,
                ..add("oldest_ns", "nanoseconds")
            },
            add("age_ns", "nanoseconds"),
        ],
        per_thread: false,
        stacks: Stacks::Always,
        interrupted: false,
        pprof: ("inuse_space", "bytes"),
    },
    Kind {
        kind: SampleKind::Pagefault,
        name: "pagefault",
        event: EventKind::Pagefault,
        flamegraph: true,
        stored_as: Some(4),
        values: &[compared("count", "faults", "page_faults")],
        per_thread: true,
        stacks: Stacks::Always,
        interrupted: false,
        pprof: ("page_faults", "count"),
    },
    Kind {
        kind: SampleKind::Signal,
        name: "signal",
        event: EventKind::Signal,
        flamegraph: true,
        stored_as: Some(6),
        // By signal number (`nr`), where each stopped the thread.
        values: &[compared("count", "signals", "signals")],
        per_thread: true,
        stacks: Stacks::Always,
        interrupted: false,
        pprof: ("signals", "count"),
    },
];

/// The most values any kind has.
pub const MAX_VALUES: usize = max_values(false);
/// The most values a stored kind has: the stores' value columns.
pub const MAX_STORED_VALUES: usize = max_values(true);

const fn max_values(stored: bool) -> usize {
    let mut i = 0;
    let mut max = 0;
    while i < KINDS.len() {
        let k = &KINDS[i];
        if (!stored || k.stored_as.is_some()) && k.values.len() > max {
            max = k.values.len();
        }
        i += 1;
    }
    max
}

impl SampleKind {
    pub fn spec(self) -> &'static Kind {
        // Every kind has its row (checked by a test).
        KINDS.iter().find(|k| k.kind == self).unwrap_or(&KINDS[0])
    }

    /// The kind stored under `n`.
    pub fn from_stored(n: u8) -> Option<SampleKind> {
        KINDS
            .iter()
            .find(|k| k.stored_as == Some(n))
            .map(|k| k.kind)
    }

    /// Combines `from` into `into`, value by value as the kind sums them.
    pub fn absorb(self, into: &mut Vec<u64>, from: &[u64]) {
        let values = self.spec().values;
        if into.len() < from.len() {
            into.resize(from.len(), 0);
        }
        for (i, (a, b)) in into.iter_mut().zip(from).enumerate() {
            *a = match values.get(i).map_or(Sum::Add, |v| v.sum) {
                Sum::Add => a.saturating_add(*b),
                Sum::Max => (*a).max(*b),
            };
        }
    }
}

impl EventKind {
    pub const ALL: [EventKind; 6] = [
        EventKind::Cpu,
        EventKind::Offcpu,
        EventKind::Syscall,
        EventKind::Alloc,
        EventKind::Pagefault,
        EventKind::Signal,
    ];

    /// The kind of sample whose stacks are this event's flamegraph.
    pub fn samples(self) -> SampleKind {
        (KINDS.iter())
            .find(|k| k.event == self && k.flamegraph)
            .map_or(SampleKind::Cpu, |k| k.kind)
    }

    pub fn name(self) -> &'static str {
        self.samples().spec().name
    }

    /// What one unit of a stack's value means for this event.
    pub fn unit(self) -> &'static str {
        self.samples().spec().values[0].unit
    }

    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.name() == s)
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the table's own rules: every kind has one row, every event one flamegraph kind,
    // stored numbers are unique, and what the stores sum in SQL (every stored value) adds.
    #[test]
    fn the_table_is_whole() {
        let all = [
            SampleKind::Cpu,
            SampleKind::Offcpu,
            SampleKind::Syscall,
            SampleKind::Alloc,
            SampleKind::AllocTotal,
            SampleKind::Live,
            SampleKind::Pagefault,
            SampleKind::Signal,
        ];
        for k in all {
            assert_eq!(KINDS.iter().filter(|r| r.kind == k).count(), 1, "{k:?}");
        }
        for e in EventKind::ALL {
            let n = KINDS
                .iter()
                .filter(|r| r.event == e && r.flamegraph)
                .count();
            assert_eq!(n, 1, "{e}");
            assert_eq!(EventKind::parse(e.name()), Some(e));
        }
        let mut stored: Vec<u8> = KINDS.iter().filter_map(|k| k.stored_as).collect();
        stored.sort_unstable();
        stored.dedup();
        assert_eq!(
            stored.len(),
            KINDS.iter().filter(|k| k.stored_as.is_some()).count()
        );
        for k in KINDS.iter().filter(|k| k.stored_as.is_some()) {
            assert!(k.values.iter().all(|v| v.sum == Sum::Add), "{}", k.name);
        }
    }

    // Checks that values combine by their rule.
    #[test]
    fn values_sum_by_their_rule() {
        let mut v = vec![1, 2, 30, 4];
        SampleKind::Live.absorb(&mut v, &[1, 1, 20, 5]);
        assert_eq!(v, vec![2, 3, 30, 9]);
        let mut v = vec![u64::MAX - 1];
        SampleKind::Cpu.absorb(&mut v, &[5]);
        assert_eq!(v, vec![u64::MAX]);
    }
}
