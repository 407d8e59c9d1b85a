/* SPDX-License-Identifier: GPL-2.0 */
/* Kinds counted by one helper: a map of `struct event_key` -> count per kind, drained alike by
 * user space (agent/src/engine/count_maps.rs lists them). Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_EVENTS_BPF_H
#define PHASEPROF_EVENTS_BPF_H

/* Keeps `struct event_key` in the object's BTF, so that user space has its layout generated
 * (types::event_key) whichever kinds use it. */
struct event_key event_key_layout;

/* Counts one event of the current thread, if it is a target's, in `map` under its phases,
 * `nr` (what the kind counts by) and its user stack. */
static __always_inline void count_event(void *ctx, void *map, __u32 nr)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!tgid || !is_active(tgid))
		return;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	struct event_key key = {
		.tgid = tgid,
		.tid = (__u32)id,
		.phase = phase,
		.window = window,
		.phase_mask = mask,
		.nr = nr,
	};
	key.user_stack = user_stack_id(ctx, SLOT_EVENT, DROP_USER_STACK);
	add_u64(map, &key, 1, DROP_EVENT_KEY);
}

#endif /* PHASEPROF_EVENTS_BPF_H */
