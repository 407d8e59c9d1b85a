//! A window as rows, the way both stores keep it: stacks stored once under content ids (their
//! frames as ids into deduplicated function and mapping tables), samples keyed by
//! (event kind, process, innermost phase, phase set, stack, syscall), per-phase totals, and a
//! window's counters (drops, costs, unwinding) by name. Ids are content hashes, so collectors
//! sharing one ClickHouse cluster agree on them without coordination.
//!
//! Merged views are sums of such rows (`Aggregate`), turned back into a `Profile`
//! (`rebuild`) for the pages, reports and downloads that already read profiles.
pub mod aggregate;
mod counters;
pub mod packed;
pub mod rebuild;
mod split;

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;

pub use aggregate::{Aggregate, Head, References};
pub use rebuild::rebuild;
pub use split::split;

/// A fast hasher for maps keyed by ids (already hashes) and small integer keys: std's SipHash
/// was a fifth of ingest's time.
#[derive(Default)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }
    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;
pub type IdSet<K> = HashSet<K, BuildHasherDefault<IdHasher>>;

/// Dictionary tables, as `Stored` tells them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Table {
    Labelsets,
    Functions,
    Mappings,
    Stacks,
    Phasesets,
}

/// Dictionary rows known to be stored (added once their batch committed): a window's split
/// leaves them out, so most windows carry no names or stacks at all (they repeat the ones
/// before). Cleared past `MAX` ids: memory stays bounded, and a row sent again is ignored.
#[derive(Default)]
pub struct Stored(RwLock<[IdSet<u64>; 5]>);

/// `Stored` read at once (a split asks thousands of times).
pub struct StoredView<'a>(std::sync::RwLockReadGuard<'a, [IdSet<u64>; 5]>);

impl StoredView<'_> {
    pub fn has(&self, table: Table, id: u64) -> bool {
        self.0[table as usize].contains(&id)
    }
}

impl Stored {
    const MAX: usize = 4_000_000;

    pub fn read(&self) -> StoredView<'_> {
        StoredView(self.0.read().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn has(&self, table: Table, id: u64) -> bool {
        self.read().has(table, id)
    }

    pub fn add(&self, ids: impl IntoIterator<Item = (Table, u64)>) {
        let mut sets = self.0.write().unwrap_or_else(|e| e.into_inner());
        if sets.iter().map(|s| s.len()).sum::<usize>() > Self::MAX {
            sets.iter_mut().for_each(|s| s.clear());
        }
        for (t, id) in ids {
            sets[t as usize].insert(id);
        }
    }
}

/// Stable 64-bit content id of a string, never 0 (0 means "none": no stack, phase
/// `(none)`): its length and its bytes as little-endian words (the last zero-padded) through
/// `id_of_words`. 64 bits: a collision among a million names has odds of about 1 in 40
/// million.
pub fn id_of(bytes: &[u8]) -> u64 {
    // Whole words read as they lie; only the rest (if any) is copied into a zero-padded word.
    // The ids are the byte-wise definition's (the test below holds them to it).
    let whole = bytes.chunks_exact(8);
    let rest = whole.remainder();
    let tail = (!rest.is_empty()).then(|| {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        u64::from_le_bytes(w)
    });
    let words = whole.map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()));
    id_of_words(std::iter::once(bytes.len() as u64).chain(words).chain(tail))
}

/// Stable 64-bit id of a sequence of ids (a stack's frames, a phase set): a multiply-rotate
/// over words with a final avalanche, never 0.
pub fn id_of_words(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut h: u64 = 0x2545_f491_4f6c_dd1d;
    for w in words {
        h = (h.rotate_left(5) ^ w).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    // splitmix64's finalizer: every input bit reaches every output bit.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
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

/// What a sample row is summed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SampleKey {
    /// The sample kind's stored number (`Kind::stored_as` in `phaseprof_model::kinds`).
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

/// A sample row's values, in the order its kind lists them (`phaseprof_model::kinds`; the
/// rest 0). Stored kinds' values all add (a test of the kinds' table holds them to it), which
/// is what both stores' SQL sums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SampleVals(pub [u64; VALUES]);

/// The stored value columns: as many as the stored kind with the most values has.
pub const VALUES: usize = phaseprof_model::MAX_STORED_VALUES;

impl SampleVals {
    pub fn absorb(&mut self, o: &SampleVals) {
        for (a, b) in self.0.iter_mut().zip(o.0) {
            *a = a.saturating_add(b);
        }
    }

    /// The first `VALUES` of `values`.
    pub fn of(values: &[u64]) -> Self {
        let mut v = SampleVals::default();
        for (a, b) in v.0.iter_mut().zip(values) {
            *a = *b;
        }
        v
    }

    /// Rows stored before values were integers kept an allocation row's estimated count as a
    /// float (`fvalue`): folded into its `ALLOC_COUNT_MILLI` value.
    pub fn with_float_count(mut self, kind: u8, fvalue: f64) -> Self {
        let alloc = phaseprof_model::SampleKind::Alloc.spec().stored_as;
        if fvalue != 0.0 && Some(kind) == alloc {
            let v = &mut self.0[phaseprof_model::ALLOC_COUNT_MILLI];
            *v = v.saturating_add(phaseprof_model::milli(fvalue));
        }
        self
    }
}

/// The name of stored value column `i` (`value`, `value2`, …), as both stores call them.
pub fn value_column(i: usize) -> String {
    match i {
        0 => "value".into(),
        _ => format!("value{}", i + 1),
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
    pub functions: IdMap<u64, String>,
    pub mappings: IdMap<u64, String>,
    pub stacks: IdMap<u64, StackRow>,
    /// A phase set: its phase ids (0 for `(none)`), ascending.
    pub phasesets: IdMap<u64, Vec<u64>>,
}

impl Dictionary {
    /// Every (table, id) this holds.
    pub fn ids(&self) -> impl Iterator<Item = (Table, u64)> + '_ {
        (self.functions.keys().map(|i| (Table::Functions, *i)))
            .chain(self.mappings.keys().map(|i| (Table::Mappings, *i)))
            .chain(self.stacks.keys().map(|i| (Table::Stacks, *i)))
            .chain(self.phasesets.keys().map(|i| (Table::Phasesets, *i)))
    }
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
    /// What this window's rows refer to, but for what was known to be stored at its split.
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
        assert_eq!(
            (p.raw, p.minutes.len(), p.hours.len()),
            (vec![(10, 20)], 0, 0)
        );
        let p = plan(h, 2 * h);
        assert_eq!(
            (p.raw.len(), p.minutes.len(), p.hours),
            (0, 0, vec![(h, 2 * h)])
        );
        // An open end (to = u64::MAX) never overflows.
        let p = plan(h, u64::MAX);
        assert!(!p.hours.is_empty());
    }

    // Checks that content ids stay what stores already hold (a changed id would split every
    // stack and name stored before from the same ones stored after), and differ with length
    // and content.
    #[test]
    fn ids_are_stable() {
        assert_eq!(id_of(b"main"), 0x7107_6c53_86be_2fee);
        // Empty, whole words only, words and a rest: as the byte-wise definition made them.
        assert_eq!(id_of(b""), 0xb4ab_02cf_dea8_688c);
        assert_eq!(id_of(b"12345678"), 0x431a_a740_cf07_78bf);
        assert_eq!(
            id_of(b"service::module_3::function_1234"),
            0xc380_fabe_1e78_7ee5
        );
        assert_eq!(id_of(b"[kernel]"), 0xd113_2079_a37f_efa2);
        assert_eq!(id_of_words([1, 2, 3]), 0x87cc_3fb9_8d5e_b609);
        assert_ne!(id_of(b"main"), id_of(b"main\0"));
        assert_ne!(id_of(b""), id_of(b"\0"));
        assert_eq!(phase_id("(none)"), 0);
    }
}
