// SPDX-License-Identifier: GPL-2.0
/*
 * phaseprof's engine: on-CPU samples, off-CPU time and syscalls of the target
 * processes, aggregated in maps keyed by (window, tgid, tid|nr, phase, stacks).
 * User space drains one window parity while the programs write the other.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "phaseprof.h"

/* One object, one concern per header, in dependency order. */
#include "maps.bpf.h"
#include "helpers.bpf.h"
#include "stack_rate.bpf.h"
#include "target_events.bpf.h"
#include "unwind.bpf.h"
#include "sampling.bpf.h"
#include "sched.bpf.h"
#include "slice_align.bpf.h"
#include "syscalls.bpf.h"
#include "phases.bpf.h"
#include "allocations.bpf.h"
#include "pagefaults.bpf.h"
#include "events.bpf.h"
#include "lifecycle.bpf.h"
#include "signals.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Never used by the programs: these make the skeleton generate Rust types for
 * records that only travel through the ring buffer or index arrays. */
struct target_event _target_event = {};
struct go_alloc_sample _go_alloc_sample = {};
struct stack_sample _stack_sample = {};
enum alloc_fn _alloc_fn = AF_MALLOC;
enum probe_counter _probe_counter = HITS_MAX;
enum drop_reason _drop_reason = DROP_MAX;
enum target_event_kind _target_event_kind = TEV_EXEC;
enum target_state _target_state = TARGET_ACTIVE;
enum stack_sample_kind _stack_sample_kind = STACK_CPU;
enum unwind_counter _unwind_counter = UNW_MAX;
enum unwind_kind _unwind_kind = UNWIND_FP;
struct unwind_row _unwind_row = {};
enum go_sched_point _go_sched_point = GO_EXECUTE;
enum go_sched_flag _go_sched_flag = GO_SCHED_CURRENT_G;
