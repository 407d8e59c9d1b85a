//! phaseprof's views of recorded profiles: the text report, diffs of two sets of runs, exports
//! (folded stacks, SVG flamegraphs, pprof) and the web pages and JSON API that show them. Built on
//! the model and the flamegraphs only, so the collector serves the same views without the BPF
//! side.

pub mod compare;
pub mod export;
pub mod format;
pub mod import;
pub mod otlp;
pub mod pprof;
pub mod report;
pub mod speedscope;
pub mod terminal;
pub mod web;

/// A small profile tests share (the collector's too, through the `fixtures` feature).
#[cfg(any(test, feature = "fixtures"))]
pub mod fixture;
#[cfg(test)]
mod golden;
