/* SPDX-License-Identifier: GPL-2.0 */
/* Syscall counts, latency and stacks (raw_tp sys_enter/sys_exit). Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_SYSCALLS_BPF_H
#define PHASEPROF_SYSCALLS_BPF_H

/* ---- syscalls ---------------------------------------------------------- */

/* The stack key of syscall `nr`: its user stack when this one is sampled (the thread's
 * first of its number, then one in `every`), else 0 (no stacks) or STACK_NOT_SAMPLED. */
static __always_inline __u64 syscall_stack(void *ctx, struct syscall_start *start, __u32 nr)
{
	if (!syscall_stack_every)
		return 0;
	/* One call site for the walk: each is verified on its own. */
	bool take = syscall_stack_every == 1;
	if (!take) {
		__u32 at = nr & (MAX_SYSCALL_NR - 1);
		__u64 bit = 1ULL << (at & 63);
		take = !(start->seen[at / 64] & bit);
		start->seen[at / 64] |= bit;
	}
	if (!take && start->rate.until_stack > 1) {
		start->rate.until_stack--;
		return STACK_NOT_SAMPLED;
	}
	if (syscall_stack_every > 1 && start->rate.until_stack <= 1)
		start->rate.until_stack = next_stack_in(&start->rate, syscall_stack_every,
							syscall_stack_walks_per_sec);
	return user_stack_id(ctx, SLOT_SYSCALL, DROP_USER_STACK);
}

/* What syscall `nr` adds to the kernel's per-process read and write syscall counts (syscr +
 * syscw of /proc/PID/io): one for the read and write family, two for sendfile and
 * copy_file_range (both counts). */
static __always_inline __u64 io_syscalls_of(__u32 nr)
{
	switch (nr) {
	case NR_READ:
	case NR_WRITE:
	case NR_PREAD64:
	case NR_PWRITE64:
	case NR_READV:
	case NR_WRITEV:
	case NR_PREADV:
	case NR_PWRITEV:
	case NR_PREADV2:
	case NR_PWRITEV2:
		return 1;
	case NR_SENDFILE:
	case NR_COPY_FILE_RANGE:
		return 2;
	default:
		return 0;
	}
}

SEC("raw_tp/sys_enter")
int raw_tp__sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 nr = ctx->args[1];
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	/* Nearly every process on the host is no target: one array load tells. Entries are created
	 * for targets' threads only (below), so a thread that has one is a target's: its syscalls
	 * skip the target_pids lookup. */
	if (stopped || syscalls_paused || !maybe_target(tgid) || nr == NR_URETPROBE ||
	    nr == NR_UPROBE)
		return 0;
	struct syscall_start *start = thread_local(&syscall_starts, false);
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
		start = thread_local(&syscall_starts, true);
		if (!start) {
			count_drop(DROP_SYSCALL_START);
			return 0;
		}
	}

	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	/* At the entry, as the phases' syscalls are told (by the phase mask there). */
	if (phases_sliced && !phases_paused)
		count_add(IO_SYSCALLS_IN_PHASE_SLICES, io_syscalls_of(nr));
	struct syscall_key key = {
		.tgid = tgid,
		.tid = (__u32)bpf_get_current_pid_tgid(),
		.phase = phase,
		.phase_mask = mask,
		.nr = nr,
		.window = window,
		.user_stack = syscall_stack(ctx, start, nr),
	};
	/* These never return: count them now, with no latency. */
	if (nr == NR_EXIT || nr == NR_EXIT_GROUP) {
		if (syscalls_sliced)
			count_hit(SYSCALLS_COUNTED);
		add_syscall(&key, 1, 0, 0);
		if (phases_enabled)
			phases_add_syscall(mask, nr, 0, key.window);
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
	start->generation = syscall_generation;
	start->ts = bpf_ktime_get_ns(); /* last: ts != 0 marks the entry valid */
	return 0;
}

SEC("raw_tp/sys_exit")
int raw_tp__sys_exit(struct bpf_raw_tracepoint_args *ctx)
{
	/* Only targets' threads have an entry: a target's exit skips the target_pids lookup. */
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u32 tgid = pid_tgid >> 32;
	if (stopped || syscalls_paused || !maybe_target(tgid))
		return 0;
	struct syscall_start *start = thread_local(&syscall_starts, false);
	if (!start || !start->ts) {
		if (!is_active(tgid))
			return 0;
		/* A new thread's first event is its own return from clone (the parent's clone is
		 * counted); anything else began before we attached. */
		struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
		long nr = BPF_CORE_READ(regs, orig_ax);
		/* The probes' own syscalls (sys_enter skipped them) leave with orig_ax set to -1
		 * (the uretprobe syscall does so, 6.11+): not the target's, and never in flight. */
		if (nr < 0 || nr == NR_URETPROBE || nr == NR_UPROBE)
			return 0;
		if (!((nr == NR_CLONE || nr == NR_CLONE3 || nr == NR_FORK || nr == NR_VFORK) &&
		      ctx->args[1] == 0)) {
			/* Under a budget: entered before the slice began. */
			if (syscalls_sliced)
				count_hit(SYSCALLS_VOIDED);
			else
				count_drop(INFO_SYSCALL_EXIT_UNMATCHED);
		}
		return 0;
	}
	/* Entered in an earlier slice (its exit then was not seen), or before this one began. */
	if (start->generation != syscall_generation) {
		start->ts = 0;
		count_hit(SYSCALLS_VOIDED);
		return 0;
	}
	struct syscall_key key = {
		.tgid = tgid,
		.tid = (__u32)pid_tgid,
		.phase = start->phase,
		.nr = start->nr,
		.window = window,
		.user_stack = start->user_stack,
		.phase_mask = start->phase_mask,
	};
	__u64 delta = bpf_ktime_get_ns() - start->ts;
	bool maps_exec = start->maps_exec && (long)ctx->args[1] >= 0;
	start->ts = 0;
	if (syscalls_sliced) {
		count_hit(SYSCALLS_COUNTED);
		count_add(IO_SYSCALLS_COUNTED, io_syscalls_of(key.nr));
	}
	long ret = (long)ctx->args[1];
	add_syscall(&key, 1, delta, ret < 0 && ret >= -4095);
	align_read_done((struct pt_regs *)ctx->args[0], key.nr, ret);
	if (phases_enabled)
		phases_add_syscall(key.phase_mask, key.nr, delta, key.window);
	/* A command held until its entry point has its mappings read there: the loader's
	 * mappings before it would only wake user space for nothing. */
	if (maps_exec && !bpf_map_lookup_elem(&entry_wanted, &tgid))
		emit(TEV_MMAP, tgid, 0, URGENT);
	return 0;
}

#endif /* PHASEPROF_SYSCALLS_BPF_H */
