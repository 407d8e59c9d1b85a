//! Allocation profiling: which allocator functions a target has, where their probes go, and
//! how much of the target's time they may cost.
pub mod costs;
pub mod go_rate;
pub mod recorder;
pub mod sites;
