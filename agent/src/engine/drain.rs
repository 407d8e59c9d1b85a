//! Taking windows from the kernel maps: the parity flip, counter maps read without racing their
//! writers, stacks resolved once, the ring buffers' records (process events, Go allocation
//! samples, stack copies) collected.
use std::collections::HashMap;
use std::time::Duration;

use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};
use phaseprof_bpf::types;

use super::{pod, Drain, Engine, TargetEvent};
use crate::window::{alloc_values, RawGoAlloc, RawLive, RawSample, RawStackSample, RawWindow};
use phaseprof_model::SampleKind;

/// A stack captured at a return probe starts with the return address: moved back into the call
/// instruction, its leaf symbolizes to the call (with its inlined callers), not to what follows.
fn into_call(mut stack: Vec<u64>) -> Vec<u64> {
    if let Some(leaf) = stack.first_mut() {
        *leaf = leaf.saturating_sub(1);
    }
    stack
}

/// Removes and returns the entry under `key`, once nothing writes the map any more (after
/// detach). A lookup, then a delete: hashes take BPF_MAP_LOOKUP_AND_DELETE_ELEM only since
/// Linux 5.14.
fn take_entry(map: &dyn MapCore, key: &[u8]) -> Result<Option<Vec<u8>>> {
    let value = map.lookup(key, MapFlags::ANY)?;
    if value.is_some() {
        map.delete(key)?;
    }
    Ok(value)
}

/// Removes and returns every entry of a map whose key `wanted` selects (used once probes are
/// detached, when nothing writes any more).
fn take_window<K: Copy, V: Copy>(
    map: &dyn MapCore,
    wanted: impl Fn(&K) -> bool,
) -> Result<Vec<(K, V)>> {
    let mut taken = Vec::new();
    for key in map.keys().collect::<Vec<_>>() {
        let k: K = pod(&key);
        if wanted(&k) {
            if let Some(v) = take_entry(map, &key)? {
                taken.push((k, pod::<V>(&v)));
            }
        }
    }
    Ok(taken)
}

/// Drains a counters map (values made of u64 counters) without racing its writers.
///
/// A program that read the old window parity just before the flip may still add to an
/// old-parity entry after the drain's grace period: a vCPU the hypervisor deschedules mid-program
/// stalls for milliseconds. Deleting the entry then would lose that increment (it would land in
/// a freed element). So a drain reads entries and reports their growth since the last read, and
/// deletes an entry only after a whole parity cycle (two windows) without change.
#[derive(Default)]
pub(super) struct Counters {
    seen: HashMap<Vec<u8>, Vec<u8>>,
}

fn sub_counters(new: &[u8], old: &[u8]) -> Vec<u8> {
    new.chunks_exact(8)
        .zip(old.chunks_exact(8))
        .flat_map(|(n, o)| {
            let n = u64::from_ne_bytes(n.try_into().expect("8 bytes"));
            let o = u64::from_ne_bytes(o.try_into().expect("8 bytes"));
            n.wrapping_sub(o).to_ne_bytes()
        })
        .collect()
}

impl Counters {
    /// Increments since the last drain of the entries `wanted` selects; `everything` (after
    /// detach) takes and deletes every entry.
    pub(super) fn take<K: Copy, V: Copy>(
        &mut self,
        map: &dyn MapCore,
        wanted: impl Fn(&K) -> bool,
        everything: bool,
    ) -> Result<Vec<(K, V)>> {
        let taken = self.take_raw(map, |k| wanted(&pod(k)), everything)?;
        Ok((taken.iter()).map(|(k, v)| (pod(k), pod(v))).collect())
    }

    /// `take` of keys and values as the map holds them.
    pub(super) fn take_raw(
        &mut self,
        map: &dyn MapCore,
        wanted: impl Fn(&[u8]) -> bool,
        everything: bool,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut taken = Vec::new();
        for key in map.keys().collect::<Vec<_>>() {
            if !wanted(&key) {
                continue;
            }
            let value = if everything {
                take_entry(map, &key)?
            } else {
                map.lookup(&key, MapFlags::ANY)?
            };
            let Some(value) = value else { continue };
            let delta = match self.seen.get(&key) {
                Some(prev) => sub_counters(&value, prev),
                None => value.clone(),
            };
            if everything {
                self.seen.remove(&key);
            } else if self.seen.get(&key) == Some(&value) {
                // Unchanged for a whole parity cycle: no writer can still hold it.
                map.delete(&key)?;
                self.seen.remove(&key);
            } else {
                self.seen.insert(key.clone(), value);
            }
            if delta.iter().any(|&b| b != 0) {
                taken.push((key, delta));
            }
        }
        Ok(taken)
    }
}

impl Engine<'_> {
    /// Stack copies that arrived since the last call (the ring is read by `poll_events` and
    /// `drain`), kernel stacks resolved.
    pub fn take_stack_samples(&mut self) -> Vec<RawStackSample> {
        let got: Vec<(u64, RawStackSample)> = self.stack_samples.try_iter().collect();
        got.into_iter()
            .map(|(kernel, mut s)| {
                s.kernel = self.stack(kernel);
                s
            })
            .collect()
    }

    /// Process events that arrived since the last call, waiting at most `timeout` for the first.
    pub fn poll_events(&self, timeout: Duration) -> Vec<TargetEvent> {
        let _ = self.ring.poll(timeout);
        // The stack-copy ring wakes no one per sample (see send_stack_copy): read it too.
        let _ = self.ring.consume();
        self.events.try_iter().collect()
    }

    /// Ends the current window: the parity the programs write flips (unless `Drain::Final`:
    /// nothing writes any more), after a grace period for programs that read the old one.
    /// Returns the parity of the window that ended.
    fn end_window(&mut self, how: Drain) -> u32 {
        let ptr: *mut u32 = &mut self.bss().window;
        // SAFETY: ptr points into the .bss mmap of the loaded object, which lives as long as
        // self.skel; volatile because BPF programs read it concurrently.
        let old = unsafe { std::ptr::read_volatile(ptr) };
        if how == Drain::Window {
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(ptr, old ^ 1) };
            // A program runs for microseconds without sleeping; 2 ms covers any that read the
            // old parity just before the flip.
            std::thread::sleep(Duration::from_millis(2));
        }
        old
    }

    /// Drains one window. While attached (`Drain::Window`): flips the window parity, gives
    /// programs that read the old parity time to finish, then takes the growth of every
    /// old-parity key (see `Counters` for why keys are not deleted right away). After `detach`,
    /// `Drain::Final` drains both parities.
    pub fn drain(&mut self, how: Drain) -> Result<RawWindow> {
        let raw = self.take_counts(how)?;
        if how == Drain::Window {
            self.prune_stacks();
        }
        Ok(raw)
    }

    /// The counter maps' growth of the window that ended, stacks resolved.
    fn take_counts(&mut self, how: Drain) -> Result<RawWindow> {
        let everything = how == Drain::Final;
        let old = self.end_window(how);
        let take = |w: u32| everything || w == old;
        let mut raw = RawWindow::default();
        if self.phases {
            let half = (!everything).then_some(old);
            self.phase_totals.take(&self.skel.maps.phase_stats, half)?;
        }

        let maps = &self.skel.maps;
        let cpu = self.cpu_counts.take::<types::cpu_key, u64>(
            &maps.cpu_counts,
            |k| take(k.window),
            everything,
        )?;
        let offcpu = self
            .offcpu_counts
            .take::<types::offcpu_key, types::offcpu_value>(
                &maps.offcpu_counts,
                |k| take(k.window),
                everything,
            )?;
        let syscalls = self
            .syscall_counts
            .take::<types::syscall_key, types::syscall_value>(
                &maps.syscall_counts,
                |k| take(k.window),
                everything,
            )?;
        let alloc_totals = self
            .alloc_totals
            .take::<types::alloc_key, types::alloc_value>(
                &maps.alloc_totals,
                |k| take(k.window),
                everything,
            )?;
        let alloc_stacks = self
            .alloc_stacks
            .take::<types::alloc_stack_key, types::alloc_stack_value>(
                &maps.alloc_stacks,
                |k| take(k.window),
                everything,
            )?;
        let faults = self.pagefault_counts.take::<types::cpu_key, u64>(
            &maps.pagefault_counts,
            |k| take(k.window),
            everything,
        )?;
        let at = |pid, tid, phase, mask| RawSample::new(SampleKind::Cpu, (pid, tid), (phase, mask));
        for (k, v) in alloc_totals {
            raw.samples.push(RawSample {
                kind: SampleKind::AllocTotal,
                values: vec![v.bytes, v.count, v.frees],
                ..at(k.tgid, 0, k.phase, k.phase_mask)
            });
        }
        for (k, v) in alloc_stacks {
            raw.samples.push(RawSample {
                kind: SampleKind::Alloc,
                user: self.stack(k.user_stack).map(into_call),
                values: alloc_values(v.est_bytes, v.samples, v.sampled_bytes),
                ..at(k.tgid, 0, k.phase, k.phase_mask)
            });
        }
        for (k, count) in faults {
            raw.samples.push(RawSample {
                kind: SampleKind::Pagefault,
                user: self.stack(k.user_stack),
                values: vec![count],
                ..at(k.tgid, k.tid, k.phase, k.phase_mask)
            });
        }
        let _ = self.ring.consume();
        let go: Vec<(u64, RawGoAlloc)> = self.go_allocs.try_iter().collect();
        for (stack, mut g) in go {
            g.user = self.stack(stack);
            raw.go_allocs.push(g);
        }
        for (k, count) in cpu {
            raw.samples.push(RawSample {
                user: self.stack(k.user_stack),
                kernel: self.stack(k.kernel_stack),
                values: vec![count],
                ..at(k.tgid, k.tid, k.phase, k.phase_mask)
            });
        }
        let (offcpu, own) = super::offcpu_spread::spread_offcpu(offcpu);
        raw.offcpu_own_stack_ns = own;
        let offcpu = (offcpu.into_iter())
            .map(|(k, [ns, cpu_wait_ns])| RawSample {
                kind: SampleKind::Offcpu,
                user: self.stack(k.user_stack),
                kernel: self.stack(k.kernel_stack),
                values: vec![ns, cpu_wait_ns],
                ..at(k.tgid, k.tid, k.phase, k.phase_mask)
            })
            .collect();
        raw.samples.extend(self.offcpu_carry.apply(offcpu));
        if let (true, Some(end)) = (everything, self.detached_at_ns) {
            // Threads off-CPU at the stop: their time as it stands, with their stacks if taken.
            for s in self.offcpu_in_progress(end)? {
                if s.user.is_some() || s.kernel.is_some() {
                    raw.offcpu_own_stack_ns += s.values[0];
                }
                raw.samples.push(s);
            }
        }
        raw.samples.extend(self.take_count_maps(take, everything)?);
        for (k, v) in syscalls {
            raw.samples.push(RawSample {
                kind: SampleKind::Syscall,
                nr: k.nr,
                user: self.stack(k.user_stack),
                values: vec![v.count, v.total_ns, v.errors],
                ..at(k.tgid, k.tid, k.phase, k.phase_mask)
            });
        }
        Ok(raw)
    }

    /// Threads still off-CPU when recording stopped (at `end`): their time up to the stop, so
    /// off-CPU time covers the whole recording as on-CPU samples do.
    fn offcpu_in_progress(&mut self, end: u64) -> Result<Vec<RawSample>> {
        let mut out = Vec::new();
        let in_progress =
            take_window::<u32, types::offcpu_start>(&self.skel.maps.offcpu_starts, |_| true)?;
        for (tid, start) in in_progress {
            // ts 0: the record of a thread that was running.
            if start.ts != 0 && start.ts < end {
                let (pid, phase, mask) = (start.tgid, start.phase, start.phase_mask);
                out.push(RawSample {
                    user: self.stack(start.user_stack),
                    kernel: self.stack(start.kernel_stack),
                    values: vec![end - start.ts, runnable_since(start.runnable_ts, end)],
                    ..RawSample::new(SampleKind::Offcpu, (pid, tid), (phase, mask))
                });
            }
        }
        Ok(out)
    }

    /// Sampled allocations not freed yet (the live heap), read without removing them.
    pub fn live_heap(&mut self) -> Result<Vec<RawLive>> {
        let mut out = Vec::new();
        let live = entries::<types::live_key, types::live_alloc>(&self.skel.maps.live_allocs);
        for (k, v) in live {
            out.push(RawLive {
                pid: k.tgid,
                phase: v.phase,
                phase_mask: v.phase_mask,
                user: self.stack(v.user_stack).map(into_call),
                est_bytes: v.est_bytes,
                size: v.size,
                allocated_at_ns: v.ts,
            });
        }
        Ok(out)
    }

    /// The addresses of stack `id` (its hash), leaf first: odd keys are in `irq_stacks`.
    pub(super) fn stack(&mut self, id: u64) -> Option<Vec<u64>> {
        let maps = &self.skel.maps;
        let map: &dyn MapCore = if id & 1 == 1 {
            &maps.irq_stacks
        } else {
            &maps.stacks
        };
        self.stacks.get(id, map)
    }

    /// After a window's drain: stacks no event referenced lately leave the kernel maps (see
    /// `StackCache`); those of threads off-CPU now and of live allocations stay.
    fn prune_stacks(&mut self) {
        let maps = &self.skel.maps;
        let mut pinned = Vec::new();
        // Records stay from switch to switch: their stacks matter while the thread is off-CPU
        // (ts set); a running thread's are those of a switch-out already credited.
        for (_, start) in entries::<u32, types::offcpu_start>(&maps.offcpu_starts) {
            if start.ts != 0 {
                pinned.extend([start.user_stack, start.kernel_stack]);
            }
        }
        for (_, live) in entries::<types::live_key, types::live_alloc>(&maps.live_allocs) {
            pinned.push(live.user_stack);
        }
        self.stack_map_entries = self.stacks.prune(&[&maps.stacks, &maps.irq_stacks], pinned);
    }
}

/// Every entry of a map, read without removing it (entries deleted meanwhile are skipped).
fn entries<K: Copy, V: Copy>(map: &dyn MapCore) -> Vec<(K, V)> {
    map.keys()
        .collect::<Vec<_>>()
        .into_iter()
        .filter_map(|k| {
            let v = map.lookup(&k, MapFlags::ANY).ok()??;
            Some((pod(&k), pod(&v)))
        })
        .collect()
}

/// A thread's time waiting for a CPU up to `end`, runnable since `ts` (0: still blocked).
fn runnable_since(ts: u64, end: u64) -> u64 {
    if ts == 0 {
        0
    } else {
        end.saturating_sub(ts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a drain reads a counter's growth since the last read, field by field, and
    // that a counter which wrapped still gives its true growth.
    #[test]
    fn deltas_are_growth_since_the_last_read() {
        let bytes = |v: &[u64]| v.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        let d = sub_counters(&bytes(&[10, 7]), &bytes(&[4, 7]));
        assert_eq!(d, bytes(&[6, 0]));
        let wrapped = sub_counters(&bytes(&[2]), &bytes(&[u64::MAX]));
        assert_eq!(wrapped, bytes(&[3]));
    }
}
