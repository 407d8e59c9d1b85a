/* SPDX-License-Identifier: GPL-2.0 */
/* Under a phase budget: the calls counted in a slice set against the bytes read that they worked
 * on. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_SLICE_ALIGN_BPF_H
#define PHASEPROF_SLICE_ALIGN_BPF_H

/*
 * A server works on what a read returns after it returns, in the thread (native code) or the
 * goroutine (Go) that read it. A slice's start falls in the work on the last read before it
 * (made at the unslowed pace: nats-server read 65 KB at once there, against 4.8 KB in slices),
 * its end in the work on its own last reads: the calls a slice counts and the bytes read in it
 * disagree by up to a read's work at each edge, for each connection, and a 1% budget sees only
 * a few reads a connection in a slice. So calls count here from the reader's first read in the
 * slice, and each stretch up to its next read is added with the bytes of the read that began
 * it: what is added is whole reads and the calls done on them. A goroutine moves between
 * threads (slowed by the probes, nats-server's were descheduled in mid-read's work), so Go's
 * stretches are the goroutine's. User space sets the calls it counted against those bytes
 * (slice_align.rs).
 */

/* A call counted in the slice in force, on `a`'s stretch (NULL: none known). */
static __always_inline void align_call_done(struct read_align *a)
{
	if (a && phases_sliced && !phases_paused && a->generation == phase_generation)
		a->calls++;
}

/* The stretch of goroutine `key` (NULL where none is known and `create` is false). */
static __always_inline struct read_align *goroutine_align(struct goroutine_key *key, bool create)
{
	if (!phases_sliced)
		return NULL;
	struct read_align *a = bpf_map_lookup_elem(&goroutine_aligns, key);
	if (a || !create)
		return a;
	struct read_align zero = {};
	bpf_map_update_elem(&goroutine_aligns, key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&goroutine_aligns, key);
}

/* Whether syscall `nr` is a read whose bytes /proc/PID/io's rchar counts. */
static __always_inline bool is_read(__u32 nr)
{
	return nr == NR_READ || nr == NR_PREAD64 || nr == NR_READV || nr == NR_PREADV ||
	       nr == NR_PREADV2;
}

/* A target's thread returned `ret` from syscall `nr` (its user registers `regs`) while the
 * syscall programs were in force: a read that returned data closes the stretch since the
 * reader's last read in the slice and begins the next. A thread that runs goroutines (the Go
 * scheduler's probes saw one) reads for the goroutine in its g register (R14: the runtime's
 * syscall functions take Go's internal ABI). */
static __always_inline void align_read_done(struct pt_regs *regs, __u32 nr, long ret)
{
	if (!phases_sliced || phases_paused || ret <= 0 || !is_read(nr))
		return;
	struct thread_phase *tp = thread_phase_current(true);
	if (!tp)
		return;
	struct read_align *a = &tp->align;
	if (tp->cur_g) {
		struct goroutine_key key = {.tgid = bpf_get_current_pid_tgid() >> 32,
					    .g = BPF_CORE_READ(regs, r14)};
		a = goroutine_align(&key, true);
		if (!a)
			return;
	}
	if (a->generation == phase_generation) {
		count_add(ALIGNED_CALLS, a->calls);
		count_add(ALIGNED_READS, 1);
		count_add(ALIGNED_READ_BYTES, a->bytes);
	}
	a->generation = phase_generation;
	a->calls = 0;
	a->bytes = ret;
}

#endif /* PHASEPROF_SLICE_ALIGN_BPF_H */
