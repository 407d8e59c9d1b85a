/* SPDX-License-Identifier: GPL-2.0 */
/* Signals delivered to targets' threads, by signal number, with the user stack they stopped.
 * Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_SIGNALS_BPF_H
#define PHASEPROF_SIGNALS_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct event_key); /* nr: the signal */
	__type(value, __u64);	       /* deliveries */
} signal_counts SEC(".maps");

/* signal_deliver(sig, info, ka): in the receiving thread, as it takes the signal (to run its
 * handler or its default action), the way perf's signal:signal_deliver counts them. */
SEC("raw_tp/signal_deliver")
int raw_tp__signal_deliver(struct bpf_raw_tracepoint_args *ctx)
{
	__u32 sig = (__u32)ctx->args[0], tid = (__u32)bpf_get_current_pid_tgid();
	/* phaseprof's own stop of a command it holds at its exec or entry point (hold_thread),
	 * not the target's signal. */
	if (sig == SIGSTOP && bpf_map_lookup_elem(&entry_held, &tid))
		return 0;
	count_event(ctx, &signal_counts, sig);
	return 0;
}

#endif /* PHASEPROF_SIGNALS_BPF_H */
