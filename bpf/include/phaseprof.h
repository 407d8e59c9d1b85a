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
/* A return probe without an attach cookie (kernels before 5.15): the innermost entry returns. */
#define PHASE_ANY 0
/* Phase ids are 1..MAX_PHASES-1; a phase mask has bit i set while phase i is on the thread's
 * stack (bit 0 alone: no phase). */
#define MAX_PHASES 64
/* Nested phases kept per thread; deeper entries are counted as drops (DROP_PHASE_DEPTH). */
#define MAX_PHASE_DEPTH 8
/* Syscall cost rules (bit i of syscall_cost_bits[nr] = rule i counts syscall nr). */
#define MAX_SYSCALL_COSTS 8
#define MAX_SYSCALL_NR 512
/* Wall-time histogram: values < 16 ns one bucket each, then 16 buckets per power of two
 * (bucket width <= 6.25%, so a bucket midpoint is within 3.2% of any value in it). */
#define WALL_SUB_BUCKETS 16
#define WALL_BUCKETS 1024

/* Words of the `target_bits` bitmap: one bit per pid up to the largest pid_max (2^22 / 64). */
#define TARGET_BIT_WORDS (1 << 16)

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
	DROP_USER_STACK = 0, /* user stack not stored (stack map full or hash collision) */
	DROP_KERNEL_STACK,   /* kernel stack not stored */
	DROP_CPU_KEY,	     /* cpu sample counts map full */
	DROP_OFFCPU_KEY,     /* off-CPU counts map full */
	DROP_OFFCPU_START,   /* could not remember a switch-out (map full) */
	DROP_SYSCALL_KEY,    /* syscall counts map full */
	DROP_SYSCALL_START,  /* could not remember a syscall entry (map full) */
	DROP_TARGET_FULL,    /* a followed child could not be added to target_pids */
	DROP_EVENT_RINGBUF,  /* a process event could not be sent to user space */
	DROP_PHASE_DEPTH,    /* a phase entered deeper than MAX_PHASE_DEPTH: not attributed */
	DROP_PHASE_THREAD,   /* no phase state (task storage) for a thread: its phases are lost */
	DROP_PHASE_MISMATCH, /* a phase exit that is not the innermost entry (unwinding) */
	/* Not drops: syscalls already in flight when recording began. Counted so
	 * that they are visible, but never reported as lost. */
	INFO_SYSCALL_EXIT_UNMATCHED,
	/* Not drops: returns from phase functions entered before recording began. */
	INFO_PHASE_EXIT_UNMATCHED,
	DROP_ALLOC_KEY,	      /* allocation totals map full */
	DROP_ALLOC_STACK_KEY, /* sampled allocation stacks map full */
	DROP_LIVE_FULL,	      /* a sampled allocation not tracked as live (map full) */
	DROP_ALLOC_THREAD,    /* no task storage for a thread's allocator state */
	DROP_ALLOC_RINGBUF,   /* a Go allocation sample could not be sent to user space */
	DROP_PAGEFAULT_KEY,   /* page fault counts map full */
	DROP_STACK_COPY,      /* a user-stack copy could not be sent (ring buffer full): the
				   * sample is counted without its user stack */
	DROP_GOROUTINE_FULL,  /* no room in goroutine_phases: a goroutine's phase entry is lost */
	DROP_PHASE_UNFINISHED, /* a goroutine ended inside a phase (Goexit): its calls never return */
	DROP_EVENT_KEY,	       /* a counts map of `struct event_key` full (count_event) */
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
	__u64 user_stack; /* stack hash (key of `stacks`); 0: none */
	__u64 kernel_stack;
	__u64 phase_mask; /* every phase on the thread's stack; `phase` is the innermost */
};

/* The key of the kinds counted by count_event (events.bpf.h): the thread, its phases, what
 * the kind counts by (`nr`: a signal's number …) and its user stack. */
struct event_key {
	__u32 tgid;
	__u32 tid;
	__u32 phase;
	__u32 window;
	__u64 user_stack; /* stack hash (key of `stacks`); 0: none */
	__u64 phase_mask;
	__u32 nr;
	__u32 pad;
};

struct offcpu_key {
	__u32 tgid;
	__u32 tid;
	__u32 phase;
	__u32 window;
	__u64 user_stack;
	__u64 kernel_stack;
	__u64 phase_mask;
};

/* Off-CPU time of one key, and of it the time runnable and waiting for a CPU (preempted, or
 * woken and not yet running); the rest was blocked (sleeping, in disk wait). */
struct offcpu_value {
	__u64 ns;
	__u64 cpu_wait_ns;
	/* Both times the thread's one-in-N at each switch-out (1 when every stack is taken): the
	 * weights user space spreads the unsampled time by (each sampled switch-out standing for
	 * N, as Horvitz-Thompson weighs a sample; N varies over time). */
	__u64 ns_weighted;
	__u64 cpu_wait_weighted;
};

/* A thread's rate of sampled stack walks, for one event kind (see next_stack_in). */
struct stack_rate {
	__u32 until_stack; /* events of this thread until the next sampled stack */
	__u32 every;	   /* its mean events per stack (the minimum or more) */
	__u32 walks;	   /* its stack walks since walks_since */
	__u32 pad;
	__u64 walks_since;
};

/* Per-thread state from switch-out to switch-in (kept between them, with ts 0). */
struct offcpu_start {
	/* The switch-out; 0 while the thread runs. */
	__u64 ts;
	__u32 tgid;
	__u32 phase;
	__u64 user_stack;
	__u64 kernel_stack;
	__u64 phase_mask;
	/* When it became runnable (switched out preempted, or, with the sched_wakeup program,
	 * woken); 0: still blocked, or woken where the scheduler's own accounting tells. */
	__u64 runnable_ts;
	/* Its wait for a CPU so far by the scheduler's account (sched_info.run_delay) at the
	 * switch-out, where the kernel keeps it (wait_from_sched_info). */
	__u64 run_delay;
	/* Its CPU time (se.sum_exec_runtime) at the switch-out: what it ran since tells a switch-in
	 * the tracepoint never reported (see sched.bpf.h). */
	__u64 runtime;
	/* With sampled stacks: the time the walks took at a sampled switch-out (see
	 * credit_offcpu), 0 at the others; and the thread's one-in-N then (0: not sampled). */
	__u32 walk_ns;
	__u32 every;
	/* Its rate of stack walks (offcpu_stack_walks_per_sec). */
	struct stack_rate rate;
};

struct syscall_key {
	__u32 tgid;
	__u32 phase;
	__u32 nr;
	__u32 window;
	__u32 tid; /* per-thread counts, for the thread tables */
	__u32 _pad;
	__u64 user_stack; /* 0 when stack capture is off */
	__u64 phase_mask;
};

struct syscall_value {
	__u64 count;
	__u64 total_ns;
	__u64 errors; /* returned -4095..-1 (-errno), as strace -c counts them */
};

/* Per-thread state from sys_enter to sys_exit. */
struct syscall_start {
	__u64 ts;
	__u32 nr;
	__u32 phase;
	__u64 user_stack;
	__u32 maps_exec; /* an mmap/mprotect with PROT_EXEC: VMAs change */
	/* syscall_generation at the entry: a syscall that entered in an earlier slice is void. */
	__u32 generation;
	__u64 phase_mask;
	/* Sampled stacks (syscall_stack_every or more syscalls per stack). */
	struct stack_rate rate;
	/* Syscall numbers this thread made (sampled stacks: each one's first carries its stack, so
	 * that rare syscalls have one). */
	__u64 seen[MAX_SYSCALL_NR / 64];
};

/* The user stack of a syscall or switch-out whose stack was not sampled (see
 * syscall_stack_every, offcpu_stack_walks_per_sec). */
#define STACK_NOT_SAMPLED 1

/* One entry of a phase stack. */
struct phase_frame {
	__u32 phase;
	__u32 recursion; /* direct re-entries of the same phase, counted once */
	__u64 entry_ts;
};

/* The phases a thread of execution is inside: an OS thread's (native code) or a goroutine's. */
struct phase_stack {
	__u32 depth;	  /* entries, including overflowed ones beyond MAX_PHASE_DEPTH */
	__u32 top;	  /* innermost stored phase, PHASE_NONE when empty */
	__u64 mask;	  /* phases on the stack; 1 (bit 0) when empty */
	__u32 generation; /* phase_generation of its entries: older ones are void */
	__u32 pad;
	struct phase_frame frames[MAX_PHASE_DEPTH];
};

/* Under a phase budget: a thread's (native code) or a goroutine's last read in the slice of
 * phase_generation `generation`, its bytes, and the calls done since (slice_align.bpf.h). */
struct read_align {
	__u32 generation;
	__u32 calls;
	__u64 bytes;
};

/* Per-OS-thread phase state, in `thread_phases` keyed by tid. */
struct thread_phase {
	/*
	 * What the thread's events are charged to: its own stack (native code) or the stack of
	 * the goroutine it runs (Go: set by the phase probes and the scheduler's switch points).
	 */
	__u32 top;
	__u32 generation; /* phase_generation when `top` and `mask` were set: older ones are void */
	__u64 mask;
	__u64 cur_g;	   /* Go: the goroutine (its g) whose phases `mask` shows; 0: none */
	__u64 oncpu_since; /* start of the current on-CPU segment (0: off-CPU or unknown) */
	/*
	 * On-CPU time is charged per scheduler slice: segments between phase boundaries add wall
	 * time to `pending`, and at switch-out the slice's wall time is rescaled to the task's
	 * own runtime (se.sum_exec_runtime), which leaves out time the hypervisor stole (and IRQ
	 * time where the kernel accounts it), so per-phase CPU matches the thread's CPU time.
	 */
	__u64 slice_start;	 /* ktime at switch-in (0: unknown) */
	__u64 runtime_in;	 /* se.sum_exec_runtime at switch-in */
	__u64 pending_mask;	 /* phases with pending wall time this slice */
	struct read_align align; /* native code: the thread's last read in a phase slice */
	struct phase_stack own;	 /* native code: the thread's own phases */
	__u64 pending[MAX_PHASES];
};

/*
 * Go: phase state follows the goroutine, which migrates between OS threads. Keyed by the
 * goroutine's g (R14 in Go code under the register ABI, the argument of the scheduler's
 * switch points), created at its first phase entry and deleted when its last phase returns.
 */
struct goroutine_key {
	__u32 tgid;
	__u32 pad;
	__u64 g;
};

struct goroutine_phase {
	struct phase_stack stack;
	__u64 parked_since; /* when it last stopped running inside a phase (0: running) */
};

/* Go scheduler points probed for goroutine phases: the low byte of their attach cookie. */
enum go_sched_point {
	GO_EXECUTE = 0, /* runtime.execute(gp): gp starts running on this thread */
	GO_STOP = 1,	/* gp stops running: mcall (every park, yield, preemption, syscall
				* exit without a P, goexit), goschedImpl and preemptPark (newstack) */
	GO_EXIT = 2,	/* goexit0(gp): gp ends */
};
/* Cookie bit: the goroutine is the running one (R14: mcall), not the first argument (RAX). An
 * enum, so the skeleton's generated types carry it to user space. */
enum go_sched_flag {
	GO_SCHED_CURRENT_G = 0x100,
};

/* Exact per-phase totals, inclusive of nested phases (per-CPU array indexed by phase id). */
struct phase_stats {
	__u64 calls;
	__u64 wall_ns;
	__u64 wall_max_ns;
	__u64 cpu_ns;
	__u64 offcpu_ns;
	__u64 cpuwait_ns; /* of offcpu_ns: runnable, waiting for a CPU */
	__u64 gowait_ns;  /* Go: time its goroutines spent descheduled inside the phase */
	__u64 syscalls;
	__u64 syscall_ns;
	__u64 costs[MAX_SYSCALL_COSTS];
	__u64 alloc_bytes; /* exact (native allocators); Go: sampled estimates, in go_allocs */
	__u64 allocs;
	__u64 frees;
	__u64 page_faults;
	__u64 wall_hist[WALL_BUCKETS];
};

/*
 * Allocator entry points: the low byte of an allocator probe's attach cookie. Allocations are
 * counted at the function's return (uretprobe), where the result is known.
 */
enum alloc_fn {
	AF_MALLOC = 0,	   /* size = arg0 (malloc, mallocx, mi_malloc, mi_zalloc, ...) */
	AF_CALLOC,	   /* size = arg0 * arg1 */
	AF_REALLOC,	   /* old = arg0, size = arg1; size 0 frees */
	AF_POSIX_MEMALIGN, /* *arg0 = result, size = arg2; returns 0 on success */
	AF_ALIGNED_ALLOC,  /* size = arg1 (aligned_alloc, memalign) */
	AF_FREE,	   /* ptr = arg0 (free, sdallocx, dallocx, mi_free) */
	/* Go's sampled allocation hook (runtime.mProf_Malloc): cookie bits 8..15 are the Go
	 * register-ABI index of its size argument, bits 16.. the address of runtime.MemProfileRate
	 * (0: unknown). */
	AF_GO_SAMPLE,
};

/* Per-thread allocator state (task-local storage). */
struct alloc_thread {
	__u64 size;	    /* pending call: requested bytes */
	__u64 arg;	    /* pending realloc: old pointer; posix_memalign: result slot */
	__u64 sp;	    /* pending call: stack pointer at entry (0: none pending) */
	__u32 kind;	    /* pending call: enum alloc_fn */
	__u32 generation;   /* pending call: attach generation (see alloc_generation) */
	__u64 until_sample; /* bytes left before the next sampled allocation */
};

/* Exact allocation totals of one (process, phase). */
struct alloc_key {
	__u32 tgid;
	__u32 phase;
	__u32 window;
	__u32 pad;
	__u64 phase_mask;
};

struct alloc_value {
	__u64 bytes;
	__u64 count;
	__u64 frees;
};

/* Sampled allocations of one (process, phase, stack). */
struct alloc_stack_key {
	__u32 tgid;
	__u32 phase;
	__u32 window;
	__u32 pad;
	__u64 phase_mask;
	__u64 user_stack;
};

struct alloc_stack_value {
	__u64 est_bytes; /* unbiased estimate: each sample point stands for the sampling period */
	__u64 samples;	 /* sampled allocations */
	__u64 sampled_bytes; /* their actual sizes */
};

/* A sampled allocation not freed yet, keyed by (tgid, address). */
struct live_key {
	__u64 ptr;
	__u32 tgid;
	__u32 pad;
};

struct live_alloc {
	__u64 ts; /* bpf_ktime_get_ns at allocation */
	__u64 est_bytes;
	__u64 size;
	__u64 user_stack;
	__u64 phase_mask;
	__u32 phase;
	__u32 pad;
};

/* One Go heap-profile sample, sent through `alloc_samples` (rare: one per ~512 KiB). */
struct go_alloc_sample {
	__u32 tgid;
	__u32 phase;
	__u64 phase_mask;
	__u64 size;
	__s64 rate; /* runtime.MemProfileRate when sampled; 0: unknown */
	__u64 user_stack;
};

/* Per-CPU probe hit counters (index), for the overhead estimate. */
enum probe_counter {
	HITS_ALLOC_ENTRY = 0,
	HITS_ALLOC_EXIT,
	HITS_FREE,
	HITS_GO_SAMPLE,
	HITS_GO_SCHED, /* Go scheduler switch points (goroutine phases), not allocator hits */
	/* ns the scheduler's programs ran on a target's CPU time: at switches to a target, which the
	 * kernel charges to the thread switched in, and at wakeups a target makes; with interrupts
	 * off, where no cpu sample sees them. */
	NS_SWITCH_TO_TARGET,
	/* Under a phase budget: calls a slice's start or end cut (never counted). */
	PHASE_CALLS_VOIDED,
	/* Under a syscall budget: syscalls counted in slices, and those a slice's start or end cut
	 * (never counted). */
	SYSCALLS_COUNTED,
	SYSCALLS_VOIDED,
	/* Under a syscall budget: what the syscalls counted in slices added to /proc/PID/io's
	 * syscr + syscw (a slice's edges are placed on that count by it: see slice_budget.rs). */
	IO_SYSCALLS_COUNTED,
	/* ns the cpu sampling program ran on a target's CPU: an interrupt of the target, which the
	 * kernel charges to it (unless it accounts interrupt time apart) and no sample sees. */
	NS_SAMPLE_ON_TARGET,
	/* ns the phase programs worked for a target, from their clock read (first thing, before
	 * the target lookups) to their end: their cost per hit beyond the uprobe machinery's, which
	 * user space measures (the programs return at once for a thread that is no target's: see
	 * hit_calibration.rs). */
	NS_PHASE_WORK,
	/* Under a phase budget, where the syscall programs are in force too: the calls counted in
	 * slices that worked on what a read of the same thread returned in the same slice, those
	 * reads and their bytes (see slice_align.bpf.h). */
	ALIGNED_CALLS,
	ALIGNED_READS,
	ALIGNED_READ_BYTES,
	/* Under a phase budget, where the syscall programs are in force: what the syscalls that
	 * entered while phases counted added to /proc/PID/io's syscr + syscw (a phase slice's
	 * edges are placed on that count by it, as a syscall slice's are: see slice_budget.rs). */
	IO_SYSCALLS_IN_PHASE_SLICES,
	HITS_MAX,
};

/*
 * A stack, stored once under a 64-bit hash of its addresses. (A STACK_TRACE map keys stacks
 * by a hash truncated to its bucket count and refuses colliding stacks: with a few hundred
 * stacks in 16k buckets a collision is likely, and every one would be a lost stack.)
 */
struct stack_trace {
	__u32 len; /* frames in ips */
	__u32 pad;
	__u64 ips[MAX_STACK_DEPTH];
};

/* Per-CPU scratch slots for building a stack_trace, one per program context that can
 * interrupt another on the same CPU (a cpu-clock sample can fire inside a syscall probe). */
enum stack_slot {
	SLOT_SAMPLE = 0,
	SLOT_SWITCH,
	SLOT_SYSCALL,
	SLOT_ALLOC,
	SLOT_FAULT,
	SLOT_EVENT, /* count_event's kinds */
	SLOT_MAX,
};

/*
 * User stacks unwound in user space (--unwind copy, for code without frame pointers): a cpu
 * sample (or page fault) of such a target is sent through `stack_samples` as this header followed by
 * `stack_copy_bytes` (+ STACK_COPY_SLACK, for the verifier) bytes of which the first `len` are the user
 * stack from `sp` up. The stack is read in STACK_COPY_CHUNK pieces aligned to their size (so none
 * straddles the end of a mapping) and the copy stops at the first piece that faults.
 */
#define MAX_STACK_COPY (64 * 1024)
#define STACK_COPY_CHUNK 512
#define STACK_COPY_SLACK (2 * STACK_COPY_CHUNK)

enum stack_sample_kind {
	STACK_CPU = 0,
	STACK_PAGEFAULT = 1,
};

/* Return addresses a pending uretprobe replaced with its trampoline, restored in a copy. */
#define MAX_RET_FIXUPS 8

struct stack_sample {
	__u32 kind; /* enum stack_sample_kind */
	__u32 pad;
	__u32 tgid;
	__u32 tid;
	__u32 phase;
	__u32 len; /* bytes of stack copied */
	__u64 phase_mask;
	__u64 kernel_stack; /* key of `stacks`; 0: none */
	__u64 ip;	    /* user registers at the sample (the syscall entry's if in kernel) */
	__u64 sp;
	__u64 bp;
	/* The thread's pending uretprobes, innermost first: the stack slot holding the trampoline
	 * address and the return address it replaced (slot 0: none). */
	__u64 ret_slots[MAX_RET_FIXUPS];
	__u64 ret_addrs[MAX_RET_FIXUPS];
};

/*
 * Unwind tables (--unwind dwarf): user space compiles each module's call-frame information into
 * rows sorted by address, one per change of rule, stored once per file in `unwind_rows` however
 * many processes map it; a target's code mappings point into them. The BPF walker looks up the
 * row of each frame's address and applies it (x86-64: the return address is at CFA - 8).
 */
enum unwind_kind {
	UNWIND_RSP = 0, /* CFA = rsp + cfa_off */
	UNWIND_RBP = 1, /* CFA = rbp + cfa_off */
	UNWIND_PLT = 2, /* a PLT entry: CFA = rsp + 8, + 8 past its push (address & 15 >= 11) */
	UNWIND_END = 3, /* the return address is undefined: the thread's entry, the walk ends */
	UNWIND_FP = 4,	/* no usable rule here: this frame is walked by its frame pointer */
};

struct unwind_row {
	__u32 pc;      /* address - the mapping's `bias` */
	__s16 cfa_off; /* bytes */
	__s8 rbp_off;  /* rbp saved at CFA + 8 * rbp_off; 0: rbp unchanged */
	__u8 kind;     /* enum unwind_kind */
};

/* Executable mappings of one process, sorted by start, and where their rows are. A process's
 * mappings take one block of MAX_UNWIND_MAPPINGS entries of `unwind_mappings`, written before
 * `table_pids` points to them and never changed while it does (a change takes a new block). */
#define MAX_UNWIND_MAPPINGS 128
/* Blocks of `unwind_mappings`: processes with tables at once, and one spare per change. */
#define MAX_UNWIND_BLOCKS 512

struct unwind_mapping {
	__u64 start;
	__u64 end;
	__u64 bias;	 /* address - bias = the rows' pc */
	__u32 row_start; /* index in unwind_rows */
	__u32 row_count; /* 0: no table; walked by frame pointers */
};

/* The last ENTRY_BLOCKS blocks are the entry point's own: on kernels with the task VMA
 * iterator (6.7), a program stopped at its entry whose files' rows are all in fills one itself
 * and runs on (see uprobe__entry_hold); user space replaces it with its own soon after. */
#define ENTRY_BLOCKS 64
/* Segments of a file the entry point can map file offsets through. */
#define FILE_SEGMENTS 8

/* Value of `file_rows`: where a file's rows are, and its loadable segments (page-aligned
 * p_offset and p_vaddr), for the entry point. */
struct file_rows {
	__u32 row_start;
	__u32 row_count; /* 0: a file without a table */
	__u64 base;
	__u64 seg_offset[FILE_SEGMENTS];
	__u64 seg_vaddr[FILE_SEGMENTS];
	__u32 segments;
	__u32 pad;
};

/* Value of `table_pids`: the target's block of mappings. */
struct unwind_target {
	__u32 first; /* index in unwind_mappings */
	__u32 count;
};

/* Per-CPU counters of the BPF walker, read at every drain. */
enum unwind_counter {
	UNW_WALKS = 0, /* user stacks walked from tables */
	UNW_COMPLETE,  /* walks that reached a frame whose return address is undefined */
	UNW_FP_FRAMES, /* frames walked by frame pointer (no table row for their address) */
	UNW_TRUNCATED, /* walks cut at MAX_STACK_DEPTH */
	UNW_FRAMES,    /* frames in all walks */
	UNW_MAX,
};

enum target_event_kind {
	TEV_EXEC = 1,	     /* a process exec'd: user space may want to add it (--name) */
	TEV_EXIT = 2,	     /* a target process exited */
	TEV_FORK = 3,	     /* a target forked a child that is now a target too */
	TEV_MMAP = 4,	     /* a target mapped executable memory: refresh its VMAs */
	TEV_ENTRY = 5,	     /* a held `record -- CMD` reached its entry point and stopped */
	TEV_THREAD_EXIT = 6, /* a target's thread exited: its name (pid: tid, ppid: tgid) */
};

struct target_event {
	__u32 kind;
	__u32 pid;
	__u32 ppid;
	__u32 pad;
	char comm[TASK_COMM_LEN];
	/* TEV_EXIT: the process's last counts, taken as its last thread exits (its parent may reap
	 * it before user space reads /proc): CPU time in ns, and read and write syscalls. */
	__u64 cpu_ns;
	__u64 io_syscalls;
};

#endif /* PHASEPROF_H */
