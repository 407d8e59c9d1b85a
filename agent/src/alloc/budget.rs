//! The allocation probes' cost to the target, estimated from probe hits, and the duty cycle
//! that keeps it inside a budget (`--alloc-budget 1%`).
use std::time::Duration;

/// Measured cost of one allocator probe hit on this machine class (target/release/bench
/// --only alloc: malloc+free pair with chosen placement, minus the bare pair, per hit; see
/// README "Performance"). A hit is an entry, a return or a free.
pub const NS_PER_HIT: f64 = 900.0;

/// Estimated slowdown of the target: probe time added over the target's own CPU time.
pub fn overhead(hits: u64, target_cpu_ns: u64) -> f64 {
    if target_cpu_ns == 0 {
        return 0.0;
    }
    hits as f64 * NS_PER_HIT / target_cpu_ns as f64
}

/// Duty cycling of the allocation probes: on for a slice of each period, sized so that the
/// overhead measured while on, times the on-fraction, stays within the budget.
#[derive(Clone, Debug)]
pub struct DutyCycle {
    /// Allowed slowdown (0.01 = 1%).
    pub budget: f64,
    pub period: Duration,
    /// Fraction of each period the probes are attached (starts at 1 and adapts).
    pub on_fraction: f64,
    /// Time spent attached and in total: totals are extrapolated by their ratio.
    pub on_ns: u64,
    pub total_ns: u64,
}

impl DutyCycle {
    pub fn new(budget: f64) -> Self {
        DutyCycle {
            budget,
            period: Duration::from_secs(1),
            // The first slice measures the cost; start small so a hot target is not slowed
            // for a whole period before the first estimate.
            on_fraction: 0.05,
            on_ns: 0,
            total_ns: 0,
        }
    }

    /// After an on-slice with measured `overhead_while_on`: the next slice's fraction.
    pub fn adapt(&mut self, overhead_while_on: f64) {
        self.on_fraction = if overhead_while_on <= self.budget {
            1.0
        } else {
            // Keep a floor so even a very hot target gets some samples each period.
            (self.budget / overhead_while_on).clamp(0.005, 1.0)
        };
    }

    pub fn on_time(&self) -> Duration {
        self.period.mul_f64(self.on_fraction)
    }

    pub fn off_time(&self) -> Duration {
        self.period.mul_f64(1.0 - self.on_fraction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the on-fraction shrinks to fit the budget and recovers when cheap.
    #[test]
    fn duty_cycle_fits_the_budget() {
        let mut d = DutyCycle::new(0.01);
        d.adapt(0.20);
        assert!((d.on_fraction - 0.05).abs() < 1e-9);
        d.adapt(0.005);
        assert_eq!(d.on_fraction, 1.0);
        d.adapt(100.0);
        assert_eq!(d.on_fraction, 0.005);
    }
}
