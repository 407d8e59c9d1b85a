//! Stack copies in, cpu samples (and page faults) out: one [`ProcessUnwinder`] per target,
//! built at its first sample from the mappings the session last told (`maps_changed`: the
//! target added, the dynamic loader mapping libraries after exec, dlopen), rebuilt at the first
//! sample after they change; exec starts it afresh.
use std::collections::HashMap;

use super::process::{ProcessUnwinder, StackCopy};
use crate::procmaps::Vma;
use crate::window::{RawSample, RawStackSample};

struct Tracked {
    /// Built at the first sample after `vmas` were told.
    unwinder: Option<ProcessUnwinder>,
    vmas: Vec<Vma>,
}

/// How the samples unwound so far fared.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UnwindStats {
    pub samples: u64,
    /// Walks that reached the end of the stack (the thread's entry).
    pub complete: u64,
    /// Samples of a process whose modules could not be read (its leaf address kept alone).
    pub no_modules: u64,
    pub copied_bytes: u64,
}

#[derive(Default)]
pub struct SampleUnwinder {
    processes: HashMap<u32, Tracked>,
    pub stats: UnwindStats,
}

impl SampleUnwinder {
    /// Unwinds one sample into a sample of count 1 (a cpu sample or a page fault).
    pub fn unwind(&mut self, s: &RawStackSample) -> RawSample {
        self.stats.samples += 1;
        self.stats.copied_bytes += s.stack.len() as u64;
        let user = match self.unwinder(s.pid) {
            Some(u) => {
                let got = u.unwind(&StackCopy {
                    ip: s.ip,
                    sp: s.sp,
                    bp: s.bp,
                    stack: &s.stack,
                });
                self.stats.complete += got.complete as u64;
                got.frames
            }
            None => {
                self.stats.no_modules += 1;
                vec![s.ip]
            }
        };
        RawSample {
            user: Some(user),
            kernel: s.kernel.clone(),
            values: vec![1],
            ..RawSample::new(s.kind, (s.pid, s.tid), (s.phase, s.phase_mask))
        }
    }

    /// `pid` exec'd or exited: its modules are gone.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }

    /// `pid`'s executable mappings are `vmas` (just read): its modules are rebuilt from them at
    /// its next sample, if they changed.
    pub fn maps_changed(&mut self, pid: u32, vmas: &[Vma]) {
        if vmas.is_empty() || self.processes.get(&pid).is_some_and(|t| t.vmas == vmas) {
            return;
        }
        let tracked = Tracked {
            unwinder: None,
            vmas: vmas.to_vec(),
        };
        self.processes.insert(pid, tracked);
    }

    fn unwinder(&mut self, pid: u32) -> Option<&mut ProcessUnwinder> {
        let t = self.processes.get_mut(&pid)?;
        let vmas = &t.vmas;
        Some(t.unwinder.get_or_insert_with(|| {
            ProcessUnwinder::from_mappings(vmas, |vma| crate::target_files::open_mapped(pid, vma))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_of(pid: u32) -> RawStackSample {
        let (ip, sp, bp, stack) = crate::unwind::process::tests::capture();
        RawStackSample {
            kind: phaseprof_model::SampleKind::Cpu,
            pid,
            tid: pid,
            phase: 2,
            phase_mask: 0b101,
            kernel: Some(vec![0xffff_ffff_8100_0000]),
            ip,
            sp,
            bp,
            stack,
        }
    }

    // Checks a sample of this process becoming a cpu sample: key fields and kernel stack carried
    // over, the user stack unwound past the capture into its callers, the counts kept; and a
    // sample of a process that is gone keeping its leaf alone, counted as such.
    #[test]
    fn turns_stack_copies_into_cpu_samples() {
        let mut u = SampleUnwinder::default();
        let s = std::thread::spawn(|| sample_of(std::process::id()))
            .join()
            .unwrap();
        u.maps_changed(s.pid, &crate::procmaps::read_vmas(s.pid).unwrap());
        let cpu = u.unwind(&s);
        assert_eq!(
            (cpu.pid, cpu.phase, cpu.phase_mask, cpu.values[0]),
            (s.pid, 2, 0b101, 1)
        );
        assert_eq!(cpu.kernel, s.kernel);
        let user = cpu.user.unwrap();
        assert_eq!(user[0], s.ip);
        assert!(user.len() > 4, "{user:x?}");
        assert_eq!(u.stats.samples, 1);
        assert_eq!(
            u.stats.complete, 1,
            "a spawned thread's walk ends at its start"
        );
        assert_eq!(u.stats.copied_bytes, s.stack.len() as u64);

        // pid_max is at most 2^22: this pid never exists.
        let gone = RawStackSample {
            pid: u32::MAX - 1,
            ..s.clone()
        };
        let cpu = u.unwind(&gone);
        assert_eq!(cpu.user, Some(vec![gone.ip]));
        assert_eq!((u.stats.samples, u.stats.no_modules), (2, 1));
    }
}
