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
pub const MIN_SYSCALLS_TO_MEASURE: u64 = 400;

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

/// Attaching and detaching, added to a slice's length when its cost is foreseen.
const ATTACH: Duration = Duration::from_millis(10);

/// The probes' share of the targets' CPU time while they slow them by `cost`: s/(1+s).
fn probe_share(cost: f64) -> f64 {
    let s = cost.max(0.0);
    s / (1.0 + s)
}

/// Duty cycling of probes (allocations', phases', syscalls') as a token bucket in the targets'
/// CPU time, the unit of the budget's promise (CPU per request within 1%): the budget accrues
/// with the targets' own CPU time (1% of it), each attached slice spends the probes' time in
/// it (the targets' CPU time in the slice × s/(1+s) at slowdown s), and probes are attached
/// only when the bucket holds a slice's expected cost. A target that waits for its work slows
/// s-fold in slices and spends s times the work it did there, as a charge of s × the slice's
/// wall time would say; a saturated one cannot: it does 1/(1+s) of its work there, and its
/// CPU time per request grows by the probes' time only (nats-server under `nats bench` on 2
/// CPUs, slowed ~60x by goroutine phases: a 20 ms slice takes at most 40 ms of its CPU time,
/// where s × 20 ms would charge 1.2 s).
#[derive(Clone, Debug)]
pub struct DutyCycle {
    /// Allowed slowdown (0.01 = 1%).
    pub budget: f64,
    /// Estimated slowdown while attached, from the last slice that measured it
    /// (UNMEASURED_COST before the first).
    pub cost: f64,
    /// Whether a slice has measured the cost yet.
    pub measured: bool,
    /// The probes' time in the targets so far, ns.
    pub spent_ns: f64,
    /// The last slice's spending per ns of its length: what the next is expected to spend.
    spend_rate: Option<f64>,
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
            spend_rate: None,
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
            self.short_slice()
        }
    }

    /// The slice of probes that cost more than the budget.
    pub fn short_slice(&self) -> Duration {
        Duration::from_millis(20)
    }

    /// What the bucket holds once the targets ran `cpu_ns` of CPU time (the probes' included,
    /// which accrue nothing), ns.
    fn held(&self, cpu_ns: u64) -> f64 {
        let own = (cpu_ns as f64 - self.spent_ns).max(0.0);
        self.budget * own - self.spent_ns
    }

    /// What the next slice, `length` long, is expected to spend: as the last one did per ns of
    /// its length, or before any, the targets' CPU time at `rate` (CPU ns per ns, as lately) at
    /// the assumed cost.
    fn next_spend(&self, rate: f64, length: Duration) -> f64 {
        let length = (length + ATTACH).as_nanos() as f64;
        match self.spend_rate {
            Some(r) => r * length,
            None => rate * length * probe_share(self.cost),
        }
    }

    /// Whether the bucket, the targets having run `cpu_ns` of CPU time at `rate` (CPU ns per
    /// ns) lately, holds the cost of a next slice `length` long (`slice`, or longer where the
    /// caller lengthens its slices).
    pub fn may_attach(&self, cpu_ns: u64, rate: f64, length: Duration) -> bool {
        self.held(cpu_ns) >= self.next_spend(rate, length)
    }

    /// How long from now `may_attach` first holds, the targets running at `rate` (at most
    /// `longest`: their pace may change).
    pub fn attach_in(
        &self,
        cpu_ns: u64,
        rate: f64,
        length: Duration,
        longest: Duration,
    ) -> Duration {
        let missing = self.next_spend(rate, length) - self.held(cpu_ns);
        let accrues = self.budget * rate;
        if missing <= 0.0 {
            return Duration::ZERO;
        }
        if accrues <= 0.0 {
            return longest;
        }
        Duration::from_nanos((missing / accrues).min(longest.as_nanos() as f64) as u64)
    }

    /// The probes' slowdown `cost`, measured over `measured_over_ns` of the targets' CPU time
    /// in slices (too little says nothing: the estimate stays).
    pub fn take_cost(&mut self, cost: f64, measured_over_ns: u64) {
        if measured_over_ns >= MIN_MEASURED_CPU_NS {
            self.cost = cost;
            self.measured = true;
        }
    }

    /// A slice in force for `on`, in which the targets ran `slice_cpu_ns` of CPU time: spends
    /// the probes' part of that time. The caller adds the counted window to `on_ns`.
    pub fn spend(&mut self, on: Duration, slice_cpu_ns: u64) {
        let spent = slice_cpu_ns as f64 * probe_share(self.cost);
        self.spent_ns += spent;
        self.spend_rate = Some(spent / on.as_nanos().max(1) as f64);
    }

    /// A slice `length` long that could not start: it spends what one was expected to, so
    /// the next waits as if it had run.
    pub fn slice_failed(&mut self, rate: f64, length: Duration) {
        self.spent_ns += self.next_spend(rate, length);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the bucket, in the targets' CPU time: no slice before the budget has accrued one,
    // spending delays the next, the probes' time accrues nothing, an idle slice keeps the cost
    // estimate, and a cheap target gets long slices.
    #[test]
    fn duty_cycle_spends_no_more_than_the_budget() {
        let ms = |n: u64| n * 1_000_000;
        let mut d = DutyCycle::new(0.01);
        // One CPU busy: a first 30 ms slice at the assumed 300% spends 3/4 of its 30 ms of
        // CPU, 22.5 ms: 2.25 s of own CPU time at 1%.
        assert!(!d.may_attach(ms(2_200), 1.0, d.slice()));
        assert!(d.may_attach(ms(2_260), 1.0, d.slice()));
        let wait = d.attach_in(ms(2_000), 1.0, d.slice(), Duration::from_secs(60));
        assert!((wait.as_secs_f64() - 0.25).abs() < 1e-6, "{wait:?}");
        // Two CPUs busy: the slice is expected to spend twice as much (45 ms), and the budget
        // accrues twice as fast.
        let wait = d.attach_in(ms(2_000), 2.0, d.slice(), Duration::from_secs(60));
        assert!((wait.as_secs_f64() - 1.25).abs() < 1e-6, "{wait:?}");
        // Targets that have not run: a slice would cost them nothing.
        assert!(d.may_attach(0, 0.0, d.slice()));
        d.take_cost(3.0, 1_000);
        d.spend(Duration::from_millis(30), 1_000);
        assert!(!d.measured, "the target hardly ran: no estimate");
        // Slowed 59x in a slice where the target ran 30 ms: the probes took 29.5 ms of it.
        d.take_cost(59.0, ms(30));
        d.spend(Duration::from_millis(30), ms(30));
        assert_eq!((d.cost, d.measured), (59.0, true));
        assert!(
            (d.spent_ns - (750.0 + 29.5e6)).abs() < 1.0,
            "{}",
            d.spent_ns
        );
        // The next slice is expected to spend as much: 1% of 29.5 + 29.5 ms of own time, and
        // the probes' time is not own.
        let spent = d.spent_ns as u64;
        assert!(!d.may_attach(spent + ms(5_900) - ms(10), 1.0, d.slice()));
        assert!(d.may_attach(spent + ms(5_900) + ms(10), 1.0, d.slice()));
        // A slice lengthened to 90 ms (with attaching, 100 ms) is expected to spend over 3x
        // as much, and waits for it.
        let long = Duration::from_millis(90);
        assert!(!d.may_attach(spent + ms(5_900) + ms(10), 1.0, long));
        assert!(d.may_attach(spent + ms(19_700) + ms(10), 1.0, long));
        // Targets that stopped running accrue nothing: the wait is the longest allowed.
        let longest = Duration::from_secs(7);
        assert_eq!(
            d.attach_in(spent + ms(100), 0.0, d.slice(), longest),
            longest
        );
        d.take_cost(0.001, ms(38));
        assert_eq!(d.slice(), Duration::from_secs(1));
    }
}
