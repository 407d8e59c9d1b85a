//! phaseprof's whole cost measured in the targets (`record -p`): their CPU time and work (the
//! bytes their reads returned, or their read and write syscalls, which the kernel counts for
//! every process with no probe) read before anything is attached and again after a stretch of
//! `--baseline`, then at attach and at the end. The probes' own time, from the samples in them
//! and the programs' clocks, misses what runs around them and what the targets do differently
//! because they are slower (on redis, 20-30% of the measured cost of exact phases and
//! allocations, most of the default events'); this measures it, as far as the load's mix
//! holds between the two stretches.
use std::time::{Duration, Instant};

use phaseprof_model::{TargetsSlowdown, WorkDone, WorkUnit};

use crate::duty_cycle::MIN_SYSCALLS_TO_MEASURE;
use crate::target_clocks::{cpu_ns, io_counts, IoCounts};

/// Reads in each stretch below which the bytes they returned are too few to measure by (a read
/// returns what has arrived), and the read and write syscalls are counted instead.
const MIN_READS: u64 = 100;

/// The targets' counters at one moment.
#[derive(Clone, Copy, Debug)]
struct Reading {
    cpu_ns: u64,
    io: IoCounts,
    at: Instant,
}

impl Reading {
    /// None when a target is gone or unreadable (its counts would drop out of the sums).
    fn take(pids: &[u32]) -> Option<Reading> {
        let mut io = IoCounts::default();
        for &pid in pids {
            let c = io_counts(pid)?;
            io.bytes_read += c.bytes_read;
            io.reads += c.reads;
            io.io_syscalls += c.io_syscalls;
        }
        Some(Reading {
            cpu_ns: cpu_ns(pids.iter().copied()),
            io,
            at: Instant::now(),
        })
    }

    /// What happened from `self` to `later`, counted in `unit`.
    fn to(&self, later: &Reading, unit: WorkUnit) -> WorkDone {
        let units = |r: &Reading| match unit {
            WorkUnit::BytesRead => r.io.bytes_read,
            WorkUnit::IoSyscalls => r.io.io_syscalls,
        };
        WorkDone {
            cpu_ns: later.cpu_ns.saturating_sub(self.cpu_ns),
            units: units(later).saturating_sub(units(self)),
            wall_ns: later.at.duration_since(self.at).as_nanos() as u64,
        }
    }

    fn reads_to(&self, later: &Reading) -> u64 {
        later.io.reads.saturating_sub(self.io.reads)
    }

    fn io_syscalls_to(&self, later: &Reading) -> u64 {
        later.io.io_syscalls.saturating_sub(self.io.io_syscalls)
    }
}

/// The stretch before anything was attached.
#[derive(Clone, Copy, Debug)]
pub struct Before {
    start: Reading,
    end: Reading,
}

/// Watches the targets `pids` for `length` with nothing of phaseprof's attached (None: a target
/// gone or unreadable). phaseprof only sleeps meanwhile, so that its own work (loading its
/// programs) takes no CPU from them.
pub fn measure_before(pids: &[u32], length: Duration) -> Option<Before> {
    let start = Reading::take(pids)?;
    std::thread::sleep(length);
    Some(Before {
        start,
        end: Reading::take(pids)?,
    })
}

/// The measurement under way: the stretch before, and the reading at attach.
pub struct Measuring {
    pids: Vec<u32>,
    before: Before,
    attached: Reading,
}

impl Measuring {
    /// Starts the recorded stretch, once every probe is attached.
    pub fn attached(before: Before, pids: &[u32]) -> Option<Self> {
        Some(Measuring {
            pids: pids.to_vec(),
            before,
            attached: Reading::take(pids)?,
        })
    }

    /// Ends it: the measurement, or why there is none.
    pub fn finish(&self) -> Result<TargetsSlowdown, String> {
        let end = Reading::take(&self.pids).ok_or("a target exited")?;
        judge(&self.before, &self.attached, &end)
    }
}

/// The measurement from the four readings: by the bytes read where each stretch has enough
/// reads, else by the read and write syscalls where each has enough of them.
fn judge(before: &Before, attached: &Reading, end: &Reading) -> Result<TargetsSlowdown, String> {
    let (b, d) = ((&before.start, &before.end), (attached, end));
    let reads = (b.0.reads_to(b.1), d.0.reads_to(d.1));
    let syscalls = (b.0.io_syscalls_to(b.1), d.0.io_syscalls_to(d.1));
    let unit = if reads.0 >= MIN_READS && reads.1 >= MIN_READS {
        WorkUnit::BytesRead
    } else if syscalls.0 >= MIN_SYSCALLS_TO_MEASURE && syscalls.1 >= MIN_SYSCALLS_TO_MEASURE {
        WorkUnit::IoSyscalls
    } else {
        return Err(format!(
            "the targets made {} reads and {} read or write syscalls before attaching, {} and {} \
             while recorded: too few to measure their work by",
            reads.0, syscalls.0, reads.1, syscalls.1
        ));
    };
    let t = TargetsSlowdown {
        unit,
        before: b.0.to(b.1, unit),
        during: d.0.to(d.1, unit),
    };
    match (t.before.units, t.during.units) {
        (0, _) | (_, 0) => Err("their reads returned no bytes".into()),
        _ => Ok(t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(cpu_ns: u64, bytes_read: u64, reads: u64, io_syscalls: u64, at: Instant) -> Reading {
        Reading {
            cpu_ns,
            io: IoCounts {
                bytes_read,
                reads,
                io_syscalls,
            },
            at,
        }
    }

    // Checks the choice of unit: bytes where both stretches read often enough, else read and
    // write syscalls, else no measurement; and that each stretch is counted from its own
    // readings (what happened between them, loading the programs, in neither).
    #[test]
    fn work_is_counted_in_bytes_else_syscalls_else_not_at_all() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let before = Before {
            start: reading(0, 0, 0, 0, t0),
            end: reading(100_000_000, 50_000, 1_000, 2_000, t0 + s),
        };
        let attached = reading(150_000_000, 80_000, 1_500, 3_000, t0 + 2 * s);
        let end = reading(400_000_000, 180_000, 3_500, 7_000, t0 + 4 * s);
        let t = judge(&before, &attached, &end).unwrap();
        assert_eq!(t.unit, WorkUnit::BytesRead);
        assert_eq!((t.before.cpu_ns, t.before.units), (100_000_000, 50_000));
        assert_eq!((t.during.cpu_ns, t.during.units), (250_000_000, 100_000));
        assert_eq!(t.during.wall_ns, 2_000_000_000);
        assert!((t.slowdown().unwrap() - 0.25).abs() < 1e-9);

        // 50 reads before: their bytes are too few, the syscalls (450, 4,000) are not.
        let few_reads = Before {
            end: reading(100_000_000, 5_000, 50, 450, t0 + s),
            ..before
        };
        let t = judge(&few_reads, &attached, &end).unwrap();
        assert_eq!(t.unit, WorkUnit::IoSyscalls);
        assert_eq!(t.before.units, 450);

        let idle = Before {
            end: reading(1_000_000, 0, 0, 10, t0 + s),
            ..before
        };
        let why = judge(&idle, &attached, &end).unwrap_err();
        assert!(
            why.contains("made 0 reads and 10 read or write syscalls"),
            "{why}"
        );
    }

    // Checks the readings of a real process: this test's own, which reads a file meanwhile.
    #[test]
    fn readings_count_a_process_own_reads() {
        let me = std::process::id();
        let a = Reading::take(&[me]).unwrap();
        let _ = std::fs::read("/proc/self/status").unwrap();
        let b = Reading::take(&[me]).unwrap();
        assert!(b.io.reads > a.io.reads);
        assert!(b.io.bytes_read > a.io.bytes_read);
        assert!(Reading::take(&[me, u32::MAX]).is_none());
    }
}
