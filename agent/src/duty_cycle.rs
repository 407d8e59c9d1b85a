//! Probes' cost to the target, estimated from probe hits at a cost per hit, and the duty cycle
//! that keeps it inside a budget (`--alloc-budget 1%`, `--phase-budget 1%`).
use std::time::Duration;

/// The targets' own CPU time: `cpu_ns` measured (which includes the time spent in probes) less
/// the time of `hits` probe hits at `ns_per_hit`.
pub fn own_cpu_ns(cpu_ns: u64, hits: u64, ns_per_hit: f64) -> u64 {
    cpu_ns.saturating_sub((hits as f64 * ns_per_hit) as u64)
}

/// Estimated slowdown of the target: probe time added over the target's own CPU time.
pub fn overhead(hits: u64, target_cpu_ns: u64, ns_per_hit: f64) -> f64 {
    if target_cpu_ns == 0 {
        return 0.0;
    }
    hits as f64 * ns_per_hit / target_cpu_ns as f64
}

/// Syscalls in slices (and outside) below which they are too few to measure the probes'
/// slowdown by (their count's own noise, √n, would pass 5%).
const MIN_SYSCALLS_TO_MEASURE: u64 = 400;

/// The probes' slowdown of the targets measured by their syscalls: their CPU time per syscall
/// while the probes were in force (`inside`: CPU ns, syscalls) over the same outside (the
/// whole recording's, `all`, less `inside`), less one. Exact counts both, and no cost per hit
/// assumed; None until each side has MIN_SYSCALLS_TO_MEASURE syscalls and a few ms of CPU time.
pub fn slowdown_by_syscalls(inside: (u64, u64), all: (u64, u64)) -> Option<f64> {
    let counted = (inside.1, all.1.saturating_sub(inside.1));
    slowdown_by_work(inside, all, counted, MIN_SYSCALLS_TO_MEASURE)
}

/// Reads in slices (and outside) below which the bytes they returned are too few to measure the
/// probes' slowdown by (a read returns what has arrived: ±20% at 25, where the estimate from
/// the calls at their cost per hit was off 5x on nats-server: see `SliceBudget`).
pub const MIN_READS_TO_MEASURE: u64 = 25;

/// The probes' slowdown of the targets measured by their work in units the probes do not
/// change (syscalls; or the bytes their reads returned, a server's protocol's whatever its
/// pace, where a server slowed 10x by goroutine probes made 1.5x the syscalls a message):
/// their CPU time per unit in slices (`inside`: CPU ns, units) over the same outside (`all`
/// less `inside`), less one. None until `counted` (the syscalls the units came in, inside and
/// outside) are `enough` each, and each side has a few ms of CPU time.
pub fn slowdown_by_work(
    inside: (u64, u64),
    all: (u64, u64),
    counted: (u64, u64),
    enough: u64,
) -> Option<f64> {
    let (cpu_in, units_in) = inside;
    let (cpu_out, units_out) = (all.0.saturating_sub(cpu_in), all.1.saturating_sub(units_in));
    if counted.0 < enough
        || counted.1 < enough
        || units_in == 0
        || units_out == 0
        || cpu_in < MIN_MEASURED_CPU_NS
        || cpu_out < MIN_MEASURED_CPU_NS
    {
        return None;
    }
    let per_in = cpu_in as f64 / units_in as f64;
    let per_out = cpu_out as f64 / units_out as f64;
    Some((per_in / per_out - 1.0).max(0.0))
}

/// A slice in which the target ran less than this says nothing about the probes' cost.
const MIN_MEASURED_CPU_NS: u64 = 2_000_000;

/// The cost assumed before a slice has measured it: about a tight malloc/free loop's (three
/// probe hits per ~20 ns pair), so the first slice cannot overspend.
const UNMEASURED_COST: f64 = 3.0;

/// Duty cycling of probes (allocations', phases') as a token bucket: the budget accrues with wall time
/// (1% of every second), each attached slice spends its estimated slowdown (overhead × length),
/// and probes are attached only when the bucket holds a whole slice's cost. So the slowdown
/// stays within the budget from the first second on, whatever the target's allocation rate.
#[derive(Clone, Debug)]
pub struct DutyCycle {
    /// Allowed slowdown (0.01 = 1%).
    pub budget: f64,
    /// Estimated slowdown while attached, from the last slice that measured it
    /// (UNMEASURED_COST before the first).
    pub cost: f64,
    /// Whether a slice has measured the cost yet.
    pub measured: bool,
    /// Slowdown spent so far, in ns of the target's time.
    pub spent_ns: f64,
    /// Time allocations were counted (every probe in force): totals are extrapolated by
    /// total / on.
    pub on_ns: u64,
}

impl DutyCycle {
    pub fn new(budget: f64) -> Self {
        DutyCycle {
            budget,
            cost: UNMEASURED_COST,
            measured: false,
            spent_ns: 0.0,
            on_ns: 0,
        }
    }

    /// How long the probes stay attached once in force (attaching itself takes milliseconds
    /// more): short while they cost more than the budget, so each slice spends little; long
    /// when they cost less.
    pub fn slice(&self) -> Duration {
        if self.measured && self.cost <= self.budget {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(20)
        }
    }

    /// Whether the bucket, `elapsed` into the recording, holds the cost of a slice (with 10 ms
    /// for attaching).
    pub fn may_attach(&self, elapsed: Duration) -> bool {
        let allowance = self.budget * elapsed.as_nanos() as f64;
        let slice = (self.slice() + Duration::from_millis(10)).as_nanos() as f64;
        allowance - self.spent_ns >= self.cost * slice
    }

    /// How far into the recording `may_attach` first holds (with no more spending meanwhile).
    pub fn attach_at(&self) -> Duration {
        let slice = (self.slice() + Duration::from_millis(10)).as_nanos() as f64;
        let ns = (self.spent_ns + self.cost * slice) / self.budget.max(1e-9);
        Duration::from_nanos(ns.min(u64::MAX as f64 / 2.0) as u64)
    }

    /// After an attached slice of `on` (attach and detach included) with measured overhead
    /// `cost` over `target_cpu_ns`. The caller adds the counted window to `on_ns`.
    pub fn slice_done(&mut self, on: Duration, cost: f64, target_cpu_ns: u64) {
        if target_cpu_ns >= MIN_MEASURED_CPU_NS {
            self.cost = cost;
            self.measured = true;
        }
        self.spent_ns += self.cost * on.as_nanos() as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the bucket: no slice before the budget has accrued one, spending delays the next,
    // an idle slice keeps the cost estimate, and a cheap target gets long slices.
    #[test]
    fn duty_cycle_spends_no_more_than_the_budget() {
        let mut d = DutyCycle::new(0.01);
        // A first 30 ms slice at the assumed 300% costs 90 ms: 9 s of 1%.
        assert!(!d.may_attach(Duration::from_millis(8_900)));
        assert!(d.may_attach(Duration::from_secs(9)));
        assert!((d.attach_at().as_secs_f64() - 9.0).abs() < 1e-6);
        d.slice_done(Duration::from_millis(30), 3.0, 1_000);
        assert!(!d.measured, "the target hardly ran: no estimate");
        d.slice_done(Duration::from_millis(30), 1.0, 8_000_000);
        assert_eq!((d.cost, d.measured), (1.0, true));
        // Spent 90 + 30 ms: the next 30 ms slice at 100% needs 150 ms of allowance, 15 s of 1%.
        assert!(!d.may_attach(Duration::from_millis(14_900)));
        assert!(d.may_attach(Duration::from_secs(15)));
        d.slice_done(Duration::from_millis(30), 0.001, 8_000_000);
        assert_eq!(d.slice(), Duration::from_secs(1));
    }
}
