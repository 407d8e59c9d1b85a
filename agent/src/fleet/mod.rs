//! Continuous profiling on a fleet: the agent daemon, its config and its delivery to the
//! collector.
pub mod config;
pub mod daemon;
pub mod delivery;
pub mod metrics;
pub mod phases;
pub mod push;
