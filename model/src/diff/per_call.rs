//! A phase's wall time per call from the calls themselves: each run's wall-time histogram gives
//! the spread of its calls, so three runs of a phase called thousands of times are thousands of
//! values, not three — as long as the runs agree with each other. When their means differ by more
//! than their calls' spread explains (an F test of the run effect, as in a one-way ANOVA), the
//! runs are the sample after all, and the estimate is over runs.
use statrs::distribution::{ContinuousCDF, FisherSnedecor};

use crate::phase_stats::{wall_bucket_bounds, PhaseStats};
use crate::stats::{mean_sd, Estimate};

/// One run's calls of a phase: how many, their exact mean wall time, and their variance from
/// the histogram (bucket midpoints, plus each bucket's width²/12 for the values it blurs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallDist {
    pub calls: u64,
    pub mean: f64,
    pub var: f64,
}

impl CallDist {
    pub fn of(st: &PhaseStats) -> Option<CallDist> {
        let n: u64 = st.wall_hist.iter().map(|(_, c)| c).sum();
        if st.calls == 0 || n < 2 {
            return None;
        }
        let buckets: Vec<(f64, f64, f64)> = st
            .wall_hist
            .iter()
            .map(|&(i, c)| {
                let (lo, hi) = wall_bucket_bounds(i);
                ((lo + hi) as f64 / 2.0, (hi - lo) as f64, c as f64)
            })
            .collect();
        let hist_mean = buckets.iter().map(|(m, _, c)| m * c).sum::<f64>() / n as f64;
        let ss: f64 = buckets
            .iter()
            .map(|(m, w, c)| c * ((m - hist_mean).powi(2) + w * w / 12.0))
            .sum();
        Some(CallDist {
            calls: st.calls,
            mean: st.wall_ns as f64 / st.calls as f64,
            var: ss / (n - 1) as f64,
        })
    }
}

/// The level of the preliminary test that decides whether the calls may stand for the runs. A
/// pooling pretest is run at 25%, not at the final test's 5% (Bancroft 1944): with a handful of
/// runs an F test at 5% misses a real run effect (a machine drifting between runs) most of the
/// time, and pooling then understates the error and calls a change where there is none (one
/// same-build comparison of 5 runs a side judged `regressed` under CI's load).
const POOLING_TEST_LEVEL: f64 = 0.25;

/// The side's mean wall time per call (the mean of its runs' means, as shown) with its standard
/// error: from the calls when the runs agree, else from the runs.
pub fn estimate(runs: &[CallDist]) -> Estimate {
    let means: Vec<f64> = runs.iter().map(|r| r.mean).collect();
    let by_runs = Estimate::of_runs(&means);
    let within_df: f64 = runs.iter().map(|r| r.calls as f64 - 1.0).sum();
    if runs.is_empty() || within_df < 1.0 {
        return by_runs;
    }
    let pooled_var = runs
        .iter()
        .map(|r| (r.calls as f64 - 1.0) * r.var)
        .sum::<f64>()
        / within_df;
    let r = runs.len() as f64;
    let inv_calls: f64 = runs.iter().map(|x| 1.0 / x.calls as f64).sum();
    let from_calls = Estimate {
        mean: by_runs.mean,
        se: (pooled_var * inv_calls).sqrt() / r,
        df: within_df,
    };
    if runs.len() < 2 {
        return from_calls;
    }
    // Variance of run means expected from the calls' spread alone, against the one observed.
    let expected = pooled_var * inv_calls / r;
    let (_, sd) = mean_sd(&means);
    let observed = sd * sd;
    if expected <= 0.0 {
        return if observed > 0.0 { by_runs } else { from_calls };
    }
    let f = observed / expected;
    let run_effect = FisherSnedecor::new(r - 1.0, within_df)
        .map(|d| 1.0 - d.cdf(f) < POOLING_TEST_LEVEL)
        .unwrap_or(true);
    if run_effect {
        by_runs
    } else {
        from_calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(calls: u64, mean: f64, sd: f64) -> CallDist {
        CallDist {
            calls,
            mean,
            var: sd * sd,
        }
    }

    // Checks that agreeing runs are estimated from their calls (many degrees of freedom, a
    // standard error of sd/sqrt(calls)), and runs whose means differ beyond their calls' spread
    // from the runs.
    #[test]
    fn calls_when_runs_agree_runs_otherwise() {
        let agree = [
            dist(1000, 10.0, 2.0),
            dist(1000, 10.05, 2.0),
            dist(1000, 9.97, 2.0),
        ];
        let e = estimate(&agree);
        assert_eq!(e.df, 2997.0);
        assert!((e.se - 2.0 / 3000f64.sqrt()).abs() < 1e-9, "{e:?}");
        let apart = [
            dist(1000, 10.0, 0.1),
            dist(1000, 12.0, 0.1),
            dist(1000, 8.0, 0.1),
        ];
        let e = estimate(&apart);
        assert_eq!(e.df, 2.0);
        assert!((e.se - 2.0 / 3f64.sqrt()).abs() < 1e-9, "{e:?}");
    }

    // Checks the histogram's variance: two buckets far apart give their spread.
    #[test]
    fn variance_from_the_histogram() {
        let st = PhaseStats {
            calls: 4,
            wall_ns: 4 * 1000,
            wall_hist: vec![(0, 2), (15, 2)],
            ..PhaseStats::default()
        };
        let d = CallDist::of(&st).unwrap();
        assert_eq!(d.mean, 1000.0);
        // Midpoints 0.5 and 15.5, mean 8: ss = 4 * 7.5² + 4 * 1/12, over 3.
        assert!(
            (d.var - (4.0 * 56.25 + 4.0 / 12.0) / 3.0).abs() < 1e-9,
            "{d:?}"
        );
    }
}
