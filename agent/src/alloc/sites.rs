//! Finding a target's allocator entry points: glibc's (or any libc's) malloc family, statically
//! linked jemalloc (plain, `je_`, `_rjem_` prefixes) and mimalloc (`mi_`), and for Go binaries
//! Go's own sampled-allocation hook.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use blazesym::SymType;
use iced_x86::Register;
use phaseprof_bpf::types::alloc_fn;

use crate::elf::for_each_symbol;
use crate::engine::{ProbeSpec, Uprobe};
use crate::x86::placement::{self, choose, Needs, Placement};

/// What an allocator function does, as the BPF side sees it (its `enum alloc_fn`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AllocKind {
    Malloc,
    Calloc,
    Realloc,
    PosixMemalign,
    AlignedAlloc,
    Free,
    /// Go's heap-profile hook: the register-ABI index of its size argument and the address of
    /// `runtime.MemProfileRate` (0: unknown).
    GoSample {
        size_arg: u8,
        rate_addr: u64,
    },
}

impl AllocKind {
    /// The probe's attach cookie.
    pub fn cookie(self) -> u64 {
        match self {
            AllocKind::Malloc => alloc_fn::AF_MALLOC.0 as u64,
            AllocKind::Calloc => alloc_fn::AF_CALLOC.0 as u64,
            AllocKind::Realloc => alloc_fn::AF_REALLOC.0 as u64,
            AllocKind::PosixMemalign => alloc_fn::AF_POSIX_MEMALIGN.0 as u64,
            AllocKind::AlignedAlloc => alloc_fn::AF_ALIGNED_ALLOC.0 as u64,
            AllocKind::Free => alloc_fn::AF_FREE.0 as u64,
            AllocKind::GoSample {
                size_arg,
                rate_addr,
            } => alloc_fn::AF_GO_SAMPLE.0 as u64 | (size_arg as u64) << 8 | rate_addr << 16,
        }
    }

    /// The registers holding the arguments the probe reads (SysV ABI).
    fn args(self) -> &'static [Register] {
        match self {
            AllocKind::Malloc | AllocKind::Free => &[Register::RDI],
            AllocKind::Calloc | AllocKind::Realloc | AllocKind::AlignedAlloc => {
                &[Register::RDI, Register::RSI]
            }
            AllocKind::PosixMemalign => &[Register::RDI, Register::RSI, Register::RDX],
            AllocKind::GoSample { .. } => &[],
        }
    }
}

/// Native entry points by unprefixed name.
const NATIVE: &[(&str, AllocKind)] = &[
    ("malloc", AllocKind::Malloc),
    ("calloc", AllocKind::Calloc),
    ("realloc", AllocKind::Realloc),
    ("posix_memalign", AllocKind::PosixMemalign),
    ("aligned_alloc", AllocKind::AlignedAlloc),
    ("memalign", AllocKind::AlignedAlloc),
    ("free", AllocKind::Free),
    // jemalloc's non-standard API (what tikv-jemallocator calls).
    ("mallocx", AllocKind::Malloc),
    ("rallocx", AllocKind::Realloc),
    ("sdallocx", AllocKind::Free),
    ("dallocx", AllocKind::Free),
];
const JEMALLOC_PREFIXES: &[&str] = &["", "je_", "_rjem_"];
const MIMALLOC: &[(&str, AllocKind)] = &[
    ("mi_malloc", AllocKind::Malloc),
    ("mi_zalloc", AllocKind::Malloc),
    ("mi_calloc", AllocKind::Calloc),
    ("mi_realloc", AllocKind::Realloc),
    ("mi_malloc_aligned", AllocKind::Malloc),
    ("mi_zalloc_aligned", AllocKind::Malloc),
    ("mi_realloc_aligned", AllocKind::Realloc),
    ("mi_aligned_alloc", AllocKind::AlignedAlloc),
    ("mi_free", AllocKind::Free),
];

fn kind_of(name: &str) -> Option<AllocKind> {
    if let Some(&(_, k)) = MIMALLOC.iter().find(|(n, _)| *n == name) {
        return Some(k);
    }
    JEMALLOC_PREFIXES.iter().find_map(|p| {
        let base = name.strip_prefix(p)?;
        NATIVE.iter().find(|(n, _)| *n == base).map(|&(_, k)| k)
    })
}

/// One allocator function to probe.
#[derive(Clone, Debug)]
pub struct AllocSite {
    pub path: PathBuf,
    pub symbol: String,
    pub kind: AllocKind,
    pub placement: Placement,
}

impl AllocSite {
    /// The engine's probes for this site: `free`, Go's sampler, or an allocator's entry and
    /// return.
    pub fn probe_specs(&self) -> Vec<ProbeSpec> {
        let programs: &[Uprobe] = match self.kind {
            AllocKind::GoSample { .. } => &[Uprobe::GoAllocSample],
            AllocKind::Free => &[Uprobe::Free],
            _ => &[Uprobe::AllocEnter, Uprobe::AllocExit],
        };
        programs
            .iter()
            .map(|&program| ProbeSpec {
                program,
                path: self.path.clone(),
                offset: self.placement.file_offset,
                cookie: self.kind.cookie(),
                what: match program {
                    Uprobe::GoAllocSample => "Go's allocation-sample probe".into(),
                    _ => format!("allocator probe of `{}`", self.symbol),
                },
            })
            .collect()
    }
}

/// Go's version from the binary's build info (`go1.26.8` → (1, 26)).
fn go_version(path: &Path) -> Option<(u32, u32)> {
    use object::Object;
    // The build info is its own section (`.go.buildinfo`, at its start).
    let reader = crate::target_files::read_elf(path).ok()?;
    let elf = object::File::parse(&reader).ok()?;
    let data = crate::target_files::section_bytes(&elf.section_by_name(".go.buildinfo")?)?;
    let at = memchr::memmem::find(&data, b"\xff Go buildinf:")?;
    // Go 1.18+: a 32-byte header, then the version as a varint-length-prefixed string.
    let rest = data.get(at + 32..)?;
    let len = *rest.first()? as usize;
    let version = std::str::from_utf8(rest.get(1..1 + len)?).ok()?;
    let mut parts = version.strip_prefix("go")?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .ok()?;
    Some((major, minor))
}

/// Go's hook: `runtime.mProf_Malloc(mp *m, p unsafe.Pointer, size uintptr)` since Go 1.23,
/// `(p, size)` from 1.17 (the register ABI) to 1.22.
fn go_sample_site(
    path: &Path,
    symbols: &BTreeMap<String, (u64, u64, u64)>,
) -> Result<Option<AllocSite>> {
    let Some(&(offset, size, _)) = symbols.get("runtime.mProf_Malloc") else {
        return Ok(None);
    };
    let Some((1, minor)) = go_version(path) else {
        eprintln!(
            "phaseprof: {}: unknown Go version; Go allocations are not recorded",
            path.display()
        );
        return Ok(None);
    };
    if minor < 17 {
        eprintln!("phaseprof: {}: Go 1.{minor} passes arguments on the stack; Go allocations are not recorded", path.display());
        return Ok(None);
    }
    let size_arg = if minor >= 23 { 2 } else { 1 };
    // Non-PIE Go executables (the default) map the variable at its link address.
    let rate_addr = symbols
        .get("runtime.MemProfileRate")
        .map(|&(_, _, addr)| addr)
        .filter(|&a| a < 1 << 48)
        .unwrap_or(0);
    // After Go's stack-check prologue, which re-runs the function's entry when the stack grows.
    let entry = crate::x86::go_entry_offset(path, offset, size)?;
    let mut placement = placement::entry(path, entry, size - (entry - offset))?;
    placement.delta = entry - offset;
    Ok(Some(AllocSite {
        path: path.to_path_buf(),
        symbol: "runtime.mProf_Malloc".into(),
        kind: AllocKind::GoSample {
            size_arg,
            rate_addr,
        },
        placement,
    }))
}

/// Every allocator function defined in `objects`, one site per function (aliases such as
/// memalign/aligned_alloc share one), with its chosen probe placement, or with `at_entry` its
/// first instruction.
pub fn find(objects: &[PathBuf], at_entry: bool) -> Result<Vec<AllocSite>> {
    let mut sites = Vec::new();
    for path in objects {
        // name → (file offset, size, address)
        let mut symbols: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
        for_each_symbol(path, |sym| {
            if let Some(off) = sym.file_offset {
                if sym.sym_type == SymType::Function || sym.name.starts_with("runtime.") {
                    symbols.insert(
                        sym.name.to_string(),
                        (off, sym.size.unwrap_or(0) as u64, sym.addr),
                    );
                }
            }
        })?;
        if let Some(site) = go_sample_site(path, &symbols)? {
            sites.push(site);
            continue; // Go code allocates through its own heap; its libc is not the allocator
        }
        let mut seen = std::collections::HashSet::new();
        for (name, &(offset, size, _)) in &symbols {
            let Some(kind) = kind_of(name) else { continue };
            if !seen.insert(offset) {
                continue;
            }
            let needs = Needs {
                args: kind.args(),
                return_probe: kind != AllocKind::Free,
                skip_null_test: kind == AllocKind::Free,
            };
            let placement = if at_entry {
                placement::entry(path, offset, size)
            } else {
                choose(path, offset, size, needs)
            }
            .with_context(|| format!("placing the probe of `{name}` in {}", path.display()))?;
            sites.push(AllocSite {
                path: path.clone(),
                symbol: name.clone(),
                kind,
                placement,
            });
        }
    }
    Ok(sites)
}

/// One line per site: where its probe went and whether the kernel emulates it there.
pub fn describe(sites: &[AllocSite]) -> String {
    sites
        .iter()
        .map(|s| {
            format!(
                "{}@{}+{:#x} `{}` ({})",
                s.symbol,
                s.path
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
                s.placement.delta,
                s.placement.instruction,
                if s.placement.emulated {
                    "emulated"
                } else {
                    "single-stepped"
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
