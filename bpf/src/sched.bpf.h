/* SPDX-License-Identifier: GPL-2.0 */
/* Off-CPU time at sched_switch and sched_wakeup (tp_btf), split by why the thread was off:
 * blocked, or runnable and waiting for a CPU. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_SCHED_BPF_H
#define PHASEPROF_SCHED_BPF_H

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

/* The current thread `prev` leaves the CPU: its stacks and phase, for its switch-in. */
static __always_inline void record_switch_out(void *ctx, bool preempt, __u32 tgid, __u32 tid,
					      __u64 state, __u64 now, __u64 runtime)
{
	__u64 mask = 1;
	__u32 phase = PHASE_NONE;
	if (phases_enabled) {
		/* prev is the current task. */
		struct thread_phase *tp = thread_phase_current(false);
		if (tp) {
			end_slice(tp, now, runtime);
			phase = view_of(tp, &mask);
		}
	}
	/* Preempted (or still TASK_RUNNING: it yielded) it waits for a CPU from now on. A thread
	 * preempted after arming a timer and before blocking may find it expired when it runs
	 * again and never block: its sleep was a wait for a CPU (as the kernel's run delay counts
	 * it too). */
	bool runnable = preempt || state == 0;
	bool walk = true;
	__u32 every = 1;
	if (offcpu_stack_walks_per_sec) {
		struct stack_rate *rate = bpf_map_lookup_elem(&offcpu_rates, &tid);
		if (!rate) {
			struct stack_rate zero = {};
			bpf_map_update_elem(&offcpu_rates, &tid, &zero, BPF_NOEXIST);
			rate = bpf_map_lookup_elem(&offcpu_rates, &tid);
		}
		/* The one-in-N this switch-out was drawn at: take_stack may set the next one. */
		if (rate && rate->every > 1)
			every = rate->every;
		walk = !rate || take_stack(rate, offcpu_stack_walks_per_sec);
	}
	/* prev is current here, so the stacks are prev's. */
	struct offcpu_start start = {
		.ts = now,
		.runnable_ts = runnable ? now : 0,
		.tgid = tgid,
		.phase = phase,
		.user_stack =
			walk ? user_stack_id(ctx, SLOT_SWITCH, DROP_USER_STACK) : STACK_NOT_SAMPLED,
		.kernel_stack = walk ? stack_id(ctx, 0, SLOT_SWITCH, DROP_KERNEL_STACK) : 0,
		.phase_mask = mask,
		.runtime = runtime,
		.every = walk ? every : 0,
	};
	if (walk && offcpu_stack_walks_per_sec)
		start.walk_ns = bpf_ktime_get_ns() - now;
	if (bpf_map_update_elem(&offcpu_starts, &tid, &start, BPF_ANY))
		count_drop(DROP_OFFCPU_START);
}

/* Adds `off` ns off-CPU, `runnable` of them waiting for a CPU, under `key`, weighted by
 * `every` (see struct offcpu_value). */
static __always_inline void add_offcpu(struct offcpu_key *key, __u64 off, __u64 runnable,
				       __u32 every)
{
	struct offcpu_value zero = {};
	struct offcpu_value *v = lookup_or_init(&offcpu_counts, key, &zero, DROP_OFFCPU_KEY);
	if (!v)
		return;
	atomic_add(&v->ns, off);
	if (every)
		atomic_add(&v->ns_weighted, off * every);
	if (runnable) {
		atomic_add(&v->cpu_wait_ns, runnable);
		if (every)
			atomic_add(&v->cpu_wait_weighted, runnable * every);
	}
}

/* Credits `off` ns off-CPU, from the switch-out `start` recorded to `end` (the switch-in), to
 * its stacks and phases; the time since it became runnable is the wait for a CPU. */
static __always_inline void credit_offcpu(struct offcpu_start *start, __u32 tid, __u64 off,
					  __u64 end)
{
	struct offcpu_key key = {
		.tgid = start->tgid,
		.tid = tid,
		.phase = start->phase,
		.window = window,
		.user_stack = start->user_stack,
		.kernel_stack = start->kernel_stack,
		.phase_mask = start->phase_mask,
	};
	__u64 runnable =
		start->runnable_ts && end > start->runnable_ts ? end - start->runnable_ts : 0;
	if (runnable > off)
		runnable = off;
	/* With sampled stacks, the walks' own time at a sampled switch-out goes with the unsampled
	 * ones: an unsampled switch-out has no walk, so a sampled stack keeping it would weigh
	 * more than its share when they are spread over it (a walk, ~3 us, is as long as a short
	 * interval). */
	__u64 walk = (__u64)start->walk_ns < off ? start->walk_ns : 0;
	if (walk) {
		__u64 walk_end = start->ts + walk;
		__u64 walk_wait = 0;
		if (start->runnable_ts && start->runnable_ts < walk_end)
			walk_wait = walk_end - start->runnable_ts;
		if (walk_wait > runnable)
			walk_wait = runnable;
		struct offcpu_key unsampled = key;
		unsampled.user_stack = STACK_NOT_SAMPLED;
		unsampled.kernel_stack = 0;
		add_offcpu(&unsampled, walk, walk_wait, 0);
		add_offcpu(&key, off - walk, runnable - walk_wait, start->every);
	} else {
		add_offcpu(&key, off, runnable, start->every);
	}
	if (phases_enabled) {
		phases_add_time(key.phase_mask, PF_OFFCPU, off, key.window);
		if (runnable)
			phases_add_time(key.phase_mask, PF_CPUWAIT, runnable, key.window);
	}
}

/*
 * A thread switching out that still has a switch-out on record was switched in without the
 * tracepoint reporting it: seen on 6.18 beside CPU hogs, about once per 400 sleeps, by tracefs
 * as well, and the interval was lost when the new switch-out overwrote the old. What the
 * thread was off the CPU since that switch-out is the time gone less the CPU time it ran since
 * (sum_exec_runtime, which the scheduler updates before the tracepoint): exact, not a guess.
 */
static __always_inline void credit_unseen_switch_in(__u32 tid, __u64 now, __u64 runtime)
{
	struct offcpu_start *stale = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (!stale)
		return;
	__u64 gone = now - stale->ts;
	__u64 ran = runtime - stale->runtime;
	if (gone > ran)
		credit_offcpu(stale, tid, gone - ran, stale->ts + gone - ran);
	bpf_map_delete_elem(&offcpu_starts, &tid);
}

static __always_inline void on_switch(void *ctx, bool preempt, struct task_struct *prev,
				      struct task_struct *next)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 prev_tgid = BPF_CORE_READ(prev, tgid);
	/* A dying thread's last switch-out is never followed by a switch-in. */
	__u32 prev_tid = BPF_CORE_READ(prev, pid);
	__u64 state = task_state(prev);
	/* Only the stop itself is ours: a held thread preempted before its SIGSTOP lands, or whose
	 * SIGSTOP a SIGCONT cancelled, keeps the hold until it really stops, and its waits count. */
	bool held = entry_holds && (state & TASK_STOPPED_BIT) &&
		    !bpf_map_delete_elem(&entry_held, &prev_tid);
	if (held)
		__sync_fetch_and_add(&entry_holds, -1);
	if (prev_tgid && is_active(prev_tgid)) {
		__u64 runtime = BPF_CORE_READ(prev, se.sum_exec_runtime);
		credit_unseen_switch_in(prev_tid, now, runtime);
		/* Stopped by us: no wait of its own. */
		if (!held && !(state & TASK_DEAD))
			record_switch_out(ctx, preempt, prev_tgid, prev_tid, state, now, runtime);
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
	credit_offcpu(start, next_tid, now - start->ts, now);
	bpf_map_delete_elem(&offcpu_starts, &next_tid);
	/* The target switched in pays for this program (see NS_SWITCH_TO_TARGET). */
	count_add(NS_SWITCH_TO_TARGET, bpf_ktime_get_ns() - now);
}

/* A blocked target thread was woken: from now on it waits for a CPU. */
static __always_inline void on_wakeup(struct task_struct *p)
{
	__u32 tgid = BPF_CORE_READ(p, tgid);
	if (!is_active(tgid))
		return;
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = BPF_CORE_READ(p, pid);
	struct offcpu_start *start = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (start && !start->runnable_ts)
		start->runnable_ts = now;
	/* The waker pays for this program: counted when it is a target (its own thread woken,
	 * as a futex or pipe hand-off does, or another target's). */
	__u32 waker = bpf_get_current_pid_tgid() >> 32;
	if (waker == tgid || is_active(waker))
		count_add(NS_SWITCH_TO_TARGET, bpf_ktime_get_ns() - now);
}

/* tp_btf: typed arguments, cheaper than raw_tp; every kernel with the BTF that CO-RE needs
 * takes it. */
SEC("tp_btf/sched_switch")
int BPF_PROG(tp_btf__sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	on_switch(ctx, preempt, prev, next);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(tp_btf__sched_wakeup, struct task_struct *p)
{
	on_wakeup(p);
	return 0;
}

#endif /* PHASEPROF_SCHED_BPF_H */
