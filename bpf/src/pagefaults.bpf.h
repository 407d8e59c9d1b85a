/* SPDX-License-Identifier: GPL-2.0 */
/* Page faults (a perf software event), with stack copies like cpu samples. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_PAGEFAULTS_BPF_H
#define PHASEPROF_PAGEFAULTS_BPF_H

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
		key.user_stack = user_stack_id(ctx, SLOT_FAULT, DROP_USER_STACK);
		add_u64(&pagefault_counts, &key, 1, DROP_PAGEFAULT_KEY);
	}
	if (phases_enabled)
		phases_add_time(mask, PF_PAGE_FAULTS, 1, key.window);
	return 0;
}

#endif /* PHASEPROF_PAGEFAULTS_BPF_H */
