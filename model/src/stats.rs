//! The statistics behind `diff` verdicts: the difference of two means with a confidence
//! interval (Welch's t, or a percentile bootstrap when a side is skewed), and how many more runs
//! an inconclusive comparison needs.
use serde::Serialize;
use statrs::distribution::{ContinuousCDF, StudentsT};

/// Mean and sample standard deviation of `xs` (0 for fewer than two values).
pub fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let mean = xs.iter().sum::<f64>() / n;
    if xs.len() < 2 {
        return (mean, 0.0);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Sample skewness (0 when undefined).
pub fn skewness(xs: &[f64]) -> f64 {
    let (mean, sd) = mean_sd(xs);
    if xs.len() < 3 || sd == 0.0 {
        return 0.0;
    }
    let n = xs.len() as f64;
    xs.iter().map(|x| ((x - mean) / sd).powi(3)).sum::<f64>() / n
}

/// How an interval was computed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    Welch,
    Bootstrap,
    /// Welch over a phase's calls pooled from runs that agree (see `diff::per_call`).
    Calls,
}

/// B − A with a two-sided confidence interval at level 1 − `alpha`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Difference {
    pub delta: f64,
    pub low: f64,
    pub high: f64,
    pub method: Method,
}

/// Welch's interval for mean(b) − mean(a); exact (zero width) when neither side varies.
pub fn welch(a: &[f64], b: &[f64], alpha: f64) -> Difference {
    let (ma, sa) = mean_sd(a);
    let (mb, sb) = mean_sd(b);
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let delta = mb - ma;
    let (va, vb) = (sa * sa / na, sb * sb / nb);
    let se = (va + vb).sqrt();
    // Spreads at rounding-error level are no spread: exact values that are equal per run.
    let negligible = se <= 1e-12 * ma.abs().max(mb.abs());
    if negligible || a.len() < 2 || b.len() < 2 {
        return Difference {
            delta,
            low: delta,
            high: delta,
            method: Method::Welch,
        };
    }
    let df = (va + vb).powi(2) / (va * va / (na - 1.0) + vb * vb / (nb - 1.0));
    let t = StudentsT::new(0.0, 1.0, df)
        .map(|d| d.inverse_cdf(1.0 - alpha / 2.0))
        .unwrap_or(f64::INFINITY);
    Difference {
        delta,
        low: delta - t * se,
        high: delta + t * se,
        method: Method::Welch,
    }
}

/// A mean's standard error and its degrees of freedom (infinite: known exactly or from many
/// values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    pub mean: f64,
    pub se: f64,
    pub df: f64,
}

impl Estimate {
    /// The mean of `xs` as the sample of runs.
    pub fn of_runs(xs: &[f64]) -> Estimate {
        let (mean, sd) = mean_sd(xs);
        Estimate {
            mean,
            se: sd / (xs.len().max(1) as f64).sqrt(),
            df: (xs.len() as f64 - 1.0).max(0.0),
        }
    }
}

/// `b − a` with its standard error and Welch–Satterthwaite degrees of freedom.
fn combine(a: &Estimate, b: &Estimate) -> (f64, f64, f64) {
    let delta = b.mean - a.mean;
    let (va, vb) = (a.se * a.se, b.se * b.se);
    let se = (va + vb).sqrt();
    let part = |v: f64, df: f64| if v == 0.0 { 0.0 } else { v * v / df };
    let denom = part(va, a.df) + part(vb, b.df);
    let df = if denom > 0.0 {
        (va + vb).powi(2) / denom
    } else {
        f64::INFINITY
    };
    (delta, se, df)
}

fn t_quantile(df: f64, p: f64) -> f64 {
    if !df.is_finite() || df > 1e6 {
        return statrs::distribution::Normal::standard().inverse_cdf(p);
    }
    StudentsT::new(0.0, 1.0, df.max(1e-3))
        .map(|d| d.inverse_cdf(p))
        .unwrap_or(f64::INFINITY)
}

/// Two-sided p-value of `b − a` against no difference (Welch's t): 0 for an exact nonzero
/// difference, 1 for an exact zero, NaN-free.
pub fn p_value(a: &Estimate, b: &Estimate) -> f64 {
    let (delta, se, df) = combine(a, b);
    if se <= 1e-12 * a.mean.abs().max(b.mean.abs()) || se == 0.0 {
        return if delta == 0.0 { 1.0 } else { 0.0 };
    }
    if df < 1e-9 {
        return 1.0;
    }
    let t = (delta / se).abs();
    let tail = if !df.is_finite() || df > 1e6 {
        1.0 - statrs::distribution::Normal::standard().cdf(t)
    } else {
        StudentsT::new(0.0, 1.0, df)
            .map(|d| 1.0 - d.cdf(t))
            .unwrap_or(0.5)
    };
    (2.0 * tail).clamp(0.0, 1.0)
}

/// The interval for `b − a` at level 1 − `alpha` from two estimates.
pub fn interval(a: &Estimate, b: &Estimate, alpha: f64) -> Difference {
    let (delta, se, df) = combine(a, b);
    let exact = se == 0.0 || se <= 1e-12 * a.mean.abs().max(b.mean.abs());
    let half = if exact {
        0.0
    } else {
        t_quantile(df, 1.0 - alpha / 2.0) * se
    };
    Difference {
        delta,
        low: delta - half,
        high: delta + half,
        method: Method::Welch,
    }
}

/// Holm's step-down levels for p-values `ps` at family-wise `alpha`: the level each test is held
/// to (alpha / (m − rank) in ascending order of p, until the first test that fails; every later
/// test is held to that failing level, so it fails too). Uniformly more powerful than
/// Bonferroni's alpha / m with the same guarantee.
pub fn holm_levels(ps: &[f64], alpha: f64) -> Vec<f64> {
    let m = ps.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&i, &j| ps[i].total_cmp(&ps[j]));
    let mut levels = vec![alpha / m.max(1) as f64; m];
    let mut failed: Option<f64> = None;
    for (rank, &i) in order.iter().enumerate() {
        let level = failed.unwrap_or(alpha / (m - rank) as f64);
        if failed.is_none() && ps[i] > level {
            failed = Some(level);
        }
        levels[i] = level;
    }
    levels
}

/// A small deterministic generator (xorshift64*): bootstrap results must not change between
/// runs of `diff` on the same files.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Percentile bootstrap interval for mean(b) − mean(a) (10,000 resamples of each side).
pub fn bootstrap(a: &[f64], b: &[f64], alpha: f64) -> Difference {
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let delta = mean(b) - mean(a);
    if a.is_empty() || b.is_empty() {
        return Difference {
            delta,
            low: delta,
            high: delta,
            method: Method::Bootstrap,
        };
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let resample = |xs: &[f64], rng: &mut Rng| {
        (0..xs.len()).map(|_| xs[rng.below(xs.len())]).sum::<f64>() / xs.len() as f64
    };
    let mut deltas: Vec<f64> = (0..10_000)
        .map(|_| resample(b, &mut rng) - resample(a, &mut rng))
        .collect();
    deltas.sort_by(f64::total_cmp);
    let at =
        |q: f64| deltas[((q * (deltas.len() - 1) as f64).round() as usize).min(deltas.len() - 1)];
    Difference {
        delta,
        low: at(alpha / 2.0),
        high: at(1.0 - alpha / 2.0),
        method: Method::Bootstrap,
    }
}

/// Fewest runs per side for which the bootstrap is trusted. With fewer, the resampled means take
/// few distinct values and the percentile interval ignores the small-sample (t) widening: at five
/// runs a single slow run made a same-build comparison look "regressed" with a 95% interval.
pub const MIN_BOOTSTRAP_RUNS: usize = 10;

/// Welch, or the bootstrap when either side is clearly skewed (|skewness| > 1) and both sides
/// have enough runs for it, where the t interval's normality assumption fails.
pub fn difference(a: &[f64], b: &[f64], alpha: f64) -> Difference {
    let enough = a.len().min(b.len()) >= MIN_BOOTSTRAP_RUNS;
    let skewed = |xs: &[f64]| skewness(xs).abs() > 1.0;
    if enough && (skewed(a) || skewed(b)) {
        bootstrap(a, b, alpha)
    } else {
        welch(a, b, alpha)
    }
}

/// What a comparison says.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "verdict")]
pub enum Verdict {
    Improved,
    Regressed,
    NoChange,
    /// The interval straddles zero and the noise threshold: this many more runs per side would
    /// likely decide it.
    Inconclusive {
        more_runs: usize,
    },
    /// One run per side: a delta, no verdict.
    Unreplicated,
    /// Shown for context (a count such as calls), not judged.
    Context,
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Improved => f.write_str("improved"),
            Verdict::Regressed => f.write_str("regressed"),
            Verdict::NoChange => f.write_str("no change"),
            Verdict::Inconclusive { more_runs } => {
                write!(f, "inconclusive (need {more_runs} more runs)")
            }
            Verdict::Unreplicated => f.write_str("n/a (one run per side)"),
            Verdict::Context => f.write_str("(context)"),
        }
    }
}

/// The verdict for `d` (lower is better) with runs `n` per side (the smaller side) and a noise
/// threshold `threshold` (absolute, in the metric's unit): a change must exclude zero and be at
/// least the threshold; no change needs the whole interval inside ±threshold.
pub fn verdict(d: &Difference, n: usize, threshold: f64) -> Verdict {
    if n < 2 {
        return Verdict::Unreplicated;
    }
    if (d.low > 0.0 || d.high < 0.0) && d.delta.abs() >= threshold {
        return if d.delta < 0.0 {
            Verdict::Improved
        } else {
            Verdict::Regressed
        };
    }
    if d.low >= -threshold && d.high <= threshold {
        return Verdict::NoChange;
    }
    // Half-widths shrink as 1/sqrt(n): the runs needed to either exclude zero (a real change of
    // the observed size) or fit inside the threshold (no change), whichever needs fewer.
    let half = (d.high - d.low) / 2.0;
    let target = d
        .delta
        .abs()
        .max(threshold - d.delta.abs())
        .max(half * 1e-3);
    let needed = (n as f64 * (half / target).powi(2)).ceil() as usize;
    Verdict::Inconclusive {
        more_runs: needed.saturating_sub(n).clamp(1, 1000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks Welch's interval against a hand computation (R: t.test(b, a) gives 2 ± 1.5715).
    #[test]
    fn welch_matches_a_textbook_case() {
        let a = [10.0, 11.0, 12.0, 11.0, 10.0];
        let b = [12.0, 13.0, 14.0, 13.0, 12.0];
        let d = welch(&a, &b, 0.05);
        assert!((d.delta - 2.0).abs() < 1e-12);
        // se = sqrt(0.7/5 * 2) = 0.52915, df = 8, t(0.975, 8) = 2.306
        assert!((d.high - d.delta - 2.306 * 0.529_15).abs() < 2e-3, "{d:?}");
        assert_eq!(verdict(&d, 5, 0.1), Verdict::Regressed);
    }

    // Checks the verdicts: exact differences, no change inside the threshold, inconclusive with
    // a run estimate, and one run per side.
    #[test]
    fn verdicts() {
        let exact = welch(&[100.0; 5], &[25.0; 5], 0.05);
        assert_eq!((exact.low, exact.high), (-75.0, -75.0));
        assert_eq!(verdict(&exact, 5, 1.0), Verdict::Improved);
        let same = welch(&[5.0, 5.1, 4.9, 5.0, 5.0], &[5.0, 4.9, 5.1, 5.0, 5.0], 0.05);
        assert_eq!(verdict(&same, 5, 0.5), Verdict::NoChange);
        let noisy = welch(&[1.0, 9.0, 5.0], &[2.0, 8.0, 7.0], 0.05);
        match verdict(&noisy, 3, 0.05) {
            Verdict::Inconclusive { more_runs } => assert!(more_runs >= 1),
            v => panic!("{v:?}"),
        }
        assert_eq!(verdict(&exact, 1, 1.0), Verdict::Unreplicated);
    }

    // Checks Holm's levels: the smallest p at alpha/m, the next at alpha/(m-1), and every test
    // after the first failure held to the failing level (so the order of rejections is kept).
    #[test]
    fn holm_steps_down() {
        let levels = holm_levels(&[0.04, 0.001, 0.015, 0.5], 0.05);
        assert_eq!(levels[1], 0.05 / 4.0);
        assert_eq!(levels[2], 0.05 / 3.0);
        // 0.04 > 0.05/2: fails, and 0.5 after it is held to the same level.
        assert_eq!(levels[0], 0.05 / 2.0);
        assert_eq!(levels[3], 0.05 / 2.0);
    }

    // Checks the p-value and interval from estimates against Welch on the runs themselves.
    #[test]
    fn estimates_agree_with_welch() {
        let a = [10.0, 11.0, 12.0, 11.0, 10.0];
        let b = [12.0, 13.0, 14.0, 13.0, 12.0];
        let (ea, eb) = (Estimate::of_runs(&a), Estimate::of_runs(&b));
        let d = interval(&ea, &eb, 0.05);
        let w = welch(&a, &b, 0.05);
        assert!((d.low - w.low).abs() < 1e-9 && (d.high - w.high).abs() < 1e-9);
        // t = 2 / 0.52915 = 3.78 on 8 df: p = 0.0054 (t tables: 3.355 at 0.01, 4.501 at 0.002).
        let p = p_value(&ea, &eb);
        assert!(p > 0.002 && p < 0.01, "{p}");
        // The interval at level 1 − p just touches zero.
        let at_p = interval(&ea, &eb, p);
        assert!(at_p.low.abs() < 1e-6, "{at_p:?}");
    }

    // Checks that skewed samples switch to the bootstrap with ten runs a side and that it is
    // deterministic; with five runs (one slow outlier) Welch's wider t interval is kept.
    #[test]
    fn skewed_samples_use_the_bootstrap() {
        let a = [1.0, 1.0, 1.1, 1.0, 1.0, 9.0, 1.0, 1.1, 1.0, 1.0];
        let b = [1.0, 1.2, 1.1, 1.0, 1.1, 1.0, 1.0, 1.1, 1.2, 1.0];
        let d = difference(&a, &b, 0.05);
        assert_eq!(d.method, Method::Bootstrap);
        assert_eq!(d, difference(&a, &b, 0.05));
        assert!(d.low < 0.0 && d.high > d.low);
        let five = difference(&a[..5], &[1.0, 1.0, 1.0, 1.0, 1.6], 0.05);
        assert_eq!(five.method, Method::Welch);
        assert!(five.low < 0.0 && five.high > 0.0, "{five:?}");
    }
}
