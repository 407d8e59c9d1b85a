//! A window as rows, the way both stores keep it: stacks stored once under content ids (their
//! frames as ids into deduplicated function and mapping tables), samples keyed by
//! (event kind, process, innermost phase, phase set, stack, syscall), per-phase totals, and a
//! window's counters (drops, costs, unwinding) by name. Ids are content hashes, so collectors
//! sharing one ClickHouse cluster agree on them without coordination.
//!
//! Merged views are sums of such rows (`Aggregate`), turned back into a `Profile`
//! (`rebuild`) for the pages, reports and downloads that already read profiles.
pub mod aggregate;
pub mod packed;
pub mod rebuild;
mod split;

use std::collections::HashMap;

pub use aggregate::{Aggregate, Head};
pub use rebuild::rebuild;
pub use split::split;

/// Stable 64-bit content id (FNV-1a), never 0 (0 means "none": no stack, phase `(none)`).
/// 64 bits: a collision among a million stacks has odds of about 1 in 40 million.
pub fn id_of(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

/// The id of a phase by name; `(none)` is 0.
pub fn phase_id(name: &str) -> u64 {
    if name == phaseprof_model::PHASE_NONE_NAME {
        0
    } else {
        id_of(name.as_bytes())
    }
}

/// Sample row kinds: the event kinds, plus the kernel's exact allocation totals (no stack).
pub const KIND_CPU: u8 = 0;
pub const KIND_OFFCPU: u8 = 1;
pub const KIND_SYSCALL: u8 = 2;
pub const KIND_ALLOC: u8 = 3;
pub const KIND_PAGEFAULT: u8 = 4;
pub const KIND_ALLOC_TOTAL: u8 = 5;

/// What a sample row is summed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    pub kind: u8,
    pub pid: u32,
    /// The innermost phase (`phase_id`).
    pub phase: u64,
    /// Every phase on the thread's stack (a `Dictionary::phasesets` id).
    pub phaseset: u64,
    /// 0: none (a syscall counted without its stack, an allocation total).
    pub stack: u64,
    /// The syscall number (syscall rows).
    pub nr: u32,
}

/// A sample row's values. cpu, page faults: `value` = count; off-CPU: ns; syscalls: count,
/// `value2` = total ns; allocations: bytes, `value2` = samples, `fvalue` = estimated count;
/// allocation totals: bytes, `value2` = count, `value3` = frees.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleVals {
    pub value: u64,
    pub value2: u64,
    pub value3: u64,
    pub fvalue: f64,
}

impl SampleVals {
    pub fn absorb(&mut self, o: &SampleVals) {
        self.value = self.value.saturating_add(o.value);
        self.value2 = self.value2.saturating_add(o.value2);
        self.value3 = self.value3.saturating_add(o.value3);
        self.fvalue += o.fvalue;
    }
}

/// A stack, leaf first: per frame its function and mapping (module) ids and its flags
/// (`FrameKind` in the low two bits, inlined in bit 2).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StackRow {
    pub functions: Vec<u64>,
    pub mappings: Vec<u64>,
    pub flags: Vec<u8>,
}

/// The stored-once tables rows refer to.
#[derive(Clone, Debug, Default)]
pub struct Dictionary {
    /// Function names (phase names too: phases are functions) and module names.
    pub functions: HashMap<u64, String>,
    pub mappings: HashMap<u64, String>,
    pub stacks: HashMap<u64, StackRow>,
    /// A phase set: its phase ids (0 for `(none)`), ascending.
    pub phasesets: HashMap<u64, Vec<u64>>,
}

impl Dictionary {
    pub fn absorb(&mut self, o: Dictionary) {
        self.functions.extend(o.functions);
        self.mappings.extend(o.mappings);
        self.stacks.extend(o.stacks);
        self.phasesets.extend(o.phasesets);
    }
}

/// One window split for storing.
#[derive(Clone, Debug)]
pub struct WindowRows {
    /// Its labels (a JSON object) and their id.
    pub labels: String,
    pub labelset: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Everything this window's rows refer to.
    pub dict: Dictionary,
    /// The window alone as an aggregate.
    pub agg: Aggregate,
}

/// A merged selection as stores answer it: the sums and what they refer to.
#[derive(Clone, Debug, Default)]
pub struct Merged {
    pub agg: Aggregate,
    pub dict: Dictionary,
}

/// Minute and hour rollup buckets (ns), by window start.
pub const MINUTE_NS: u64 = 60_000_000_000;
pub const HOUR_NS: u64 = 60 * MINUTE_NS;

/// How a time range `[from, to)` (window starts) is read: whole hours from hour rollups,
/// whole minutes around them from minute rollups, the rest (less than a minute at each end)
/// from the windows' own rows. Each part is a list of `[from, to)` ranges.
#[derive(Debug, PartialEq)]
pub struct Plan {
    pub raw: Vec<(u64, u64)>,
    pub minutes: Vec<(u64, u64)>,
    pub hours: Vec<(u64, u64)>,
}

pub fn plan(from: u64, to: u64) -> Plan {
    let up = |t: u64, b: u64| t.div_ceil(b).saturating_mul(b);
    let down = |t: u64, b: u64| t / b * b;
    let mut p = Plan {
        raw: vec![],
        minutes: vec![],
        hours: vec![],
    };
    let (m0, m1) = (up(from, MINUTE_NS), down(to, MINUTE_NS));
    if m0 >= m1 {
        p.raw.push((from, to));
        return p;
    }
    let (h0, h1) = (up(from, HOUR_NS), down(to, HOUR_NS));
    if h0 < h1 {
        p.hours.push((h0, h1));
        p.minutes.push((m0, h0));
        p.minutes.push((h1, m1));
    } else {
        p.minutes.push((m0, m1));
    }
    p.raw.push((from, m0));
    p.raw.push((m1, to));
    for v in [&mut p.raw, &mut p.minutes] {
        v.retain(|(a, b)| a < b);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the read plan: parts tile [from, to) exactly, rollups only where whole buckets
    // fit, and a range shorter than a minute is read raw.
    #[test]
    fn plan_tiles_the_range() {
        let h = HOUR_NS;
        let m = MINUTE_NS;
        let p = plan(3 * h + 90 * 1_000_000_000, 5 * h + 2 * m + 5);
        assert_eq!(p.hours, vec![(4 * h, 5 * h)]);
        assert_eq!(
            p.minutes,
            vec![(3 * h + 2 * m, 4 * h), (5 * h, 5 * h + 2 * m)]
        );
        assert_eq!(
            p.raw,
            vec![
                (3 * h + 90 * 1_000_000_000, 3 * h + 2 * m),
                (5 * h + 2 * m, 5 * h + 2 * m + 5)
            ]
        );
        let p = plan(10, 20);
        assert_eq!((p.raw, p.minutes.len(), p.hours.len()), (vec![(10, 20)], 0, 0));
        let p = plan(h, 2 * h);
        assert_eq!((p.raw.len(), p.minutes.len(), p.hours), (0, 0, vec![(h, 2 * h)]));
        // An open end (to = u64::MAX) never overflows.
        let p = plan(h, u64::MAX);
        assert!(!p.hours.is_empty());
    }
}
