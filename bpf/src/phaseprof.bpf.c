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

#define EFAULT 14
#define EEXIST 17
#define PROT_EXEC 0x4
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

/* Set by user space between open and load. */
const volatile bool syscall_stacks = true;
const volatile bool follow_children = false;
const volatile bool notify_exec = false;
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

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);   /* tgid */
	__type(value, __u32); /* enum target_state */
} target_pids SEC(".maps");

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
	__type(value, __u64); /* ns */
} offcpu_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32); /* tid */
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

/* Per-thread phase state, in task-local storage: every phase probe and every event looks it up,
 * and a task's own storage is a pointer away where a hash lookup costs ~0.1-0.2 us here. Created
 * for targets' threads only, freed by the kernel when the thread exits. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_phase);
} thread_phases SEC(".maps");

/* The target thread that last switched in on this CPU, until its own next event reads it (task
 * storage of `next` cannot be reached from the raw_tp flavour of sched_switch, and a thread's
 * slice only matters once it does something on this CPU, where it stays until it switches out). */
struct switch_in {
	__u32 tid;
	__u32 pad;
	__u64 ts;
	__u64 runtime;         /* its se.sum_exec_runtime then */
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

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, MAX_PHASES);
	__type(key, __u32); /* phase id */
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

static __always_inline void count_drop(enum drop_reason reason)
{
	__u32 key = reason;
	__u64 *v = bpf_map_lookup_elem(&drops, &key);
	if (v)
		*v += 1; /* per-CPU: no atomics needed */
}

static __always_inline bool is_active(__u32 tgid)
{
	if (stopped)
		return false;
	__u32 *state = bpf_map_lookup_elem(&target_pids, &tgid);
	return state && *state == TARGET_ACTIVE;
}

/* The innermost phase the current thread's events are charged to, and the mask of all. */
static __always_inline __u32 thread_phase_of(__u64 *mask)
{
	*mask = 1;
	if (!phases_enabled)
		return PHASE_NONE;
	struct thread_phase *tp = bpf_task_storage_get(&thread_phases, bpf_get_current_task_btf(), 0, 0);
	if (!tp)
		return PHASE_NONE;
	*mask = tp->mask ? tp->mask : 1;
	return tp->top;
}

/* Takes this CPU's pending switch-in when it is the current thread's: its slice starts there. */
static __always_inline void take_switch_in(struct thread_phase *tp, __u32 tid)
{
	__u32 zero = 0;
	struct switch_in *si = bpf_map_lookup_elem(&switch_ins, &zero);
	if (!si || !si->ts || si->tid != tid)
		return;
	tp->oncpu_since = si->ts;
	tp->slice_start = si->ts;
	tp->runtime_in = si->runtime;
	si->ts = 0;
}

/* The current thread's phase state, or NULL when it has none and `create` is false. */
static __always_inline struct thread_phase *thread_phase_current(bool create)
{
	struct thread_phase *tp = bpf_task_storage_get(&thread_phases, bpf_get_current_task_btf(), 0,
						       create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	if (!tp) {
		if (create)
			count_drop(DROP_PHASE_THREAD);
		return NULL;
	}
	if (!tp->mask)
		tp->mask = 1;
	if (!tp->own.mask)
		tp->own.mask = 1;
	take_switch_in(tp, (__u32)bpf_get_current_pid_tgid());
	return tp;
}

/* The current thread's phase state, created for a target's thread: only targets' threads have
 * one, so having one spares the target_pids lookup. NULL for other processes, or when stopped. */
static __always_inline struct thread_phase *target_thread_phase(void)
{
	if (stopped)
		return NULL;
	struct thread_phase *tp = thread_phase_current(false);
	if (tp)
		return tp;
	if (!is_active(bpf_get_current_pid_tgid() >> 32))
		return NULL;
	return thread_phase_current(true);
}

/* Index of the lowest set bit (de Bruijn multiplication: BPF has no ctz). */
static const __u8 debruijn64[64] = {
	0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4,
	62, 55, 59, 36, 53, 51, 43, 22, 45, 39, 33, 30, 24, 18, 12, 5,
	63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11,
	46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6,
};

static __always_inline __u32 lowest_bit(__u64 mask)
{
	return debruijn64[((mask & -mask) * 0x03f79d71b4cb0a89ULL) >> 58];
}

enum phase_field { PF_CPU, PF_OFFCPU, PF_PAGE_FAULTS, PF_FREES, PF_GOWAIT };

/* Adds `ns` of on-CPU or off-CPU time (or a count of another field) to every phase in `mask`
 * (inclusive attribution). Global functions like this one are verified once, not once per
 * caller and path. */
__noinline int phases_add_time(__u64 mask, __u32 field, __u64 ns)
{
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = bpf_map_lookup_elem(&phase_stats, &id);
		if (!st)
			continue;
		if (field == PF_CPU)
			st->cpu_ns += ns;
		else if (field == PF_OFFCPU)
			st->offcpu_ns += ns;
		else if (field == PF_PAGE_FAULTS)
			st->page_faults += ns;
		else if (field == PF_GOWAIT)
			st->gowait_ns += ns;
		else
			st->frees += ns;
	}
	return 0;
}

/* Counts one allocation of `bytes` in every phase of `mask`. */
__noinline int phases_add_alloc(__u64 mask, __u64 bytes)
{
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = bpf_map_lookup_elem(&phase_stats, &id);
		if (!st)
			continue;
		st->alloc_bytes += bytes;
		st->allocs += 1;
	}
	return 0;
}

/* Counts a syscall of `nr` taking `ns` in every phase of `mask`, with its cost rules. */
__noinline int phases_add_syscall(__u64 mask, __u32 nr, __u64 ns)
{
	__u8 costs = syscall_cost_bits[nr & (MAX_SYSCALL_NR - 1)];
	if (nr >= MAX_SYSCALL_NR)
		costs = 0;
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = bpf_map_lookup_elem(&phase_stats, &id);
		if (!st)
			continue;
		st->syscalls += 1;
		st->syscall_ns += ns;
		/* Branch-free: a branch per rule would multiply the verifier's paths. */
		for (int c = 0; c < MAX_SYSCALL_COSTS; c++)
			st->costs[c] += (costs >> c) & 1;
	}
	return 0;
}

/* Log-linear bucket of a duration; see WALL_BUCKETS. */
static __always_inline __u32 wall_bucket(__u64 ns)
{
	if (ns < WALL_SUB_BUCKETS)
		return ns;
	__u32 msb = 0;
	__u64 v = ns;
	if (v >> 32) { v >>= 32; msb += 32; }
	if (v >> 16) { v >>= 16; msb += 16; }
	if (v >> 8) { v >>= 8; msb += 8; }
	if (v >> 4) { v >>= 4; msb += 4; }
	if (v >> 2) { v >>= 2; msb += 2; }
	if (v >> 1) { msb += 1; }
	__u32 idx = (msb - 3) * WALL_SUB_BUCKETS + ((ns >> (msb - 4)) & (WALL_SUB_BUCKETS - 1));
	return idx < WALL_BUCKETS ? idx : WALL_BUCKETS - 1;
}

/* Adds the on-CPU segment since `oncpu_since` to the pending time of the current phases. */
static __always_inline void charge_cpu(struct thread_phase *tp, __u64 now)
{
	if (tp->oncpu_since && now > tp->oncpu_since) {
		__u64 seg = now - tp->oncpu_since;
		__u64 mask = tp->mask;
		tp->pending_mask |= mask;
		for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
			__u32 id = lowest_bit(mask) & (MAX_PHASES - 1);
			mask &= mask - 1;
			tp->pending[id] += seg;
		}
	}
	tp->oncpu_since = now;
}

/* At switch-out: charges the slice's pending time, rescaled from wall time to the task's
 * runtime over the slice (`runtime_now` = se.sum_exec_runtime), and starts a new slice. */
static __always_inline void end_slice(struct thread_phase *tp, __u64 now, __u64 runtime_now)
{
	charge_cpu(tp, now);
	/* 16.16 fixed point; 1.0 when the slice's start is unknown (attached mid-slice). */
	__u64 scale = 1 << 16;
	if (tp->slice_start && now > tp->slice_start && runtime_now >= tp->runtime_in)
		scale = ((runtime_now - tp->runtime_in) << 16) / (now - tp->slice_start);
	__u64 mask = tp->pending_mask;
	for (int i = 0; i < MAX_PHASES && mask; i++) {
		__u32 id = lowest_bit(mask) & (MAX_PHASES - 1);
		mask &= mask - 1;
		__u64 ns = (tp->pending[id] * scale) >> 16;
		tp->pending[id] = 0;
		struct phase_stats *st = bpf_map_lookup_elem(&phase_stats, &id);
		if (st)
			st->cpu_ns += ns;
	}
	tp->pending_mask = 0;
	tp->oncpu_since = 0;
	tp->slice_start = 0;
}

/* Recomputes `top` and `mask` from the stored frames. */
static __always_inline void phase_stack_changed(struct phase_stack *ps)
{
	__u64 mask = 0;
	__u32 top = PHASE_NONE;
	for (int i = 0; i < MAX_PHASE_DEPTH; i++) {
		if (i >= ps->depth)
			break;
		__u32 id = ps->frames[i].phase & (MAX_PHASES - 1);
		mask |= 1ULL << id;
		top = id;
	}
	ps->mask = mask ? mask : 1;
	ps->top = top;
}

/* From now on the thread's events are charged to the phases of `ps` (NULL: none). */
static __always_inline void thread_view(struct thread_phase *tp, struct phase_stack *ps)
{
	tp->top = ps ? ps->top : PHASE_NONE;
	tp->mask = ps && ps->mask ? ps->mask : 1;
}

/* FNV-1a over a stack's addresses, never 0. Global: verified once, not in every caller. */
__noinline __u64 hash_stack(struct stack_trace *st, __u64 seed)
{
	if (!st)
		return 1;
	__u64 h = seed;
	__u32 len = st->len;
	for (__u32 i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= len)
			break;
		h = (h ^ st->ips[i]) * 0x100000001b3ULL;
	}
	return h ? h : 1;
}

/*
 * Stores the current stack (user with BPF_F_USER_STACK, else kernel) under the hash of its
 * addresses and returns the hash; 0 when there is no stack (-EFAULT: a kernel stack of a
 * thread in user mode) or it could not be stored (counted as a drop).
 */
static __always_inline __u64 stack_id(void *ctx, __u64 flags, enum stack_slot slot, enum drop_reason reason)
{
	__u32 key = slot;
	struct stack_trace *st = bpf_map_lookup_elem(&stack_scratch, &key);
	if (!st)
		return 0;
	long n = bpf_get_stack(ctx, st->ips, sizeof(st->ips), flags);
	if (n <= 0) {
		if (n < 0 && n != -EFAULT)
			count_drop(reason);
		return 0;
	}
	__u32 len = n / sizeof(__u64);
	st->len = len;
	st->pad = 0;
	__u64 h = hash_stack(st, flags & BPF_F_USER_STACK ? 0xcbf29ce484222325ULL : 0x84222325cbf29ce4ULL);
	/* Most stacks repeat: a lock-free lookup saves the bucket lock of an update. */
	if (bpf_map_lookup_elem(&stacks, &h))
		return h;
	long err = bpf_map_update_elem(&stacks, &h, st, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count_drop(reason);
		return 0;
	}
	return h;
}

/* Adds `delta` to the u64 under `key`, creating it if needed. */
static __always_inline void add_u64(void *map, void *key, __u64 delta, enum drop_reason reason)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	if (v) {
		__sync_fetch_and_add(v, delta);
		return;
	}
	long err = bpf_map_update_elem(map, key, &delta, BPF_NOEXIST);
	if (!err)
		return;
	if (err == -EEXIST) { /* another CPU created it meanwhile */
		v = bpf_map_lookup_elem(map, key);
		if (v) {
			__sync_fetch_and_add(v, delta);
			return;
		}
	}
	count_drop(reason);
}

/* The value under `key`, inserted as `zero` first when missing; NULL (a drop of `reason`)
 * when the map is full. */
static __always_inline void *lookup_or_init(void *map, const void *key, const void *zero,
					    enum drop_reason reason)
{
	void *v = bpf_map_lookup_elem(map, key);
	if (v)
		return v;
	long err = bpf_map_update_elem(map, key, zero, BPF_NOEXIST);
	if (err && err != -EEXIST) { /* EEXIST: another CPU created it meanwhile */
		count_drop(reason);
		return NULL;
	}
	v = bpf_map_lookup_elem(map, key);
	if (!v)
		count_drop(reason);
	return v;
}

static __always_inline void add_syscall(struct syscall_key *key, __u64 count, __u64 ns)
{
	struct syscall_value zero = {};
	struct syscall_value *v = lookup_or_init(&syscall_counts, key, &zero, DROP_SYSCALL_KEY);
	if (!v)
		return;
	__sync_fetch_and_add(&v->count, count);
	__sync_fetch_and_add(&v->total_ns, ns);
}

static __always_inline void emit(__u32 kind, __u32 pid, __u32 ppid)
{
	struct target_event *e = bpf_ringbuf_reserve(&target_events, sizeof(*e), 0);
	if (!e) {
		count_drop(DROP_EVENT_RINGBUF);
		return;
	}
	e->kind = kind;
	e->pid = pid;
	e->ppid = ppid;
	e->pad = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
}

/* ---- on-CPU ------------------------------------------------------------ */

/*
 * A pending uretprobe (a phase's or an allocator's return probe) has replaced its function's
 * return address on the user stack with the trampoline's, where an unwinder would stop. The
 * kernel keeps what it replaced (current->utask->return_instances, innermost first): send the
 * slots and the real addresses so user space can put them back into the copy.
 */
static __always_inline void ret_fixups(struct stack_sample *s)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct return_instance *ri = BPF_CORE_READ(task, utask, return_instances);
	for (int i = 0; i < MAX_RET_FIXUPS; i++) {
		s->ret_slots[i] = 0;
		s->ret_addrs[i] = 0;
		if (!ri)
			continue;
		s->ret_slots[i] = BPF_CORE_READ(ri, stack);
		s->ret_addrs[i] = BPF_CORE_READ(ri, orig_ret_vaddr);
		ri = BPF_CORE_READ(ri, next);
	}
}

/*
 * Sends the sample (a cpu sample or a page fault) with its user registers and a copy of its
 * user stack to user space, which unwinds it from the modules' call-frame information. False
 * when the ring buffer is full (counted: the caller then counts the sample without a user stack).
 */
static __always_inline bool send_stack_copy(struct bpf_perf_event_data *ctx, struct cpu_key *key,
					    enum stack_sample_kind kind)
{
	/* The size is a load-time constant (rodata): the verifier knows the record's length. */
	struct stack_sample *s = bpf_ringbuf_reserve(&stack_samples,
		sizeof(*s) + stack_copy_bytes + STACK_COPY_SLACK, 0);
	if (!s) {
		count_drop(DROP_STACK_COPY);
		return false;
	}
	__u64 ip, sp, bp;
	/* User mode iff the interrupted address is in the lower half (x86-64 canonical addresses;
	 * a context read of `cs` alone is refused: pt_regs context reads are 8 bytes wide). */
	if ((__s64)ctx->regs.ip >= 0) {
		ip = ctx->regs.ip;
		sp = ctx->regs.sp;
		bp = ctx->regs.bp;
	} else {
		/* In the kernel on the thread's behalf: its user registers at the kernel entry. */
		struct pt_regs *u = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
		ip = BPF_CORE_READ(u, ip);
		sp = BPF_CORE_READ(u, sp);
		bp = BPF_CORE_READ(u, bp);
	}
	s->kind = kind;
	s->pad = 0;
	s->tgid = key->tgid;
	s->tid = key->tid;
	s->phase = key->phase;
	s->phase_mask = key->phase_mask;
	s->kernel_stack = key->kernel_stack;
	s->ip = ip;
	s->sp = sp;
	s->bp = bp;
	ret_fixups(s);
	__u8 *stack = (__u8 *)(s + 1);
	__u64 off = 0;
	__u64 want = STACK_COPY_CHUNK - (sp & (STACK_COPY_CHUNK - 1));
	for (int i = 0; i <= MAX_STACK_COPY / STACK_COPY_CHUNK; i++) {
		if (off >= stack_copy_bytes || off >= MAX_STACK_COPY)
			break;
		if (want > stack_copy_bytes - off)
			want = stack_copy_bytes - off;
		if (want == 0 || want > STACK_COPY_CHUNK)
			break;
		/* The mask changes nothing (want <= STACK_COPY_CHUNK) but proves the bound to the
		 * verifier, which lost it in the compiler's arithmetic; the slack covers it. */
		if (bpf_probe_read_user(stack + off, want & (STACK_COPY_SLACK - 1), (void *)(sp + off)))
			break;
		off += want;
		want = STACK_COPY_CHUNK;
	}
	s->len = off;
	/* No wakeup per sample: waking the reader costs an IPI, which in a VM is a VM exit (about
	 * 35 us a sample measured here). User space reads the ring every 20 ms anyway; it is woken
	 * only once the ring is a quarter full. */
	__u64 avail = bpf_ringbuf_query(&stack_samples, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&stack_samples, BPF_RB_RING_SIZE);
	bpf_ringbuf_submit(s, avail > size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	return true;
}

SEC("perf_event")
int perf_event__sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!tgid || !is_active(tgid))
		return 0;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	struct cpu_key key = {
		.tgid = tgid,
		.tid = (__u32)id,
		.phase = phase,
		.phase_mask = mask,
		.window = window,
		.kernel_stack = stack_id(ctx, 0, SLOT_SAMPLE, DROP_KERNEL_STACK),
	};
	/* Without frame pointers the kernel's walk gives the leaf and garbage: copy the stack. */
	if (stack_copy_bytes && bpf_map_lookup_elem(&unwind_pids, &tgid)) {
		if (send_stack_copy(ctx, &key, STACK_CPU))
			return 0;
	} else {
		key.user_stack = stack_id(ctx, BPF_F_USER_STACK, SLOT_SAMPLE, DROP_USER_STACK);
	}
	add_u64(&cpu_counts, &key, 1, DROP_CPU_KEY);
	return 0;
}

/* ---- off-CPU ----------------------------------------------------------- */

/* Older kernels name the task state `state`, newer ones `__state`. */
struct task_struct___o {
	volatile long int state;
} __attribute__((preserve_access_index));

static __always_inline __u64 task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return BPF_CORE_READ(t, __state);
	return BPF_CORE_READ((struct task_struct___o *)t, state);
}

static __always_inline void on_switch(void *ctx, struct task_struct *prev, struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 prev_tgid = BPF_CORE_READ(prev, tgid);
	/* A dying thread's last switch-out is never followed by a switch-in. */
	if (is_active(prev_tgid) && !(task_state(prev) & TASK_DEAD)) {
		__u32 prev_tid = BPF_CORE_READ(prev, pid);
		__u64 mask = 1;
		__u32 phase = PHASE_NONE;
		if (phases_enabled) {
			/* prev is the current task. */
			struct thread_phase *tp = thread_phase_current(false);
			if (tp) {
				end_slice(tp, now, BPF_CORE_READ(prev, se.sum_exec_runtime));
				mask = tp->mask;
				phase = tp->top;
			}
		}
		/* prev is current here, so the stacks are prev's. */
		struct offcpu_start start = {
			.ts = now,
			.tgid = prev_tgid,
			.phase = phase,
			.user_stack = stack_id(ctx, BPF_F_USER_STACK, SLOT_SWITCH, DROP_USER_STACK),
			.kernel_stack = stack_id(ctx, 0, SLOT_SWITCH, DROP_KERNEL_STACK),
			.phase_mask = mask,
		};
		if (bpf_map_update_elem(&offcpu_starts, &prev_tid, &start, BPF_ANY))
			count_drop(DROP_OFFCPU_START);
	}

	__u32 next_tid = BPF_CORE_READ(next, pid);
	if (phases_enabled && is_active(BPF_CORE_READ(next, tgid))) {
		__u32 zero = 0;
		struct switch_in *si = bpf_map_lookup_elem(&switch_ins, &zero);
		if (si) {
			si->tid = next_tid;
			si->ts = now;
			si->runtime = BPF_CORE_READ(next, se.sum_exec_runtime);
		}
	}
	struct offcpu_start *start = bpf_map_lookup_elem(&offcpu_starts, &next_tid);
	if (!start)
		return;
	struct offcpu_key key = {
		.tgid = start->tgid,
		.tid = next_tid,
		.phase = start->phase,
		.window = window,
		.user_stack = start->user_stack,
		.kernel_stack = start->kernel_stack,
		.phase_mask = start->phase_mask,
	};
	__u64 delta = now - start->ts;
	bpf_map_delete_elem(&offcpu_starts, &next_tid);
	add_u64(&offcpu_counts, &key, delta, DROP_OFFCPU_KEY);
	if (phases_enabled)
		phases_add_time(key.phase_mask, PF_OFFCPU, delta);
}

/* Twins: tp_btf where BTF-typed tracepoints load, raw_tp otherwise. User space
 * picks one with a load probe and disables the other. */
SEC("tp_btf/sched_switch")
int BPF_PROG(tp_btf__sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	on_switch(ctx, prev, next);
	return 0;
}

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_tp__sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	on_switch(ctx, prev, next);
	return 0;
}

/* ---- syscalls ---------------------------------------------------------- */

SEC("raw_tp/sys_enter")
int raw_tp__sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 nr = ctx->args[1];
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	/* Entries are created for targets' threads only (below), so a thread that has one is a
	 * target's: its syscalls skip the target_pids lookup. */
	if (stopped || nr == NR_URETPROBE || nr == NR_UPROBE)
		return 0;
	struct task_struct *task = bpf_get_current_task_btf();
	struct syscall_start *start = bpf_task_storage_get(&syscall_starts, task, 0, 0);
	if (!start) {
		__u32 *state = bpf_map_lookup_elem(&target_pids, &tgid);
		if (!state)
			return 0;
		if (*state != TARGET_ACTIVE) {
			/* `record -- CMD`: counting starts with the command's own execve. */
			if (nr != NR_EXECVE && nr != NR_EXECVEAT)
				return 0;
			*state = TARGET_ACTIVE;
		}
		start = bpf_task_storage_get(&syscall_starts, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (!start) {
			count_drop(DROP_SYSCALL_START);
			return 0;
		}
	}

	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	struct syscall_key key = {
		.tgid = tgid,
		.phase = phase,
		.phase_mask = mask,
		.nr = nr,
		.window = window,
		.user_stack = syscall_stacks ? stack_id(ctx, BPF_F_USER_STACK, SLOT_SYSCALL, DROP_USER_STACK) : 0,
	};
	/* These never return: count them now, with no latency. */
	if (nr == NR_EXIT || nr == NR_EXIT_GROUP) {
		add_syscall(&key, 1, 0);
		if (phases_enabled)
			phases_add_syscall(mask, nr, 0);
		return 0;
	}
	start->nr = nr;
	start->phase = key.phase;
	start->user_stack = key.user_stack;
	start->phase_mask = mask;
	start->maps_exec = 0;
	if (nr == NR_MMAP || nr == NR_MPROTECT) {
		struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
		start->maps_exec = (BPF_CORE_READ(regs, dx) & PROT_EXEC) != 0;
	}
	start->ts = bpf_ktime_get_ns(); /* last: ts != 0 marks the entry valid */
	return 0;
}

SEC("raw_tp/sys_exit")
int raw_tp__sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	/* Only targets' threads have an entry: a target's exit skips the target_pids lookup. */
	if (stopped)
		return 0;
	struct syscall_start *start = bpf_task_storage_get(&syscall_starts, bpf_get_current_task_btf(), 0, 0);
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!start || !start->ts) {
		if (!is_active(tgid))
			return 0;
		/* A new thread's first event is its own return from clone (the parent's clone is
		 * counted); anything else began before we attached. */
		struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
		long nr = BPF_CORE_READ(regs, orig_ax);
		if (nr == NR_URETPROBE || nr == NR_UPROBE)
			return 0;
		if (!((nr == NR_CLONE || nr == NR_CLONE3 || nr == NR_FORK || nr == NR_VFORK) && ctx->args[1] == 0))
			count_drop(INFO_SYSCALL_EXIT_UNMATCHED);
		return 0;
	}
	struct syscall_key key = {
		.tgid = tgid,
		.phase = start->phase,
		.nr = start->nr,
		.window = window,
		.user_stack = start->user_stack,
		.phase_mask = start->phase_mask,
	};
	__u64 delta = bpf_ktime_get_ns() - start->ts;
	bool maps_exec = start->maps_exec && (long)ctx->args[1] >= 0;
	start->ts = 0;
	add_syscall(&key, 1, delta);
	if (phases_enabled)
		phases_add_syscall(key.phase_mask, key.nr, delta);
	if (maps_exec)
		emit(TEV_MMAP, tgid, 0);
	return 0;
}

/* ---- phases ------------------------------------------------------------ */

static __always_inline void count_hit(enum probe_counter c)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&probe_hits, &key);
	if (v)
		*v += 1;
}

/* Pushes an entry of `phase`. Direct recursion counts one call, at the outermost entry;
 * entries beyond MAX_PHASE_DEPTH are counted as drops (and popped again by their returns). */
static __always_inline void phase_push(struct phase_stack *ps, __u32 phase, __u64 now)
{
	__u32 d = ps->depth;
	if (d >= 1 && d <= MAX_PHASE_DEPTH && ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)].phase == phase) {
		ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)].recursion++;
		return;
	}
	if (d >= MAX_PHASE_DEPTH) {
		count_drop(DROP_PHASE_DEPTH);
		ps->depth = d + 1;
		return;
	}
	struct phase_frame *f = &ps->frames[d & (MAX_PHASE_DEPTH - 1)];
	f->phase = phase;
	f->recursion = 0;
	f->entry_ts = now;
	ps->depth = d + 1;
	phase_stack_changed(ps);
}

/* Counts a completed call of `phase` that took `wall` ns. */
static __always_inline void phase_call_done(__u32 phase, __u64 wall)
{
	struct phase_stats *st = bpf_map_lookup_elem(&phase_stats, &phase);
	if (!st)
		return;
	st->calls += 1;
	st->wall_ns += wall;
	if (wall > st->wall_max_ns)
		st->wall_max_ns = wall;
	__u32 b = wall_bucket(wall);
	if (b < WALL_BUCKETS)
		st->wall_hist[b] += 1;
}

/* Pops the innermost entry for a return of `phase` (a non-empty stack) and counts the call. */
static __always_inline void phase_pop(struct phase_stack *ps, __u32 phase, __u64 now)
{
	__u32 d = ps->depth;
	if (d > MAX_PHASE_DEPTH) {
		ps->depth = d - 1; /* an overflowed entry */
		return;
	}
	struct phase_frame *f = &ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)];
	if (f->phase != phase) {
		/* Not the innermost phase: a frame was unwound without returning. Pop it anyway
		 * so the stack stays bounded. */
		count_drop(DROP_PHASE_MISMATCH);
	} else if (f->recursion) {
		f->recursion--;
		return;
	}
	__u64 wall = now - f->entry_ts;
	__u32 popped = f->phase & (MAX_PHASES - 1);
	ps->depth = d - 1;
	phase_stack_changed(ps);
	phase_call_done(popped, wall);
}

/* Entry of a phase function (native code); the attach cookie is the phase id. */
SEC("uprobe")
int uprobe__phase_enter(struct pt_regs *ctx)
{
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	__u32 phase = bpf_get_attach_cookie(ctx) & (MAX_PHASES - 1);
	__u64 now = bpf_ktime_get_ns();
	/* Time on-CPU until now belongs to the enclosing phases. */
	charge_cpu(tp, now);
	phase_push(&tp->own, phase, now);
	thread_view(tp, &tp->own);
	return 0;
}

/* Return of a phase function (native code): a uretprobe. */
SEC("uretprobe")
int uretprobe__phase_exit(struct pt_regs *ctx)
{
	struct thread_phase *tp = stopped ? NULL : thread_phase_current(false);
	if (!tp || tp->own.depth == 0) {
		/* Entered before we attached. */
		if (is_active(bpf_get_current_pid_tgid() >> 32))
			count_drop(INFO_PHASE_EXIT_UNMATCHED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	charge_cpu(tp, now);
	phase_pop(&tp->own, bpf_get_attach_cookie(ctx) & (MAX_PHASES - 1), now);
	thread_view(tp, &tp->own);
	return 0;
}

/* Go's register ABI keeps the running goroutine's g in R14. */
static __always_inline __u64 go_current_g(struct pt_regs *ctx)
{
	return ctx->r14;
}

/* Entry of a Go phase function: the phase goes on the stack of the goroutine, wherever it runs
 * later. */
SEC("uprobe")
int uprobe__go_phase_enter(struct pt_regs *ctx)
{
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	__u32 phase = bpf_get_attach_cookie(ctx) & (MAX_PHASES - 1);
	__u64 now = bpf_ktime_get_ns();
	struct goroutine_key key = { .tgid = bpf_get_current_pid_tgid() >> 32, .g = go_current_g(ctx) };
	struct goroutine_phase zero = {};
	struct goroutine_phase *gp = lookup_or_init(&goroutine_phases, &key, &zero, DROP_GOROUTINE_FULL);
	if (!gp)
		return 0;
	charge_cpu(tp, now);
	phase_push(&gp->stack, phase, now);
	thread_view(tp, &gp->stack);
	tp->cur_g = key.g;
	return 0;
}

/* A return instruction of a Go phase function (never a uretprobe, which would corrupt moving
 * goroutine stacks). */
SEC("uprobe")
int uprobe__go_phase_return(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct goroutine_key key = { .tgid = tgid, .g = go_current_g(ctx) };
	struct goroutine_phase *gp = bpf_map_lookup_elem(&goroutine_phases, &key);
	if (!gp || gp->stack.depth == 0) {
		if (is_active(tgid))
			count_drop(INFO_PHASE_EXIT_UNMATCHED);
		return 0;
	}
	__u64 now = bpf_ktime_get_ns();
	struct thread_phase *tp = target_thread_phase();
	if (tp)
		charge_cpu(tp, now);
	phase_pop(&gp->stack, bpf_get_attach_cookie(ctx) & (MAX_PHASES - 1), now);
	if (tp) {
		thread_view(tp, &gp->stack);
		tp->cur_g = key.g;
	}
	/* Outside every phase the goroutine needs no state (and its g may be reused). */
	if (gp->stack.depth == 0)
		bpf_map_delete_elem(&goroutine_phases, &key);
	return 0;
}

/*
 * The Go scheduler's switch points, which change the goroutine an OS thread runs without a
 * kernel context switch. Each takes the goroutine as its first argument (RAX), but mcall, which
 * runs on the stopping goroutine (R14). At GO_EXECUTE
 * the thread starts charging its events to gp's phases, and the time gp spent descheduled inside
 * a phase since its last GO_STOP is its goroutine wait; at GO_STOP and GO_EXIT the thread runs
 * scheduler code that belongs to no phase.
 */
SEC("uprobe")
int uprobe__go_sched(struct pt_regs *ctx)
{
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	count_hit(HITS_GO_SCHED);
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u32 point = cookie & 0xff;
	__u64 now = bpf_ktime_get_ns();
	/* Both registers are read as they are: the verifier refuses a context read at an offset
	 * the compiler would otherwise select. */
	__u64 running = go_current_g(ctx), arg = ctx->ax;
	barrier_var(running);
	barrier_var(arg);
	struct goroutine_key key = {
		.tgid = tgid,
		.g = cookie & GO_SCHED_CURRENT_G ? running : arg,
	};
	struct goroutine_phase *gp = bpf_map_lookup_elem(&goroutine_phases, &key);
	charge_cpu(tp, now);
	if (point == GO_EXECUTE && gp) {
		thread_view(tp, &gp->stack);
		tp->cur_g = key.g;
	} else {
		thread_view(tp, NULL);
		tp->cur_g = point == GO_EXECUTE ? key.g : 0;
	}
	if (!gp)
		return 0;
	if (point == GO_EXECUTE) {
		if (gp->parked_since && now > gp->parked_since)
			phases_add_time(gp->stack.mask, PF_GOWAIT, now - gp->parked_since);
		gp->parked_since = 0;
	} else if (point == GO_STOP) {
		/* The first of the stop points a switch passes (mcall, then the function it calls). */
		if (!gp->parked_since)
			gp->parked_since = now;
	} else {
		/* Ended inside a phase (runtime.Goexit): those calls never return. */
		count_drop(DROP_PHASE_UNFINISHED);
		bpf_map_delete_elem(&goroutine_phases, &key);
	}
	return 0;
}

/* ---- allocations ------------------------------------------------------- */

static __always_inline void add_alloc_totals(__u32 tgid, __u32 phase, __u64 mask, __u64 bytes, __u64 count, __u64 frees)
{
	struct alloc_key key = { .tgid = tgid, .phase = phase, .window = window, .phase_mask = mask };
	struct alloc_value zero = {};
	struct alloc_value *v = lookup_or_init(&alloc_totals, &key, &zero, DROP_ALLOC_KEY);
	if (!v)
		return;
	__sync_fetch_and_add(&v->bytes, bytes);
	__sync_fetch_and_add(&v->count, count);
	__sync_fetch_and_add(&v->frees, frees);
}

/*
 * Byte sampling: sample points lie every `period` bytes along the thread's stream of allocated
 * bytes, starting at a random offset; an allocation is sampled when its bytes contain k >= 1
 * points and then stands for k periods. Each byte is equally likely to be a point (1/period),
 * so the estimate is unbiased for any allocation size (a countdown re-drawn from scratch after
 * each sample would drop the bytes past the last point and estimate low). With a period of 1
 * every allocation is sampled with its exact size.
 */
static __always_inline __u64 sample_points(struct alloc_thread *at, __u64 size)
{
	__u64 period = alloc_sample_bytes ? alloc_sample_bytes : 1;
	if (period == 1)
		return size;
	if (at->until_sample == 0)
		at->until_sample = 1 + bpf_get_prandom_u32() % period;
	if (size < at->until_sample) {
		at->until_sample -= size;
		return 0;
	}
	__u64 past = size - at->until_sample;
	at->until_sample = period - past % period;
	return 1 + past / period;
}

/* A successful allocation of `size` bytes at `ptr` by the current thread. */
static __always_inline void record_alloc(void *ctx, struct alloc_thread *at, __u64 ptr, __u64 size)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	add_alloc_totals(tgid, phase, mask, size, 1, 0);
	if (phases_enabled)
		phases_add_alloc(mask, size);
	__u64 k = sample_points(at, size);
	if (!k)
		return;
	__u64 period = alloc_sample_bytes > 1 ? alloc_sample_bytes : 1;
	__u64 est = period == 1 ? size : k * period;
	struct alloc_stack_key key = {
		.tgid = tgid,
		.phase = phase,
		.window = window,
		.phase_mask = mask,
		.user_stack = stack_id(ctx, BPF_F_USER_STACK, SLOT_ALLOC, DROP_USER_STACK),
	};
	struct alloc_stack_value zero = {};
	struct alloc_stack_value *v = lookup_or_init(&alloc_stacks, &key, &zero, DROP_ALLOC_STACK_KEY);
	if (!v)
		return;
	__sync_fetch_and_add(&v->est_bytes, est);
	__sync_fetch_and_add(&v->samples, 1);
	__sync_fetch_and_add(&v->sampled_bytes, size);
	if (!alloc_live || !ptr)
		return;
	struct live_key lk = { .ptr = ptr, .tgid = tgid };
	struct live_alloc la = {
		.ts = bpf_ktime_get_ns(),
		.est_bytes = est,
		.size = size,
		.user_stack = key.user_stack,
		.phase_mask = mask,
		.phase = phase,
	};
	if (bpf_map_update_elem(&live_allocs, &lk, &la, BPF_ANY))
		count_drop(DROP_LIVE_FULL);
}

/* A free of `ptr` (non-NULL) by the current thread. */
static __always_inline void record_free(__u64 ptr)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	add_alloc_totals(tgid, phase, mask, 0, 0, 1);
	if (phases_enabled)
		phases_add_time(mask, PF_FREES, 1);
	if (alloc_live) {
		struct live_key lk = { .ptr = ptr, .tgid = tgid };
		bpf_map_delete_elem(&live_allocs, &lk);
	}
}

/* The calling thread's allocator state, created on first use. */
static __always_inline struct alloc_thread *alloc_thread_get(void)
{
	struct alloc_thread *at = bpf_task_storage_get(&alloc_threads, bpf_get_current_task_btf(), 0,
						       BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!at)
		count_drop(DROP_ALLOC_THREAD);
	return at;
}

/* An allocator call of this thread is in progress below stack pointer `sp`: calls made from
 * inside it (glibc's realloc calls malloc, memalign may too) are internal and not counted. */
static __always_inline bool inside_allocator(struct alloc_thread *at, __u64 sp)
{
	return at->sp && at->generation == alloc_generation && sp < at->sp;
}

/* Entry of malloc & co; the cookie's low byte is the enum alloc_fn. Probes sit where the
 * return address is still on top of the stack, so sp is the caller's sp at the call.
 * Allocator probes are multi-uprobes: one link per program and library, so attaching and
 * detaching them (duty cycling) costs one RCU grace period, not one per function. */
SEC("uprobe.multi")
int uprobe__alloc_enter(struct pt_regs *ctx)
{
	if (alloc_paused || !is_active(bpf_get_current_pid_tgid() >> 32))
		return 0;
	count_hit(HITS_ALLOC_ENTRY);
	struct alloc_thread *at = alloc_thread_get();
	if (!at)
		return 0;
	__u64 sp = PT_REGS_SP(ctx);
	if (inside_allocator(at, sp))
		return 0;
	__u32 kind = bpf_get_attach_cookie(ctx) & 0xff;
	__u64 a0 = PT_REGS_PARM1(ctx), a1 = PT_REGS_PARM2(ctx), a2 = PT_REGS_PARM3(ctx);
	at->kind = kind;
	at->arg = 0;
	switch (kind) {
	case AF_MALLOC:
		at->size = a0;
		break;
	case AF_CALLOC:
		at->size = a0 * a1;
		break;
	case AF_REALLOC:
		at->arg = a0;
		at->size = a1;
		break;
	case AF_POSIX_MEMALIGN:
		at->arg = a0;
		at->size = a2;
		break;
	default: /* AF_ALIGNED_ALLOC */
		at->size = a1;
		break;
	}
	at->generation = alloc_generation;
	at->sp = sp;
	return 0;
}

/* Return of malloc & co (uretprobe at the same site as the entry probe). */
SEC("uretprobe.multi")
int uretprobe__alloc_exit(struct pt_regs *ctx)
{
	if (alloc_paused || !is_active(bpf_get_current_pid_tgid() >> 32))
		return 0;
	count_hit(HITS_ALLOC_EXIT);
	struct alloc_thread *at = bpf_task_storage_get(&alloc_threads, bpf_get_current_task_btf(), 0, 0);
	if (!at || !at->sp || at->generation != alloc_generation)
		return 0;
	/* After the return the stack pointer is one slot above the entry's: anything else is the
	 * return of an internal call. */
	if (PT_REGS_SP(ctx) != at->sp + 8)
		return 0;
	at->sp = 0;
	__u64 ret = PT_REGS_RC(ctx);
	__u64 ptr = ret;
	switch (at->kind) {
	case AF_POSIX_MEMALIGN:
		ptr = 0;
		if ((int)ret == 0)
			bpf_probe_read_user(&ptr, sizeof(ptr), (void *)at->arg);
		break;
	case AF_REALLOC:
		/* realloc(p, 0) frees p and returns NULL; a failed realloc leaves p allocated. */
		if (at->arg && (ret || at->size == 0))
			record_free(at->arg);
		break;
	}
	if (ptr)
		record_alloc(ctx, at, ptr, at->size);
	return 0;
}

/* free & co, probed past their NULL test when the code allows; the argument is still intact. */
SEC("uprobe.multi")
int uprobe__free(struct pt_regs *ctx)
{
	if (alloc_paused || !is_active(bpf_get_current_pid_tgid() >> 32))
		return 0;
	count_hit(HITS_FREE);
	__u64 ptr = PT_REGS_PARM1(ctx);
	if (!ptr)
		return 0;
	struct alloc_thread *at = bpf_task_storage_get(&alloc_threads, bpf_get_current_task_btf(), 0, 0);
	if (at && inside_allocator(at, PT_REGS_SP(ctx)))
		return 0;
	record_free(ptr);
	return 0;
}

/* Go's register ABI: integer arguments in RAX, RBX, RCX, RDI, RSI, R8, R9, R10 (, R11). The
 * registers are copied first: the verifier refuses context reads at a computed offset. */
static __always_inline __u64 go_arg(struct pt_regs *ctx, __u32 index)
{
	__u64 regs[8] = { ctx->ax, ctx->bx, ctx->cx, ctx->di, ctx->si, ctx->r8, ctx->r9, ctx->r10 };
	return regs[index & 7];
}

/* Go's own heap-profile sample (runtime.mProf_Malloc): one allocation Go chose to sample;
 * user space weighs it by the sampling rate. Go frees are not tracked (garbage collected). */
SEC("uprobe")
int uprobe__go_alloc_sample(struct pt_regs *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!is_active(tgid))
		return 0;
	count_hit(HITS_GO_SAMPLE);
	__u64 cookie = bpf_get_attach_cookie(ctx);
	__u64 rate_addr = cookie >> 16;
	struct go_alloc_sample *s = bpf_ringbuf_reserve(&alloc_samples, sizeof(*s), 0);
	if (!s) {
		count_drop(DROP_ALLOC_RINGBUF);
		return 0;
	}
	__u64 mask;
	s->tgid = tgid;
	s->phase = thread_phase_of(&mask);
	s->phase_mask = mask;
	s->size = go_arg(ctx, (cookie >> 8) & 0xff);
	s->rate = 0;
	if (rate_addr)
		bpf_probe_read_user(&s->rate, sizeof(s->rate), (void *)rate_addr);
	s->user_stack = stack_id(ctx, BPF_F_USER_STACK, SLOT_ALLOC, DROP_USER_STACK);
	bpf_ringbuf_submit(s, 0);
	return 0;
}

/* ---- page faults ------------------------------------------------------- */

/* The software page-faults perf event, one per CPU with a period of 1: every fault. */
SEC("perf_event")
int perf_event__pagefault(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!tgid || !is_active(tgid))
		return 0;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	struct cpu_key key = {
		.tgid = tgid,
		.tid = (__u32)id,
		.phase = phase,
		.phase_mask = mask,
		.window = window,
			.kernel_stack = 0,
	};
	if (stack_copy_bytes && bpf_map_lookup_elem(&unwind_pids, &tgid)) {
		if (!send_stack_copy(ctx, &key, STACK_PAGEFAULT))
			add_u64(&pagefault_counts, &key, 1, DROP_PAGEFAULT_KEY);
	} else {
		key.user_stack = stack_id(ctx, BPF_F_USER_STACK, SLOT_FAULT, DROP_USER_STACK);
		add_u64(&pagefault_counts, &key, 1, DROP_PAGEFAULT_KEY);
	}
	if (phases_enabled)
		phases_add_time(mask, PF_PAGE_FAULTS, 1);
	return 0;
}

/* ---- process lifecycle ------------------------------------------------- */

SEC("raw_tp/sched_process_fork")
int BPF_PROG(raw_tp__sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	if (!follow_children)
		return 0;
	__u32 ptgid = BPF_CORE_READ(parent, tgid);
	__u32 ctgid = BPF_CORE_READ(child, tgid);
	/* New threads share the parent's tgid and are covered already. */
	if (ctgid == ptgid || !is_active(ptgid))
		return 0;
	__u32 state = TARGET_ACTIVE;
	if (bpf_map_update_elem(&target_pids, &ctgid, &state, BPF_ANY)) {
		count_drop(DROP_TARGET_FULL);
		return 0;
	}
	/* The child runs the parent's program until it execs: walk its stacks the same way from
	 * its first sample (user space decides again when it sees the fork, and at the exec). */
	__u32 *dwarf = bpf_map_lookup_elem(&unwind_pids, &ptgid);
	if (dwarf)
		bpf_map_update_elem(&unwind_pids, &ctgid, dwarf, BPF_ANY);
	emit(TEV_FORK, ctgid, ptgid);
	return 0;
}

SEC("raw_tp/sched_process_exec")
int raw_tp__sched_process_exec(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u32 *state = bpf_map_lookup_elem(&target_pids, &tgid);
	/* `record -- CMD` without syscall events: the held child becomes a target at its exec
	 * (with them, sys_enter already did so at the execve's entry). */
	if (state && *state == TARGET_ARMED)
		*state = TARGET_ACTIVE;
	if (notify_exec || state)
		emit(TEV_EXEC, tgid, 0);
	return 0;
}

SEC("raw_tp/sched_process_exit")
int raw_tp__sched_process_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	/* A thread's phase state (task storage) goes with the thread. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	/* signal->live reaches 0 when the last thread of the group exits. */
	if (BPF_CORE_READ(task, signal, live.counter) == 0)
		emit(TEV_EXIT, tgid, 0);
	return 0;
}

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
enum go_sched_point _go_sched_point = GO_EXECUTE;
enum go_sched_flag _go_sched_flag = GO_SCHED_CURRENT_G;
