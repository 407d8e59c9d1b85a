//! From a phases config and the target's ELF objects to the probes to attach: every matched
//! function with its entry offset and, for Go code, the offsets of its return instructions
//! (Go moves goroutine stacks, so a uretprobe's hijacked return address would crash it).
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use iced_x86::{Decoder, DecoderOptions, Mnemonic};

use super::config::{CostEvent, PhaseConfig};
use super::symbols::{function_symbols, resolve, FunctionSymbol, ProbeSite};
use crate::engine::MAX_SYSCALL_COSTS;

/// One probe point of one phase.
#[derive(Clone, Debug)]
pub struct PhaseProbe {
    /// Phase id (index into the profile's phases; 0 is `(none)`).
    pub phase: u32,
    pub site: ProbeSite,
    /// Go code: file offsets of the function's return instructions. None: use a uretprobe.
    pub returns: Option<Vec<u64>>,
}

#[derive(Clone, Debug, Default)]
pub struct PhasePlan {
    /// Phase names by id - 1.
    pub names: Vec<String>,
    pub probes: Vec<PhaseProbe>,
    /// Syscall cost rules the kernel counts per phase: (name, syscall numbers).
    pub syscall_costs: Vec<(String, Vec<u32>)>,
}

/// Go binaries carry `runtime.main`; their functions get return-instruction probes.
fn is_go(symbols: &[FunctionSymbol]) -> bool {
    symbols.iter().any(|s| s.raw == "runtime.main")
}

/// File offsets of every `ret` in the function at `site`, decoded from its machine code.
pub fn return_offsets(path: &Path, file_offset: u64, size: u64) -> Result<Vec<u64>> {
    if size == 0 {
        bail!("the symbol has no size, so its return instructions cannot be found");
    }
    let mut code = vec![0u8; size as usize];
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.seek(SeekFrom::Start(file_offset))?;
    f.read_exact(&mut code)?;
    let mut decoder = Decoder::with_ip(64, &code, file_offset, DecoderOptions::NONE);
    let mut rets = Vec::new();
    while decoder.can_decode() {
        let insn = decoder.decode();
        if insn.mnemonic() == Mnemonic::Ret {
            rets.push(insn.ip());
        }
    }
    if rets.is_empty() {
        bail!("no return instruction found (the function never returns, or ends in a tail call)");
    }
    Ok(rets)
}

impl PhasePlan {
    /// Resolves every phase of `cfg` in `objects` (the target's executable and shared objects).
    /// Prints how many functions a glob matched when it matched more than one.
    pub fn build(cfg: &PhaseConfig, file: &str, objects: &[PathBuf]) -> Result<PhasePlan> {
        let mut symbols = Vec::new();
        for path in objects {
            symbols.push((path.clone(), function_symbols(path)?));
        }
        let mut plan = PhasePlan::default();
        for (i, spec) in cfg.phases.iter().enumerate() {
            let phase = i as u32 + 1;
            let sites = resolve(spec, file, &symbols)?;
            if sites.len() > 1 {
                eprintln!(
                    "phaseprof: phase `{}`: `{}` matches {} functions (all probed)",
                    spec.name,
                    spec.function,
                    sites.len()
                );
            }
            for site in sites {
                let go = symbols
                    .iter()
                    .any(|(p, syms)| *p == site.path && is_go(syms));
                let returns = if go {
                    Some(
                        return_offsets(&site.path, site.file_offset, site.size).with_context(
                            || {
                                format!(
                                    "phase `{}`: placing return probes in Go function `{}`",
                                    spec.name, site.symbol
                                )
                            },
                        )?,
                    )
                } else {
                    None
                };
                plan.probes.push(PhaseProbe {
                    phase,
                    site,
                    returns,
                });
            }
            plan.names.push(spec.name.clone());
        }
        for rule in cfg.costs.iter().filter(|r| r.event == CostEvent::Syscall) {
            if plan.syscall_costs.len() == MAX_SYSCALL_COSTS {
                bail!(
                    "{file}:{}: at most {MAX_SYSCALL_COSTS} syscall costs are supported",
                    rule.line
                );
            }
            let nrs = rule
                .syscalls
                .iter()
                .filter_map(|s| phaseprof_model::syscall_nr(s))
                .collect();
            plan.syscall_costs.push((rule.name.clone(), nrs));
        }
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks return-instruction decoding on a real function of this test binary.
    #[test]
    fn finds_return_instructions() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let syms = function_symbols(&exe).unwrap();
        let f = syms
            .iter()
            .find(|s| {
                s.name
                    .ends_with("symbols::tests::a_phase_function_for_tests")
            })
            .expect("the test function is in the binary");
        let rets = return_offsets(&exe, f.file_offset, f.size).unwrap();
        assert!(!rets.is_empty());
        assert!(rets
            .iter()
            .all(|&r| r >= f.file_offset && r < f.file_offset + f.size));
    }
}
