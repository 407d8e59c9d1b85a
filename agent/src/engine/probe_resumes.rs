//! Where a target's thread resumes after an entry probe's trap: the probed instruction's next
//! one. The trap runs with interrupts off at its start and end, so the timer of a cpu sample due
//! then fires as the thread returns to user mode, and the sample lands on that next instruction,
//! in the probed function's own code, with no kernel frame to show the trap. On redis with six
//! phases, the phase functions' own samples rose from 3 to 38 of ~1,000 that way (8% of the
//! probes' measured cost), and `malloc` and `free` from 2 to 84 of 1,353 under `--events alloc`.
//! Such samples are the probes' (the `[phaseprof probes]` tower). A sample of the function's
//! own work on that one instruction is taken for the probes' too: one instruction of the
//! function, where probes that stay attached land on every call.
//!
//! Return probes resume at the caller's return address, and Go's exit probes (on `ret`) too:
//! not known here, so not claimed.
use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};

use iced_x86::{Decoder, DecoderOptions, FlowControl};

use super::{ProbeSpec, Uprobe};
use crate::procmaps::Vma;

/// The longest x86 instruction.
const MAX_INSN_BYTES: usize = 15;

/// Resume sites, as (device, inode, file offset): probes on one file serve every process that
/// maps it.
#[derive(Default, Debug)]
pub struct ProbeResumes {
    sites: HashSet<(u64, u64, u64)>,
    /// Probes already looked at (each target process gets the same libraries' probes).
    seen: HashSet<(std::path::PathBuf, u64)>,
}

impl ProbeResumes {
    /// Notes where `probes` resume, for those that resume on the next instruction.
    pub fn add(&mut self, probes: &[ProbeSpec]) {
        for p in probes.iter().filter(|p| resumes_next(p.program)) {
            if !self.seen.insert((p.path.clone(), p.offset)) {
                continue;
            }
            self.sites.extend(resume_offsets(p));
        }
    }

    /// Whether `addr`, in `vma`, is where an entry probe's trap resumes.
    pub fn contains(&self, vma: &Vma, addr: u64) -> bool {
        let Some((dev, ino)) = vma.inode else {
            return false;
        };
        let offset = addr.wrapping_sub(vma.start).wrapping_add(vma.offset);
        self.sites.contains(&(dev, ino, offset))
    }
}

/// Whether a probe's thread goes on at the probed instruction's next (not a return probe's,
/// whose trampoline returns to the caller, nor a Go exit probe on `ret`).
fn resumes_next(program: Uprobe) -> bool {
    use Uprobe::*;
    match program {
        PhaseEnter | PhaseLeave | GoPhaseEnter | GoPhaseLeave | GoSched | AllocEnter | Free
        | GoAllocSample => true,
        PhaseExit | GoPhaseReturn | AllocExit => false,
    }
}

/// Where the probe's thread goes on, with its file's identity: the instruction's next, or for
/// an emulated branch (an allocator probed at its `ja` past a size check) where it leads.
/// Read from the file, at most one instruction's bytes; nothing when it cannot be read.
fn resume_offsets(p: &ProbeSpec) -> Vec<(u64, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let read = || -> Option<(std::fs::Metadata, Vec<u8>)> {
        let mut f = crate::target_files::open_host(&p.path, &Default::default()).ok()?;
        let meta = f.metadata().ok()?;
        f.seek(SeekFrom::Start(p.offset)).ok()?;
        let mut code = Vec::with_capacity(MAX_INSN_BYTES);
        (&mut f)
            .take(MAX_INSN_BYTES as u64)
            .read_to_end(&mut code)
            .ok()?;
        Some((meta, code))
    };
    let Some((meta, code)) = read() else {
        return Vec::new();
    };
    let insn = Decoder::with_ip(64, &code, p.offset, DecoderOptions::NONE).decode();
    let offsets = match insn.flow_control() {
        _ if insn.is_invalid() => vec![],
        FlowControl::Next => vec![insn.next_ip()],
        FlowControl::ConditionalBranch => vec![insn.next_ip(), insn.near_branch_target()],
        FlowControl::UnconditionalBranch | FlowControl::Call => vec![insn.near_branch_target()],
        _ => vec![],
    };
    let (dev, ino) = (meta.dev(), meta.ino());
    offsets.into_iter().map(|o| (dev, ino, o)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the resume sites of entry probes on a `push r15` (2 bytes), a `push rbp` (1 byte)
    // and a `ja` (both ways), in a mapping at another offset and at none; a return probe's
    // thread resumes in the caller (not noted).
    #[test]
    fn entry_probes_resume_after_their_instruction() {
        use std::os::unix::fs::MetadataExt;
        // Removed when the test ends, passed or not.
        struct Removed(std::path::PathBuf);
        impl Drop for Removed {
            fn drop(&mut self) {
                let _ = std::fs::remove_file(&self.0);
            }
        }
        let path = std::env::temp_dir().join(format!("phaseprof-resumes-{}", std::process::id()));
        let _removed = Removed(path.clone());
        // push r15; push rbp; ja +1; ret; ret
        std::fs::write(&path, [0x41, 0x57, 0x55, 0x77, 0x01, 0xc3, 0xc3]).unwrap();
        let m = std::fs::metadata(&path).unwrap();
        let spec = |program, offset| ProbeSpec {
            program,
            path: path.clone(),
            offset,
            cookie: 0,
            what: String::new(),
        };
        let mut r = ProbeResumes::default();
        r.add(&[
            spec(Uprobe::PhaseEnter, 0),
            spec(Uprobe::PhaseExit, 0),
            spec(Uprobe::Free, 2),
            spec(Uprobe::AllocEnter, 3),
        ]);
        let vma = Vma {
            start: 0x40_1000,
            end: 0x40_2000,
            offset: 0x1000,
            path: path.display().to_string(),
            inode: Some((m.dev(), m.ino())),
        };
        let at = |offset: u64| 0x40_1000 + offset - 0x1000;
        let resumes: Vec<u64> = (0..7)
            .filter(|&o| r.contains(&vma, at(0x1000 + o)))
            .collect();
        // Not at the offsets in the file: the mapping's own offset counts.
        assert!(resumes.is_empty(), "{resumes:?}");
        let vma = Vma { offset: 0, ..vma };
        let resumes: Vec<u64> = (0..7)
            .filter(|&o| r.contains(&vma, 0x40_1000 + o))
            .collect();
        // After each push; the `ja` goes on at the first `ret` or jumps to the second.
        assert_eq!(resumes, vec![2, 3, 5, 6]);
        let other = Vma {
            inode: Some((m.dev(), m.ino() + 1)),
            ..vma
        };
        assert!(!r.contains(&other, 0x40_1002));
    }
}
