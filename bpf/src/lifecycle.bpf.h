/* SPDX-License-Identifier: GPL-2.0 */
/* Process lifecycle: forks followed, execs and exits reported. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_LIFECYCLE_BPF_H
#define PHASEPROF_LIFECYCLE_BPF_H

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

#endif /* PHASEPROF_LIFECYCLE_BPF_H */
