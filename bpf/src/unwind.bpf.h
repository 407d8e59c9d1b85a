/* SPDX-License-Identifier: GPL-2.0 */
/* User stacks of code without frame pointers, walked from unwind tables (--unwind dwarf), for
 * every event kind. Part of phaseprof.bpf.c (one object). */
#ifndef PHASEPROF_UNWIND_BPF_H
#define PHASEPROF_UNWIND_BPF_H

/* Rows of every module's table; user space sizes it at load and writes it through mmap. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* Each target's block of mappings; user space writes blocks through mmap too (a command that
 * execs a hundred programs writes two blocks each: one syscall per mapping added up). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MAX_UNWIND_BLOCKS *MAX_UNWIND_MAPPINGS);
	__type(key, __u32);
	__type(value, struct unwind_mapping);
} unwind_mappings SEC(".maps");

/* Targets walked from tables. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_UNWIND_BLOCKS);
	__type(key, __u32); /* tgid */
	__type(value, struct unwind_target);
} table_pids SEC(".maps");

/* Files whose rows are in unwind_rows, by the kernel's (device, inode); user space keeps it in
 * step. Read by the entry point only (fill_entry_block). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct program_file);
	__type(value, struct file_rows);
} file_rows SEC(".maps");

/* Slot -> the tgid an entry block was filled for; absent: free (user space deletes it once its
 * own block has replaced it). A hash, not an array: taking a slot is an insert that fails when
 * it exists, with no atomic instruction (5.10 refuses the compare-and-swap anywhere). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ENTRY_BLOCKS);
	__type(key, __u32);
	__type(value, __u32);
} entry_block_owner SEC(".maps");

/* The entry block tried next. */
__u32 entry_block_next = 0;

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UNW_MAX);
	__type(key, __u32);
	__type(value, __u64);
} unwind_counts SEC(".maps");

/* A walk in progress, per scratch slot (a walk can be interrupted by another program's on the
 * same CPU, which uses another slot): the registers of the frame being walked and what the walk
 * found. Kept in a map, not passed: global functions take pointer arguments only since 5.12. */
struct unwind_walk {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u32 complete;
	__u32 fixups; /* pending uretprobes found (ret_slots/ret_addrs) */
	__u64 ret_slots[MAX_RET_FIXUPS];
	__u64 ret_addrs[MAX_RET_FIXUPS];
	__u32 first; /* the target's block of unwind_mappings */
	__u32 count;
	__u32 unmapped; /* a frame's address lay in none of the target's mappings */
	__u32 pad;
	__u64 fp_frames;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLOT_MAX);
	__type(key, __u32);
	__type(value, struct unwind_walk);
} unwind_walks SEC(".maps");

/* When this CPU last announced a target's unknown code (see announce_unmapped). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} unmapped_announced SEC(".maps");

/* A walk met code outside every mapping user space gave for `tgid` (a library mapped since, by
 * dlopen or by the loader): asks user space to re-read its mappings, at most once per 10 ms per
 * CPU, instead of waiting for its periodic re-read. */
static __always_inline void announce_unmapped(__u32 tgid)
{
	__u32 zero = 0;
	__u64 *at = bpf_map_lookup_elem(&unmapped_announced, &zero);
	__u64 now = bpf_ktime_get_ns();
	if (!at || now - *at < 10 * 1000 * 1000)
		return;
	*at = now;
	emit(TEV_MMAP, tgid, 0, URGENT);
}

static __always_inline void unwind_count(enum unwind_counter c, __u64 n)
{
	__u32 key = c;
	__u64 *v = bpf_map_lookup_elem(&unwind_counts, &key);
	if (v)
		*v += n; /* per-CPU: no atomics needed */
}

/*
 * Binary searches without a branch per step (the step's half is taken by arithmetic, not an
 * `if`): the verifier then walks one path through a search instead of one per outcome of every
 * step, which it cannot prune and which exceeds its budget within a few frames.
 */

/* 1 when a <= b, else 0, for a and b below 2^63 (user space addresses; user space leaves the
 * kernel half's [vsyscall] out of the mappings). */
static __always_inline __u32 at_most(__u64 a, __u64 b)
{
	return (a - b - 1) >> 63;
}

/* The index of the last of the `count` entries of `map` from `first`, sorted by `field`, whose
 * `field` is <= `at` (the first one when none is: callers check). */
#define LAST_AT_MOST(map, type, field, first, count, at, steps)                                    \
	({                                                                                         \
		__u32 base_ = (first), len_ = (count);                                             \
		for (int i_ = 0; i_ < (steps); i_++) {                                             \
			if (len_ <= 1)                                                             \
				break;                                                             \
			__u32 half_ = len_ / 2, mid_ = base_ + half_;                              \
			type *e_ = bpf_map_lookup_elem(&map, &mid_);                               \
			if (!e_)                                                                   \
				break;                                                             \
			base_ += half_ * at_most(e_->field, (at));                                 \
			len_ -= half_;                                                             \
		}                                                                                  \
		base_;                                                                             \
	})

/* The mapping holding `pc` among `count` sorted from `first`, or NULL. */
static __always_inline struct unwind_mapping *find_mapping(__u32 first, __u32 count, __u64 pc)
{
	if (!count)
		return NULL;
	/* 8 halvings cover 128 mappings. */
	__u32 at = LAST_AT_MOST(unwind_mappings, struct unwind_mapping, start, first, count, pc, 8);
	struct unwind_mapping *m = bpf_map_lookup_elem(&unwind_mappings, &at);
	return m && m->start <= pc && pc < m->end ? m : NULL;
}

/* The row in force at `pc` (the last row starting at or before it), or NULL. */
static __always_inline struct unwind_row *find_row(struct unwind_mapping *m, __u64 pc)
{
	if (!m->row_count || pc < m->bias || pc - m->bias > 0xffffffffULL)
		return NULL;
	__u64 rel = pc - m->bias;
	/* 25 halvings cover 32M rows. */
	__u32 at = LAST_AT_MOST(unwind_rows, struct unwind_row, pc, m->row_start, m->row_count, rel,
				25);
	struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &at);
	return r && r->pc <= rel ? r : NULL;
}

/* The return address in the slot at `addr`, the real one where a pending uretprobe put its
 * trampoline's there. */
static __always_inline __u64 restore_return(struct unwind_walk *w, __u64 addr, __u64 ra)
{
	for (int i = 0; i < MAX_RET_FIXUPS; i++) {
		if (i >= w->fixups)
			break;
		if (w->ret_slots[i] == addr)
			return w->ret_addrs[i];
	}
	return ra;
}

/* One frame of the walk in scratch slot `slot`: records its address and steps to its caller. 1
 * ends the walk. Global: the verifier checks it once per program, on its own, instead of within
 * every walk's loop at every call site (which took it about half a second per site). */
__noinline int unwind_frame(__u32 slot)
{
	struct unwind_walk *w = bpf_map_lookup_elem(&unwind_walks, &slot);
	struct stack_trace *st = bpf_map_lookup_elem(&stack_scratch, &slot);
	if (!w || !st)
		return 1;
	__u32 n = st->len;
	if (n >= MAX_STACK_DEPTH)
		return 1;
	__u64 pc = w->pc;
	st->ips[n] = pc;
	st->len = n + 1;
	/* A caller's address is a return address: the call is the instruction before it (which
	 * matters when a call to a function that never returns ends its caller). */
	struct unwind_mapping *m = find_mapping(w->first, w->count, n ? pc - 1 : pc);
	struct unwind_row *row = m ? find_row(m, n ? pc - 1 : pc) : NULL;
	if (!m)
		w->unmapped = 1;
	__u8 kind = row ? row->kind : UNWIND_FP;
	__u64 cfa;
	if (kind == UNWIND_END) {
		w->complete = 1;
		return 1;
	} else if (kind == UNWIND_RSP && row) {
		cfa = w->sp + row->cfa_off;
	} else if (kind == UNWIND_RBP && row) {
		cfa = w->bp + row->cfa_off;
	} else if (kind == UNWIND_PLT && row) {
		cfa = w->sp + 8 + ((pc & 15) >= (__u64)row->cfa_off ? 8 : 0);
	} else {
		/* Frame pointers: rbp points at the saved rbp, the return address above it. */
		if (!w->bp)
			return 1;
		cfa = w->bp + 16;
		w->fp_frames++;
	}
	/* Each caller's frame lies above its callee's: a frame at or below the one walked is a
	 * loop or garbage (a frame pointer that points at itself), where the walk ends. */
	if (cfa <= w->sp)
		return 1;
	__u64 ra = 0;
	if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)))
		return 1;
	if (w->fixups)
		ra = restore_return(w, cfa - 8, ra);
	if (kind == UNWIND_FP || !row) {
		if (bpf_probe_read_user(&w->bp, sizeof(w->bp), (void *)(cfa - 16)))
			return 1;
	} else if (row->rbp_off) {
		if (bpf_probe_read_user(&w->bp, sizeof(w->bp),
					(void *)(cfa + 8 * (__s64)row->rbp_off)))
			return 1;
	}
	w->sp = cfa;
	w->pc = ra;
	return ra ? 0 : 1;
}

/*
 * Walks the current thread's user stack from the tables of target `t` (from its registers at the
 * kernel entry: a syscall's, an interrupt's, a uprobe's trap) into the scratch stack of `slot`.
 * False when the walk could not start.
 */
static __always_inline bool walk_user_stack(struct stack_trace *st, struct unwind_target *t,
					    enum stack_slot slot)
{
	__u32 key = slot;
	struct unwind_walk *w = bpf_map_lookup_elem(&unwind_walks, &key);
	if (!w)
		return false;
	struct pt_regs *regs = current_user_regs();
	w->pc = BPF_CORE_READ(regs, ip);
	w->sp = BPF_CORE_READ(regs, sp);
	w->bp = BPF_CORE_READ(regs, bp);
	w->complete = 0;
	w->fixups = 0;
	struct return_instance *ri = BPF_CORE_READ(current_task(), utask, return_instances);
	for (int i = 0; i < MAX_RET_FIXUPS && ri; i++) {
		w->ret_slots[i] = BPF_CORE_READ(ri, stack);
		w->ret_addrs[i] = BPF_CORE_READ(ri, orig_ret_vaddr);
		w->fixups = i + 1;
		ri = BPF_CORE_READ(ri, next);
	}
	st->len = 0;
	st->pad = 0;
	w->first = t->first;
	w->count = t->count;
	w->unmapped = 0;
	w->fp_frames = 0;
	/* A bounded loop (Linux 5.3), not bpf_loop (5.17): each step is the global function,
	 * which the verifier checks once, so the loop costs it a few instructions per frame. */
	for (int i = 0; i < MAX_STACK_DEPTH; i++)
		if (unwind_frame(slot))
			break;
	unwind_count(UNW_WALKS, 1);
	unwind_count(UNW_FRAMES, st->len);
	if (w->fp_frames)
		unwind_count(UNW_FP_FRAMES, w->fp_frames);
	if (w->complete)
		unwind_count(UNW_COMPLETE, 1);
	else if (st->len >= MAX_STACK_DEPTH)
		unwind_count(UNW_TRUNCATED, 1);
	if (w->unmapped)
		announce_unmapped(bpf_get_current_pid_tgid() >> 32);
	return st->len > 0;
}

/* The task VMA iterator (Linux 6.7); weak: absent, the entry point always stops the program. */
extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task,
				 __u64 addr) __weak __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __weak __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __weak __ksym;

#define VM_EXEC 0x4
#define PAGE_SHIFT 12

/* Writes `vma` as the walker's mapping `m`, from its file's rows; false when the file has none
 * in the kernel yet (user space must read it first). */
static __always_inline bool entry_mapping(struct unwind_mapping *m, struct vm_area_struct *vma)
{
	m->start = vma->vm_start;
	m->end = vma->vm_end;
	m->bias = 0;
	m->row_start = 0;
	m->row_count = 0;
	struct file *file = vma->vm_file;
	if (!file)
		return true; /* the vDSO, a JIT's code: frame pointers, as user space does */
	struct program_file key = {
		.dev = BPF_CORE_READ(file, f_inode, i_sb, s_dev),
		.ino = BPF_CORE_READ(file, f_inode, i_ino),
	};
	struct file_rows *f = bpf_map_lookup_elem(&file_rows, &key);
	if (!f)
		return false;
	__u64 offset = vma->vm_pgoff << PAGE_SHIFT;
	for (int i = 0; i < FILE_SEGMENTS; i++) {
		if (i >= f->segments)
			break;
		if (f->seg_offset[i] == offset) {
			m->bias = vma->vm_start - f->seg_vaddr[i] + f->base;
			m->row_start = f->row_start;
			m->row_count = f->row_count;
			break;
		}
	}
	return true;
}

/*
 * The current process's executable mappings, written into a free entry block from the rows of
 * their files, and `table_pids` pointed at it: what user space would do at the entry point,
 * without stopping the program for it. Returns the block's slot + 1; 0 when it cannot (no
 * iterator in this kernel, a file whose rows are not in yet, no free block, more mappings
 * than a block holds): the caller stops the program for user space then.
 */
static __always_inline __u32 fill_entry_block(__u32 tgid)
{
	if (!bpf_ksym_exists(bpf_iter_task_vma_new))
		return 0;
	/* Two CPUs may try the same slot: one takes it, the other stops its program. */
	__u32 slot = entry_block_next++ % ENTRY_BLOCKS;
	if (bpf_map_update_elem(&entry_block_owner, &slot, &tgid, BPF_NOEXIST))
		return 0;
	__u32 first = (MAX_UNWIND_BLOCKS - ENTRY_BLOCKS + slot) * MAX_UNWIND_MAPPINGS;
	__u32 n = 0;
	bool complete = true;
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;
	bpf_iter_task_vma_new(&it, bpf_get_current_task_btf(), 0);
	while ((vma = bpf_iter_task_vma_next(&it))) {
		if (!(vma->vm_flags & VM_EXEC))
			continue;
		/* The kernel half: as user space, left out. */
		if (vma->vm_start >> 63)
			break;
		__u32 at = first + n;
		struct unwind_mapping *m = bpf_map_lookup_elem(&unwind_mappings, &at);
		if (n >= MAX_UNWIND_MAPPINGS || !m || !entry_mapping(m, vma)) {
			complete = false;
			break;
		}
		n++;
	}
	bpf_iter_task_vma_destroy(&it);
	/* Ends the block for user space, which reads it by its slot (Engine::entry_block). */
	__u32 end = first + n;
	struct unwind_mapping *past =
		n < MAX_UNWIND_MAPPINGS ? bpf_map_lookup_elem(&unwind_mappings, &end) : NULL;
	if (past)
		past->start = past->end = 0;
	struct unwind_target t = {.first = first, .count = n};
	if (!complete || !n || bpf_map_update_elem(&table_pids, &tgid, &t, BPF_ANY)) {
		bpf_map_delete_elem(&entry_block_owner, &slot);
		return 0;
	}
	return slot + 1;
}

/* The current thread's user stack, stored: from tables for targets that have them, else by the
 * kernel's frame-pointer walk. */
static __always_inline __u64 user_stack_id(void *ctx, enum stack_slot slot, enum drop_reason reason)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct unwind_target *t = bpf_map_lookup_elem(&table_pids, &tgid);
	if (!t)
		return stack_id(ctx, BPF_F_USER_STACK, slot, reason);
	__u32 key = slot;
	struct stack_trace *st = bpf_map_lookup_elem(&stack_scratch, &key);
	if (!st || !walk_user_stack(st, t, slot))
		return 0;
	return store_stack(st, slot, USER_STACK_SEED, reason);
}

#endif /* PHASEPROF_UNWIND_BPF_H */
