//! How far a budget's extrapolation may be off, from how much its slices disagree: each slice's
//! calls per unit of the targets' work (bytes read, or read and write syscalls) is one draw of
//! the rate the totals are scaled by, and the ratio estimator's standard error follows from
//! their spread. The count of units alone (1/√n) says far less: nats-server's reads returned
//! 4.8 KB on average in its slices and 65 KB outside, and four slices with 56 reads (±13% by
//! their count) came out 24% under in one recording and 56% over in the next.
use serde::{Deserialize, Serialize};

/// The units a slice's calls are set against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    ReadBytes = 0,
    Syscalls = 1,
}

/// Running sums over slices: calls c, units u (one per `Unit`), and their squares and
/// products, so that windows merge by adding.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct SliceSpread {
    pub slices: u64,
    pub calls: f64,
    pub calls_sq: f64,
    pub units: [f64; 2],
    pub units_sq: [f64; 2],
    pub calls_units: [f64; 2],
}

impl SliceSpread {
    /// A slice that counted `calls` while the targets' reads returned `read_bytes` and they
    /// made `syscalls` read and write syscalls.
    pub fn add(&mut self, calls: u64, read_bytes: u64, syscalls: u64) {
        let c = calls as f64;
        self.slices += 1;
        self.calls += c;
        self.calls_sq += c * c;
        for (i, u) in [read_bytes as f64, syscalls as f64].into_iter().enumerate() {
            self.units[i] += u;
            self.units_sq[i] += u * u;
            self.calls_units[i] += c * u;
        }
    }

    pub fn absorb(&mut self, b: &SliceSpread) {
        self.slices += b.slices;
        self.calls += b.calls;
        self.calls_sq += b.calls_sq;
        for i in 0..2 {
            self.units[i] += b.units[i];
            self.units_sq[i] += b.units_sq[i];
            self.calls_units[i] += b.calls_units[i];
        }
    }

    /// The relative standard error of calls per `unit` over the slices (the ratio estimator's:
    /// Σ(cᵢ − R·uᵢ)² / (k(k−1)·ū²), R = Σc/Σu); None with fewer than 3 slices or no calls.
    pub fn relative_error(&self, unit: Unit) -> Option<f64> {
        let (k, i) = (self.slices as f64, unit as usize);
        if self.slices < 3 || self.calls <= 0.0 || self.units[i] <= 0.0 {
            return None;
        }
        let r = self.calls / self.units[i];
        let residual = self.calls_sq - 2.0 * r * self.calls_units[i] + r * r * self.units_sq[i];
        let mean_units = self.units[i] / k;
        let var = residual.max(0.0) / (k * (k - 1.0) * mean_units * mean_units);
        Some(var.sqrt() / r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the spread: slices at one rate agree (no error), slices at rates 1 and 3 per unit
    // do not (R = 2; residuals ±1 per slice of 1 unit: √(4/(4·3))/2 = 29%); merged windows
    // give what one would.
    #[test]
    fn slices_that_disagree_widen_the_error() {
        let mut same = SliceSpread::default();
        for _ in 0..4 {
            same.add(10, 5, 1);
        }
        assert!(same.relative_error(Unit::ReadBytes).unwrap() < 1e-9);
        let mut apart = SliceSpread::default();
        for c in [1, 3, 1, 3] {
            apart.add(c, 1, 1);
        }
        let e = apart.relative_error(Unit::Syscalls).unwrap();
        assert!((e - (1.0f64 / 3.0).sqrt() / 2.0).abs() < 1e-9, "{e}");
        let (mut a, mut b) = (SliceSpread::default(), SliceSpread::default());
        for c in [1, 3] {
            a.add(c, 1, 1);
            b.add(c, 1, 1);
        }
        a.absorb(&b);
        assert_eq!(a, apart);
        let mut two = SliceSpread::default();
        two.add(1, 1, 1);
        two.add(3, 1, 1);
        assert_eq!(two.relative_error(Unit::Syscalls), None);
    }
}
