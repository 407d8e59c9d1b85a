/* SPDX-License-Identifier: GPL-2.0 */
/* On-CPU samples (perf_event), with stack copies for targets unwound in user space. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_SAMPLING_BPF_H
#define PHASEPROF_SAMPLING_BPF_H

/* ---- on-CPU ------------------------------------------------------------ */

/*
 * A pending uretprobe (a phase's or an allocator's return probe) has replaced its function's
 * return address on the user stack with the trampoline's, where an unwinder would stop. The
 * kernel keeps what it replaced (current->utask->return_instances, innermost first): send the
 * slots and the real addresses so user space can put them back into the copy.
 */
static __always_inline void ret_fixups(struct stack_sample *s)
{
	struct return_instance *ri = BPF_CORE_READ(current_task(), utask, return_instances);
	for (int i = 0; i < MAX_RET_FIXUPS; i++) {
		s->ret_slots[i] = 0;
		s->ret_addrs[i] = 0;
		if (!ri)
			continue;
		s->ret_slots[i] = BPF_CORE_READ(ri, stack);
		s->ret_addrs[i] = BPF_CORE_READ(ri, orig_ret_vaddr);
		ri = BPF_CORE_READ(ri, next);
	}
}

/*
 * Sends the sample (a cpu sample or a page fault) with its user registers and a copy of its
 * user stack to user space, which unwinds it from the modules' call-frame information. False
 * when the ring buffer is full (counted: the caller then counts the sample without a user stack).
 */
static __always_inline bool send_stack_copy(struct bpf_perf_event_data *ctx, struct cpu_key *key,
					    enum stack_sample_kind kind)
{
	/* The size is a load-time constant (rodata): the verifier knows the record's length. */
	struct stack_sample *s = bpf_ringbuf_reserve(
		&stack_samples, sizeof(*s) + stack_copy_bytes + STACK_COPY_SLACK, 0);
	if (!s) {
		count_drop(DROP_STACK_COPY);
		return false;
	}
	__u64 ip, sp, bp;
	/* User mode iff the interrupted address is in the lower half (x86-64 canonical addresses;
	 * a context read of `cs` alone is refused: pt_regs context reads are 8 bytes wide). */
	if ((__s64)ctx->regs.ip >= 0) {
		ip = ctx->regs.ip;
		sp = ctx->regs.sp;
		bp = ctx->regs.bp;
	} else {
		/* In the kernel on the thread's behalf: its user registers at the kernel entry. */
		struct pt_regs *u = current_user_regs();
		ip = BPF_CORE_READ(u, ip);
		sp = BPF_CORE_READ(u, sp);
		bp = BPF_CORE_READ(u, bp);
	}
	s->kind = kind;
	s->pad = 0;
	s->tgid = key->tgid;
	s->tid = key->tid;
	s->phase = key->phase;
	s->phase_mask = key->phase_mask;
	s->kernel_stack = key->kernel_stack;
	s->ip = ip;
	s->sp = sp;
	s->bp = bp;
	ret_fixups(s);
	__u8 *stack = (__u8 *)(s + 1);
	__u64 off = 0;
	__u64 want = STACK_COPY_CHUNK - (sp & (STACK_COPY_CHUNK - 1));
	for (int i = 0; i <= MAX_STACK_COPY / STACK_COPY_CHUNK; i++) {
		if (off >= stack_copy_bytes || off >= MAX_STACK_COPY)
			break;
		if (want > stack_copy_bytes - off)
			want = stack_copy_bytes - off;
		if (want == 0 || want > STACK_COPY_CHUNK)
			break;
		/* The mask changes nothing (want <= STACK_COPY_CHUNK) but proves the bound to the
		 * verifier, which lost it in the compiler's arithmetic; the slack covers it. */
		if (bpf_probe_read_user(stack + off, want & (STACK_COPY_SLACK - 1),
					(void *)(sp + off)))
			break;
		off += want;
		want = STACK_COPY_CHUNK;
	}
	s->len = off;
	/* No wakeup per sample: waking the reader costs an IPI, which in a VM is a VM exit (about
	 * 35 us a sample measured here). User space reads the ring every 20 ms anyway; it is woken
	 * only once the ring is a quarter full. */
	__u64 avail = bpf_ringbuf_query(&stack_samples, BPF_RB_AVAIL_DATA);
	__u64 size = bpf_ringbuf_query(&stack_samples, BPF_RB_RING_SIZE);
	bpf_ringbuf_submit(s, avail > size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	return true;
}

/* A cpu sample of target thread `id` (tgid << 32 | tid): its key, and its user stack copied or
 * walked by the kernel. */
static __always_inline void take_sample(struct bpf_perf_event_data *ctx, __u64 id)
{
	__u32 tgid = id >> 32;
	__u64 mask;
	__u32 phase = thread_phase_of(&mask);
	struct cpu_key key = {
		.tgid = tgid,
		.tid = (__u32)id,
		.phase = phase,
		.phase_mask = mask,
		.window = window,
		.kernel_stack = stack_id(ctx, 0, SLOT_SAMPLE, DROP_KERNEL_STACK),
	};
	/* Without frame pointers the kernel's walk gives the leaf and garbage: copy the stack. */
	if (stack_copy_bytes && bpf_map_lookup_elem(&unwind_pids, &tgid)) {
		if (send_stack_copy(ctx, &key, STACK_CPU))
			return;
	} else {
		key.user_stack = user_stack_id(ctx, SLOT_SAMPLE, DROP_USER_STACK);
	}
	add_u64(&cpu_counts, &key, 1, DROP_CPU_KEY);
}

SEC("perf_event")
int perf_event__sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tgid = id >> 32;
	if (!tgid || !is_active(tgid))
		return 0;
	__u64 start = bpf_ktime_get_ns();
	take_sample(ctx, id);
	/* The sampled target pays for this program, in an interrupt no sample sees (see
	 * NS_SAMPLE_ON_TARGET). */
	count_add(NS_SAMPLE_ON_TARGET, bpf_ktime_get_ns() - start);
	return 0;
}

#endif /* PHASEPROF_SAMPLING_BPF_H */
