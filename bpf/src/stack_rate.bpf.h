/* SPDX-License-Identifier: GPL-2.0 */
/* Sampled stack walks: which of a thread's events (syscalls, switch-outs) carry a stack. Part of
 * phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_STACK_RATE_BPF_H
#define PHASEPROF_STACK_RATE_BPF_H

/* A walk of a target's stack costs ~2-4 us here (unwind tables), ten to twenty syscalls'
 * counting: redis, ~100,000 syscalls a second on one thread, lost 6% of its CPU to one in 16;
 * at a switch-out the kernel and user walks were 3.2 of the 3.9 us the program took. With a
 * rate of walks per second each thread walks at most that many stacks a second on average,
 * measured over periods of this length: beyond it its interval grows to match (at least
 * doubles), and halves again (down to the minimum) when it walks less than half as many. */
#define WALK_RATE_PERIOD_NS 100000000ULL
#define MAX_STACK_EVERY 65536

/* Events until `rate`'s thread takes its next stack: random with mean `every` (at least
 * `min_every`), so that each event is as likely as any other to carry one (the split of the
 * others by stack stays unbiased), `every` adapted to the thread's rate of walks (0: no
 * adapting). */
static __always_inline __u32 next_stack_in(struct stack_rate *rate, __u32 min_every,
					   __u32 walks_per_sec)
{
	if (!walks_per_sec)
		return 1 + bpf_get_prandom_u32() % (2 * min_every - 1);
	__u64 now = bpf_ktime_get_ns();
	__u32 every = rate->every < min_every ? min_every : rate->every;
	if (now - rate->walks_since >= WALK_RATE_PERIOD_NS) {
		/* Walks allowed since walks_since: the check comes at a walk, so often later. */
		__u64 allowed = walks_per_sec * (now - rate->walks_since) / 1000000000ULL;
		if (rate->walks > allowed && every < MAX_STACK_EVERY) {
			/* To the rate seen at once (a thread switching out 70,000 times a second
			 * would take a second of doublings), at least doubled. */
			__u64 scaled = (__u64)every * rate->walks / (allowed ? allowed : 1);
			if (scaled < 2 * (__u64)every)
				scaled = 2 * (__u64)every;
			every = scaled < MAX_STACK_EVERY ? scaled : MAX_STACK_EVERY;
		} else if (rate->walks < allowed / 2 && every / 2 >= min_every)
			every /= 2;
		rate->walks = 0;
		rate->walks_since = now;
	}
	rate->walks++;
	rate->every = every;
	return 1 + bpf_get_prandom_u32() % (2 * every - 1);
}

/* Whether the current event of `rate`'s thread takes its stack: every one while the thread
 * walks fewer than `walks_per_sec` a second, else one in its `every`. */
static __always_inline bool take_stack(struct stack_rate *rate, __u32 walks_per_sec)
{
	if (rate->until_stack > 1) {
		rate->until_stack--;
		return false;
	}
	rate->until_stack = next_stack_in(rate, 1, walks_per_sec);
	return true;
}

#endif /* PHASEPROF_STACK_RATE_BPF_H */
