//! What one probe hit costs a target, in ns of its CPU time: the one table every estimate
//! phaseprof prints or exports reads (phase probes while recording, the allocation budget, the
//! agent's `/metrics`). Measured with `bench` on the 2-core development VM (README
//! "Performance"): `--only phases`, `--only alloc`, `--only syscalls`. x86 uprobes emulate a
//! probed `push` (the usual entry site) but single-step most other instructions, a `ret`
//! included, so every exact Go exit costs a single-step.

/// A native phase call: entry probe on an emulated instruction, exit through a uretprobe, with
/// the default events (2,612 ns measured; 2,273 with cpu samples only).
pub const NATIVE_PHASE_CALL_NS: f64 = 2_600.0;
/// A Go phase call: entry probe after the stack check (`push rbp`, emulated), exit probe on a
/// `ret` (single-stepped): 17,619 ns measured.
pub const GO_PHASE_CALL_NS: f64 = 18_000.0;
/// Added when a function's entry had to be probed on an instruction the kernel single-steps
/// (a bare bpftrace uprobe on Go's first `cmp`: 16,179 ns; on free's `test`: 16,640 ns).
pub const SINGLE_STEP_NS: f64 = 16_000.0;
/// One hit of a Go scheduler switch point (`mcall` and `execute`, probed on `push rbp`): 1,522.
pub const GO_SWITCH_HIT_NS: f64 = 1_500.0;
/// One allocator probe hit (an entry, a return or a free) at the chosen instruction: 1,067.
pub const ALLOC_HIT_NS: f64 = 1_100.0;
/// A target's syscall counted with its latency, no stack (`--syscall-stacks none`): +381 ns.
pub const SYSCALL_NS: f64 = 381.0;
/// A target's syscall with its user stack walked (`--syscall-stacks all`): +2,166 ns.
pub const SYSCALL_WITH_STACK_NS: f64 = 2_166.0;
