//! phaseprof end-to-end tests: real BPF on the running kernel, compared with ground truth.
//! Every test here needs root; without it each one says so and returns (CI runs as root).
// A scenario reads top to bottom (start, drive, stop, compare with the truth): the length
// limit on functions is for the product's code.
#![allow(clippy::too_many_lines)]

mod agent_io;
mod agent_state;
mod allocations;
mod attach;
mod browser;
mod debug_symbols;
mod deploy;
mod diff;
mod errors;
mod exactness;
mod exports;
mod fleet;
mod fleet_soak;
mod follow_children;
mod foreign_agents;
mod hostile;
mod hostile_bodies;
mod hostile_local;
mod inlined;
mod kernels;
mod offcpu_stacks;
mod phase_budget;
mod phases;
mod phases_exec;
mod probe_cost;
mod pyroscope_series;
mod real_servers;
mod soak;
mod store_faults;
mod store_sums;
mod symbols;
mod syscall_budget;
mod terminal;
mod unwind;
mod unwind_auto;

/// Root tests are `#[ignore = "needs root…"]`: a non-root `cargo test` reports them ignored, and
/// root runs them with `--include-ignored`. This returns early (skipping, loudly) should one run
/// without root anyway.
#[macro_export]
macro_rules! require_root {
    () => {
        if !phaseprof_e2e::is_root() {
            eprintln!("SKIPPED: this test loads BPF programs and needs root");
            return;
        }
    };
}
