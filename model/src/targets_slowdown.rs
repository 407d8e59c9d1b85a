//! phaseprof's cost measured in the targets themselves: their CPU time per unit of work (the
//! bytes their reads returned, or their read and write syscalls: counted by the kernel for
//! every process, with no probe) in a stretch before anything was attached, against the same
//! while recorded. Unlike the probes' own time (`probe_cost`), it holds what no probe's frame
//! or clock shows: the kernel's paths around the programs, the caches they evict, and a
//! server's own work grown because it answers later (on redis a third of the measured cost of
//! exact phases was its wakeups of a client that had gone idle meanwhile). It is only as good
//! as the work's mix is steady: a load that changed between the two stretches moves it as much
//! as the probes do, and the report says so.
use serde::{Deserialize, Serialize};

/// The unit the targets' work is counted in.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WorkUnit {
    /// Bytes their reads returned (`rchar`): a protocol's whatever its pace, where a server
    /// slowed by probes batches more requests into each read.
    BytesRead,
    /// Their read and write syscalls (`syscr` + `syscw`).
    IoSyscalls,
}

impl WorkUnit {
    pub fn name(self) -> &'static str {
        match self {
            WorkUnit::BytesRead => "byte read",
            WorkUnit::IoSyscalls => "read or write syscall",
        }
    }
}

/// The targets' CPU time and work over a stretch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct WorkDone {
    pub cpu_ns: u64,
    pub units: u64,
    /// The stretch's length.
    pub wall_ns: u64,
}

impl WorkDone {
    /// CPU ns per unit (None without work).
    pub fn ns_per_unit(&self) -> Option<f64> {
        (self.units > 0).then(|| self.cpu_ns as f64 / self.units as f64)
    }
}

/// The targets' CPU time per unit of work before phaseprof attached and while it recorded.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
pub struct TargetsSlowdown {
    pub unit: WorkUnit,
    pub before: WorkDone,
    pub during: WorkDone,
}

impl TargetsSlowdown {
    /// CPU time per unit while recorded over before, less one (negative: the targets did their
    /// work more cheaply while recorded, which only a changed load or noise can do).
    pub fn slowdown(&self) -> Option<f64> {
        Some(self.during.ns_per_unit()? / self.before.ns_per_unit()? - 1.0)
    }

    /// The CPU time the targets spent beyond what their work cost before, over the recording,
    /// in ns (negative with the slowdown).
    pub fn extra_ns(&self) -> Option<f64> {
        let s = self.slowdown()?;
        Some(self.during.cpu_ns as f64 * s / (1.0 + s))
    }

    /// The same measurement over a further stretch recorded after the same stretch before.
    pub fn and_after(&self, more: &WorkDone) -> Self {
        let d = &self.during;
        TargetsSlowdown {
            during: WorkDone {
                cpu_ns: d.cpu_ns + more.cpu_ns,
                units: d.units + more.units,
                wall_ns: d.wall_ns + more.wall_ns,
            },
            ..*self
        }
    }

    /// In words, for the report.
    pub fn describe(&self) -> Option<String> {
        let s = self.slowdown()?;
        let unit = self.unit.name();
        Some(format!(
            "{:+.1}% CPU time per {unit} ({:.0} ns against {:.0} ns in the {:.1} s before \
             attaching; {:.0} ms of the targets' CPU time): phaseprof's whole cost, the kernel's \
             paths and the targets' slower answers included, as far as their load's mix held \
             steady",
            100.0 * s,
            self.during.ns_per_unit()?,
            self.before.ns_per_unit()?,
            self.before.wall_ns as f64 / 1e9,
            self.extra_ns()? / 1e6,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the arithmetic: 600 ns a byte against 500 before is +20%, and of 1.2 s of CPU time
    // while recorded, 200 ms were beyond what the work cost before.
    #[test]
    fn slowdown_is_cpu_per_unit_against_before() {
        let t = TargetsSlowdown {
            unit: WorkUnit::BytesRead,
            before: WorkDone {
                cpu_ns: 500_000_000,
                units: 1_000_000,
                wall_ns: 1_000_000_000,
            },
            during: WorkDone {
                cpu_ns: 1_200_000_000,
                units: 2_000_000,
                wall_ns: 3_000_000_000,
            },
        };
        assert!((t.slowdown().unwrap() - 0.2).abs() < 1e-9);
        assert!((t.extra_ns().unwrap() - 200e6).abs() < 1.0);
        let line = t.describe().unwrap();
        assert!(
            line.starts_with("+20.0% CPU time per byte read (600 ns against 500 ns in the 1.0 s"),
            "{line}"
        );
        assert!(line.contains("200 ms of the targets' CPU time"), "{line}");
        let idle = TargetsSlowdown {
            before: WorkDone::default(),
            ..t
        };
        assert_eq!(idle.slowdown(), None);
        assert_eq!(idle.describe(), None);
    }
}
