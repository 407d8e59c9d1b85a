//! What the totals of probes attached for slices only (a phase or allocation budget) are
//! extrapolated by: the bytes the targets read, or their read and write syscalls, both of which
//! the kernel counts exactly in and out of slices; or their own CPU time (less the probes'
//! estimated time), which an error in the probes' cost per hit moves the more the larger their
//! share of the CPU while attached.
//!
//! The bytes read first: a server's bytes per request are its protocol's, whatever its pace,
//! where its syscalls per request are not once slowed (nats-server read and wrote the same
//! 91.4 MB for 200,000 messages bare and under probes that slowed it 13x, but in 907 syscalls
//! bare, 1,391 slowed, 1,162 bare again). Read, not written: a server works on what a read
//! returns at once, but what it writes may wait in its own queues, and a slice's edges move
//! those queues' bytes across (nats-server, slowed 8x in slices, flushed in them the backlog
//! its subscribers had from the fast run before: 3,000,000 messages were estimated 14% and
//! 17% under by the bytes read and written, 2.1% and 2.5% under by the bytes read).

/// What the totals were extrapolated by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Basis {
    ReadBytes,
    Syscalls,
    OwnCpu,
}

impl Basis {
    /// Its name in reports' JSON.
    pub fn name(self) -> &'static str {
        match self {
            Basis::ReadBytes => "read_bytes",
            Basis::Syscalls => "syscalls",
            Basis::OwnCpu => "cpu",
        }
    }
}

/// Syscalls inside slices below which they are never extrapolated by.
const FEWEST_SYSCALLS_TO_COUNT_BY: u64 = 25;

/// The own-CPU extrapolation's error where the probes cost nothing: the targets' CPU time also
/// goes to work outside what the probes count, which need not keep pace with it.
const CPU_ERROR_FLOOR: f64 = 0.02;

/// The targets' read and write syscalls, in slices and in all, and of them the reads, with the
/// bytes the reads returned, in slices and in all.
#[derive(Clone, Copy, Debug, Default)]
pub struct Io {
    pub syscalls_in_slices: u64,
    pub syscalls: u64,
    pub reads_in_slices: u64,
    pub reads: u64,
    pub read_bytes_in_slices: u64,
    pub read_bytes: u64,
}

impl Io {
    /// Whether the bytes read measure the targets' work: reads are at least a tenth of their
    /// read and write syscalls, in slices and in all, and returned bytes in slices. A program
    /// that reads its configuration and then only writes (validator-sim: 10 KB read, then
    /// 4,000,000 writes) is counted by its syscalls.
    pub fn reads_are_the_work(&self) -> bool {
        self.read_bytes_in_slices > 0
            && self.reads_in_slices * 10 >= self.syscalls_in_slices
            && self.reads * 10 >= self.syscalls
    }

    /// Whether the bytes read are counted by, whatever the syscalls say: the reads are the
    /// work (`reads_are_the_work`), and FEWEST_SYSCALLS_TO_COUNT_BY or more of them in slices.
    pub fn reads_carry_the_work(&self) -> bool {
        self.reads_are_the_work() && self.reads_in_slices >= FEWEST_SYSCALLS_TO_COUNT_BY
    }

    /// How far extrapolating by the syscalls stands from extrapolating by the bytes read, where
    /// the reads are the work (else 0): a server slowed in slices reads less at a time, so it
    /// makes more syscalls for the same bytes there (nats-server slowed ~50x by goroutine
    /// probes made 6.2 times the syscalls per byte read in slices that it did in all, and by
    /// its 121 syscalls in slices was estimated 83.8% under, ±9% by their count alone).
    pub fn syscalls_disagree(&self) -> f64 {
        if !self.reads_are_the_work() || self.syscalls_in_slices == 0 || self.read_bytes == 0 {
            return 0.0;
        }
        let by_syscalls = self.syscalls as f64 / self.syscalls_in_slices as f64;
        let by_bytes = self.read_bytes as f64 / self.read_bytes_in_slices as f64;
        (by_syscalls / by_bytes - 1.0).abs()
    }

    /// The expected error of extrapolating by `io`: 1/√n for the n syscalls or reads in slices
    /// it counts by; by the syscalls, at least how far they stand from the bytes read.
    pub fn error_by(&self, io: Basis) -> f64 {
        let by_count = syscall_error(self.counted_by(io));
        match io {
            Basis::Syscalls => by_count.max(self.syscalls_disagree()),
            _ => by_count,
        }
    }

    /// The syscalls the basis `io` (bytes read, or syscalls) counts by in slices: its error is
    /// about 1/√n.
    pub fn counted_by(&self, io: Basis) -> u64 {
        match io {
            Basis::ReadBytes => self.reads_in_slices,
            _ => self.syscalls_in_slices,
        }
    }
}

/// The basis with the smaller expected error, for the targets' reads and writes `io` made while
/// the probes slowed them by `overhead` and left them `counted_own_ns` of own CPU time in
/// slices: syscalls, and the bytes reads return, err by about 1/√n for n in slices (a slice's
/// edges cut the unit of work they come in), own CPU time by a tenth of the slowdown (what a
/// 10% error in the probes' cost moves it by); the syscalls, however few, where the probes'
/// estimated time took all of the slices' CPU time (nothing own is left to scale by). Of the
/// two, the bytes read where the reads carry the work; where fewer were read in slices, the
/// bytes read still if they err less than the syscalls, which disagree with them as much as
/// the slowed targets batched otherwise (`syscalls_disagree`).
pub fn basis(io: &Io, overhead: f64, counted_own_ns: u64) -> Basis {
    let by = if io.reads_carry_the_work()
        || (io.reads_are_the_work() && io.error_by(Basis::ReadBytes) < io.error_by(Basis::Syscalls))
    {
        Basis::ReadBytes
    } else {
        Basis::Syscalls
    };
    if counted_own_ns == 0 && io.syscalls_in_slices > 0 {
        return by;
    }
    let enough = by == Basis::ReadBytes || io.counted_by(by) >= FEWEST_SYSCALLS_TO_COUNT_BY;
    if enough && io.error_by(by) <= cpu_error(overhead) {
        by
    } else {
        Basis::OwnCpu
    }
}

/// The syscall extrapolation's expected error with `n` of them in slices.
pub fn syscall_error(n: u64) -> f64 {
    1.0 / (n.max(1) as f64).sqrt()
}

fn cpu_error(overhead: f64) -> f64 {
    (0.1 * overhead).max(CPU_ERROR_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes only: `n` in slices of 100 times as many.
    fn writes(n: u64) -> Io {
        Io {
            syscalls_in_slices: n,
            syscalls: 100 * n,
            ..Io::default()
        }
    }

    /// `n` syscalls in slices, a third of them reads returning 100 bytes each, in slices and in
    /// all.
    fn reads(n: u64) -> Io {
        Io {
            reads_in_slices: n / 3,
            reads: 100 * n / 3,
            read_bytes_in_slices: 100 * (n / 3),
            read_bytes: 100 * (100 * n / 3),
            ..writes(n)
        }
    }

    // Checks the choice: few syscalls lose to cheap probes' CPU time, many win over costly ones;
    // with no own CPU time counted, any syscalls win; the bytes read where the reads are a
    // steady part of the syscalls, by as many of them.
    #[test]
    fn the_basis_that_errs_less() {
        let own = 1_000_000;
        assert_eq!(basis(&writes(24), 100.0, own), Basis::OwnCpu);
        assert_eq!(basis(&writes(100), 0.5, own), Basis::OwnCpu);
        assert_eq!(basis(&writes(400), 0.5, own), Basis::Syscalls);
        assert_eq!(basis(&writes(2_000), 0.05, own), Basis::OwnCpu);
        assert_eq!(basis(&writes(3_000), 0.05, own), Basis::Syscalls);
        assert_eq!(basis(&writes(3), 0.0, 0), Basis::Syscalls);
        assert_eq!(basis(&Io::default(), 0.0, 0), Basis::OwnCpu);
        assert_eq!(basis(&reads(1_200), 0.5, own), Basis::ReadBytes);
        // 133 reads: ±8.7%, more than 5% by CPU time.
        assert_eq!(basis(&reads(400), 0.5, own), Basis::OwnCpu);
        assert_eq!(basis(&reads(60), 100.0, own), Basis::Syscalls);
        assert_eq!(basis(&reads(90), 100.0, own), Basis::ReadBytes);
        // Reads at the start only, then writes: never by their bytes.
        let startup = Io {
            reads: 100,
            ..reads(1_200)
        };
        assert_eq!(basis(&startup, 0.5, own), Basis::Syscalls);
    }

    // Checks a server slowed in slices so much that it read less at a time there (nats-server,
    // ~50x: 121 syscalls and 13 reads of 786,432 bytes in slices; 12,301 and 7,708 of
    // 496,004,459 in all): by the syscalls it was 83.8% under, which is how far they disagree
    // with the bytes read, so its 13 reads (±28%) are counted by instead. Where the syscalls
    // per byte are as in all, the more numerous syscalls still win over a few reads.
    #[test]
    fn syscalls_that_disagree_with_the_bytes_read_lose() {
        let slowed = Io {
            syscalls_in_slices: 121,
            syscalls: 12_301,
            reads_in_slices: 13,
            reads: 7_708,
            read_bytes_in_slices: 786_432,
            read_bytes: 496_004_459,
        };
        assert!((slowed.syscalls_disagree() - 0.839).abs() < 0.001);
        assert!((slowed.error_by(Basis::Syscalls) - 0.839).abs() < 0.001);
        assert!((slowed.error_by(Basis::ReadBytes) - 0.277).abs() < 0.001);
        assert_eq!(basis(&slowed, 5.27, 1_000_000), Basis::ReadBytes);
        // At the pace of all: 20 reads and 60 syscalls in slices, the syscalls by ±13%.
        assert_eq!(reads(60).syscalls_disagree(), 0.0);
        assert_eq!(basis(&reads(60), 100.0, 1_000_000), Basis::Syscalls);
        // No bytes read in all (a window of an earlier version): nothing to disagree with.
        let unknown = Io {
            read_bytes: 0,
            ..slowed
        };
        assert_eq!(unknown.syscalls_disagree(), 0.0);
    }
}
