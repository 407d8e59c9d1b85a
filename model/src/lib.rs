//! phaseprof's profile data model and its `.phaseprof` file format.
//!
//! A [`Profile`] holds interned frames and stacks, samples per event kind (each carrying the
//! phase it was recorded in), target metadata and what the kernel side lost. Everything a report,
//! an export or a diff shows is derived from it; see `FORMAT.md` for the on-disk layout.

pub mod build;
mod coverage;
pub mod diff;
pub mod format;
mod format_v1;
pub mod frames;
pub mod kinds;
pub mod lost;
pub mod merge;
pub mod phase_budget;
pub mod phase_probe_share;
pub mod phase_stats;
pub mod probe_cost;
pub mod profile;
pub mod slice_basis;
pub mod slice_spread;
pub mod split;
pub mod stack_spread;
pub mod stats;
pub mod summary;
pub mod syscall_budget;
mod syscall_names;
pub mod targets_slowdown;
pub mod threads;
pub mod units;
pub mod unwind_info;
pub mod weighted;
pub mod window_limits;

pub use build::{PhaseAt, ProfileBuilder};

/// The version and git revision the binaries were built from (`--version`).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("PHASEPROF_GIT_REVISION"),
    ")"
);
pub use format::{
    read_profile, read_profile_limited, read_window_limited, write_profile, write_profile_binary,
    FormatError, DEFAULT_MAX_INFLATED, FORMAT_VERSION, WIRE_GZIP_LEVEL, WIRE_VERSION,
};
pub use frames::{display_name, folded_frame_name, is_allocator_frame, is_go_sampling_hook};
pub use kinds::*;
pub use lost::{Lost, INLINED_UNPROBED};
pub use phase_budget::BudgetInfo;
pub use phase_stats::{wall_bucket_bounds, PhaseStats, WALL_SUB_BUCKETS};
pub use probe_cost::{
    OwnSamples, ProbeCost, OTHER_PROBES_FRAME, OWN_COST_FRAME, SYSCALL_PROBES_FRAME,
    UPROBE_PROBES_FRAME,
};
pub use profile::*;
pub use summary::Summary;
pub use targets_slowdown::{TargetsSlowdown, WorkDone, WorkUnit};
pub use unwind_info::{TableInfo, UnwindInfo, WalkCounts};
pub use weighted::{in_phase, Weighted};

/// The name of x86_64 syscall `nr`, or `syscall_<nr>` for numbers this build does not know.
pub fn syscall_name(nr: u32) -> String {
    match syscall_names::X86_64.get(nr as usize) {
        Some(name) if !name.is_empty() => (*name).to_string(),
        _ => format!("syscall_{nr}"),
    }
}

/// The x86_64 number of syscall `name`, if this build knows it.
pub fn syscall_nr(name: &str) -> Option<u32> {
    syscall_names::X86_64
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u32)
}

/// The sum of `values`, saturating at 2^64−1 as every merged counter does (a plain `sum`
/// wraps in release builds).
pub fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the syscall table both ways for well-known numbers and the fallback.
    #[test]
    fn syscall_names_round_trip() {
        assert_eq!(syscall_name(1), "write");
        assert_eq!(syscall_name(231), "exit_group");
        assert_eq!(syscall_nr("write"), Some(1));
        assert_eq!(syscall_name(9999), "syscall_9999");
    }
}
