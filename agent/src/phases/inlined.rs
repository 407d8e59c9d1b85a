//! Copies of phase functions the compiler inlined into their callers, from the DWARF
//! (`DW_TAG_inlined_subroutine`), as `perf probe` finds them: a probe on the function's symbol
//! never sees a call that runs an inlined copy. A copy is probed at its first instruction (the
//! entry) and at the first instruction after the range that holds it (where the caller goes on:
//! the exit; other ranges of a copy are its cold paths, moved away); a copy that ends its caller
//! has no such exit and is counted as not covered.
use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context, Result};
use gimli::{AttributeValue, EndianSlice, RunTimeEndian};
use object::{Object, ObjectSegment};

use crate::elf::{demangle, FunctionSymbol};

/// One inlined copy of a function: file offsets of its entry and of its exit (None: the copy
/// cannot be followed to an exit).
#[derive(Clone, Debug, PartialEq)]
pub struct InlinedCopy {
    /// The inlined function's name (demangled where the DWARF gives a linkage name).
    pub name: String,
    pub entry: u64,
    pub exit: Option<u64>,
}

type Reader<'a> = EndianSlice<'a, RunTimeEndian>;

/// Every inlined copy in `path`'s DWARF whose function `wanted` accepts by name (empty without
/// DWARF). `symbols`: the file's functions, to check that an exit lies inside its caller.
pub fn inlined_copies(
    path: &Path,
    symbols: &[FunctionSymbol],
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<InlinedCopy>> {
    let reader = crate::target_files::read_elf(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let elf =
        object::File::parse(&reader).with_context(|| format!("parsing {}", path.display()))?;
    if elf.section_by_name(".debug_info").is_none() {
        return Ok(Vec::new());
    }
    let endian = if elf.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let mut sections: HashMap<&'static str, std::borrow::Cow<'_, [u8]>> = HashMap::new();
    for id in [
        gimli::SectionId::DebugInfo,
        gimli::SectionId::DebugAbbrev,
        gimli::SectionId::DebugStr,
        gimli::SectionId::DebugLineStr,
        gimli::SectionId::DebugRanges,
        gimli::SectionId::DebugRngLists,
        gimli::SectionId::DebugAddr,
        gimli::SectionId::DebugStrOffsets,
        gimli::SectionId::DebugLine,
    ] {
        if let Some(s) = elf.section_by_name(id.name()) {
            let bytes = crate::target_files::section_bytes(&s)
                .with_context(|| format!("{} of {} is too large", id.name(), path.display()))?;
            sections.insert(id.name(), bytes);
        }
    }
    let dwarf = gimli::Dwarf::load(|id| -> Result<Reader<'_>, gimli::Error> {
        Ok(Reader::new(
            sections.get(id.name()).map(|b| &b[..]).unwrap_or(&[]),
            endian,
        ))
    })?;
    let found = walk_units(&dwarf)?;
    let offset_of = |vaddr: u64| -> Option<u64> {
        elf.segments().find_map(|s| {
            let (off, size) = s.file_range();
            (vaddr >= s.address() && vaddr < s.address() + size).then(|| off + vaddr - s.address())
        })
    };
    // An exit must be an instruction of the caller: inside a function, not its start.
    let inside_a_function = |off: u64| {
        symbols
            .iter()
            .any(|f| off > f.file_offset && off < f.file_offset + f.size)
    };
    let mut out = Vec::new();
    for copy in found.copies {
        let Some(name) = found.names.get(&copy.origin) else {
            continue;
        };
        if !wanted(name) {
            continue;
        }
        let Some(entry) = offset_of(copy.low) else {
            continue;
        };
        let exit = copy
            .high
            .and_then(offset_of)
            .filter(|&off| inside_a_function(off));
        out.push(InlinedCopy {
            name: name.clone(),
            entry,
            exit,
        });
    }
    Ok(out)
}

/// An inlined copy as the DWARF gives it: its function's DIE, its first address, and the end
/// of the range that holds it.
struct RawCopy {
    origin: usize,
    low: u64,
    high: Option<u64>,
}

#[derive(Default)]
struct Found {
    /// Function names by the global offset of their DIE.
    names: HashMap<usize, String>,
    copies: Vec<RawCopy>,
}

fn walk_units(dwarf: &gimli::Dwarf<Reader<'_>>) -> Result<Found> {
    let mut found = Found::default();
    let mut units = dwarf.units();
    while let Some(header) = units.next()? {
        let unit = dwarf.unit(header)?;
        let Some(base) = gimli::UnitOffset(0).to_debug_info_offset(&unit.header) else {
            continue;
        };
        let base = base.0;
        let mut entries = unit.entries();
        while let Some(die) = entries.next_dfs()? {
            match die.tag() {
                gimli::DW_TAG_subprogram => {
                    if let Some(name) = die_name(dwarf, &unit, die)? {
                        found.names.insert(base + die.offset().0, name);
                    }
                }
                gimli::DW_TAG_inlined_subroutine => {
                    let origin = match die.attr_value(gimli::DW_AT_abstract_origin) {
                        Some(AttributeValue::UnitRef(o)) => base + o.0,
                        Some(AttributeValue::DebugInfoRef(o)) => o.0,
                        _ => continue,
                    };
                    let mut ranges = dwarf.die_ranges(&unit, die)?;
                    let mut all = Vec::new();
                    while let Some(r) = ranges.next()? {
                        all.push(r);
                    }
                    let Some(first) = all.iter().min_by_key(|r| r.begin) else {
                        continue;
                    };
                    if first.begin == 0 {
                        continue; // discarded by the linker
                    }
                    let low = die_entry_pc(dwarf, &unit, die)?.unwrap_or(first.begin);
                    // The range the copy starts in ends where its caller goes on; others are
                    // its cold paths (an abort), moved away.
                    let high = (all.iter())
                        .find(|r| low >= r.begin && low < r.end)
                        .map(|r| r.end);
                    found.copies.push(RawCopy { origin, low, high });
                }
                _ => {}
            }
        }
    }
    Ok(found)
}

/// A function's name: its linkage name demangled (Rust, C++), else its name (C, Go's full
/// `pkg.(*T).Method`).
fn die_name(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    die: &gimli::DebuggingInformationEntry<Reader<'_>>,
) -> Result<Option<String>> {
    for (attr, mangled) in [
        (gimli::DW_AT_linkage_name, true),
        (gimli::DW_AT_MIPS_linkage_name, true),
        (gimli::DW_AT_name, false),
    ] {
        if let Some(v) = die.attr_value(attr) {
            let s = dwarf.attr_string(unit, v)?;
            let s = String::from_utf8_lossy(s.slice()).into_owned();
            return Ok(Some(if mangled { demangle(&s) } else { s }));
        }
    }
    Ok(None)
}

/// A copy's `DW_AT_entry_pc`, where its ranges do not start with its first instruction.
fn die_entry_pc(
    dwarf: &gimli::Dwarf<Reader<'_>>,
    unit: &gimli::Unit<Reader<'_>>,
    die: &gimli::DebuggingInformationEntry<Reader<'_>>,
) -> Result<Option<u64>> {
    Ok(match die.attr_value(gimli::DW_AT_entry_pc) {
        Some(AttributeValue::Addr(a)) => Some(a),
        Some(AttributeValue::DebugAddrIndex(i)) => Some(dwarf.address(unit, i)?),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks a C file compiled by clang -O2 -g: `step` is inlined into `run` (one contiguous
    // copy, followed by more of `run`) and also kept out of line (its address is taken): the
    // copy is found, with an exit inside `run`.
    #[test]
    fn finds_an_inlined_copy_and_its_exit() {
        let dir = std::env::temp_dir().join(format!("phaseprof-inlined-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("f.c");
        std::fs::write(
            &src,
            "static volatile long sink;\n\
             static void step(long i) { sink += i * 7; sink ^= i; }\n\
             void (*volatile keep)(long) = step;\n\
             __attribute__((noinline)) void run(long n) { for (long i = 0; i < n; i++) { step(i); sink += 1; } }\n\
             int main(void) { run(10); return 0; }\n",
        )
        .unwrap();
        let bin = dir.join("f");
        let st = std::process::Command::new("clang")
            .args(["-O2", "-g", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("clang (scripts/setup.sh installs it)");
        assert!(st.success());
        let syms = crate::elf::function_symbols(&bin).unwrap();
        let copies = inlined_copies(&bin, &syms, |n| n == "step").unwrap();
        let run = syms.iter().find(|f| f.name == "run").unwrap();
        assert!(!copies.is_empty(), "no inlined copy of step");
        for c in &copies {
            assert_eq!(c.name, "step");
            assert!(c.entry >= run.file_offset && c.entry < run.file_offset + run.size);
        }
        assert!(copies.iter().any(|c| c.exit.is_some()), "{copies:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
