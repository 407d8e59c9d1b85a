//! The embedded store's encoding of an `Aggregate`: a JSON header (window counts, head,
//! counters, phase totals) and the sample rows as varint records over one table of the ids
//! they use. A window of 500 stacks packs into ~8 KiB; a minute or an hour of a host sums
//! into one such row per bucket, so a day's query reads a few hundred of them.
use std::collections::{BTreeMap, HashMap};

use phaseprof_model::phase_stats::PhaseStats;
use serde::{Deserialize, Serialize};

use super::{Aggregate, Head, SampleKey, SampleVals, StackRow};
use crate::store_error::StoreError;

/// 2: a row's values as a count and that many varints. 1: three varints, and an allocation
/// row's estimated count as an f64.
const VERSION: u8 = 2;

#[derive(Serialize, Deserialize)]
struct Header {
    windows: u64,
    start_ns: u64,
    end_ns: u64,
    events: u8,
    head: Option<Head>,
    counters: BTreeMap<String, u64>,
    phase_stats: Vec<(u64, PhaseStats)>,
}

/// LEB128, as RowBinary writes lengths too.
pub fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Reads values in order; every read checks the bounds (a corrupt row is an error).
struct Reader<'a>(&'a [u8]);

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("a stored row is corrupt: {what}"))
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        if self.0.len() < n {
            return Err(corrupt("it ends early"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn varint(&mut self) -> Result<u64, StoreError> {
        let (mut n, mut shift) = (0u64, 0);
        loop {
            let b = self.take(1)?[0];
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(n);
            }
            shift += 7;
            if shift > 63 {
                return Err(corrupt("a bad varint"));
            }
        }
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn f64(&mut self) -> Result<f64, StoreError> {
        Ok(f64::from_bits(self.u64()?))
    }

    fn index(&mut self, ids: &[u64]) -> Result<u64, StoreError> {
        let i = self.varint()? as usize;
        ids.get(i)
            .copied()
            .ok_or_else(|| corrupt("an id index out of range"))
    }
}

pub fn encode(a: &Aggregate) -> Vec<u8> {
    let header = Header {
        windows: a.windows,
        start_ns: a.start_ns,
        end_ns: a.end_ns,
        events: a.events,
        head: a.head.clone(),
        counters: a.counters.clone(),
        phase_stats: a.phase_stats.iter().map(|(k, v)| (*k, v.clone())).collect(),
    };
    let json = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = vec![VERSION];
    put_varint(&mut out, json.len() as u64);
    out.extend_from_slice(&json);
    let mut ids: Vec<u64> = Vec::new();
    let mut index: HashMap<u64, u64> = HashMap::new();
    let mut idx = |id: u64| {
        *index.entry(id).or_insert_with(|| {
            ids.push(id);
            (ids.len() - 1) as u64
        })
    };
    let mut records = Vec::with_capacity(a.samples.len() * 12);
    for (k, v) in &a.samples {
        records.push(k.kind);
        for n in [
            u64::from(k.pid),
            idx(k.phase),
            idx(k.phaseset),
            idx(k.stack),
            u64::from(k.nr),
            v.0.len() as u64,
        ] {
            put_varint(&mut records, n);
        }
        for &n in &v.0 {
            put_varint(&mut records, n);
        }
    }
    put_varint(&mut out, ids.len() as u64);
    for id in &ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    put_varint(&mut out, a.samples.len() as u64);
    out.extend_from_slice(&records);
    out
}

/// Adds what `bytes` (an `encode`d aggregate) holds to `into`.
pub fn absorb(into: &mut Aggregate, bytes: &[u8]) -> Result<(), StoreError> {
    let mut r = Reader(bytes);
    let version = r.take(1)?[0];
    if !(1..=VERSION).contains(&version) {
        return Err(corrupt("an unknown version"));
    }
    let n = r.varint()? as usize;
    let header: Header = serde_json::from_slice(r.take(n)?).map_err(|e| corrupt(&e.to_string()))?;
    if header.windows == 0 {
        return Ok(());
    }
    into.absorb_window_stats(
        header.windows,
        header.start_ns,
        header.end_ns,
        header.events,
    );
    if let Some(h) = &header.head {
        into.offer_head(h);
    }
    for (k, v) in &header.counters {
        into.add_counter(k, *v);
    }
    for (p, s) in &header.phase_stats {
        into.add_phase_stats(*p, s);
    }
    let nids = r.varint()? as usize;
    if nids > r.0.len() / 8 {
        return Err(corrupt("more ids than bytes"));
    }
    let ids: Vec<u64> = (0..nids).map(|_| r.u64()).collect::<Result<_, _>>()?;
    let nrec = r.varint()?;
    into.samples.reserve(nrec.min(1 << 20) as usize);
    for _ in 0..nrec {
        let kind = r.take(1)?[0];
        let key = SampleKey {
            kind,
            pid: r.varint()? as u32,
            phase: r.index(&ids)?,
            phaseset: r.index(&ids)?,
            stack: r.index(&ids)?,
            nr: r.varint()? as u32,
        };
        let v = match version {
            1 => {
                let v = SampleVals::of(&[r.varint()?, r.varint()?, r.varint()?]);
                let alloc = phaseprof_model::SampleKind::Alloc.spec().stored_as;
                match Some(kind) == alloc {
                    true => v.with_float_count(kind, r.f64()?),
                    false => v,
                }
            }
            _ => {
                let n = r.varint()?;
                let mut values = Vec::with_capacity(n.min(16) as usize);
                for _ in 0..n {
                    values.push(r.varint()?);
                }
                SampleVals::of(&values)
            }
        };
        into.add_sample(key, &v);
    }
    Ok(())
}

/// A stack's frames as stored by the embedded store: (function, mapping, flags) per frame.
pub fn encode_stack(s: &StackRow) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.flags.len() * 17);
    for ((f, m), fl) in s.functions.iter().zip(&s.mappings).zip(&s.flags) {
        out.extend_from_slice(&f.to_le_bytes());
        out.extend_from_slice(&m.to_le_bytes());
        out.push(*fl);
    }
    out
}

pub fn decode_stack(bytes: &[u8]) -> Result<StackRow, StoreError> {
    if !bytes.len().is_multiple_of(17) {
        return Err(corrupt("a stack's frames"));
    }
    let mut s = StackRow::default();
    for f in bytes.chunks_exact(17) {
        let mut r = Reader(f);
        s.functions.push(r.u64()?);
        s.mappings.push(r.u64()?);
        s.flags.push(r.take(1)?[0]);
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc_key() -> SampleKey {
        SampleKey {
            kind: phaseprof_model::SampleKind::Alloc.spec().stored_as.unwrap(),
            pid: 7,
            phase: 5,
            phaseset: 9,
            stack: u64::MAX,
            nr: 0,
        }
    }

    // Checks that rows stored by the first layout (three values, and an allocation row's
    // estimated count as a float) read as today's: the count in thousandths.
    #[test]
    fn first_layout_reads() {
        let header = serde_json::to_vec(&Header {
            windows: 1,
            start_ns: 0,
            end_ns: 1,
            events: 0,
            head: None,
            counters: BTreeMap::new(),
            phase_stats: vec![],
        })
        .unwrap();
        let mut v1 = vec![1u8];
        put_varint(&mut v1, header.len() as u64);
        v1.extend_from_slice(&header);
        let k = alloc_key();
        put_varint(&mut v1, 3);
        for id in [k.phase, k.phaseset, k.stack] {
            v1.extend_from_slice(&id.to_le_bytes());
        }
        put_varint(&mut v1, 1);
        v1.push(k.kind);
        for n in [7, 0, 1, 2, 0, 4096, 3, 0] {
            put_varint(&mut v1, n);
        }
        v1.extend_from_slice(&2.5f64.to_le_bytes());
        let mut a = Aggregate::default();
        absorb(&mut a, &v1).unwrap();
        assert_eq!(a.samples[&k].0, [4096, 3, 2500]);
    }

    // Checks that an aggregate survives encoding (samples, fractional counts, header), that
    // absorbing twice doubles it, and that truncated bytes are an error, not a panic.
    #[test]
    fn round_trip_and_truncation() {
        let mut a = Aggregate::default();
        a.absorb_window_stats(1, 10, 20, 0b11);
        a.add_counter("lost.events", 3);
        let k = alloc_key();
        a.add_sample(k, &SampleVals::of(&[1 << 40, 2, 2500]));
        let bytes = encode(&a);
        let mut b = Aggregate::default();
        absorb(&mut b, &bytes).unwrap();
        absorb(&mut b, &bytes).unwrap();
        assert_eq!(b.windows, 2);
        assert_eq!(b.counters["lost.events"], 6);
        assert_eq!(b.samples[&k].0, [1 << 41, 4, 5000]);
        for cut in 0..bytes.len() {
            assert!(
                absorb(&mut Aggregate::default(), &bytes[..cut]).is_err(),
                "{cut}"
            );
        }
        let s = StackRow {
            functions: vec![1, 2],
            mappings: vec![3, 4],
            flags: vec![0, 5],
        };
        assert_eq!(decode_stack(&encode_stack(&s)).unwrap(), s);
    }
}
