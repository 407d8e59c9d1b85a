/* SPDX-License-Identifier: GPL-2.0 */
/* Process lifecycle: forks followed, execs and exits reported. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_LIFECYCLE_BPF_H
#define PHASEPROF_LIFECYCLE_BPF_H

/* ---- process lifecycle ------------------------------------------------- */

static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child,
				   bool atomic_or)
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
	set_target_bit(ctgid, atomic_or);
	/* The child runs the parent's program until it execs: walk its stacks the same way from
	 * its first sample (user space decides again when it sees the fork, and at the exec). */
	__u32 *copy = bpf_map_lookup_elem(&unwind_pids, &ptgid);
	if (copy)
		bpf_map_update_elem(&unwind_pids, &ctgid, copy, BPF_ANY);
	/* Same mappings as the parent's until it execs or maps more: the parent's tables. Not an
	 * entry block (see fill_entry_block): user space frees it for another program once the
	 * parent has a block of ours, and the child has frame pointers until it gets its own. */
	struct unwind_target *tables = bpf_map_lookup_elem(&table_pids, &ptgid);
	if (tables && tables->first < (MAX_UNWIND_BLOCKS - ENTRY_BLOCKS) * MAX_UNWIND_MAPPINGS)
		bpf_map_update_elem(&table_pids, &ctgid, tables, BPF_ANY);
	emit(TEV_FORK, ctgid, ptgid, URGENT);
	return 0;
}

/* Twins: kernels before 5.12 refuse the atomic OR instruction anywhere in a program, so user
 * space loads the second one there (a load probe decides). */
SEC("raw_tp/sched_process_fork")
int BPF_PROG(raw_tp__sched_process_fork, struct task_struct *parent, struct task_struct *child)
{
	return on_fork(parent, child, true);
}

SEC("raw_tp/sched_process_fork")
int BPF_PROG(raw_tp__sched_process_fork_no_atomic_or, struct task_struct *parent,
	     struct task_struct *child)
{
	return on_fork(parent, child, false);
}

#define SIGSTOP 19

/* Stops the current process (on its return to user mode) until user space continues it; the stop
 * is ours, not the target's: its switch-out is not an off-CPU wait (see on_switch). */
static __always_inline void hold_thread(void)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid(), one = 1;
	if (!bpf_map_update_elem(&entry_held, &tid, &one, BPF_ANY))
		__sync_fetch_and_add(&entry_holds, 1);
	bpf_send_signal(SIGSTOP);
}

/* A program whose entry hold is attached already: the command is to stop at its entry point,
 * and need not stop at the exec too (user space decides while the loader maps libraries). */
static __always_inline bool hold_at_entry_only(struct bpf_raw_tracepoint_args *ctx, __u32 tgid)
{
	struct linux_binprm *bprm = (struct linux_binprm *)ctx->args[2];
	struct inode *inode = BPF_CORE_READ(bprm, file, f_inode);
	struct program_file f = {
		.dev = BPF_CORE_READ(inode, i_sb, s_dev),
		.ino = BPF_CORE_READ(inode, i_ino),
	};
	__u32 one = 1;
	return bpf_map_lookup_elem(&entry_probed, &f) &&
	       !bpf_map_update_elem(&entry_wanted, &tgid, &one, BPF_ANY);
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
	/* ppid of the event: 1 when stopped here (user space continues it). */
	__u32 stopped = 0;
	if (state && hold_execs) {
		if (hold_at_entry_only(ctx, tgid))
			/* Its old program's block: frame pointers until its entry point has one (user
			 * space may see this exec only after that, and must not undo it then). */
			bpf_map_delete_elem(&table_pids, &tgid);
		else {
			hold_thread();
			stopped = 1;
		}
	}
	if (notify_exec || state)
		emit(TEV_EXEC, tgid, stopped, URGENT);
	return 0;
}

/*
 * `record -- CMD` walked from unwind tables: attached to a program's entry point (for every
 * process; those in entry_wanted stop), where the dynamic loader has mapped its libraries and
 * none of its code has run. Stops it until user space has installed the tables of those
 * libraries (and continues it), so that even the main thread's first waits have whole stacks.
 */
SEC("uprobe")
int uprobe__entry_hold(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_active(tgid) || !bpf_map_lookup_elem(&entry_wanted, &tgid))
		return 0;
	/* ppid of the event: the entry block filled + 1, or 0 when stopped here. */
	__u32 block = fill_entry_block(tgid);
	if (!block)
		hold_thread();
	emit(TEV_ENTRY, tgid, block, URGENT);
	return 0;
}

/*
 * What the kernel counts for a process (its CPU-time clock, /proc/PID/io), read as its last
 * thread `task` exits: the threads released before it (signal), itself, and its leader when
 * that exited first and waits, a zombie, to be reaped (its counts join signal's only then).
 */
static __always_inline __u64 process_cpu_ns(struct task_struct *task)
{
	__u64 ns = BPF_CORE_READ(task, signal, sum_sched_runtime) +
		   BPF_CORE_READ(task, se.sum_exec_runtime);
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	if (leader && leader != task)
		ns += BPF_CORE_READ(leader, se.sum_exec_runtime);
	return ns;
}

static __always_inline __u64 process_io_syscalls(struct task_struct *task)
{
	if (!bpf_core_field_exists(task->ioac.syscr))
		return 0;
	__u64 n = BPF_CORE_READ(task, signal, ioac.syscr) +
		  BPF_CORE_READ(task, signal, ioac.syscw) + BPF_CORE_READ(task, ioac.syscr) +
		  BPF_CORE_READ(task, ioac.syscw);
	struct task_struct *leader = BPF_CORE_READ(task, group_leader);
	if (leader && leader != task)
		n += BPF_CORE_READ(leader, ioac.syscr) + BPF_CORE_READ(leader, ioac.syscw);
	return n;
}

SEC("raw_tp/sched_process_exit")
int raw_tp__sched_process_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!bpf_map_lookup_elem(&target_pids, &tgid))
		return 0;
	/* A thread's state goes with the thread: task storage by itself, hash entries here. */
	__u32 tid = (__u32)id;
	if (!have_task_storage) {
		bpf_map_delete_elem(&syscall_starts, &tid);
		bpf_map_delete_elem(&thread_phases, &tid);
		bpf_map_delete_elem(&alloc_threads, &tid);
	}
	/* Its off-CPU record too: its last switch-out, a dying one, records nothing. */
	bpf_map_delete_elem(&offcpu_starts, &tid);
	struct task_struct *task = current_task();
	/* signal->live reaches 0 when the last thread of the group exits. */
	/* Named now, while it exists: a short-lived thread is gone by the window's drain. */
	emit(TEV_THREAD_EXIT, (__u32)id, tgid, LATER);
	if (BPF_CORE_READ(task, signal, live.counter) == 0)
		emit_counts(TEV_EXIT, tgid, 0, LATER, process_cpu_ns(task),
			    process_io_syscalls(task));
	return 0;
}

#endif /* PHASEPROF_LIFECYCLE_BPF_H */
