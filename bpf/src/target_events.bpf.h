/* SPDX-License-Identifier: GPL-2.0 */
/* The target events ring: what user space must act on (processes, programs, code, exits). Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_TARGET_EVENTS_BPF_H
#define PHASEPROF_TARGET_EVENTS_BPF_H

/* Whether user space is woken for an event now (`URGENT`: it must act while the process
 * waits or still exists: a hold, a new process or program, new code; the work it does for a
 * fork or an exec then overlaps the program's own start instead of lengthening its entry
 * hold) or at its next poll, within 20 ms (`LATER`: exits). A wake-up costs the event's thread
 * an IPI, which in a VM is a VM exit: the fork, exec and exit programs measured ~14 us each
 * with one, ~2 us without, here. */
enum wake {
	LATER,
	URGENT
};

/* Sends a target event (`kind`, with `pid` and `ppid` as the kind uses them, and the counts
 * of a process's exit) to user space. */
static __always_inline void emit_counts(__u32 kind, __u32 pid, __u32 ppid, enum wake wake,
					__u64 cpu_ns, __u64 io_syscalls)
{
	struct target_event *e = bpf_ringbuf_reserve(&target_events, sizeof(*e), 0);
	if (!e) {
		count_drop(DROP_EVENT_RINGBUF);
		return;
	}
	e->kind = kind;
	e->pid = pid;
	e->ppid = ppid;
	e->pad = 0;
	e->cpu_ns = cpu_ns;
	e->io_syscalls = io_syscalls;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	/* Forced: after events left unannounced, the ring's own test (was the reader caught
	 * up?) would not wake it. A quarter full, it is woken whatever the event. */
	__u64 avail = bpf_ringbuf_query(&target_events, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&target_events, BPF_RB_RING_SIZE);
	bpf_ringbuf_submit(e, wake == URGENT || avail > size / 4 ? BPF_RB_FORCE_WAKEUP
								 : BPF_RB_NO_WAKEUP);
}

static __always_inline void emit(__u32 kind, __u32 pid, __u32 ppid, enum wake wake)
{
	emit_counts(kind, pid, ppid, wake, 0, 0);
}

#endif /* PHASEPROF_TARGET_EVENTS_BPF_H */
