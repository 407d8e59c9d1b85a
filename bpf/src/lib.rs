//! phaseprof's BPF programs, compiled from C (CO-RE) and exposed as libbpf-rs skeletons.
//!
//! `include/phaseprof.h` is the only definition of the records shared with the kernel;
//! Rust sees them as `phaseprof::types::*`, generated from the object's BTF.

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unused_imports
)]
pub mod phaseprof {
    include!(concat!(env!("OUT_DIR"), "/phaseprof.skel.rs"));
}

pub use phaseprof::types;
pub use phaseprof::{OpenPhaseprofSkel, PhaseprofSkel, PhaseprofSkelBuilder};
