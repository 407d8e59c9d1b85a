/* SPDX-License-Identifier: GPL-2.0 */
/* Load-time configuration (rodata), the globals user space flips (.bss), and every map. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_MAPS_BPF_H
#define PHASEPROF_MAPS_BPF_H

#define EFAULT 14
#define EEXIST 17
#define PROT_EXEC 0x4
#define NR_READ 0
#define NR_WRITE 1
#define NR_PREAD64 17
#define NR_PWRITE64 18
#define NR_READV 19
#define NR_WRITEV 20
#define NR_SENDFILE 40
#define NR_PREADV 295
#define NR_PWRITEV 296
#define NR_COPY_FILE_RANGE 326
#define NR_PREADV2 327
#define NR_PWRITEV2 328
#define NR_MMAP 9
#define NR_MPROTECT 10
#define NR_CLONE 56
#define NR_FORK 57
#define NR_VFORK 58
#define NR_CLONE3 435
#define NR_EXECVE 59
#define NR_EXIT 60
#define NR_EXIT_GROUP 231
#define NR_EXECVEAT 322
/* The uprobe machinery's own syscalls (x86-64): the return trampoline enters the kernel through
 * `uretprobe` since Linux 6.11, optimized uprobes through `uprobe` since 6.18. They are the
 * profiler's work, never the target's. */
#define NR_URETPROBE 335
#define NR_UPROBE 336
#define TASK_DEAD 0x80
#define TASK_STOPPED_BIT 0x4 /* __TASK_STOPPED */

/* Set by user space between open and load. */
/* Kernel features user space probed at start (agent/src/engine/features.rs). Where one is
 * missing the programs take the other path, and the verifier, which knows rodata, never sees the
 * helper this kernel lacks (its branch is dead code there). */
/* Task-local storage and bpf_get_current_task_btf (Linux 5.11); else per-thread hash maps keyed
 * by tid (user space retypes the maps before load), deleted at the thread's exit. */
const volatile bool have_task_storage = true;
/* The scheduler's wait accounting readable (sched_info, the run queue's clock: see
 * sched.bpf.h); else the sched_wakeup program marks when a thread becomes runnable. */
const volatile bool wait_from_sched_info = true;
/* bpf_task_pt_regs (5.15); else the registers at the top of the task's kernel stack. */
const volatile bool have_task_pt_regs = true;
/* bpf_get_attach_cookie (5.15); else a phase's return pops the innermost entry unchecked (and
 * entries use one program per phase id, chosen by user space). */
const volatile bool have_attach_cookie = true;
/* Syscall stacks: 0 none, 1 every syscall's, N: one in N on average per thread (the gaps drawn
 * uniformly from 1..2N-1, so that no periodic pattern of the program aliases with them). */
const volatile __u32 syscall_stack_every = 1;
/* `sampled`: a thread's N grows so that it walks at most this many stacks a second (0: N
 * stays; see next_stack_in). */
const volatile __u32 syscall_stack_walks_per_sec = 0;
/* Off-CPU stacks: 0, every switch-out's; N, a thread walks at most N a second (one in its
 * every, see take_stack), its other switch-outs keyed STACK_NOT_SAMPLED. Time stays exact. */
const volatile __u32 offcpu_stack_walks_per_sec = 0;
const volatile bool follow_children = false;
const volatile bool notify_exec = false;
/* `record -- CMD` with unwind tables: a target that execs stops until user space has installed
 * the new program's tables (we are its ancestor: nobody else sees the stop). */
const volatile bool hold_execs = false;
/* Phase probes are attached: look up thread phases in every event. */
const volatile bool phases_enabled = false;
/* Allocation stacks are sampled once per this many bytes (1: every allocation). */
const volatile __u64 alloc_sample_bytes = 512 * 1024;
/* Track sampled allocations until they are freed (the live heap). */
const volatile bool alloc_live = true;
/* Bytes of user stack copied per cpu sample or page fault of a target in `unwind_pids` (0: no
 * copies). */
const volatile __u32 stack_copy_bytes = 0;
/* Bit i set: syscall cost rule i counts this syscall number. */
const volatile __u8 syscall_cost_bits[MAX_SYSCALL_NR] = {};

/* Flipped by user space at every drain; see struct cpu_key. */
__u32 window = 0;
/* Bumped by user space whenever allocator probes are (re)attached: a call entered under an
 * older generation may have lost its return probe to the detach and is not waited for. */
__u32 alloc_generation = 0;
/* Set by user space when the recording stops: from then on nothing is counted, even while
 * detaching the programs takes its time (retiring uprobes waits for RCU grace periods). */
bool stopped = false;
/* Duty cycling: set while allocator probes are being attached or detached, so allocations are
 * counted exactly over the window in which every probe is in force (totals are extrapolated
 * from that window's length). */
bool alloc_paused = false;
/* Phase budget (duty cycling of the phase probes), all 0 in exact mode. `phase_generation` is
 * bumped by user space at the start and the end of every slice, so a call whose entry or exit
 * fell outside one is never counted and no event is charged to a phase entered in an earlier
 * slice; `phases_paused` is set outside slices and while the probes are being attached or
 * detached (no probe counts, and no thread's phases hold: see view_current); `phases_sliced`
 * says the budget is on (a call cut by a slice's edge is counted as voided, and `(none)` is
 * not kept). */
__u32 phase_generation = 0;
bool phases_paused = false;
bool phases_sliced = false;
/* Syscall budget (duty cycling of raw_tp sys_enter/sys_exit), 0 in exact mode: user space
 * attaches the two programs for slices and bumps `syscall_generation` at each slice's start and
 * end, so a syscall whose entry or exit fell outside one is never counted (it is counted as
 * voided: `syscalls_sliced` says the budget is on). `syscalls_paused` is set from a slice's end
 * until the next one's start: the programs, detached one after the other, count nothing. */
__u32 syscall_generation = 0;
bool syscalls_sliced = false;
bool syscalls_paused = false;
/* Threads in `entry_held` (see uprobe__entry_hold); 0 spares every switch-out the lookup. */
__u32 entry_holds = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* enum target_state */
} target_pids SEC(".maps");

/* Bit tgid set for every process that ever became a target (never cleared: a stale bit only
 * costs the target_pids lookup). Nearly every process on the host is not a target; this tells
 * them apart with one inlined array load on every syscall and context switch instead of a hash
 * lookup. User space sets bits through a shared mapping, with atomic ORs as the programs do. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, TARGET_BIT_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} target_bits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_MAX);
	__type(key, __u32);
	__type(value, __u64);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	/* Preallocated: stacks are stored from the cpu-clock interrupt, where an allocating
	 * (BPF_F_NO_PREALLOC) map can fail with -ENOMEM and lose the stack. */
	__type(key, __u64); /* hash of the addresses */
	__type(value, struct stack_trace);
} stacks SEC(".maps");

/* Stacks stored from the cpu-clock interrupt. Its program can fire inside another program's
 * update of a hash map on the same CPU; before Linux 6.15 that nested update fails with -EBUSY
 * whenever the two keys share one of the map's eight per-CPU bucket locks (measured on 6.1: one
 * stack of a few thousand lost). A map of its own is never held by what it interrupts. Keys are
 * odd here, even in `stacks`: user space knows which map to read by the key. Sized like
 * `stacks` by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct stack_trace);
} irq_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOT_MAX);
	__type(key, __u32);
	__type(value, struct stack_trace);
} stack_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cpu_key);
	__type(value, __u64); /* samples */
} cpu_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_value);
} offcpu_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid: deleted at the thread's exit */
	__type(value, struct offcpu_start);
} offcpu_starts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct syscall_key);
	__type(value, struct syscall_value);
} syscall_counts SEC(".maps");

/* Per-thread syscall entry, in task-local storage: cheaper than a hash keyed by tid on
 * the hottest path, and freed by the kernel when the thread exits. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct syscall_start);
} syscall_starts SEC(".maps");

/* Zeros to create per-thread hash entries from where task storage is missing (never written;
 * as large as the largest per-thread record, checked below). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct thread_phase);
} thread_zeros SEC(".maps");

_Static_assert(sizeof(struct syscall_start) <= sizeof(struct thread_phase), "thread_zeros");
_Static_assert(sizeof(struct alloc_thread) <= sizeof(struct thread_phase), "thread_zeros");
_Static_assert(sizeof(struct offcpu_start) <= sizeof(struct thread_phase), "thread_zeros");

/* Per-thread phase state, in task-local storage: every phase probe and every event looks it up,
 * and a task's own storage is a pointer away where a hash lookup costs ~0.1-0.2 us here. Created
 * for targets' threads only, freed by the kernel when the thread exits. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_phase);
} thread_phases SEC(".maps");

/* The target thread that last switched in on this CPU, until its own next event reads it (a
 * per-CPU slot serves kernels without task storage alike, and a thread's slice only matters
 * once it does something on this CPU, where it stays until it switches out). */
struct switch_in {
	__u32 tid;
	__u32 pad;
	__u64 ts;
	__u64 runtime; /* its se.sum_exec_runtime then */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct switch_in);
} switch_ins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct goroutine_key);
	__type(value, struct goroutine_phase);
} goroutine_phases SEC(".maps");

/* Under a phase budget: each goroutine's last read in a slice (slice_align.bpf.h). The least
 * recently used are dropped: a goroutine that has not read for a while has nothing pending. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct goroutine_key);
	__type(value, struct read_align);
} goroutine_aligns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * MAX_PHASES);
	__type(key, __u32); /* phase id + MAX_PHASES * window parity (phase_stats_of) */
	__type(value, struct phase_stats);
} phase_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} target_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct alloc_thread);
} alloc_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct alloc_key);
	__type(value, struct alloc_value);
} alloc_totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct alloc_stack_key);
	__type(value, struct alloc_stack_value);
} alloc_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct live_key);
	__type(value, struct live_alloc);
} live_allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} alloc_samples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HITS_MAX);
	__type(key, __u32);
	__type(value, __u64);
} probe_hits SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cpu_key);
	__type(value, __u64); /* faults */
} pagefault_counts SEC(".maps");

/* Threads stopped at their entry point by uprobe__entry_hold: tid -> 1, until their switch-out. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} entry_held SEC(".maps");

/* Commands to stop at their entry point (tgid -> 1): the entry-hold uprobe of a program stays
 * attached for every process that runs it (attaching and retiring a uprobe costs ~100 ms; a
 * command that execs the same program a thousand times pays it once), and stops only these. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u32);
} entry_wanted SEC(".maps");

/* Program files whose entry-hold uprobe is attached (user space keeps it in step): a command
 * that execs one is not stopped at the exec, only at the entry point (one stop, not two). */
struct program_file {
	__u64 dev; /* the kernel's dev_t: major << 20 | minor */
	__u64 ino;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct program_file);
	__type(value, __u32);
} entry_probed SEC(".maps");

/* Targets whose user stacks are unwound in user space from a copy (no frame pointers). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* 1 */
} unwind_pids SEC(".maps");

/* struct stack_sample records; sized by user space for the sampling rate and copy size. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} stack_samples SEC(".maps");

#endif /* PHASEPROF_MAPS_BPF_H */
