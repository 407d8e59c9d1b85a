//! Who did the work: totals per process and per thread (its tid and name), for the report's
//! tables, the web page's group-by switch and exports split by process or thread. Allocations
//! are counted per process in the kernel, so they have no thread.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::kinds::*;
use crate::profile::{EventKind, Profile};
use crate::weighted::{in_phase, Weighted};

/// What a thread or a process did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    pub cpu_samples: u64,
    pub offcpu_ns: u64,
    /// Of `offcpu_ns`: runnable, waiting for a CPU.
    pub cpu_wait_ns: u64,
    pub syscalls: u64,
    pub syscall_ns: u64,
    pub page_faults: u64,
}

impl Totals {
    fn absorb(&mut self, t: &Totals) {
        self.cpu_samples = self.cpu_samples.saturating_add(t.cpu_samples);
        self.offcpu_ns = self.offcpu_ns.saturating_add(t.offcpu_ns);
        self.cpu_wait_ns = self.cpu_wait_ns.saturating_add(t.cpu_wait_ns);
        self.syscalls = self.syscalls.saturating_add(t.syscalls);
        self.syscall_ns = self.syscall_ns.saturating_add(t.syscall_ns);
        self.page_faults = self.page_faults.saturating_add(t.page_faults);
    }

    /// Busiest first: cpu, then off-cpu, then syscalls.
    fn rank(&self) -> std::cmp::Reverse<(u64, u64, u64)> {
        std::cmp::Reverse((self.cpu_samples, self.offcpu_ns, self.syscalls))
    }
}

/// One thread's totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadRow {
    pub pid: u32,
    pub tid: u32,
    pub name: String,
    #[serde(flatten)]
    pub totals: Totals,
}

/// One process's totals (its threads summed, plus its allocations).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessRow {
    pub pid: u32,
    pub name: String,
    pub threads: usize,
    #[serde(flatten)]
    pub totals: Totals,
    pub alloc_bytes: u64,
}

/// A thread's name as recorded (`?` when it was never seen by name).
pub fn thread_name(p: &Profile, tid: u32) -> String {
    p.meta
        .threads
        .get(&tid)
        .cloned()
        .unwrap_or_else(|| "?".into())
}

/// A process's name: its main thread's, or the target's comm for the first target.
pub fn process_name(p: &Profile, pid: u32) -> String {
    match p.meta.threads.get(&pid) {
        Some(n) => n.clone(),
        None if p.meta.pids.first() == Some(&pid) => p.meta.comm.clone(),
        None => "?".into(),
    }
}

/// Per thread, inside `phase` (None: everything), most CPU first.
pub fn threads(p: &Profile, phase: Option<u32>) -> Vec<ThreadRow> {
    let mut by: BTreeMap<(u32, u32), ThreadRow> = BTreeMap::new();
    fn entry<'m>(
        by: &'m mut BTreeMap<(u32, u32), ThreadRow>,
        p: &Profile,
        pid: u32,
        tid: u32,
    ) -> &'m mut ThreadRow {
        by.entry((pid, tid)).or_insert_with(|| ThreadRow {
            pid,
            tid,
            name: if tid == 0 {
                "(per process)".into()
            } else {
                thread_name(p, tid)
            },
            ..ThreadRow::default()
        })
    }
    let per_thread = (p.samples.iter())
        .filter(|s| s.kind.spec().per_thread && in_phase(phase, s.phase, s.phase_mask));
    for s in per_thread {
        let r = &mut entry(&mut by, p, s.pid, s.tid).totals;
        let (into, v) = match s.kind {
            SampleKind::Cpu => (&mut r.cpu_samples, s.value(CPU_COUNT)),
            SampleKind::Offcpu => {
                r.cpu_wait_ns = r.cpu_wait_ns.saturating_add(s.value(OFFCPU_CPU_WAIT_NS));
                (&mut r.offcpu_ns, s.value(OFFCPU_NS))
            }
            SampleKind::Syscall => {
                r.syscall_ns = r.syscall_ns.saturating_add(s.value(SYSCALL_NS));
                (&mut r.syscalls, s.value(SYSCALL_COUNT))
            }
            SampleKind::Pagefault => (&mut r.page_faults, s.value(FAULT_COUNT)),
            _ => continue,
        };
        *into = into.saturating_add(v);
    }
    let mut rows: Vec<ThreadRow> = by.into_values().collect();
    rows.sort_by_key(|r| r.totals.rank());
    rows
}

/// Per process, inside `phase`, most CPU first.
pub fn processes(p: &Profile, phase: Option<u32>) -> Vec<ProcessRow> {
    let mut by: BTreeMap<u32, ProcessRow> = BTreeMap::new();
    fn entry<'m>(
        by: &'m mut BTreeMap<u32, ProcessRow>,
        p: &Profile,
        pid: u32,
    ) -> &'m mut ProcessRow {
        by.entry(pid).or_insert_with(|| ProcessRow {
            pid,
            name: process_name(p, pid),
            ..ProcessRow::default()
        })
    }
    for t in threads(p, phase) {
        let r = entry(&mut by, p, t.pid);
        r.threads += usize::from(t.tid != 0);
        r.totals.absorb(&t.totals);
    }
    for s in
        (p.samples_of(SampleKind::AllocTotal)).filter(|s| in_phase(phase, s.phase, s.phase_mask))
    {
        let r = entry(&mut by, p, s.pid);
        r.alloc_bytes = r.alloc_bytes.saturating_add(s.value(TOTAL_BYTES));
    }
    let mut rows: Vec<ProcessRow> = by.into_values().collect();
    rows.sort_by_key(|r| r.totals.rank());
    rows
}

/// How exports and flamegraphs split stacks: one tree per process or per thread, under a root
/// frame that names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupBy {
    Process,
    Thread,
}

impl GroupBy {
    pub fn parse(s: &str) -> Option<GroupBy> {
        match s {
            "process" | "pid" => Some(GroupBy::Process),
            "thread" | "tid" => Some(GroupBy::Thread),
            _ => None,
        }
    }

    /// The root frame of `w`'s tree: `pid 812 (etcd)`, `tid 815 (raft) of pid 812`.
    pub fn root_frame(self, p: &Profile, w: &Weighted) -> String {
        match (self, w.tid) {
            (GroupBy::Process, _) => format!("pid {} ({})", w.pid, process_name(p, w.pid)),
            (GroupBy::Thread, 0) => format!("pid {} (threads not recorded)", w.pid),
            (GroupBy::Thread, tid) => {
                format!("tid {tid} ({}) of pid {}", thread_name(p, tid), w.pid)
            }
        }
    }
}

/// Whether `kind` is recorded per thread (allocations are per process).
pub fn per_thread(kind: EventKind) -> bool {
    !matches!(kind, EventKind::Alloc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{PhaseAt, ProfileBuilder};
    use crate::Sample;

    // Checks that thread rows sum each thread's events and processes sum their threads, with
    // names from the recording and inside a phase only that phase's events.
    #[test]
    fn rows_per_thread_and_process() {
        let mut b = ProfileBuilder::new(Default::default(), vec!["(none)".into(), "io".into()]);
        let s = b.intern_stack(vec![]);
        let io = PhaseAt { phase: 1, mask: 2 };
        b.add(Sample::new(SampleKind::Cpu, (10, 10), PhaseAt::NONE, vec![5]).on(s));
        b.add(Sample::new(SampleKind::Cpu, (10, 11), io, vec![7]).on(s));
        b.add(Sample::new(SampleKind::Offcpu, (10, 11), io, vec![1000]).on(s));
        b.add(
            Sample::new(SampleKind::Syscall, (10, 11), io, vec![3, 30])
                .on(None)
                .syscall(1),
        );
        b.add(
            Sample::new(SampleKind::Syscall, (20, 21), PhaseAt::NONE, vec![2, 20])
                .on(None)
                .syscall(0),
        );
        let mut p = b.finish();
        p.meta.threads.insert(10, "server".into());
        p.meta.threads.insert(11, "worker".into());
        let t = threads(&p, None);
        assert_eq!(t[0].tid, 11);
        assert_eq!(t[0].name, "worker");
        let t0 = &t[0].totals;
        assert_eq!((t0.cpu_samples, t0.offcpu_ns, t0.syscalls), (7, 1000, 3));
        let pr = processes(&p, None);
        assert_eq!(pr[0].pid, 10);
        assert_eq!((pr[0].name.as_str(), pr[0].threads), ("server", 2));
        assert_eq!(pr[0].totals.cpu_samples, 12);
        assert_eq!(pr[1].totals.syscalls, 2);
        let in_io = threads(&p, Some(1));
        assert_eq!(in_io.len(), 1);
        assert_eq!(in_io[0].totals.cpu_samples, 7);
    }
}
