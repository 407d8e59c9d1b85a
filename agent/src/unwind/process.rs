//! One process's modules as framehop sees them, and the unwind of one copied stack.
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;

use anyhow::{Context, Result};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use object::{Object, ObjectSection, ObjectSegment};

use crate::procmaps::Vma;

/// Registers and stack memory of one sample.
pub struct StackCopy<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Memory from `sp` up.
    pub stack: &'a [u8],
}

impl StackCopy<'_> {
    fn read(&self, addr: u64) -> Result<u64, ()> {
        let at = addr.checked_sub(self.sp).ok_or(())? as usize;
        let bytes = self.stack.get(at..at + 8).ok_or(())?;
        Ok(u64::from_le_bytes(bytes.try_into().map_err(|_| ())?))
    }
}

/// A stack as unwound: addresses leaf first (the first is `ip`, the rest return addresses, as a
/// frame-pointer walk gives them), and whether the walk ended at the stack's end through known
/// modules rather than at the end of the copy or in code it could not unwind.
#[derive(Debug, PartialEq)]
pub struct Unwound {
    pub frames: Vec<u64>,
    pub complete: bool,
}

/// The modules of one process, ready to unwind its samples. Rebuilt when its mappings change
/// (exec, dlopen): `covers` says whether an address is known.
pub struct ProcessUnwinder {
    unwinder: UnwinderX86_64<Vec<u8>>,
    cache: CacheX86_64,
    ranges: Vec<Range<u64>>,
}

/// Stacks deeper than this are cut (and reported incomplete).
const MAX_FRAMES: usize = 256;

impl ProcessUnwinder {
    /// Modules from executable mappings; `open` opens the file of a mapping.
    pub fn from_mappings(vmas: &[Vma], open: impl Fn(&Vma) -> std::io::Result<File>) -> Self {
        let mut unwinder = UnwinderX86_64::new();
        let mut ranges = Vec::new();
        let mut by_file: HashMap<&str, Vec<&Vma>> = HashMap::new();
        for vma in vmas.iter().filter(|v| v.is_file()) {
            by_file.entry(&vma.path).or_default().push(vma);
        }
        for (path, vmas) in by_file {
            // A file we cannot read or parse only loses its own frames: the walk falls back to
            // frame pointers there.
            let module = open(vmas[0])
                .map_err(anyhow::Error::from)
                .and_then(|file| module(path, file, &vmas));
            if let Ok(module) = module {
                ranges.push(module.avma_range());
                unwinder.add_module(module);
            }
        }
        ProcessUnwinder {
            unwinder,
            cache: CacheX86_64::new(),
            ranges,
        }
    }

    /// Whether `addr` lies in a module this unwinder knows.
    pub fn covers(&self, addr: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&addr))
    }

    pub fn unwind(&mut self, s: &StackCopy) -> Unwound {
        let mut read = |addr| s.read(addr);
        let mut frames = self.unwinder.iter_frames(
            s.ip,
            UnwindRegsX86_64::new(s.ip, s.sp, s.bp),
            &mut self.cache,
            &mut read,
        );
        let mut out = Vec::new();
        loop {
            match frames.next() {
                Ok(Some(f)) if out.len() < MAX_FRAMES => out.push(f.address()),
                Ok(Some(_)) | Err(_) => {
                    return Unwound {
                        frames: out,
                        complete: false,
                    }
                }
                Ok(None) => {
                    // Ended where the stack ends, through code it knows: a guess by frame
                    // pointers in unknown code can end "cleanly" on a zero too. (The leaf may be
                    // in the vDSO, which is no module.)
                    let known = out.iter().skip(1).all(|&a| self.covers(a));
                    return Unwound {
                        frames: out,
                        complete: known,
                    };
                }
            }
        }
    }
}

/// The virtual address of the file (page-aligned) that a mapping of file offset `offset` starts
/// at: address - (start - this) is the file's virtual address. The kernel maps a segment from
/// its page-aligned file offset, so the mapping holds the segment whose p_offset rounds down to
/// `offset`, with p_vaddr rounded down the same way. (Matching on the unrounded file range picks
/// the wrong segment when p_offset and p_vaddr differ by a page.)
/// `segments` are (p_offset, p_vaddr) pairs.
pub(crate) fn mapped_vaddr(segments: &[(u64, u64)], offset: u64) -> Option<u64> {
    const PAGE: u64 = 0x1000;
    segments
        .iter()
        .find_map(|&(off, vaddr)| (off & !(PAGE - 1) == offset).then_some(vaddr & !(PAGE - 1)))
}

/// An ELF file's (p_offset, p_vaddr) pairs.
pub(crate) fn segments<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Vec<(u64, u64)> {
    elf.segments()
        .map(|seg| (seg.file_range().0, seg.address()))
        .collect()
}

/// One mapped ELF file as a framehop module: its unwind sections, and where it is loaded.
fn module(name: &str, file: File, vmas: &[&Vma]) -> Result<Module<Vec<u8>>> {
    let reader = crate::target_files::elf_reader(file);
    let elf = object::File::parse(&reader).with_context(|| format!("parsing {name}"))?;
    let first = vmas[0];
    let svma =
        mapped_vaddr(&segments(&elf), first.offset).context("no segment holds the mapped code")?;
    let bias = first.start.wrapping_sub(svma);
    let section = |name: &str| {
        elf.section_by_name(name).and_then(|s| {
            let range = s.address()..s.address() + s.size();
            let bytes = crate::target_files::section_bytes(&s)?.into_owned();
            Some((range, bytes))
        })
    };
    let (text_svma, text) = section(".text").unzip();
    let (eh_frame_svma, eh_frame) = section(".eh_frame").unzip();
    let (eh_frame_hdr_svma, eh_frame_hdr) = section(".eh_frame_hdr").unzip();
    let got_svma = section(".got").map(|(r, _)| r);
    let debug_frame = section(".debug_frame").map(|(_, d)| d);
    let start = vmas.iter().map(|v| v.start).min().unwrap_or(first.start);
    let end = vmas.iter().map(|v| v.end).max().unwrap_or(first.end);
    Ok(Module::new(
        name.to_string(),
        start..end,
        bias,
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma,
            text,
            got_svma,
            eh_frame_svma,
            eh_frame,
            eh_frame_hdr_svma,
            eh_frame_hdr,
            debug_frame,
            ..Default::default()
        },
    ))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// This thread's ip, sp and bp here, and up to 16 KiB of its stack read through
    /// `/proc/self/mem` in 512-byte chunks that stop at the first unreadable one (as BPF does).
    #[inline(never)]
    pub(crate) fn capture() -> (u64, u64, u64, Vec<u8>) {
        let (ip, sp, bp): (u64, u64, u64);
        // SAFETY: reads three registers, touches no memory.
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
            );
        }
        use std::os::unix::fs::FileExt;
        let mem = std::fs::File::open("/proc/self/mem").unwrap();
        let mut stack = Vec::new();
        let mut chunk = [0u8; 512];
        // Chunks aligned to 512 bytes (the first one shorter), so that a chunk never straddles
        // the end of the stack's mapping.
        let mut want = 512 - (sp % 512) as usize;
        while stack.len() < 16 << 10 {
            match mem.read_at(&mut chunk[..want], sp + stack.len() as u64) {
                Ok(n) if n == want => stack.extend_from_slice(&chunk[..want]),
                _ => break,
            }
            want = 512;
        }
        (ip, sp, bp, stack)
    }

    #[inline(never)]
    fn level_three() -> Unwound {
        let (ip, sp, bp, stack) = capture();
        let pid = std::process::id();
        let vmas = crate::procmaps::read_vmas(pid).unwrap();
        let mut u =
            ProcessUnwinder::from_mappings(&vmas, |vma| crate::target_files::open_mapped(pid, vma));
        assert!(u.covers(ip));
        let got = u.unwind(&StackCopy {
            ip,
            sp,
            bp,
            stack: &stack,
        });
        std::hint::black_box(got)
    }

    #[inline(never)]
    fn level_two() -> Unwound {
        std::hint::black_box(level_three())
    }

    #[inline(never)]
    fn level_one() -> Unwound {
        std::hint::black_box(level_two())
    }

    // Checks a real unwind of this test's own stack from its CFI: the frames, symbolized,
    // pass through level_three, level_two and level_one in that order, and the walk goes on
    // past them into the test harness.
    #[test]
    fn unwinds_its_own_stack() {
        let u = std::thread::spawn(level_one).join().unwrap();
        let src = blazesym::symbolize::source::Process::new(std::process::id().into());
        let symbolizer = blazesym::symbolize::Symbolizer::new();
        let addrs: Vec<u64> = u.frames.clone();
        let syms = symbolizer
            .symbolize(
                &blazesym::symbolize::source::Source::Process(src),
                blazesym::symbolize::Input::AbsAddr(&addrs),
            )
            .unwrap();
        let names: Vec<String> = syms
            .iter()
            .map(|s| s.as_sym().map(|s| s.name.to_string()).unwrap_or_default())
            .collect();
        let at = |f: &str| names.iter().position(|n| n.contains(f));
        let (three, two, one) = (at("level_three"), at("level_two"), at("level_one"));
        assert!(
            three.is_some() && three < two && two < one,
            "frames {names:?}"
        );
        assert!(names.len() > one.unwrap() + 2, "stopped early: {names:?}");
    }
}
