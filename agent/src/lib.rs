//! phaseprof: records CPU, off-CPU and syscalls of live processes with BPF and attributes them
//! to phases. Recording (`engine`, `record`) is separate from processing (`window` →
//! `aggregate` → model), so the processing is tested from fixtures without root.

pub mod aggregate;
pub mod alloc;
pub mod cli;
pub mod command;
pub mod duty_cycle;
pub mod elf;
pub mod engine;
pub mod fleet;
pub mod live_server;
pub mod perf_events;
pub mod phases;
pub mod preflight;
pub mod probe_costs;
pub mod processes;
pub mod procmaps;
pub mod record;
pub mod run_name;
pub mod session;
pub mod signals;
pub mod slice_align;
pub mod slice_budget;
pub mod slice_tally;
pub mod soak;
pub mod symbolize;
pub mod syscall_budget;
pub mod target_clocks;
pub mod target_files;
pub mod targets;
pub mod targets_slowdown;
pub mod unwind;
pub mod window;
pub mod x86;
