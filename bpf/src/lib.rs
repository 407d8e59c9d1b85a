//! phaseprof's BPF programs, compiled from C (CO-RE) and exposed as libbpf-rs skeletons.
//!
//! `include/phaseprof.h` is the only definition of the records shared with the kernel;
//! Rust sees them as `phaseprof::types::*`, generated from the object's BTF, and its limits as
//! `limits::*`, generated from its `#define`s.

#[allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::too_many_lines,
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

/// The header's limits and sizes (`#define`s), generated from it by build.rs.
#[allow(clippy::all, unused_parens)]
pub mod limits {
    include!(concat!(env!("OUT_DIR"), "/limits.rs"));
}

pub use phaseprof::types;
pub use phaseprof::{OpenPhaseprofSkel, PhaseprofSkel, PhaseprofSkelBuilder};

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the generated limits against the generated records: the arrays the header sizes
    // with them have those lengths, so a limit and a layout cannot disagree.
    #[test]
    fn limits_match_the_records() {
        let st = types::stack_trace::default();
        assert_eq!(st.ips.len() as u64, limits::MAX_STACK_DEPTH);
        let s = types::stack_sample::default();
        assert_eq!(s.ret_slots.len() as u64, limits::MAX_RET_FIXUPS);
        let ps = types::phase_stats::default();
        assert_eq!(ps.costs.len() as u64, limits::MAX_SYSCALL_COSTS);
        assert_eq!(ps.wall_hist.len() as u64, limits::WALL_BUCKETS);
        assert_eq!(limits::STACK_COPY_SLACK, 2 * limits::STACK_COPY_CHUNK);
    }
}
