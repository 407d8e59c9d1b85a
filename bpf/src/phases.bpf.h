/* SPDX-License-Identifier: GPL-2.0 */
/* Phase probes: native entry/exit, Go entry/return instructions, Go scheduler switches. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_PHASES_BPF_H
#define PHASEPROF_PHASES_BPF_H

/* ---- phases ------------------------------------------------------------ */

/*
 * Each phase program is defined twice over one body: as a uprobe (one link per probe) and as a
 * multi-uprobe (Linux 6.6, with cookies: one link per program and file). User space attaches
 * the multi-uprobes where the kernel has them: a phase budget's slice then attaches and detaches
 * all its probes at once, where single links retire one RCU grace period after another (~100 ms
 * each here), their breakpoints trapping meanwhile.
 */
#define PHASE_PROGRAM(sec, name, body)                                                             \
	SEC(sec) int name(struct pt_regs *ctx)                                                     \
	{                                                                                          \
		return body(ctx);                                                                  \
	}                                                                                          \
	SEC(sec ".multi") int name##_multi(struct pt_regs *ctx)                                    \
	{                                                                                          \
		return body(ctx);                                                                  \
	}

/*
 * A phase program's clock read, first thing (`now`, the hit's time), and the end of its work
 * for a target: NS_PHASE_WORK from one to the other. The target lookups count: they are most of
 * a hit's work beyond the uprobe machinery (on a hot loop, enter and exit ran 205 ns a call
 * for a target, of which a clock read after the lookups timed 68 ns). The calibration's
 * programs (no target) also look up and read the clock, before returning at once: that overlap
 * is about the clock read and counter update after `now` that no timing sees.
 */
static __always_inline __u64 phase_work_begins(void)
{
	return bpf_ktime_get_ns();
}

static __always_inline void phase_work_done(__u64 now)
{
	count_add(NS_PHASE_WORK, bpf_ktime_get_ns() - now);
}

/* Pushes an entry of `phase`. Direct recursion counts one call, at the outermost entry;
 * entries beyond MAX_PHASE_DEPTH are counted as drops (and popped again by their returns). */
static __always_inline void phase_push(struct phase_stack *ps, __u32 phase, __u64 now)
{
	phase_stack_current(ps);
	__u32 d = ps->depth;
	if (d >= 1 && d <= MAX_PHASE_DEPTH &&
	    ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)].phase == phase) {
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

/* A target's return from a phase function whose entry was not seen: entered before recording
 * began, or (under a phase budget) before the slice in force began, a call the slices cut. */
static __always_inline void phase_exit_unmatched(void)
{
	if (phases_sliced)
		count_hit(PHASE_CALLS_VOIDED);
	else
		count_drop(INFO_PHASE_EXIT_UNMATCHED);
}

/* Counts a completed call of `phase` that took `wall` ns. */
static __always_inline void phase_call_done(__u32 phase, __u64 wall)
{
	struct phase_stats *st = phase_stats_of(phase, window);
	if (!st)
		return;
	st->calls += 1;
	st->wall_ns += wall;
	if (wall > st->wall_max_ns)
		st->wall_max_ns = wall;
	/* Masked where it is used: the 6.1 verifier loses a bound checked on another copy of the
	 * index (`R0 unbounded memory access`). WALL_BUCKETS is a power of two. */
	__u32 b = wall_bucket(wall);
	st->wall_hist[b & (WALL_BUCKETS - 1)] += 1;
}

/* Pops the innermost entry for a return of `phase` (a non-empty stack; PHASE_ANY: whichever is
 * innermost) and counts the call, on the stretch `a` of its thread's or goroutine's reads. */
static __always_inline void phase_pop(struct read_align *a, struct phase_stack *ps, __u32 phase,
				      __u64 now)
{
	__u32 d = ps->depth;
	if (d > MAX_PHASE_DEPTH) {
		ps->depth = d - 1; /* an overflowed entry */
		return;
	}
	struct phase_frame *f = &ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)];
	if (phase != PHASE_ANY && f->phase != phase) {
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
	align_call_done(a);
}

/* The phase id a probe was attached for (its cookie); PHASE_ANY without cookies. */
static __always_inline __u32 probe_phase(struct pt_regs *ctx)
{
	if (!have_attach_cookie)
		return PHASE_ANY;
	return bpf_get_attach_cookie(ctx) & (MAX_PHASES - 1);
}

/* Entry of a phase function (native code). */
static __always_inline int phase_enter(__u32 phase)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	/* Time on-CPU until now belongs to the enclosing phases. */
	charge_cpu(tp, now);
	phase_push(&tp->own, phase & (MAX_PHASES - 1), now);
	thread_view(tp, &tp->own);
	phase_work_done(now);
	return 0;
}

/* The attach cookie is the phase id. */
static __always_inline int phase_enter_cookie(struct pt_regs *ctx)
{
	return phase_enter(bpf_get_attach_cookie(ctx));
}

PHASE_PROGRAM("uprobe", uprobe__phase_enter, phase_enter_cookie)

/* Kernels without attach cookies: one entry program per phase id (see PROBE_FOR). */
static __noinline int phase_enter_id(struct pt_regs *ctx, __u32 phase)
{
	return phase_enter(phase);
}

PROBES_FOR_PHASE_IDS(uprobe__phase_enter_, phase_enter_id)

/* Return of a phase function (native code): a uretprobe. */
static __always_inline int phase_exit(struct pt_regs *ctx)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	struct thread_phase *tp = stopped ? NULL : thread_phase_current(false);
	if (tp)
		phase_stack_current(&tp->own);
	if (!tp || tp->own.depth == 0) {
		/* Entered before we attached. */
		if (is_active(bpf_get_current_pid_tgid() >> 32))
			phase_exit_unmatched();
		return 0;
	}
	charge_cpu(tp, now);
	phase_pop(&tp->align, &tp->own, probe_phase(ctx), now);
	thread_view(tp, &tp->own);
	phase_work_done(now);
	return 0;
}

PHASE_PROGRAM("uretprobe", uretprobe__phase_exit, phase_exit)

/* Whether `phase` is the innermost phase of `ps`. */
static __always_inline bool phase_on_top(struct phase_stack *ps, __u32 phase)
{
	phase_stack_current(ps);
	__u32 d = ps->depth;
	if (d == 0 || d > MAX_PHASE_DEPTH)
		return false;
	return ps->frames[(d - 1) & (MAX_PHASE_DEPTH - 1)].phase == phase;
}

/* The first instruction after an inlined copy of a phase function (native code), where its
 * caller goes on: the copy's end. The caller also gets there on paths that skipped the copy,
 * with nothing to end (needs attach cookies: the phase must be known). */
static __always_inline int phase_leave(struct pt_regs *ctx)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	struct thread_phase *tp = stopped ? NULL : thread_phase_current(false);
	__u32 phase = probe_phase(ctx);
	if (!tp || !phase_on_top(&tp->own, phase))
		return 0;
	charge_cpu(tp, now);
	phase_pop(&tp->align, &tp->own, phase, now);
	thread_view(tp, &tp->own);
	phase_work_done(now);
	return 0;
}

PHASE_PROGRAM("uprobe", uprobe__phase_leave, phase_leave)

/* The phase state of the goroutine `key`, NULL when it has none or only of an earlier phase
 * slice (which is deleted: the goroutine may never enter a phase again). */
static __always_inline struct goroutine_phase *goroutine_phase_current(struct goroutine_key *key)
{
	struct goroutine_phase *gp = bpf_map_lookup_elem(&goroutine_phases, key);
	if (gp && gp->stack.generation != phase_generation) {
		bpf_map_delete_elem(&goroutine_phases, key);
		return NULL;
	}
	return gp;
}

/* Go's register ABI keeps the running goroutine's g in R14. */
static __always_inline __u64 go_current_g(struct pt_regs *ctx)
{
	return ctx->r14;
}

/* Entry of a Go phase function: the phase goes on the stack of the goroutine, wherever it runs
 * later. */
static __always_inline int go_phase_enter(struct pt_regs *ctx, __u32 phase)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	phase &= MAX_PHASES - 1;
	struct goroutine_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
				    .g = go_current_g(ctx)};
	struct goroutine_phase zero = {};
	struct goroutine_phase *gp =
		lookup_or_init(&goroutine_phases, &key, &zero, DROP_GOROUTINE_FULL);
	if (!gp)
		return 0;
	if (gp->stack.generation != phase_generation)
		gp->parked_since = 0; /* of an earlier phase slice */
	charge_cpu(tp, now);
	phase_push(&gp->stack, phase, now);
	thread_view(tp, &gp->stack);
	tp->cur_g = key.g;
	phase_work_done(now);
	return 0;
}

/* The attach cookie is the phase id. */
static __always_inline int go_phase_enter_cookie(struct pt_regs *ctx)
{
	return go_phase_enter(ctx, bpf_get_attach_cookie(ctx));
}

PHASE_PROGRAM("uprobe", uprobe__go_phase_enter, go_phase_enter_cookie)

static __noinline int go_phase_enter_id(struct pt_regs *ctx, __u32 phase)
{
	return go_phase_enter(ctx, phase);
}

PROBES_FOR_PHASE_IDS(uprobe__go_phase_enter_, go_phase_enter_id)

/* The end of a call of a Go phase function: `leave`, the first instruction after an inlined
 * copy (reached on paths that skipped the copy too, with nothing to end), else a return. */
static __always_inline int go_phase_end(struct pt_regs *ctx, bool leave)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct goroutine_key key = {.tgid = tgid, .g = go_current_g(ctx)};
	struct goroutine_phase *gp = goroutine_phase_current(&key);
	if (leave && (!gp || !phase_on_top(&gp->stack, probe_phase(ctx))))
		return 0;
	if (!gp || gp->stack.depth == 0) {
		if (is_active(tgid))
			phase_exit_unmatched();
		return 0;
	}
	struct thread_phase *tp = target_thread_phase();
	if (tp)
		charge_cpu(tp, now);
	phase_pop(goroutine_align(&key, false), &gp->stack, probe_phase(ctx), now);
	if (tp) {
		thread_view(tp, &gp->stack);
		tp->cur_g = key.g;
	}
	/* Outside every phase the goroutine needs no state (and its g may be reused). */
	if (gp->stack.depth == 0)
		bpf_map_delete_elem(&goroutine_phases, &key);
	phase_work_done(now);
	return 0;
}

/* A return instruction of a Go phase function (never a uretprobe, which would corrupt moving
 * goroutine stacks). */
static __always_inline int go_phase_return(struct pt_regs *ctx)
{
	return go_phase_end(ctx, false);
}

PHASE_PROGRAM("uprobe", uprobe__go_phase_return, go_phase_return)

/* The first instruction after an inlined copy of a Go phase function (needs attach cookies). */
static __always_inline int go_phase_leave(struct pt_regs *ctx)
{
	return go_phase_end(ctx, true);
}

PHASE_PROGRAM("uprobe", uprobe__go_phase_leave, go_phase_leave)

/*
 * The Go scheduler's switch points, which change the goroutine an OS thread runs without a
 * kernel context switch. Each takes the goroutine as its first argument (RAX), but mcall, which
 * runs on the stopping goroutine (R14). At GO_EXECUTE
 * the thread starts charging its events to gp's phases, and the time gp spent descheduled inside
 * a phase since its last GO_STOP is its goroutine wait; at GO_STOP and GO_EXIT the thread runs
 * scheduler code that belongs to no phase.
 */
static __always_inline int go_sched(struct pt_regs *ctx, __u64 cookie)
{
	if (phases_paused)
		return 0;
	__u64 now = phase_work_begins();
	struct thread_phase *tp = target_thread_phase();
	if (!tp)
		return 0;
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	count_hit(HITS_GO_SCHED);
	__u32 point = cookie & 0xff;
	/* Both registers are read as they are: the verifier refuses a context read at an offset
	 * the compiler would otherwise select. */
	__u64 running = go_current_g(ctx), arg = ctx->ax;
	barrier_var(running);
	barrier_var(arg);
	struct goroutine_key key = {
		.tgid = tgid,
		.g = cookie & GO_SCHED_CURRENT_G ? running : arg,
	};
	struct goroutine_phase *gp = goroutine_phase_current(&key);
	charge_cpu(tp, now);
	if (point == GO_EXECUTE && gp) {
		thread_view(tp, &gp->stack);
		tp->cur_g = key.g;
	} else {
		thread_view(tp, NULL);
		tp->cur_g = point == GO_EXECUTE ? key.g : 0;
	}
	if (!gp) {
		phase_work_done(now);
		return 0;
	}
	if (point == GO_EXECUTE) {
		if (gp->parked_since && now > gp->parked_since)
			phases_add_time(gp->stack.mask, PF_GOWAIT, now - gp->parked_since, window);
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
	phase_work_done(now);
	return 0;
}

/* The attach cookie is the enum go_sched_point, with GO_SCHED_CURRENT_G. */
static __always_inline int go_sched_cookie(struct pt_regs *ctx)
{
	return go_sched(ctx, bpf_get_attach_cookie(ctx));
}

PHASE_PROGRAM("uprobe", uprobe__go_sched, go_sched_cookie)

static __noinline int go_sched_point(struct pt_regs *ctx, __u64 cookie)
{
	return go_sched(ctx, cookie);
}

/* Without cookies: one program per cookie value (GO_SCHED_CURRENT_G is 256). */
PROBE_FOR(uprobe__go_sched_, go_sched_point, 0)
PROBE_FOR(uprobe__go_sched_, go_sched_point, 1)
PROBE_FOR(uprobe__go_sched_, go_sched_point, 2)
PROBE_FOR(uprobe__go_sched_, go_sched_point, 256)
PROBE_FOR(uprobe__go_sched_, go_sched_point, 257)
PROBE_FOR(uprobe__go_sched_, go_sched_point, 258)

#endif /* PHASEPROF_PHASES_BPF_H */
