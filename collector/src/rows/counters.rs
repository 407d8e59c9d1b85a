//! A window's counters in the rows, each named once here: drops (`lost.*`), named costs
//! (`cost.*`), unwinding counts (`unwind.*`), the targets' CPU time, late names, the phase
//! probes' cost and how a phase budget counted. `add` reads them from a window as it is split into rows; `restore` writes the
//! sums back into the profile rebuilt from them. A counter added to the profile is added to
//! the table below, and nowhere else in the collector.
use phaseprof_model::{BudgetInfo, Lost, Meta, PhaseProbeCost, Profile, UnwindInfo};

use super::Aggregate;

/// When the sum of a group of counters stands for the merged windows.
#[derive(Clone, Copy)]
enum Known {
    /// Always (absent counts as 0).
    Always,
    /// When every window had it (the targets' CPU time: a sum over some windows would be
    /// taken for all of them).
    InEveryWindow,
    /// When any window had it (the phase probes' cost, where phases were probed).
    InAnyWindow,
}

/// A group of counters that a window has or has not as a whole.
struct Group {
    /// The counter of windows that had the group (for `InEveryWindow`, `InAnyWindow`).
    windows: &'static str,
    known: Known,
    counters: &'static [Counter],
    /// The group's values missing from the merged profile (None where not `known`).
    clear: fn(&mut Profile),
}

struct Counter {
    name: &'static str,
    get: fn(&Counted) -> Option<u64>,
    set: fn(&mut Profile, u64),
}

/// What a window's counters are read from (whatever form its frames were decoded in).
struct Counted<'a> {
    meta: &'a Meta,
    lost: &'a Lost,
}

fn unwind<'a>(p: &Counted<'a>) -> Option<&'a UnwindInfo> {
    p.meta.unwind.as_ref()
}

fn set_unwind(p: &mut Profile, set: impl FnOnce(&mut UnwindInfo)) {
    if let Some(u) = p.meta.unwind.as_mut() {
        set(u);
    }
}

fn probes(m: &mut Meta) -> &mut PhaseProbeCost {
    m.phase_probes.get_or_insert_with(PhaseProbeCost::default)
}

fn alloc(m: &mut Meta) -> &mut phaseprof_model::AllocInfo {
    m.alloc.get_or_insert_with(Default::default)
}

/// A counter of a budget's (`BudgetInfo`: `phase_budget`, `syscall_budget`), by its field;
/// named `<budget>.<name>`. The merged budget is the earliest window's (its budget, syscall
/// and shortest slice), with the sums written into it.
macro_rules! budget_counter {
    ($budget:ident, $name:expr, |$b:ident| $get:expr, |$bm:ident, $v:ident| $set:expr) => {
        Counter {
            name: concat!(stringify!($budget), ".", $name),
            get: |p| {
                let $b = p.meta.$budget.as_ref()?;
                Some($get)
            },
            set: |p, $v| {
                let $bm = p.meta.$budget.get_or_insert_with(BudgetInfo::default);
                $set
            },
        }
    };
    ($budget:ident, $field:ident) => {
        budget_counter!($budget, stringify!($field), |b| b.$field, |b, v| b.$field =
            v)
    };
}

/// Sums over the windows of a budget's counters; whether the probes stayed attached (or the
/// slowdown was measured) in all of them, as the number of windows where they did not.
macro_rules! budget_group {
    ($windows:expr, $budget:ident) => {
        Group {
            windows: $windows,
            known: Known::InAnyWindow,
            clear: |_| {},
            counters: &[
                budget_counter!($budget, counted_own_ns),
                budget_counter!($budget, own_ns),
                budget_counter!($budget, syscalls_in_slices),
                budget_counter!($budget, syscalls),
                budget_counter!($budget, slices),
                budget_counter!($budget, counted_ns),
                budget_counter!($budget, calls_voided),
                budget_counter!($budget, carried_windows),
                budget_counter!(
                    $budget,
                    "detached_windows",
                    |b| u64::from(!b.attached_throughout),
                    |b, v| b.attached_throughout = v == 0
                ),
                budget_counter!(
                    $budget,
                    "unmeasured_windows",
                    |b| u64::from(!b.slowdown_measured),
                    |b, v| b.slowdown_measured = v == 0
                ),
                budget_counter!(
                    $budget,
                    "overhead_ppm",
                    |b| (b.overhead_while_attached * 1e6).round() as u64,
                    |b, v| b.overhead_while_attached = v as f64 / 1e6
                ),
            ],
        }
    };
}

/// The windows with a phase budget, and with a syscall budget (the slowdown while attached is
/// their mean).
const PHASE_BUDGET_WINDOWS: &str = "windows_with_phase_budget";
const SYSCALL_BUDGET_WINDOWS: &str = "windows_with_syscall_budget";

/// A counter of the walks (`UnwindInfo`), by its name and field.
macro_rules! unwind_counter {
    ($name:literal, $($field:ident).+) => {
        Counter {
            name: $name,
            get: |p| Some(unwind(p)?.$($field).+),
            set: |p, v| set_unwind(p, |u| u.$($field).+ = v),
        }
    };
}

const GROUPS: &[Group] = &[
    Group {
        windows: "windows",
        known: Known::Always,
        clear: |_| {},
        counters: &[
            Counter {
                name: "lost.events",
                get: |p| Some(p.lost.events),
                set: |p, v| p.lost.events = v,
            },
            Counter {
                name: "lost.stacks",
                get: |p| Some(p.lost.stacks),
                set: |p, v| p.lost.stacks = v,
            },
            Counter {
                name: "lost.syscalls_in_flight_at_start",
                get: |p| Some(p.lost.syscalls_in_flight_at_start),
                set: |p, v| p.lost.syscalls_in_flight_at_start = v,
            },
            Counter {
                name: "lost.phase_exits_before_start",
                get: |p| Some(p.lost.phase_exits_before_start),
                set: |p, v| p.lost.phase_exits_before_start = v,
            },
            Counter {
                name: "names_late",
                get: |p| Some(p.meta.names_late).filter(|&n| n > 0),
                set: |p, v| p.meta.names_late = v,
            },
        ],
    },
    Group {
        windows: "windows_with_targets_cpu",
        known: Known::InEveryWindow,
        clear: |p| p.meta.targets_cpu_ns = None,
        counters: &[Counter {
            name: "targets_cpu_ns",
            get: |p| p.meta.targets_cpu_ns,
            set: |p, v| p.meta.targets_cpu_ns = Some(v),
        }],
    },
    Group {
        windows: "windows_with_phase_probes",
        known: Known::InAnyWindow,
        clear: |p| p.meta.phase_probes = None,
        counters: &[
            Counter {
                name: "phase_probes.calls",
                get: |p| Some(p.meta.phase_probes?.calls),
                set: |p, v| probes(&mut p.meta).calls = v,
            },
            Counter {
                name: "phase_probes.switch_hits",
                get: |p| Some(p.meta.phase_probes?.switch_hits),
                set: |p, v| probes(&mut p.meta).switch_hits = v,
            },
            Counter {
                name: "phase_probes.probe_ns",
                get: |p| Some(p.meta.phase_probes?.probe_ns),
                set: |p, v| probes(&mut p.meta).probe_ns = v,
            },
            Counter {
                name: "phase_probes.target_cpu_ns",
                get: |p| Some(p.meta.phase_probes?.target_cpu_ns),
                set: |p, v| probes(&mut p.meta).target_cpu_ns = v,
            },
        ],
    },
    budget_group!(PHASE_BUDGET_WINDOWS, phase_budget),
    budget_group!(SYSCALL_BUDGET_WINDOWS, syscall_budget),
    // An allocation budget's syscalls (what its totals were extrapolated by) add up; the
    // rest of how allocations were taken is the earliest window's.
    Group {
        windows: "windows_with_alloc",
        known: Known::InAnyWindow,
        clear: |_| {},
        counters: &[
            Counter {
                name: "alloc.syscalls_in_slices",
                get: |p| Some(p.meta.alloc.as_ref()?.syscalls_in_slices),
                set: |p, v| alloc(&mut p.meta).syscalls_in_slices = v,
            },
            Counter {
                name: "alloc.syscalls",
                get: |p| Some(p.meta.alloc.as_ref()?.syscalls),
                set: |p, v| alloc(&mut p.meta).syscalls = v,
            },
            Counter {
                name: "alloc.counted_own_ns",
                get: |p| Some(p.meta.alloc.as_ref()?.counted_own_ns),
                set: |p, v| alloc(&mut p.meta).counted_own_ns = v,
            },
        ],
    },
    // Unwinding counts go where the earliest window said how stacks were walked.
    Group {
        windows: "windows",
        known: Known::Always,
        clear: |_| {},
        counters: &[
            unwind_counter!("unwind.unwound_samples", unwound_samples),
            unwind_counter!("unwind.complete", complete),
            unwind_counter!("unwind.copied_bytes", copied_bytes),
            unwind_counter!("unwind.walks.stacks", walks.stacks),
            unwind_counter!("unwind.walks.complete", walks.complete),
            unwind_counter!("unwind.walks.frames", walks.frames),
            unwind_counter!("unwind.walks.fp_frames", walks.fp_frames),
            unwind_counter!("unwind.walks.truncated", walks.truncated),
        ],
    },
];

/// Counters by a name of the window's own (`lost.reason.<reason>`, `cost.<name>`).
const LOST_REASON: &str = "lost.reason.";
const COST: &str = "cost.";

/// The counters of window `p` into `agg`.
pub fn add<F>(agg: &mut Aggregate, p: &Profile<F>) {
    let counted = Counted {
        meta: &p.meta,
        lost: &p.lost,
    };
    for g in GROUPS {
        let mut had = false;
        for c in g.counters {
            if let Some(v) = (c.get)(&counted) {
                agg.add_counter(c.name, v);
                had = true;
            }
        }
        if had && !matches!(g.known, Known::Always) {
            agg.add_counter(g.windows, 1);
        }
    }
    for (k, v) in &p.lost.by_reason {
        agg.add_counter(&format!("{LOST_REASON}{k}"), *v);
    }
    for (k, v) in &p.costs {
        agg.add_counter(&format!("{COST}{k}"), *v);
    }
}

/// The summed counters of `agg` (`windows` of them) into the profile rebuilt from its rows.
pub fn restore(p: &mut Profile, agg: &Aggregate) {
    let counter = |k: &str| agg.counters.get(k).copied();
    for g in GROUPS {
        (g.clear)(p);
        let known = match g.known {
            Known::Always => true,
            Known::InEveryWindow => agg.windows > 0 && counter(g.windows) == Some(agg.windows),
            Known::InAnyWindow => counter(g.windows).is_some_and(|n| n > 0),
        };
        if known {
            for c in g.counters {
                (c.set)(p, counter(c.name).unwrap_or(0));
            }
        }
    }
    let named = |prefix: &str| {
        (agg.counters.iter())
            .filter_map(|(k, v)| Some((k.strip_prefix(prefix)?.to_string(), *v)))
            .collect()
    };
    for (b, windows) in [
        (&mut p.meta.phase_budget, PHASE_BUDGET_WINDOWS),
        (&mut p.meta.syscall_budget, SYSCALL_BUDGET_WINDOWS),
    ] {
        if let (Some(b), Some(n)) = (b, counter(windows)) {
            b.overhead_while_attached /= n.max(1) as f64;
        }
    }
    p.lost.by_reason = named(LOST_REASON);
    p.costs = named(COST);
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the merged phase budget: the windows' sums as the model's own merge makes them,
    // probes attached throughout only if in every window.
    #[test]
    fn a_phase_budget_adds_up_over_windows() {
        let window = |syscalls: u64, attached: bool| {
            let mut p = Profile::default();
            p.meta.phase_budget = Some(BudgetInfo {
                budget: 0.01,
                syscall: "write".into(),
                syscalls_in_slices: syscalls / 10,
                syscalls,
                counted_own_ns: 10,
                own_ns: 100,
                slices: 2,
                shortest_slice_ns: 20_000_000,
                counted_ns: 30_000_000,
                carried_windows: u64::from(!attached),
                attached_throughout: attached,
                reads_aligned: 0,
                overhead_while_attached: 0.5,
                ..BudgetInfo::default()
            });
            p
        };
        let (a, b) = (window(1_000, true), window(3_000, false));
        let mut agg = Aggregate::default();
        add(&mut agg, &a);
        add(&mut agg, &b);
        let mut merged = a.clone();
        restore(&mut merged, &agg);
        let mut want = a.meta.phase_budget.clone().unwrap();
        want.absorb(b.meta.phase_budget.as_ref().unwrap());
        assert_eq!(merged.meta.phase_budget, Some(want));
    }
}
