//! The stacks the programs store, read into a cache in user space, and both kept bounded for a
//! process that never ends (the fleet agent).
//!
//! The programs store each distinct stack once, under the hash of its addresses, and never
//! delete one. Left alone, the map fills after its first few thousand distinct call paths and
//! every new one is lost from then on. So after each window's drain, a kernel entry that no
//! event referenced for `KERNEL_KEEP` drains is deleted (its addresses stay in the cache: an
//! event that took its key just before the delete still resolves). Should it be needed again,
//! the program that meets it stores it anew. The cache itself keeps what was used in the last
//! `CACHE_TTL`, at most `CACHE_MAX` stacks; stacks still held by threads that are off-CPU, or by
//! live allocations, count as used. A key found nowhere is counted (`lost.by_reason
//! .stack_expired`): a syscall that stayed on-CPU across drains for longer than `CACHE_TTL`
//! (one blocked is off-CPU, its stack pinned).
use std::collections::HashMap;
use std::time::{Duration, Instant};

use libbpf_rs::{MapCore, MapFlags};
use phaseprof_bpf::types;

use super::pod;

/// Drains without a reference after which a stack leaves the kernel map.
const KERNEL_KEEP: u64 = 2;
/// How long the cache keeps a stack nothing uses. Threads blocked in a syscall are off-CPU,
/// and their stacks pinned; what this covers is a syscall busy on-CPU across a drain. (At 10
/// minutes, the soak's agent grew by 30 MiB of stacks it would never see again.)
const CACHE_TTL: Duration = Duration::from_secs(60);
/// Most stacks the cache holds (a stack is ~30 addresses: ~20 MiB at most).
const CACHE_MAX: usize = 65_536;
/// The key of a syscall or switch-out whose stack was not sampled (the programs'
/// STACK_NOT_SAMPLED).
pub(super) const NOT_SAMPLED: u64 = 1;

struct Cached {
    addrs: Vec<u64>,
    /// The drain that last referenced it.
    drain: u64,
    used: Instant,
}

#[derive(Default)]
pub(super) struct StackCache {
    entries: HashMap<u64, Cached>,
    /// Drains so far: the clock of `Cached::drain`.
    drains: u64,
    /// Keys referenced but found neither here nor in the kernel.
    pub expired: u64,
    /// Kernel entries deleted so far.
    pub pruned: u64,
}

/// The addresses of the stack under `key` in `map`, leaf first.
fn read(map: &dyn MapCore, key: u64) -> Option<Vec<u64>> {
    let bytes = map.lookup(&key.to_ne_bytes(), MapFlags::ANY).ok()??;
    let st: types::stack_trace = pod(&bytes);
    let len = (st.len as usize).min(st.ips.len());
    Some(st.ips[..len].to_vec())
}

impl StackCache {
    /// The addresses of stack `key` (its hash; `map` the kernel map that holds such keys),
    /// marked used.
    pub(super) fn get(&mut self, key: u64, map: &dyn MapCore) -> Option<Vec<u64>> {
        if key == 0 || key == NOT_SAMPLED {
            return None;
        }
        let drain = self.drains;
        if let Some(c) = self.entries.get_mut(&key) {
            c.drain = drain;
            c.used = Instant::now();
            return Some(c.addrs.clone());
        }
        let Some(addrs) = read(map, key) else {
            self.expired += 1;
            return None;
        };
        self.insert(key, addrs.clone());
        Some(addrs)
    }

    fn insert(&mut self, key: u64, addrs: Vec<u64>) {
        let c = Cached {
            addrs,
            drain: self.drains,
            used: Instant::now(),
        };
        self.entries.insert(key, c);
    }

    /// After a window's drain: `pinned` (stacks of threads off-CPU, of live allocations) count
    /// as used; kernel entries of `maps` unreferenced for KERNEL_KEEP drains are deleted, the
    /// cache trimmed to its bounds. Returns how many kernel entries remain.
    pub(super) fn prune(
        &mut self,
        maps: &[&dyn MapCore],
        pinned: impl IntoIterator<Item = u64>,
    ) -> usize {
        self.drains += 1;
        let now = Instant::now();
        for key in pinned {
            if let Some(c) = self.entries.get_mut(&key) {
                c.drain = self.drains;
                c.used = now;
            }
        }
        let mut remain = 0;
        for map in maps {
            for key in map.keys().collect::<Vec<_>>() {
                let Ok(bytes) = <[u8; 8]>::try_from(key.as_slice()) else {
                    continue;
                };
                let id = u64::from_ne_bytes(bytes);
                let idle = match self.entries.get(&id) {
                    Some(c) => self.drains - c.drain >= KERNEL_KEEP,
                    None => {
                        // Stored, never referenced yet (its event is in the next window, or
                        // its count was dropped): kept, and from now on known.
                        if let Some(addrs) = read(*map, id) {
                            self.insert(id, addrs);
                        }
                        false
                    }
                };
                if idle && map.delete(&key).is_ok() {
                    self.pruned += 1;
                } else {
                    remain += 1;
                }
            }
        }
        self.entries
            .retain(|_, c| now.duration_since(c.used) < CACHE_TTL);
        if self.entries.len() > CACHE_MAX {
            let mut ages: Vec<Instant> = self.entries.values().map(|c| c.used).collect();
            let cut = ages.len() - CACHE_MAX;
            let (_, &mut oldest_kept, _) = ages.select_nth_unstable(cut);
            self.entries.retain(|_, c| c.used >= oldest_kept);
        }
        remain
    }

    /// Stacks held in user space.
    pub(super) fn cached(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the cache's bound: past CACHE_MAX, the stacks used least recently go first, and
    // what was used recently stays.
    #[test]
    fn the_cache_keeps_the_most_recently_used() {
        let mut c = StackCache::default();
        let base = Instant::now();
        for key in 0..(CACHE_MAX as u64 + 10) {
            c.insert(key + 2, vec![key]);
            c.entries.get_mut(&(key + 2)).unwrap().used = base + Duration::from_nanos(key);
        }
        // Key 2 (the oldest) is used again: it must survive the trim.
        c.entries.get_mut(&2).unwrap().used = base + Duration::from_secs(1);
        c.prune(&[], []);
        assert!(c.cached() <= CACHE_MAX);
        assert!(c.entries.contains_key(&2));
        assert!(!c.entries.contains_key(&3));
    }
}
