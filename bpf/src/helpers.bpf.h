/* SPDX-License-Identifier: GPL-2.0 */
/* Helpers shared by the programs: targets, thread phases, stacks, counters, events. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_HELPERS_BPF_H
#define PHASEPROF_HELPERS_BPF_H

/* Atomically adds `v` to `*p`. An add of zero is skipped, and not only because it changes
 * nothing: LLVM rewrites an atomic add of a known 0 into an atomic OR, an instruction kernels
 * before 5.12 refuse wherever it appears in a program. */
static __always_inline void atomic_add(__u64 *p, __u64 v)
{
	if (v)
		__sync_fetch_and_add(p, v);
}

static __always_inline void count_drop(enum drop_reason reason)
{
	__u32 key = reason;
	__u64 *v = bpf_map_lookup_elem(&drops, &key);
	if (v)
		*v += 1; /* per-CPU: no atomics needed */
}

/* Whether `tgid` may be a target (its bit in target_bits); false: certainly not. */
static __always_inline bool maybe_target(__u32 tgid)
{
	__u32 word = (tgid >> 6) & (TARGET_BIT_WORDS - 1);
	__u64 *w = bpf_map_lookup_elem(&target_bits, &word);
	return w && ((*w >> (tgid & 63)) & 1);
}

/* Sets tgid's bit; `atomic_or` false on kernels before 5.12, which refuse an atomic OR
 * instruction anywhere in a program: the bit is then added once if unset (a tgid's bit is set
 * once, at its fork, so two adds of the same bit do not race). */
static __always_inline void set_target_bit(__u32 tgid, bool atomic_or)
{
	__u32 word = (tgid >> 6) & (TARGET_BIT_WORDS - 1);
	__u64 *w = bpf_map_lookup_elem(&target_bits, &word);
	if (!w)
		return;
	__u64 bit = 1ULL << (tgid & 63);
	if (atomic_or)
		__sync_fetch_and_or(w, bit);
	else if (!(*w & bit))
		atomic_add(w, bit);
}

static __always_inline bool is_active(__u32 tgid)
{
	if (stopped || !maybe_target(tgid))
		return false;
	__u32 *state = bpf_map_lookup_elem(&target_pids, &tgid);
	return state && *state == TARGET_ACTIVE;
}

/*
 * The current thread's record in per-thread map `map`, created zeroed when `create`: task-local
 * storage (a pointer away, freed by the kernel with the thread), or on kernels without it a hash
 * keyed by tid (its entries deleted at the thread's exit, see lifecycle.bpf.h).
 */
static __always_inline void *thread_local(void *map, bool create)
{
	if (have_task_storage)
		return bpf_task_storage_get(map, bpf_get_current_task_btf(), 0,
					    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	__u32 tid = (__u32)bpf_get_current_pid_tgid();
	void *v = bpf_map_lookup_elem(map, &tid);
	if (v || !create)
		return v;
	__u32 zero = 0;
	void *zeros = bpf_map_lookup_elem(&thread_zeros, &zero);
	if (!zeros)
		return NULL;
	bpf_map_update_elem(map, &tid, zeros, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, &tid);
}

/* The current task, for reads of its fields (any kernel: not a BTF pointer). */
static __always_inline struct task_struct *current_task(void)
{
	return (struct task_struct *)bpf_get_current_task();
}

/* x86-64's THREAD_SIZE without KASAN (distribution kernels): task_pt_regs() is at its top. */
#define KERNEL_STACK_SIZE (16 * 1024)

/* The current thread's user registers, saved at its entry into the kernel (a syscall, an
 * interrupt, a uprobe's trap). */
static __always_inline struct pt_regs *current_user_regs(void)
{
	if (have_task_pt_regs)
		return (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	void *stack = BPF_CORE_READ(current_task(), stack);
	return (struct pt_regs *)(stack + KERNEL_STACK_SIZE) - 1;
}

/* Whether `tp`'s view (`top`, `mask`) holds: set in the phase slice in force. Between slices
 * none does: a probe that passed its pause check just before a slice ended may set a view
 * after the end's generation bump, which the pause voids. */
static __always_inline bool view_current(struct thread_phase *tp)
{
	return !phases_paused && tp->generation == phase_generation;
}

/* The innermost phase `tp`'s events are charged to, and the mask of all: none when they were
 * set in an earlier phase slice (see phase_generation). */
static __always_inline __u32 view_of(struct thread_phase *tp, __u64 *mask)
{
	if (!view_current(tp)) {
		*mask = 1;
		return PHASE_NONE;
	}
	*mask = tp->mask ? tp->mask : 1;
	return tp->top;
}

/* The innermost phase the current thread's events are charged to, and the mask of all. */
static __always_inline __u32 thread_phase_of(__u64 *mask)
{
	*mask = 1;
	/* Between a phase budget's slices no thread is in a phase (see view_current). */
	if (!phases_enabled || phases_paused)
		return PHASE_NONE;
	struct thread_phase *tp = thread_local(&thread_phases, false);
	if (!tp)
		return PHASE_NONE;
	return view_of(tp, mask);
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
	struct thread_phase *tp = thread_local(&thread_phases, create);
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
	0,  1,	48, 2,	57, 49, 28, 3,	61, 58, 50, 42, 38, 29, 17, 4,	62, 55, 59, 36, 53, 51,
	43, 22, 45, 39, 33, 30, 24, 18, 12, 5,	63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21,
	44, 32, 23, 11, 46, 26, 40, 15, 34, 20, 31, 10, 25, 14, 19, 9,	13, 8,	7,  6,
};

static __always_inline __u32 lowest_bit(__u64 mask)
{
	return debruijn64[((mask & -mask) * 0x03f79d71b4cb0a89ULL) >> 58];
}

enum phase_field {
	PF_CPU,
	PF_OFFCPU,
	PF_PAGE_FAULTS,
	PF_FREES,
	PF_GOWAIT,
	PF_CPUWAIT
};

/* Phase `id`'s totals in window `win`'s half of phase_stats: user space takes one half while
 * the other fills, as the counter maps' keys carry the window, so that a window's phase table
 * and its samples hold the same events. Callers with a counter key pass the key's window. */
static __always_inline struct phase_stats *phase_stats_of(__u32 id, __u32 win)
{
	__u32 key = (id & (MAX_PHASES - 1)) + (win & 1) * MAX_PHASES;
	return bpf_map_lookup_elem(&phase_stats, &key);
}

/* Adds `ns` of on-CPU or off-CPU time (or a count of another field) to every phase in `mask`
 * (inclusive attribution), in window `win`. Global functions like this one are verified once,
 * not once per caller and path. */
__noinline int phases_add_time(__u64 mask, __u32 field, __u64 ns, __u32 win)
{
	if (mask == 1 && phases_sliced)
		return 0; /* (none) under a phase budget: its totals are not kept */
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = phase_stats_of(id, win);
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
		else if (field == PF_CPUWAIT)
			st->cpuwait_ns += ns;
		else
			st->frees += ns;
	}
	return 0;
}

/* Counts one allocation of `bytes` in every phase of `mask`. */
__noinline int phases_add_alloc(__u64 mask, __u64 bytes, __u32 win)
{
	if (mask == 1 && phases_sliced)
		return 0; /* (none) under a phase budget: its totals are not kept */
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = phase_stats_of(id, win);
		if (!st)
			continue;
		st->alloc_bytes += bytes;
		st->allocs += 1;
	}
	return 0;
}

/* Counts a syscall of `nr` taking `ns` in every phase of `mask`, with its cost rules. */
__noinline int phases_add_syscall(__u64 mask, __u32 nr, __u64 ns, __u32 win)
{
	if (mask == 1 && phases_sliced)
		return 0; /* (none) under a phase budget: its totals are not kept */
	__u8 costs = syscall_cost_bits[nr & (MAX_SYSCALL_NR - 1)];
	if (nr >= MAX_SYSCALL_NR)
		costs = 0;
	for (int i = 0; i < MAX_PHASE_DEPTH + 1 && mask; i++) {
		__u32 id = lowest_bit(mask);
		mask &= mask - 1;
		struct phase_stats *st = phase_stats_of(id, win);
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
	if (v >> 32) {
		v >>= 32;
		msb += 32;
	}
	if (v >> 16) {
		v >>= 16;
		msb += 16;
	}
	if (v >> 8) {
		v >>= 8;
		msb += 8;
	}
	if (v >> 4) {
		v >>= 4;
		msb += 4;
	}
	if (v >> 2) {
		v >>= 2;
		msb += 2;
	}
	if (v >> 1) {
		msb += 1;
	}
	__u32 idx = (msb - 3) * WALL_SUB_BUCKETS + ((ns >> (msb - 4)) & (WALL_SUB_BUCKETS - 1));
	return idx < WALL_BUCKETS ? idx : WALL_BUCKETS - 1;
}

/* Adds the on-CPU segment since `oncpu_since` to the pending time of the current phases. */
static __always_inline void charge_cpu(struct thread_phase *tp, __u64 now)
{
	if (tp->oncpu_since && now > tp->oncpu_since) {
		__u64 seg = now - tp->oncpu_since;
		__u64 mask = view_current(tp) ? tp->mask : 1;
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
	__u32 win = window;
	for (int i = 0; i < MAX_PHASES && mask; i++) {
		__u32 id = lowest_bit(mask) & (MAX_PHASES - 1);
		mask &= mask - 1;
		__u64 ns = (tp->pending[id] * scale) >> 16;
		tp->pending[id] = 0;
		struct phase_stats *st = phase_stats_of(id, win);
		if (st)
			st->cpu_ns += ns;
	}
	tp->pending_mask = 0;
	tp->oncpu_since = 0;
	tp->slice_start = 0;
}

/* Adds `n` to this CPU's probe counter `c` (hits, or ns). */
static __always_inline void count_add(enum probe_counter c, __u64 n)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&probe_hits, &key);
	if (v)
		*v += n;
}

static __always_inline void count_hit(enum probe_counter c)
{
	count_add(c, 1);
}

/* Empties `ps` when its entries are of an earlier phase slice (see phase_generation). */
static __always_inline void phase_stack_current(struct phase_stack *ps)
{
	if (ps->generation == phase_generation)
		return;
	if (ps->depth)
		count_add(PHASE_CALLS_VOIDED, ps->depth);
	ps->depth = 0;
	ps->top = PHASE_NONE;
	ps->mask = 1;
	ps->generation = phase_generation;
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
	tp->generation = phase_generation;
}

/* FNV-1a over the addresses of the scratch stack of `slot`, never 0 or STACK_NOT_SAMPLED.
 * Global: verified once, not in every caller; its arguments are scalars, which global functions
 * take on every kernel (pointers only since 5.12). */
__noinline __u64 hash_stack(__u32 slot, __u64 seed)
{
	struct stack_trace *st = bpf_map_lookup_elem(&stack_scratch, &slot);
	if (!st)
		return 1;
	__u64 h = seed;
	__u32 len = st->len;
	for (__u32 i = 0; i < MAX_STACK_DEPTH; i++) {
		if (i >= len)
			break;
		h = (h ^ st->ips[i]) * 0x100000001b3ULL;
	}
	return h > STACK_NOT_SAMPLED ? h : STACK_NOT_SAMPLED + 1;
}

#define USER_STACK_SEED 0xcbf29ce484222325ULL
#define KERNEL_STACK_SEED 0x84222325cbf29ce4ULL

/* Stores `st` (the scratch stack of `slot`) under the hash of its addresses and returns the
 * hash; 0 when it could not be stored (counted as a drop of `reason`). */
static __always_inline __u64 store_stack(struct stack_trace *st, enum stack_slot slot, __u64 seed,
					 enum drop_reason reason)
{
	__u64 h = hash_stack(slot, seed);
	/* `slot` is a constant at every (inlined) call: one map per caller, no map pointer that
	 * differs by path. Odd keys live in irq_stacks, even ones in stacks (h >= 2 here). */
	void *map = &stacks;
	if (slot == SLOT_SAMPLE) {
		h |= 1;
		map = &irq_stacks;
	} else {
		h &= ~1ULL;
	}
	/* Most stacks repeat: a lock-free lookup saves the bucket lock of an update. */
	if (bpf_map_lookup_elem(map, &h))
		return h;
	long err = bpf_map_update_elem(map, &h, st, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count_drop(reason);
		return 0;
	}
	return h;
}

/*
 * Stores the current stack (user with BPF_F_USER_STACK, by the kernel's frame-pointer walk;
 * else kernel) and returns its key; 0 when there is no stack (-EFAULT: a kernel stack of a
 * thread in user mode) or it could not be stored (counted as a drop).
 */
static __always_inline __u64 stack_id(void *ctx, __u64 flags, enum stack_slot slot,
				      enum drop_reason reason)
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
	st->len = n / sizeof(__u64);
	st->pad = 0;
	return store_stack(st, slot, flags & BPF_F_USER_STACK ? USER_STACK_SEED : KERNEL_STACK_SEED,
			   reason);
}

/* Adds `delta` to the u64 under `key`, creating it if needed. */
static __always_inline void add_u64(void *map, void *key, __u64 delta, enum drop_reason reason)
{
	__u64 *v = bpf_map_lookup_elem(map, key);
	if (v) {
		atomic_add(v, delta);
		return;
	}
	long err = bpf_map_update_elem(map, key, &delta, BPF_NOEXIST);
	if (!err)
		return;
	if (err == -EEXIST) { /* another CPU created it meanwhile */
		v = bpf_map_lookup_elem(map, key);
		if (v) {
			atomic_add(v, delta);
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

static __always_inline void add_syscall(struct syscall_key *key, __u64 count, __u64 ns,
					__u64 errors)
{
	struct syscall_value zero = {};
	struct syscall_value *v = lookup_or_init(&syscall_counts, key, &zero, DROP_SYSCALL_KEY);
	if (!v)
		return;
	atomic_add(&v->count, count);
	atomic_add(&v->total_ns, ns);
	if (errors)
		atomic_add(&v->errors, errors);
}

/*
 * Kernels without attach cookies (before 5.15): one program per value the cookie would carry,
 * chosen by user space by name (`<prog><value>`) and loaded only for the values in use. The
 * bodies are static and not inlined: each is in the object once.
 */
#define PROBE_FOR(prog, body, n)                                                                   \
	SEC("uprobe") int prog##n(struct pt_regs *ctx)                                             \
	{                                                                                          \
		return body(ctx, n);                                                               \
	}
#define PROBES_FOR_TENS(prog, body, tens)                                                          \
	PROBE_FOR(prog, body, tens##0)                                                             \
	PROBE_FOR(prog, body, tens##1)                                                             \
	PROBE_FOR(prog, body, tens##2)                                                             \
	PROBE_FOR(prog, body, tens##3)                                                             \
	PROBE_FOR(prog, body, tens##4)                                                             \
	PROBE_FOR(prog, body, tens##5)                                                             \
	PROBE_FOR(prog, body, tens##6)                                                             \
	PROBE_FOR(prog, body, tens##7)                                                             \
	PROBE_FOR(prog, body, tens##8)                                                             \
	PROBE_FOR(prog, body, tens##9)
/* Phase ids 1..MAX_PHASES-1 (63). */
#define PROBES_FOR_PHASE_IDS(prog, body)                                                           \
	PROBE_FOR(prog, body, 1)                                                                   \
	PROBE_FOR(prog, body, 2)                                                                   \
	PROBE_FOR(prog, body, 3)                                                                   \
	PROBE_FOR(prog, body, 4)                                                                   \
	PROBE_FOR(prog, body, 5)                                                                   \
	PROBE_FOR(prog, body, 6)                                                                   \
	PROBE_FOR(prog, body, 7)                                                                   \
	PROBE_FOR(prog, body, 8)                                                                   \
	PROBE_FOR(prog, body, 9)                                                                   \
	PROBES_FOR_TENS(prog, body, 1)                                                             \
	PROBES_FOR_TENS(prog, body, 2)                                                             \
	PROBES_FOR_TENS(prog, body, 3)                                                             \
	PROBES_FOR_TENS(prog, body, 4)                                                             \
	PROBES_FOR_TENS(prog, body, 5)                                                             \
	PROBE_FOR(prog, body, 60)                                                                  \
	PROBE_FOR(prog, body, 61)                                                                  \
	PROBE_FOR(prog, body, 62)                                                                  \
	PROBE_FOR(prog, body, 63)

#endif /* PHASEPROF_HELPERS_BPF_H */
