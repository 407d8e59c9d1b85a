/* SPDX-License-Identifier: GPL-2.0 */
/* Allocator probes: totals per phase, sampled stacks, the live heap. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_ALLOCATIONS_BPF_H
#define PHASEPROF_ALLOCATIONS_BPF_H

/* ---- allocations ------------------------------------------------------- */

static __always_inline void add_alloc_totals(__u32 tgid, __u32 phase, __u64 mask, __u64 bytes,
					     __u64 count, __u64 frees)
{
	struct alloc_key key = {.tgid = tgid, .phase = phase, .window = window, .phase_mask = mask};
	struct alloc_value zero = {};
	struct alloc_value *v = lookup_or_init(&alloc_totals, &key, &zero, DROP_ALLOC_KEY);
	if (!v)
		return;
	atomic_add(&v->bytes, bytes);
	atomic_add(&v->count, count);
	atomic_add(&v->frees, frees);
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
		phases_add_alloc(mask, size, window);
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
		.user_stack = user_stack_id(ctx, SLOT_ALLOC, DROP_USER_STACK),
	};
	struct alloc_stack_value zero = {};
	struct alloc_stack_value *v =
		lookup_or_init(&alloc_stacks, &key, &zero, DROP_ALLOC_STACK_KEY);
	if (!v)
		return;
	atomic_add(&v->est_bytes, est);
	atomic_add(&v->samples, 1);
	atomic_add(&v->sampled_bytes, size);
	if (!alloc_live || !ptr)
		return;
	struct live_key lk = {.ptr = ptr, .tgid = tgid};
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
		phases_add_time(mask, PF_FREES, 1, window);
	if (alloc_live) {
		struct live_key lk = {.ptr = ptr, .tgid = tgid};
		bpf_map_delete_elem(&live_allocs, &lk);
	}
}

/* The calling thread's allocator state, created on first use. */
static __always_inline struct alloc_thread *alloc_thread_get(void)
{
	struct alloc_thread *at = thread_local(&alloc_threads, true);
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

/* Entry of malloc & co, an enum alloc_fn `kind` (the cookie's low byte). Probes sit where the
 * return address is still on top of the stack, so sp is the caller's sp at the call. */
static __always_inline int alloc_enter(struct pt_regs *ctx, __u32 kind)
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
static __always_inline int alloc_exit(struct pt_regs *ctx)
{
	if (alloc_paused || !is_active(bpf_get_current_pid_tgid() >> 32))
		return 0;
	count_hit(HITS_ALLOC_EXIT);
	struct alloc_thread *at = thread_local(&alloc_threads, false);
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
static __always_inline int free_call(struct pt_regs *ctx)
{
	if (alloc_paused || !is_active(bpf_get_current_pid_tgid() >> 32))
		return 0;
	count_hit(HITS_FREE);
	__u64 ptr = PT_REGS_PARM1(ctx);
	if (!ptr)
		return 0;
	struct alloc_thread *at = thread_local(&alloc_threads, false);
	if (at && inside_allocator(at, PT_REGS_SP(ctx)))
		return 0;
	record_free(ptr);
	return 0;
}

/* Allocator probes are multi-uprobes (Linux 6.6): one link per program and library, so attaching
 * and detaching them (duty cycling) costs one RCU grace period, not one per function. */
SEC("uprobe.multi")
int uprobe__alloc_enter(struct pt_regs *ctx)
{
	return alloc_enter(ctx, bpf_get_attach_cookie(ctx) & 0xff);
}

SEC("uretprobe.multi")
int uretprobe__alloc_exit(struct pt_regs *ctx)
{
	return alloc_exit(ctx);
}

SEC("uprobe.multi")
int uprobe__free(struct pt_regs *ctx)
{
	return free_call(ctx);
}

/* Twins for kernels without uprobe_multi links (before 6.6): one link per function. */
SEC("uprobe")
int uprobe__alloc_enter_one(struct pt_regs *ctx)
{
	return alloc_enter(ctx, bpf_get_attach_cookie(ctx) & 0xff);
}

/* Without attach cookies (before 5.15): one entry program per enum alloc_fn (the returns and
 * free need none). */
static __noinline int alloc_enter_kind(struct pt_regs *ctx, __u32 kind)
{
	return alloc_enter(ctx, kind);
}

PROBE_FOR(uprobe__alloc_enter_kind_, alloc_enter_kind, 0)
PROBE_FOR(uprobe__alloc_enter_kind_, alloc_enter_kind, 1)
PROBE_FOR(uprobe__alloc_enter_kind_, alloc_enter_kind, 2)
PROBE_FOR(uprobe__alloc_enter_kind_, alloc_enter_kind, 3)
PROBE_FOR(uprobe__alloc_enter_kind_, alloc_enter_kind, 4)

SEC("uretprobe")
int uretprobe__alloc_exit_one(struct pt_regs *ctx)
{
	return alloc_exit(ctx);
}

SEC("uprobe")
int uprobe__free_one(struct pt_regs *ctx)
{
	return free_call(ctx);
}

/* Go's register ABI: integer arguments in RAX, RBX, RCX, RDI, RSI, R8, R9, R10 (, R11). The
 * registers are copied first: the verifier refuses context reads at a computed offset. */
static __always_inline __u64 go_arg(struct pt_regs *ctx, __u32 index)
{
	__u64 regs[8] = {ctx->ax, ctx->bx, ctx->cx, ctx->di, ctx->si, ctx->r8, ctx->r9, ctx->r10};
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
	s->user_stack = user_stack_id(ctx, SLOT_ALLOC, DROP_USER_STACK);
	bpf_ringbuf_submit(s, 0);
	return 0;
}

#endif /* PHASEPROF_ALLOCATIONS_BPF_H */
