//! The phase probes' cost to the target, estimated from what the kernel counted (calls per
//! phase, Go scheduler switch-point hits) and printed while recording, as the allocation
//! probes' is, from the costs per hit in [`crate::probe_costs`].
use std::time::{Duration, Instant};

use anyhow::Result;
use phaseprof_model::PhaseProbeCost;

use super::PhasePlan;
use crate::engine::Engine;
use crate::probe_costs::PhaseHitCosts;

/// How often the estimate is printed.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// What the kernel had counted at one moment, and the targets' CPU time then.
#[derive(Clone, Copy, Default)]
struct Counts {
    calls: u64,
    /// Estimated probe time of those calls and switch-point hits.
    cost_ns: f64,
    switches: u64,
    cpu_ns: u64,
}

/// The estimated cost of one call of each phase (by id), and the counts at the start and at
/// the last report.
pub struct PhaseProbeOverhead {
    ns_per_call: Vec<f64>,
    /// Measured before the first probes go on (None before).
    costs: Option<PhaseHitCosts>,
    start: Option<Counts>,
    last: Counts,
    last_at: Instant,
}

impl PhaseProbeOverhead {
    pub fn new(phases: usize) -> Self {
        PhaseProbeOverhead {
            ns_per_call: vec![0.0; phases + 1],
            costs: None,
            start: None,
            last: Counts::default(),
            last_at: Instant::now(),
        }
    }

    /// Notes the probes of `plan` (its phase `p` counted as `id_of(p)`): a phase costs what its
    /// most expensive function's probes cost. The first probes have their cost per hit measured
    /// on this machine first (the constants where that fails, said in one line).
    pub fn note(&mut self, engine: &Engine<'_>, plan: &PhasePlan, id_of: impl Fn(u32) -> u32) {
        if plan.probes.is_empty() {
            return;
        }
        let costs = *self
            .costs
            .get_or_insert_with(|| match engine.calibrate_phase_hits() {
                Ok(costs) => {
                    eprintln!("phaseprof: {}", costs.describe());
                    costs
                }
                Err(e) => {
                    eprintln!(
                        "phaseprof: phase probe cost not measured here ({e:#}): {}",
                        PhaseHitCosts::ASSUMED.describe()
                    );
                    PhaseHitCosts::ASSUMED
                }
            });
        for probe in &plan.probes {
            let mut ns = if probe.is_go() {
                costs.go_call_ns
            } else {
                costs.native_call_ns
            };
            if !probe.entry_emulated {
                ns += costs.single_step_ns;
            }
            let id = id_of(probe.phase) as usize;
            if id >= self.ns_per_call.len() {
                self.ns_per_call.resize(id + 1, 0.0);
            }
            self.ns_per_call[id] = self.ns_per_call[id].max(ns);
        }
    }

    /// The calls counted so far (of every phase).
    pub fn calls(&self, engine: &Engine<'_>) -> Result<u64> {
        Ok(self.counts(engine, &[])?.calls)
    }

    /// The probes' estimated time so far, in ns (a counter: calls and switch-point hits).
    pub fn probe_ns(&self, engine: &Engine<'_>) -> Result<f64> {
        Ok(self.counts(engine, &[])?.cost_ns)
    }

    fn counts(&self, engine: &Engine<'_>, pids: &[u32]) -> Result<Counts> {
        // Calls are counted inclusively per phase: a nested call is counted in each phase
        // enclosing it, but its probes run once, in its own phase, which is what weighs it.
        let stats = engine.phase_stats(self.ns_per_call.len(), &[])?;
        let (calls, calls_ns) = stats
            .iter()
            .zip(&self.ns_per_call)
            .fold((0, 0.0), |(n, c), (st, ns)| {
                (n + st.calls, c + st.calls as f64 * ns)
            });
        let switches = engine.go_switch_hits()?;
        let costs = self.costs.unwrap_or(PhaseHitCosts::ASSUMED);
        // Measured costs are the machinery's: the programs' work is timed by themselves.
        let work_ns = match costs.mechanism {
            Some(_) => engine.phase_work_ns()? as f64,
            None => 0.0,
        };
        Ok(Counts {
            calls,
            cost_ns: calls_ns + switches as f64 * costs.switch_hit_ns + work_ns,
            switches,
            cpu_ns: crate::target_clocks::cpu_ns(pids.iter().copied()),
        })
    }

    /// Called often while recording: every few seconds, the probes' estimated share of the
    /// targets' CPU time since the last report, to print; with `whole`, over the whole
    /// recording. None in between, or without phase probes.
    pub fn tick(
        &mut self,
        engine: &Engine<'_>,
        pids: &[u32],
        whole: bool,
    ) -> Result<Option<Estimate>> {
        if self.ns_per_call.iter().all(|&ns| ns == 0.0) {
            return Ok(None);
        }
        let Some(start) = self.start else {
            // The kernel's counts start at zero when the probes are attached; the targets' CPU
            // time counts from now (a target attached by pid has run long before).
            let now = Counts {
                cpu_ns: crate::target_clocks::cpu_ns(pids.iter().copied()),
                ..Counts::default()
            };
            self.start = Some(now);
            self.last = now;
            self.last_at = Instant::now();
            return Ok(None);
        };
        if !whole && self.last_at.elapsed() < REPORT_EVERY {
            return Ok(None);
        }
        let now = self.counts(engine, pids)?;
        let from = if whole { start } else { self.last };
        let secs = if whole {
            None
        } else {
            Some(self.last_at.elapsed().as_secs_f64())
        };
        self.last = now;
        self.last_at = Instant::now();
        Ok(Some(Estimate {
            cost: between(&from, &now),
            secs,
        }))
    }
}

/// The estimate between two counts.
fn between(from: &Counts, to: &Counts) -> PhaseProbeCost {
    PhaseProbeCost {
        calls: to.calls.saturating_sub(from.calls),
        switch_hits: to.switches.saturating_sub(from.switches),
        probe_ns: (to.cost_ns - from.cost_ns).max(0.0) as u64,
        target_cpu_ns: to.cpu_ns.saturating_sub(from.cpu_ns),
    }
}

/// An estimate to print: over the whole recording, or as rates over the `secs` since the last.
pub struct Estimate {
    pub cost: PhaseProbeCost,
    secs: Option<f64>,
}

impl std::fmt::Display for Estimate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "phaseprof: phase probes: {}",
            self.cost.describe(self.secs)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the arithmetic: 1,000 native calls (2.3 ms of probes) in 115 ms of the target's CPU
    // time are 2% of it; rates divide by the span.
    #[test]
    fn overhead_is_probe_time_over_the_targets_cpu_time() {
        let from = Counts::default();
        let to = Counts {
            calls: 1000,
            cost_ns: 2_300_000.0,
            switches: 0,
            cpu_ns: 115_000_000,
        };
        let line = between(&from, &to).describe(None);
        assert!(
            line.contains(
                "1000 calls, estimated probe time 2.3 ms, 2.00% of the target's CPU time"
            ),
            "{line}"
        );
        let line = between(&from, &to).describe(Some(2.0));
        assert!(line.contains("500 calls/s"), "{line}");
    }
}
