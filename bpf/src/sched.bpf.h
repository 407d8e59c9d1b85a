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
		return t->__state;
	return BPF_CORE_READ((struct task_struct___o *)t, state);
}

/*
 * How long `t` waited for a CPU since its switch-out `start`, by the scheduler's own account,
 * which its switch-in (or a later switch-out) reads: the waits it already added to run_delay
 * (a migration ends one), and the one in progress since it was queued (last_queued, in its run
 * queue's clock, which the scheduler updated before this tracepoint and adds at the switch
 * itself). Reading it here costs a few loads of lines the scheduler just touched, where a
 * sched_wakeup program ran at every wakeup in the system and, for a target, wrote the
 * switch-out's record from the waker's CPU.
 */
static __always_inline __u64 sched_info_wait(struct task_struct *t, struct offcpu_start *start)
{
	__u64 waited = t->sched_info.run_delay - start->run_delay;
	__u64 queued = t->sched_info.last_queued;
	if (queued) {
		__u64 clock = t->se.cfs_rq->rq->clock;
		if (clock > queued)
			waited += clock - queued;
	}
	return waited;
}

/* How long the thread of switch-out `start` waited for a CPU until `end`: since it became
 * runnable (marked at its switch-out or by sched_wakeup), or by the scheduler's account. */
static __always_inline __u64 cpu_wait_until(struct task_struct *t, struct offcpu_start *start,
					    __u64 end)
{
	if (wait_from_sched_info)
		return sched_info_wait(t, start);
	return start->runnable_ts && end > start->runnable_ts ? end - start->runnable_ts : 0;
}

/* The current thread `prev` leaves the CPU: its stacks and phase, for its switch-in, in its
 * record `start` (whose stack rate it keeps). */
static __always_inline void record_switch_out(void *ctx, bool preempt, struct task_struct *prev,
					      struct offcpu_start *start, __u32 tgid, __u64 state,
					      __u64 now, __u64 runtime)
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
	/* The one-in-N this switch-out was drawn at: take_stack may set the next one. */
	__u32 every = start->rate.every > 1 ? start->rate.every : 1;
	if (offcpu_stack_walks_per_sec)
		walk = take_stack(&start->rate, offcpu_stack_walks_per_sec);
	/* prev is current here, so the stacks are prev's. */
	start->runnable_ts = runnable ? now : 0;
	start->tgid = tgid;
	start->phase = phase;
	start->user_stack =
		walk ? user_stack_id(ctx, SLOT_SWITCH, DROP_USER_STACK) : STACK_NOT_SAMPLED;
	start->kernel_stack = walk ? stack_id(ctx, 0, SLOT_SWITCH, DROP_KERNEL_STACK) : 0;
	start->phase_mask = mask;
	start->runtime = runtime;
	start->every = walk ? every : 0;
	start->walk_ns = walk && offcpu_stack_walks_per_sec ? bpf_ktime_get_ns() - now : 0;
	if (wait_from_sched_info)
		start->run_delay = prev->sched_info.run_delay;
	/* Last: a record with ts set is a switch-out awaiting its switch-in. */
	start->ts = now;
}

/* Thread `tid`'s record (created at its first switch-out when `create`), kept from switch to
 * switch and written in place: a hash update and delete at every switch cost more than the
 * rest of the program. Deleted at the thread's exit. */
static __always_inline struct offcpu_start *offcpu_record(__u32 tid, bool create)
{
	struct offcpu_start *start = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (start || !create)
		return start;
	__u32 zero = 0;
	void *zeros = bpf_map_lookup_elem(&thread_zeros, &zero);
	if (zeros)
		bpf_map_update_elem(&offcpu_starts, &tid, zeros, BPF_NOEXIST);
	start = bpf_map_lookup_elem(&offcpu_starts, &tid);
	if (!start)
		count_drop(DROP_OFFCPU_START);
	return start;
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

/* Credits `off` ns off-CPU, from the switch-out `start` recorded to its switch-in, `runnable` of
 * them waiting for a CPU, to its stacks and phases. */
static __always_inline void credit_offcpu(struct offcpu_start *start, __u32 tid, __u64 off,
					  __u64 runnable)
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
static __always_inline void credit_unseen_switch_in(struct task_struct *t,
						    struct offcpu_start *stale, __u32 tid,
						    __u64 now, __u64 runtime)
{
	__u64 gone = now - stale->ts;
	__u64 ran = runtime - stale->runtime;
	if (gone > ran)
		credit_offcpu(stale, tid, gone - ran,
			      cpu_wait_until(t, stale, stale->ts + gone - ran));
	stale->ts = 0;
}

/*
 * The tasks are the tracepoint's typed arguments: their fields are read directly, a load each
 * (BPF_CORE_READ would call a helper for each). Most switches on a busy host are other
 * programs': they leave after two bitmap checks, before any clock read or hash lookup.
 */
static __always_inline void on_switch(void *ctx, bool preempt, struct task_struct *prev,
				      struct task_struct *next)
{
	__u32 prev_tgid = prev->tgid;
	__u32 prev_tid = prev->pid;
	bool prev_target = prev_tgid && is_active(prev_tgid);
	bool next_target = is_active(next->tgid);
	if (!prev_target && !next_target && !entry_holds)
		return;
	__u64 now = bpf_ktime_get_ns();
	__u64 state = task_state(prev);
	/* Only the stop itself is ours: a held thread preempted before its SIGSTOP lands, or whose
	 * SIGSTOP a SIGCONT cancelled, keeps the hold until it really stops, and its waits count. */
	bool held = entry_holds && (state & TASK_STOPPED_BIT) &&
		    !bpf_map_delete_elem(&entry_held, &prev_tid);
	if (held)
		__sync_fetch_and_add(&entry_holds, -1);
	if (prev_target) {
		__u64 runtime = prev->se.sum_exec_runtime;
		/* Stopped by us: no wait of its own. A dying thread's last switch-out is never
		 * followed by a switch-in. */
		bool waits = !held && !(state & TASK_DEAD);
		struct offcpu_start *start = offcpu_record(prev_tid, waits);
		if (start && start->ts)
			credit_unseen_switch_in(prev, start, prev_tid, now, runtime);
		if (start && waits)
			record_switch_out(ctx, preempt, prev, start, prev_tgid, state, now,
					  runtime);
	}
	/* A thread of a target that stopped being one (detached, or recording stopped) keeps its
	 * switch-out: user space reads what is still off-CPU at the stop. */
	if (!next_target)
		return;
	__u32 next_tid = next->pid;
	if (phases_enabled) {
		__u32 zero = 0;
		struct switch_in *si = bpf_map_lookup_elem(&switch_ins, &zero);
		if (si) {
			si->tid = next_tid;
			si->ts = now;
			si->runtime = next->se.sum_exec_runtime;
		}
	}
	struct offcpu_start *start = offcpu_record(next_tid, false);
	if (!start || !start->ts)
		return;
	credit_offcpu(start, next_tid, now - start->ts, cpu_wait_until(next, start, now));
	start->ts = 0;
	/* The target switched in pays for this program (see NS_SWITCH_TO_TARGET). */
	count_add(NS_SWITCH_TO_TARGET, bpf_ktime_get_ns() - now);
}

/* A blocked target thread was woken: from now on it waits for a CPU. Attached only where the
 * scheduler's own wait accounting cannot be read (wait_from_sched_info). */
static __always_inline void on_wakeup(struct task_struct *p)
{
	__u32 tgid = p->tgid;
	if (!is_active(tgid))
		return;
	__u64 now = bpf_ktime_get_ns();
	__u32 tid = p->pid;
	struct offcpu_start *start = offcpu_record(tid, false);
	if (start && start->ts && !start->runnable_ts)
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
