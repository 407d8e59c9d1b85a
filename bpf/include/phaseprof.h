/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * The one definition of every record that crosses the kernel/user boundary.
 * Rust reads these through the skeleton's generated `types` module; never copy
 * them by hand.
 */
#ifndef PHASEPROF_H
#define PHASEPROF_H

#define MAX_STACK_DEPTH 127
#define TASK_COMM_LEN 16

/* Phase 0 is "(none)": events outside any probed phase function. */
#define PHASE_NONE 0

/* Value of an entry in `target_pids`. */
enum target_state {
	/* Forked by `record -- CMD`, waiting for its execve: nothing counted yet. */
	TARGET_ARMED = 1,
	/* Recorded. */
	TARGET_ACTIVE = 2,
};

/*
 * Index into the per-CPU `drops` array. Everything the kernel side could not
 * record is counted here and surfaced as `lost` in reports.
 */
enum drop_reason {
	DROP_USER_STACK = 0,      /* user stack not stored (stack map full or hash collision) */
	DROP_KERNEL_STACK,        /* kernel stack not stored */
	DROP_CPU_KEY,             /* cpu sample counts map full */
	DROP_OFFCPU_KEY,          /* off-CPU counts map full */
	DROP_OFFCPU_START,        /* could not remember a switch-out (map full) */
	DROP_SYSCALL_KEY,         /* syscall counts map full */
	DROP_SYSCALL_START,       /* could not remember a syscall entry (map full) */
	DROP_TARGET_FULL,         /* a followed child could not be added to target_pids */
	DROP_EVENT_RINGBUF,       /* a process event could not be sent to user space */
	/* Not drops: syscalls already in flight when recording began. Counted so
	 * that they are visible, but never reported as lost. */
	INFO_SYSCALL_EXIT_UNMATCHED,
	DROP_MAX,
};

/*
 * Every aggregation key carries `window`: the parity of the drain window it was
 * written in. User space flips `window` and then drains the other parity, which
 * no program writes any more, so no increment is ever lost to a drain.
 */
struct cpu_key {
	__u32 tgid;
	__u32 tid;
	__u32 phase;
	__u32 window;
	__u64 user_stack;      /* stack hash (key of `stacks`); 0: none */
	__u64 kernel_stack;
};

struct offcpu_key {
	__u32 tgid;
	__u32 tid;
	__u32 phase;
	__u32 window;
	__u64 user_stack;
	__u64 kernel_stack;
};

/* Per-thread state from switch-out to switch-in. */
struct offcpu_start {
	__u64 ts;
	__u32 tgid;
	__u32 phase;
	__u64 user_stack;
	__u64 kernel_stack;
};

struct syscall_key {
	__u32 tgid;
	__u32 phase;
	__u32 nr;
	__u32 window;
	__u64 user_stack;      /* 0 when stack capture is off */
};

struct syscall_value {
	__u64 count;
	__u64 total_ns;
};

/* Per-thread state from sys_enter to sys_exit. */
struct syscall_start {
	__u64 ts;
	__u32 nr;
	__u32 phase;
	__u64 user_stack;
	__u32 maps_exec;       /* an mmap/mprotect with PROT_EXEC: VMAs change */
	__u32 pad;
};

/*
 * A stack, stored once under a 64-bit hash of its addresses. (A STACK_TRACE map keys stacks
 * by a hash truncated to its bucket count and refuses colliding stacks: with a few hundred
 * stacks in 16k buckets a collision is likely, and every one would be a lost stack.)
 */
struct stack_trace {
	__u32 len;             /* frames in ips */
	__u32 pad;
	__u64 ips[MAX_STACK_DEPTH];
};

/* Per-CPU scratch slots for building a stack_trace, one per program context that can
 * interrupt another on the same CPU (a cpu-clock sample can fire inside a syscall probe). */
enum stack_slot {
	SLOT_SAMPLE = 0,
	SLOT_SWITCH,
	SLOT_SYSCALL,
	SLOT_MAX,
};

enum target_event_kind {
	TEV_EXEC = 1,   /* a process exec'd: user space may want to add it (--name) */
	TEV_EXIT = 2,   /* a target process exited */
	TEV_FORK = 3,   /* a target forked a child that is now a target too */
	TEV_MMAP = 4,   /* a target mapped executable memory: refresh its VMAs */
};

struct target_event {
	__u32 kind;
	__u32 pid;
	__u32 ppid;
	__u32 pad;
	char comm[TASK_COMM_LEN];
};

#endif /* PHASEPROF_H */
