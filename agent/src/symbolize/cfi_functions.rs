//! Functions of a file that has no symbol for them, found from its call-frame information:
//! Debian's libraries keep `.eh_frame` (for unwinding) but not their static functions' names.
//! An address such a function contains is named after the function's start
//! (`libz.so.1.2.13+0x49e0`), so every sample in it lands in one frame of the flamegraph
//! instead of one frame per instruction.

use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
use object::{Object, ObjectSection, ObjectSegment};

/// Function ranges as file offsets, sorted by start.
#[derive(Default)]
pub struct CfiFunctions {
    ranges: Vec<(u64, u64)>,
}

impl CfiFunctions {
    /// The FDEs of `path`'s `.eh_frame`; empty when it has none or cannot be read.
    pub fn of(file: &std::fs::File) -> Self {
        let Ok(clone) = file.try_clone() else {
            return Self::default();
        };
        let reader = crate::target_files::elf_reader(clone);
        let Ok(elf) = object::File::parse(&reader) else {
            return Self::default();
        };
        let mut ranges = Vec::new();
        if let Some(section) = elf.section_by_name(".eh_frame") {
            let bytes = crate::target_files::section_bytes(&section).unwrap_or_default();
            let eh_frame = EhFrame::new(&bytes[..], LittleEndian);
            let mut bases = BaseAddresses::default().set_eh_frame(section.address());
            if let Some(text) = elf.section_by_name(".text") {
                bases = bases.set_text(text.address());
            }
            let mut entries = eh_frame.entries(&bases);
            while let Ok(Some(entry)) = entries.next() {
                let CieOrFde::Fde(partial) = entry else {
                    continue;
                };
                let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
                    continue;
                };
                let (start, len) = (fde.initial_address(), fde.len());
                if let Some(offset) = file_offset(&elf, start) {
                    ranges.push((offset, offset + len));
                }
            }
        }
        ranges.sort_unstable();
        CfiFunctions { ranges }
    }

    /// The start (file offset) of the function containing file offset `offset`.
    pub fn start_of(&self, offset: u64) -> Option<u64> {
        let i = self.ranges.partition_point(|&(start, _)| start <= offset);
        let (start, end) = *self.ranges.get(i.checked_sub(1)?)?;
        (offset < end).then_some(start)
    }
}

/// The file offset of virtual address `addr` (through the segment that loads it).
fn file_offset<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>, addr: u64) -> Option<u64> {
    elf.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        let from = seg.address();
        (from <= addr && addr < from + size).then(|| addr - from + offset)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks Debian's libz (no symbols for its static functions, call-frame information for
    // all of them): its exported `deflate` starts an FDE, an address inside deflate maps back to
    // deflate's start, and an address past the last function to nothing.
    #[test]
    fn finds_functions_of_a_stripped_library() {
        let libz = std::path::Path::new("/lib/x86_64-linux-gnu/libz.so.1");
        if !libz.exists() {
            eprintln!("SKIPPED: no libz.so.1 (scripts/setup.sh installs zlib1g-dev)");
            return;
        }
        let cfi = CfiFunctions::of(&std::fs::File::open(libz).unwrap());
        assert!(cfi.ranges.len() > 50, "{} FDEs", cfi.ranges.len());
        let deflate = crate::elf::function_symbols(libz)
            .unwrap()
            .into_iter()
            .find(|f| f.name == "deflate")
            .expect("libz exports deflate");
        assert_eq!(cfi.start_of(deflate.file_offset), Some(deflate.file_offset));
        assert_eq!(
            cfi.start_of(deflate.file_offset + 5),
            Some(deflate.file_offset)
        );
        assert_eq!(cfi.start_of(u64::MAX / 2), None);
    }
}
