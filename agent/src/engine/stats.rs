//! What the kernel counted besides samples: exact per-phase totals, probe hits (the probes'
//! cost estimates), and every drop by reason.
use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};
use phaseprof_bpf::types;
use phaseprof_model::{Lost, PhaseStats, INLINED_UNPROBED};

use super::{pod, Engine};

/// ns the programs that time themselves ran on the targets' CPU (see `take_timed_ns`).
#[derive(Clone, Copy, Default)]
pub struct TimedProbeNs {
    pub switch: u64,
    pub sample: u64,
}

impl Engine<'_> {
    /// Allocator probe hits so far, summed over CPUs: (entries + returns + frees + Go samples).
    pub fn alloc_probe_hits(&self) -> Result<u64> {
        use types::probe_counter as c;
        let mut total = 0;
        for counter in [
            c::HITS_ALLOC_ENTRY,
            c::HITS_ALLOC_EXIT,
            c::HITS_FREE,
            c::HITS_GO_SAMPLE,
        ] {
            total += self.probe_hits(counter)?;
        }
        Ok(total)
    }

    /// Hits of the Go scheduler's switch points (goroutine phases) so far.
    pub fn go_switch_hits(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::HITS_GO_SCHED)
    }

    /// The ns the phase programs worked for targets so far, beyond the uprobe machinery
    /// (NS_PHASE_WORK).
    pub fn phase_work_ns(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::NS_PHASE_WORK)
    }

    /// Under a phase budget: the calls counted that aligned with the reads they worked on,
    /// those reads and their bytes so far (see slice_align.bpf.h).
    pub fn aligned_reads(&self) -> Result<(u64, u64, u64)> {
        use types::probe_counter as c;
        Ok((
            self.probe_hits(c::ALIGNED_CALLS)?,
            self.probe_hits(c::ALIGNED_READS)?,
            self.probe_hits(c::ALIGNED_READ_BYTES)?,
        ))
    }

    /// Under a phase budget: the calls in flight at a slice's end so far (never counted).
    pub fn phase_calls_voided(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::PHASE_CALLS_VOIDED)
    }

    /// The ns the programs that time themselves ran on the targets' CPU time since the last
    /// call: the scheduler's at switches to targets (charged to the target switched in) and at
    /// wakeups they make, and the cpu sampler's, an interrupt of the target sampled. No cpu
    /// sample sees either.
    pub fn take_timed_ns(&mut self) -> Result<TimedProbeNs> {
        use types::probe_counter as c;
        let now = TimedProbeNs {
            switch: self.probe_hits(c::NS_SWITCH_TO_TARGET)?,
            sample: self.probe_hits(c::NS_SAMPLE_ON_TARGET)?,
        };
        let last = std::mem::replace(&mut self.timed_ns_taken, now);
        Ok(TimedProbeNs {
            switch: now.switch.saturating_sub(last.switch),
            sample: now.sample.saturating_sub(last.sample),
        })
    }

    pub(super) fn probe_hits(&self, counter: types::probe_counter) -> Result<u64> {
        let per_cpu = self
            .skel
            .maps
            .probe_hits
            .lookup_percpu(&counter.0.to_ne_bytes(), MapFlags::ANY)?;
        Ok(per_cpu
            .unwrap_or_default()
            .iter()
            .map(|v| pod::<u64>(v))
            .sum())
    }

    /// Exact per-phase totals so far, by phase id (0 = `(none)`), summed over CPUs and windows;
    /// syscall cost rule i is reported under `cost_names[i]`.
    pub fn phase_stats(&self, phases: usize, cost_names: &[String]) -> Result<Vec<PhaseStats>> {
        (self.phase_totals).so_far(&self.skel.maps.phase_stats, phases, cost_names)
    }

    /// The per-phase totals of the window the last `drain` took, as `phase_stats`: the same
    /// events as its samples.
    pub fn window_phase_stats(&self, phases: usize, cost_names: &[String]) -> Vec<PhaseStats> {
        self.phase_totals.last_window(phases, cost_names)
    }

    /// Everything the kernel side dropped so far, summed over CPUs.
    pub fn lost(&self) -> Result<Lost> {
        let mut counts = Vec::new();
        for i in 0..types::drop_reason::DROP_MAX.0 {
            let per_cpu = self
                .skel
                .maps
                .drops
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)?;
            let n: u64 = per_cpu
                .unwrap_or_default()
                .iter()
                .map(|v| pod::<u64>(v))
                .sum();
            counts.push((types::drop_reason(i), n));
        }
        let mut lost = lost_of(&counts);
        // Not a drop of the kernel's, but calls the phases do not see all the same.
        lost.by_reason
            .insert(INLINED_UNPROBED.into(), self.inlined_unprobed);
        if self.stacks.expired > 0 {
            lost.stacks += self.stacks.expired;
            lost.by_reason
                .insert("stack_expired".into(), self.stacks.expired);
        }
        Ok(lost)
    }

    /// The stack maps' use: entries in the kernel maps after the last prune, stacks cached in
    /// user space, kernel entries deleted so far.
    pub fn stack_usage(&self) -> StackUsage {
        StackUsage {
            kernel: self.stack_map_entries as u64,
            cached: self.stacks.cached() as u64,
            pruned: self.stacks.pruned,
        }
    }
}

/// See `Engine::stack_usage`.
#[derive(Clone, Copy, Debug, Default)]
pub struct StackUsage {
    pub kernel: u64,
    pub cached: u64,
    pub pruned: u64,
}

/// The drop counters by reason as a `Lost`: each named (the names `report` and the docs use),
/// stack drops counted as stacks, the rest as events; the informational counters apart.
fn lost_of(counts: &[(types::drop_reason, u64)]) -> Lost {
    let mut lost = Lost::default();
    for &(reason, n) in counts {
        let name = match reason {
            types::drop_reason::DROP_USER_STACK => "user_stack",
            types::drop_reason::DROP_KERNEL_STACK => "kernel_stack",
            types::drop_reason::DROP_CPU_KEY => "cpu_counts_full",
            types::drop_reason::DROP_OFFCPU_KEY => "offcpu_counts_full",
            types::drop_reason::DROP_OFFCPU_START => "offcpu_starts_full",
            types::drop_reason::DROP_SYSCALL_KEY => "syscall_counts_full",
            types::drop_reason::DROP_SYSCALL_START => "syscall_starts_full",
            types::drop_reason::DROP_TARGET_FULL => "target_pids_full",
            types::drop_reason::DROP_EVENT_RINGBUF => "event_ringbuf_full",
            types::drop_reason::DROP_PHASE_DEPTH => "phase_depth_exceeded",
            types::drop_reason::DROP_PHASE_THREAD => "thread_phases_full",
            types::drop_reason::DROP_PHASE_MISMATCH => "phase_exit_mismatch",
            types::drop_reason::DROP_ALLOC_KEY => "alloc_totals_full",
            types::drop_reason::DROP_ALLOC_STACK_KEY => "alloc_stacks_full",
            types::drop_reason::DROP_LIVE_FULL => "live_allocs_full",
            types::drop_reason::DROP_ALLOC_THREAD => "alloc_thread_state",
            types::drop_reason::DROP_ALLOC_RINGBUF => "alloc_samples_ringbuf_full",
            types::drop_reason::DROP_PAGEFAULT_KEY => "pagefault_counts_full",
            types::drop_reason::DROP_STACK_COPY => "stack_copy_ringbuf_full",
            types::drop_reason::DROP_GOROUTINE_FULL => "goroutine_phases_full",
            types::drop_reason::DROP_PHASE_UNFINISHED => "phase_unfinished_goroutine_exit",
            types::drop_reason::DROP_EVENT_KEY => "event_counts_full",
            types::drop_reason::INFO_PHASE_EXIT_UNMATCHED => {
                lost.phase_exits_before_start = n;
                continue;
            }
            types::drop_reason::INFO_SYSCALL_EXIT_UNMATCHED => {
                lost.syscalls_in_flight_at_start = n;
                continue;
            }
            _ => "unknown",
        };
        match reason {
            types::drop_reason::DROP_USER_STACK
            | types::drop_reason::DROP_KERNEL_STACK
            | types::drop_reason::DROP_STACK_COPY => lost.stacks += n,
            _ => lost.events += n,
        }
        lost.by_reason.insert(name.to_string(), n);
    }
    lost
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the naming and the split of drop counters: stack drops count as stacks, the rest
    // as events, the informational ones land in their own fields, not in by_reason.
    #[test]
    fn drops_are_named_and_split() {
        use types::drop_reason as r;
        let lost = lost_of(&[
            (r::DROP_USER_STACK, 3),
            (r::DROP_STACK_COPY, 2),
            (r::DROP_CPU_KEY, 5),
            (r::DROP_PHASE_DEPTH, 1),
            (r::INFO_SYSCALL_EXIT_UNMATCHED, 7),
            (r::INFO_PHASE_EXIT_UNMATCHED, 4),
        ]);
        assert_eq!((lost.stacks, lost.events), (5, 6));
        assert_eq!(lost.by_reason["user_stack"], 3);
        assert_eq!(lost.by_reason["stack_copy_ringbuf_full"], 2);
        assert_eq!(lost.by_reason["cpu_counts_full"], 5);
        assert_eq!(lost.by_reason["phase_depth_exceeded"], 1);
        assert_eq!(lost.syscalls_in_flight_at_start, 7);
        assert_eq!(lost.phase_exits_before_start, 4);
        assert_eq!(lost.by_reason.len(), 4);
        // Every reason the kernel can count has a name of its own.
        for i in 0..r::DROP_MAX.0 {
            let l = lost_of(&[(r(i), 1)]);
            assert!(
                !l.by_reason.contains_key("unknown"),
                "reason {i} has no name"
            );
        }
    }
}
