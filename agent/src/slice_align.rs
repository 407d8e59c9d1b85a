//! Under a phase budget: the bytes read that the calls a slice counted worked on. The kernel
//! side (slice_align.bpf.h) adds a thread's calls from its first read in a slice, stretch by
//! stretch up to each next read, with the bytes of the read that began the stretch; the
//! slice's edges, which fall in the work on a read (made at the unslowed pace, in larger pieces,
//! before the start; the slice's own last read, at the end), cut no counted call off its bytes.
//! The totals extrapolated by the bytes read are then scaled by the bytes the counted calls
//! stand for: those calls' bytes per call, times all the calls the slices counted.
use anyhow::Result;

use crate::engine::Engine;

/// The aligned counters so far: calls, the reads that closed their stretches, their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Aligned {
    pub calls: u64,
    pub reads: u64,
    pub bytes: u64,
}

impl Aligned {
    pub fn read(engine: &Engine<'_>) -> Result<Aligned> {
        let (calls, reads, bytes) = engine.aligned_reads()?;
        Ok(Aligned {
            calls,
            reads,
            bytes,
        })
    }

    /// What was counted from `earlier` to `self`.
    pub fn since(&self, earlier: &Aligned) -> Aligned {
        Aligned {
            calls: self.calls.saturating_sub(earlier.calls),
            reads: self.reads.saturating_sub(earlier.reads),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }

    fn add(&mut self, b: &Aligned) {
        self.calls += b.calls;
        self.reads += b.reads;
        self.bytes += b.bytes;
    }
}

/// Reads aligned below which the bytes read in slices are left as the kernel counted them.
/// Few: at a 1% budget nats-server's goroutines each read once or twice a slice, most of its
/// calls in slices worked on a read from before (14 stretches of 58 reads in 3 slices aligned
/// 465 of 3,119 calls, which were 3.7% under where all of them were 35% over).
const MIN_ALIGNED_READS: u64 = 8;

/// How far the aligned calls per byte may stand from all the slices' calls per byte read: the
/// edges move up to a read's work for each reader, not more. Beyond it, the work is done by
/// threads that do not read it (a pool fed by a queue aligns few or none of its calls), and the
/// bytes read in slices stand as the kernel counted them.
const MAX_ALIGNED_RATIO: f64 = 2.0;

/// Over whole slices: the calls they counted, the bytes read in them (/proc/PID/io), and what
/// aligned.
#[derive(Clone, Copy, Debug, Default)]
pub struct SliceAlignment {
    calls: u64,
    read_bytes: u64,
    aligned: Aligned,
}

impl SliceAlignment {
    /// A slice ended that counted `calls` while the targets read `read_bytes`, `aligned` of them.
    pub fn add(&mut self, calls: u64, read_bytes: u64, aligned: &Aligned) {
        self.calls += calls;
        self.read_bytes += read_bytes;
        self.aligned.add(aligned);
    }

    /// Whether enough of the slices' calls aligned with their reads to count by them, at a
    /// rate like all of theirs (MAX_ALIGNED_RATIO).
    pub fn holds(&self) -> bool {
        if self.aligned.reads < MIN_ALIGNED_READS || self.aligned.bytes == 0 {
            return false;
        }
        let rate = |calls: u64, bytes: u64| calls as f64 / bytes.max(1) as f64;
        let ratio =
            rate(self.aligned.calls, self.aligned.bytes) / rate(self.calls, self.read_bytes);
        (1.0 / MAX_ALIGNED_RATIO..=MAX_ALIGNED_RATIO).contains(&ratio)
    }

    /// The bytes read in slices, `read_bytes_in` as the kernel counted them, as the bytes the
    /// calls counted in them worked on, and the reads that tells from; None where too few
    /// aligned (`holds`).
    pub fn bytes_worked(&self, read_bytes_in: u64) -> Option<(u64, u64)> {
        if !self.holds() || self.read_bytes == 0 {
            return None;
        }
        let worked = self.aligned.bytes as f64 * self.calls as f64 / self.aligned.calls as f64;
        let scaled = read_bytes_in as f64 * worked / self.read_bytes as f64;
        Some((scaled.round() as u64, self.aligned.reads))
    }
}

/// One slice's calls and bytes for its spread (`SliceSpread`): the aligned ones where it had
/// any, else all it counted.
pub fn slice_calls_and_bytes(calls: u64, read_bytes: u64, aligned: &Aligned) -> (u64, u64) {
    if aligned.reads > 0 && aligned.calls > 0 {
        (aligned.calls, aligned.bytes)
    } else {
        (calls, read_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the scaling: 1,000 calls counted over slices that read 300 KB, of which 800
    // aligned with 40 reads of 200 KB: the calls stand for 250 KB; too few reads aligned, or
    // at a rate far from all of the calls', and the kernel's bytes stand.
    #[test]
    fn the_calls_stand_for_their_reads_bytes() {
        let aligned = Aligned {
            calls: 800,
            reads: 40,
            bytes: 200_000,
        };
        let slices = |a: Aligned| {
            let mut s = SliceAlignment::default();
            s.add(1_000, 300_000, &a);
            s
        };
        let a = slices(aligned);
        assert_eq!(a.bytes_worked(300_000), Some((250_000, 40)));
        // A window that counted half of those bytes: half as many.
        assert_eq!(a.bytes_worked(150_000), Some((125_000, 40)));
        let few = slices(Aligned {
            reads: 7,
            ..aligned
        });
        assert_eq!(few.bytes_worked(300_000), None);
        // Readers that hand the work to others: 20 of 1,000 calls on 200 KB of 300 KB.
        let pool = slices(Aligned {
            calls: 20,
            ..aligned
        });
        assert_eq!(pool.bytes_worked(300_000), None);
        // A fifth of the calls aligned, at twice all calls' rate: still by them.
        let part = slices(Aligned {
            calls: 200,
            bytes: 30_000,
            ..aligned
        });
        assert_eq!(part.bytes_worked(300_000), Some((150_000, 40)));
        assert_eq!(slice_calls_and_bytes(9, 99, &aligned), (800, 200_000));
        assert_eq!(slice_calls_and_bytes(9, 99, &Aligned::default()), (9, 99));
    }
}
