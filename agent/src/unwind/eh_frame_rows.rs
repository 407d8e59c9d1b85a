//! One ELF file's call-frame information (`.eh_frame`) compiled into the compact rows the BPF
//! walker reads: sorted by address, one row per change of rule, 8 bytes each. A row says how to
//! find the canonical frame address (CFA: the caller's stack pointer; x86-64 keeps the return
//! address just below it) and where the caller's rbp was saved. Rules the walker cannot apply
//! (DWARF expressions other than the PLT's, registers other than rsp/rbp) and the gaps between
//! functions become `Fp` rows: those frames are walked by frame pointers.
use std::path::Path;

use anyhow::{Context, Result};
use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, Register, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use object::{Object, ObjectSection};

/// How a row finds the CFA (`enum unwind_kind` of the BPF header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Rsp = 0,
    Rbp = 1,
    /// A PLT entry (`cfa_off` holds the address threshold, see the header).
    Plt = 2,
    /// The return address is undefined: the outermost frame (`_start`, `clone3`).
    End = 3,
    Fp = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// Address minus the table's `base`.
    pub pc: u32,
    pub kind: Kind,
    pub cfa_off: i16,
    /// rbp saved at CFA + 8 * rbp_off; 0: unchanged.
    pub rbp_off: i8,
}

impl Row {
    /// The header's `struct unwind_row`, as the kernel's array holds it.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[..4].copy_from_slice(&self.pc.to_le_bytes());
        b[4..6].copy_from_slice(&self.cfa_off.to_le_bytes());
        b[6] = self.rbp_off as u8;
        b[7] = self.kind as u8;
        b
    }

    fn same_rule(&self, other: &Row) -> bool {
        (self.kind, self.cfa_off, self.rbp_off) == (other.kind, other.cfa_off, other.rbp_off)
    }
}

/// A file's rows, addresses relative to `base` (a virtual address of the file).
#[derive(Debug, Default)]
pub struct Table {
    pub base: u64,
    pub rows: Vec<Row>,
    /// Rows the walker cannot apply (walked by frame pointers), for the report.
    pub unsupported: usize,
    /// The file's (p_offset, p_vaddr) pairs, to place its mappings.
    pub segments: Vec<(u64, u64)>,
}

impl Table {
    /// Frame pointers for every frame of a file that keeps them (`--unwind auto` per module),
    /// but the outermost frames (`_start`, `clone3`), where a walk ends complete: a few rows.
    pub fn frame_pointers_only(&mut self) {
        for r in &mut self.rows {
            if r.kind != Kind::End {
                (r.kind, r.cfa_off, r.rbp_off) = (Kind::Fp, 0, 0);
            }
        }
        self.rows.dedup_by(|later, first| first.same_rule(later));
        self.unsupported = 0;
    }
}

/// One row's rule: (kind, cfa offset, rbp offset in 8-byte units).
type Rule = (Kind, i16, i8);

/// The PLT's CFA expression as GNU ld writes it: rsp + 8, + 8 more once past the entry's push
/// (`(rip & 15) >= 11`; 10 in some linkers' layouts). Returns the threshold.
fn plt_threshold(expr: &[u8]) -> Option<i16> {
    // DW_OP_breg7 8, DW_OP_breg16 0, DW_OP_lit15, DW_OP_and, DW_OP_litN, DW_OP_ge, DW_OP_lit3,
    // DW_OP_shl, DW_OP_plus
    match expr {
        [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
            if (0x30..0x50).contains(lit) =>
        {
            Some((*lit - 0x30) as i16)
        }
        _ => None,
    }
}

/// Compiles `path`'s `.eh_frame`. A file without one has an empty table.
pub fn compile(path: &Path) -> Result<Table> {
    let reader = crate::target_files::read_elf(path)?;
    let elf =
        object::File::parse(&reader).with_context(|| format!("parsing {}", path.display()))?;
    let segments = super::process::segments(&elf);
    let Some(section) = elf.section_by_name(".eh_frame") else {
        return Ok(Table {
            segments,
            ..Table::default()
        });
    };
    let bytes = crate::target_files::section_bytes(&section).context(".eh_frame too large")?;
    let eh = EhFrame::new(&bytes, LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = elf.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = elf.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    // (address, row) for every row of every FDE, with the end of each FDE.
    let mut raw: Vec<(u64, Option<Rule>)> = Vec::new();
    let mut ctx = UnwindContext::new();
    let mut entries = eh.entries(&bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            continue;
        };
        if fde.len() == 0 {
            continue;
        }
        let Ok(mut rows) = fde.rows(&eh, &bases, &mut ctx) else {
            continue;
        };
        while let Ok(Some(row)) = rows.next_row() {
            raw.push((row.start_address(), Some(rule_of(row, &eh))));
        }
        raw.push((fde.end_address(), None));
    }
    Ok(Table {
        segments,
        ..assemble(raw)
    })
}

/// The rule of one row.
fn rule_of(
    row: &gimli::UnwindTableRow<usize>,
    eh: &EhFrame<gimli::EndianSlice<'_, LittleEndian>>,
) -> Rule {
    const FP: Rule = (Kind::Fp, 0, 0);
    // An undefined return address (or none: every CIE defines one) is the outermost frame.
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Undefined) => return (Kind::End, 0, 0),
        Some(RegisterRule::Offset(-8)) => {}
        Some(_) => return FP,
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => 0,
        Some(RegisterRule::Offset(n)) if n % 8 == 0 && (-1024..1024).contains(&n) => (n / 8) as i8,
        Some(_) => return FP,
    };
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(off) = i16::try_from(*offset) else {
                return FP;
            };
            match *register {
                X86_64::RSP => (Kind::Rsp, off, rbp),
                X86_64::RBP => (Kind::Rbp, off, rbp),
                Register(_) => FP,
            }
        }
        CfaRule::Expression(e) => match e.get(eh).ok().and_then(|e| plt_threshold(e.0.slice())) {
            Some(t) => (Kind::Plt, t, rbp),
            None => FP,
        },
    }
}

/// Sorts the rows, fills the gaps between functions with `Fp` rows and merges neighbours that
/// say the same.
fn assemble(mut raw: Vec<(u64, Option<Rule>)>) -> Table {
    // At one address a function's first row wins over the previous function's end.
    raw.sort_by_key(|&(addr, rule)| (addr, rule.is_some()));
    let Some(base) = raw.first().map(|r| r.0) else {
        return Table::default();
    };
    let mut rows: Vec<Row> = Vec::with_capacity(raw.len());
    let mut unsupported = 0;
    for (addr, rule) in raw {
        let Ok(pc) = u32::try_from(addr - base) else {
            break; // a module over 4 GiB of code: the rest is walked by frame pointers
        };
        let (kind, cfa_off, rbp_off) = rule.unwrap_or((Kind::Fp, 0, 0));
        unsupported += (rule.is_some() && kind == Kind::Fp) as usize;
        let row = Row {
            pc,
            kind,
            cfa_off,
            rbp_off,
        };
        match rows.last_mut() {
            Some(last) if last.pc == pc => *last = row,
            _ => rows.push(row),
        }
    }
    // A run of rows with one rule needs its first only.
    rows.dedup_by(|later, first| first.same_rule(later));
    Table {
        base,
        rows,
        unsupported,
        segments: Vec::new(),
    }
}

impl Table {
    /// The row in force at `addr` (a virtual address of the file).
    pub fn row_at(&self, addr: u64) -> Option<&Row> {
        let rel = u32::try_from(addr.checked_sub(self.base)?).ok()?;
        let i = self.rows.partition_point(|r| r.pc <= rel);
        self.rows.get(i.checked_sub(1)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks Debian's libc: thousands of rows; `clone3` ends its thread's stack (its return
    // address is undefined after the new thread starts); a function body takes rsp-based rules;
    // the PLT is recognized; rows are sorted and merged.
    #[test]
    fn compiles_libc() {
        let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
        let mut t = compile(libc).unwrap();
        assert!(t.rows.len() > 5000, "{} rows", t.rows.len());
        assert!(t.rows.windows(2).all(|w| w[0].pc < w[1].pc));
        assert!(t.rows.windows(2).all(|w| !w[0].same_rule(&w[1])));
        let ends = t.rows.iter().filter(|r| r.kind == Kind::End).count();
        assert!(ends >= 1, "no outermost frame in libc");
        let plt = t.rows.iter().filter(|r| r.kind == Kind::Plt).count();
        assert!(plt >= 1, "no PLT rule in libc");
        let unsupported = t.unsupported * 100 / t.rows.len();
        assert!(unsupported < 2, "{}% unsupported rows", unsupported);
        // Per module, for a file with frame pointers: its ends, frame pointers between them.
        t.frame_pointers_only();
        let kinds: Vec<Kind> = t.rows.iter().map(|r| r.kind).collect();
        assert_eq!(kinds.iter().filter(|&&k| k == Kind::End).count(), ends);
        assert!(kinds.iter().all(|&k| k == Kind::End || k == Kind::Fp));
        assert!(kinds.windows(2).all(|w| w[0] != w[1]), "{kinds:?}");
    }

    // Checks the assembled table against gimli's own rows, FDE by FDE, at every row's start and
    // last address, for libc and the dynamic loader: the merged, sorted table says the same
    // rule everywhere a function's CFI does.
    #[test]
    fn table_agrees_with_every_fde() {
        for path in [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/lib64/ld-linux-x86-64.so.2",
        ] {
            let path = Path::new(path);
            let t = compile(path).unwrap();
            let data = std::fs::read(path).unwrap();
            let elf = object::File::parse(&data[..]).unwrap();
            let section = elf.section_by_name(".eh_frame").unwrap();
            let bytes = section.uncompressed_data().unwrap();
            let eh = EhFrame::new(&bytes, LittleEndian);
            let mut bases = BaseAddresses::default().set_eh_frame(section.address());
            if let Some(text) = elf.section_by_name(".text") {
                bases = bases.set_text(text.address());
            }
            let mut ctx = UnwindContext::new();
            let mut entries = eh.entries(&bases);
            let mut checked = 0;
            while let Some(entry) = entries.next().unwrap() {
                let CieOrFde::Fde(partial) = entry else {
                    continue;
                };
                let fde = partial.parse(|s, b, o| s.cie_from_offset(b, o)).unwrap();
                let mut rows = fde.rows(&eh, &bases, &mut ctx).unwrap();
                while let Some(row) = rows.next_row().unwrap() {
                    let want = rule_of(row, &eh);
                    for addr in [row.start_address(), row.end_address() - 1] {
                        let got = t.row_at(addr).map(|r| (r.kind, r.cfa_off, r.rbp_off));
                        assert_eq!(got, Some(want), "{} at {addr:#x}", path.display());
                        checked += 1;
                    }
                }
            }
            assert!(
                checked > 1000,
                "{checked} rows checked in {}",
                path.display()
            );
        }
    }

    // Checks the row encoding against the header's layout.
    #[test]
    fn rows_encode_as_the_header_says() {
        let r = Row {
            pc: 0x1234,
            kind: Kind::Rbp,
            cfa_off: 16,
            rbp_off: -2,
        };
        assert_eq!(r.to_bytes(), [0x34, 0x12, 0, 0, 16, 0, 0xfe, 1]);
        assert_eq!(std::mem::size_of::<phaseprof_bpf::types::unwind_row>(), 8);
    }
}
