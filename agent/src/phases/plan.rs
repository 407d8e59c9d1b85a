//! From a phases config and the target's ELF objects to the probes to attach: every matched
//! function with its entry offset and, for Go code, the offsets of its return instructions
//! (Go moves goroutine stacks, so a uretprobe's hijacked return address would crash it).
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, Register};
use phaseprof_bpf::types::{go_sched_flag, go_sched_point};

use super::config::{CostEvent, PhaseConfig};
use super::symbols::{function_symbols, resolve, FunctionSymbol, ProbeSite};
use crate::alloc::placement::{choose_in, kernel_emulates, Needs};
use crate::engine::MAX_SYSCALL_COSTS;

/// One probe point of one phase.
#[derive(Clone, Debug)]
pub struct PhaseProbe {
    /// Phase id (index into the profile's phases; 0 is `(none)`).
    pub phase: u32,
    pub site: ProbeSite,
    /// Go code: file offsets of the function's return instructions. None: use a uretprobe.
    pub returns: Option<Vec<u64>>,
    /// Whether the kernel emulates the entry's instruction (else it is single-stepped).
    pub entry_emulated: bool,
}

/// Where in the Go scheduler a goroutine starts or stops running on an OS thread: phases of
/// Go code are kept per goroutine, and these probes tell which goroutine's phases a thread's
/// events belong to (the scheduler switches goroutines without a kernel context switch).
#[derive(Clone, Debug, PartialEq)]
pub struct GoSwitchProbe {
    pub site: ProbeSite,
    /// The attach cookie: enum go_sched_point, with GO_SCHED_CURRENT_G when the goroutine is
    /// the running one rather than the first argument.
    pub cookie: u64,
}

/// The runtime functions probed for goroutine phases: `execute(gp)` starts running a goroutine;
/// `mcall(fn)` (assembly, never inlined) is how a running goroutine stops in every case but
/// one (parks, yields, is preempted by a signal, finds no P after a syscall, exits); the stack
/// check's preemption in `newstack`, already on the scheduler's stack, calls `goschedImpl(gp)`
/// or `preemptPark(gp)`; `goexit0(gp)` ends one. Each is (name, point, the goroutine is the
/// running one, required). Small wrappers such as `gopreempt_m` are inlined and cannot be used.
const GO_SWITCH_POINTS: &[(&str, u32, bool, bool)] = &[
    ("runtime.execute", GO_EXECUTE, false, true),
    ("runtime.mcall", GO_STOP, true, true),
    ("runtime.goschedImpl", GO_STOP, false, false),
    ("runtime.preemptPark", GO_STOP, false, false),
    ("runtime.goexit0", GO_EXIT, false, false),
];
const GO_SCHED_CURRENT_G: u64 = go_sched_flag::GO_SCHED_CURRENT_G.0 as u64;
const GO_EXECUTE: u32 = go_sched_point::GO_EXECUTE.0;
const GO_STOP: u32 = go_sched_point::GO_STOP.0;
const GO_EXIT: u32 = go_sched_point::GO_EXIT.0;

#[derive(Clone, Debug, Default)]
pub struct PhasePlan {
    /// Phase names by id - 1.
    pub names: Vec<String>,
    pub probes: Vec<PhaseProbe>,
    /// Go executables with phases: their scheduler's switch points.
    pub go_switches: Vec<GoSwitchProbe>,
    /// Syscall cost rules the kernel counts per phase: (name, syscall numbers).
    pub syscall_costs: Vec<(String, Vec<u32>)>,
    /// Allocation cost rules computed from allocation stacks: (name, frame globs).
    pub alloc_costs: Vec<(String, Vec<String>)>,
}

/// Go binaries carry `runtime.main`; their functions get return-instruction probes.
pub(crate) fn is_go(symbols: &[FunctionSymbol]) -> bool {
    symbols.iter().any(|s| s.raw == "runtime.main")
}

/// The instructions of the function at `file_offset`, with their file offsets as `ip`.
pub(crate) fn decode_function(
    path: &Path,
    file_offset: u64,
    size: u64,
) -> Result<Vec<Instruction>> {
    if size == 0 {
        bail!("the symbol has no size, so its code cannot be decoded");
    }
    let mut code = vec![0u8; size as usize];
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    f.seek(SeekFrom::Start(file_offset))?;
    f.read_exact(&mut code)?;
    let mut decoder = Decoder::with_ip(64, &code, file_offset, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while decoder.can_decode() {
        insns.push(decoder.decode());
    }
    Ok(insns)
}

/// x86 uprobes refuse instructions with a LOCK or an ES/CS/DS/SS prefix (the kernel's
/// `is_prefix_bad`): a probe there is never installed, silently.
pub(crate) fn uprobe_refuses(insn: &Instruction) -> bool {
    insn.has_lock_prefix()
        || matches!(
            insn.segment_prefix(),
            Register::ES | Register::CS | Register::DS | Register::SS
        )
}

/// Where to put a function's entry probe (and its uretprobe, which reads the return address at
/// the stack top): the first instruction, or when the kernel refuses it, the first later one
/// that every call still executes exactly once with the return address on top of the stack —
/// before any branch, call or stack change, and not a branch target.
pub fn entry_offset(path: &Path, file_offset: u64, size: u64) -> Result<u64> {
    let insns = decode_function(path, file_offset, size.max(1))?;
    let Some(first) = insns.first() else {
        bail!("the function is empty")
    };
    if !uprobe_refuses(first) {
        return Ok(first.ip());
    }
    let targets: Vec<u64> = insns
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            )
        })
        .map(|i| i.near_branch_target())
        .collect();
    for insn in &insns[1..] {
        let straight = insn.flow_control() == FlowControl::Next
            && insn.stack_pointer_increment() == 0
            && insn.op0_register() != Register::RSP;
        if !straight || targets.contains(&insn.ip()) {
            break;
        }
        if !uprobe_refuses(insn) {
            return Ok(insn.ip());
        }
    }
    bail!("its first instructions cannot be uprobed (LOCK or segment prefix) and no later instruction of its entry block qualifies")
}

/// The entry probe of a native function, which shares its site with a uretprobe: on an
/// instruction the kernel emulates when the entry block has one before the stack moves (a
/// single-stepped probe costs a second trap, ~15 us here), else where [`entry_offset`] puts it.
/// The site must not be a branch target, or a loop back to it would count a call twice.
pub fn native_entry(path: &Path, file_offset: u64, size: u64) -> Result<(u64, bool)> {
    let insns = decode_function(path, file_offset, size.max(1))?;
    let needs = Needs {
        args: &[],
        return_probe: true,
        skip_null_test: false,
    };
    if let Ok(p) = choose_in(&insns, file_offset, needs) {
        let targeted = insns.iter().any(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) && i.near_branch_target() == p.file_offset
        });
        if p.emulated && !targeted {
            return Ok((p.file_offset, true));
        }
    }
    let entry = entry_offset(path, file_offset, size)?;
    let emulated = insns
        .iter()
        .find(|i| i.ip() == entry)
        .is_some_and(kernel_emulates);
    Ok((entry, emulated))
}

/// Go functions open with a stack check (`cmp rsp, [r14+16]; jbe morestack`) whose slow path
/// grows the stack and jumps back to the entry: a probe there would fire twice for one call.
/// The entry probe of a Go function goes right after that check; functions without one keep
/// their first instruction.
pub fn go_entry_offset(path: &Path, file_offset: u64, size: u64) -> Result<u64> {
    let insns = decode_function(path, file_offset, size)?;
    for (i, insn) in insns.iter().enumerate().take(4) {
        if insn.flow_control() == FlowControl::ConditionalBranch {
            let checks_stack = insns[..i]
                .iter()
                .any(|c| c.mnemonic() == Mnemonic::Cmp && c.memory_base() == Register::R14);
            if checks_stack {
                if let Some(body) = insns.get(i + 1) {
                    return Ok(body.ip());
                }
            }
            break;
        }
    }
    Ok(file_offset)
}

/// File offsets of every `ret` in the function at `site`, decoded from its machine code.
pub fn return_offsets(path: &Path, file_offset: u64, size: u64) -> Result<Vec<u64>> {
    let rets: Vec<u64> = decode_function(path, file_offset, size)?
        .iter()
        .filter(|i| i.mnemonic() == Mnemonic::Ret)
        .map(|i| i.ip())
        .collect();
    if rets.is_empty() {
        bail!("no return instruction found (the function never returns, or ends in a tail call)");
    }
    Ok(rets)
}

/// Whether the kernel emulates the instruction at `file_offset` of `path`.
fn emulated_at(path: &Path, file_offset: u64) -> bool {
    decode_function(path, file_offset, 16)
        .ok()
        .and_then(|insns| insns.first().map(kernel_emulates))
        .unwrap_or(false)
}

/// The scheduler's switch points in the Go executable `path` (see [`GO_SWITCH_POINTS`]).
fn go_switch_probes(path: &Path, syms: &[FunctionSymbol]) -> Result<Vec<GoSwitchProbe>> {
    // Go 1.17 brought the register ABI, which keeps the running goroutine in R14 (and names
    // the assembly functions' ABI0 entry points `*.abi0`); before it, R14 is just a register.
    if !syms.iter().any(|s| s.raw.ends_with(".abi0")) {
        bail!(
            "{}: Go phases are kept per goroutine, found through Go's register ABI (Go >= 1.17); this binary predates it (no `.abi0` functions)",
            path.display()
        );
    }
    let mut out = Vec::new();
    for &(name, point, current, required) in GO_SWITCH_POINTS {
        let Some(sym) = syms.iter().find(|s| s.raw == name) else {
            if required {
                bail!(
                    "{}: Go phases are kept per goroutine, which needs the runtime's `{name}` (Go >= 1.17 with its register ABI); it is not in the symbol table",
                    path.display()
                );
            }
            continue;
        };
        let entry = go_entry_offset(path, sym.file_offset, sym.size)
            .with_context(|| format!("decoding `{name}` in {}", path.display()))?;
        out.push(GoSwitchProbe {
            site: ProbeSite {
                path: path.to_path_buf(),
                symbol: name.to_string(),
                file_offset: entry,
                size: sym.size,
            },
            cookie: point as u64 | if current { GO_SCHED_CURRENT_G } else { 0 },
        });
    }
    Ok(out)
}

impl PhasePlan {
    /// Resolves every phase of `cfg` in `objects` (the target's executable and shared objects).
    pub fn build(cfg: &PhaseConfig, file: &str, objects: &[PathBuf]) -> Result<PhasePlan> {
        let mut plan = PhasePlan::from_config(cfg, file)?;
        plan.resolve(cfg, file, objects)?;
        Ok(plan)
    }

    /// Phase names and syscall cost rules, without probes yet (`resolve` adds them once the
    /// target's objects are known).
    pub fn from_config(cfg: &PhaseConfig, file: &str) -> Result<PhasePlan> {
        let mut plan = PhasePlan {
            names: cfg.phases.iter().map(|p| p.name.clone()).collect(),
            ..PhasePlan::default()
        };
        plan.alloc_costs = cfg
            .costs
            .iter()
            .filter(|r| r.event == CostEvent::Alloc)
            .map(|r| (r.name.clone(), r.frames.clone()))
            .collect();
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

    /// Finds every phase's functions in `objects` and plans their probes. Prints how many
    /// functions a glob matched when it matched more than one.
    pub fn resolve(&mut self, cfg: &PhaseConfig, file: &str, objects: &[PathBuf]) -> Result<()> {
        let mut symbols = Vec::new();
        for path in objects {
            symbols.push((path.clone(), function_symbols(path)?));
        }
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
            for mut site in sites {
                let func_start = site.file_offset;
                let go = symbols
                    .iter()
                    .any(|(p, syms)| *p == site.path && is_go(syms));
                let cannot = || {
                    format!(
                        "phase `{}`: function `{}` cannot be probed",
                        spec.name, site.symbol
                    )
                };
                let (entry, returns, entry_emulated) = if go {
                    let entry =
                        go_entry_offset(&site.path, func_start, site.size).with_context(cannot)?;
                    let returns =
                        return_offsets(&site.path, func_start, site.size).with_context(cannot)?;
                    (entry, Some(returns), emulated_at(&site.path, entry))
                } else {
                    let (entry, emulated) =
                        native_entry(&site.path, func_start, site.size).with_context(cannot)?;
                    (entry, None, emulated)
                };
                if entry != func_start && !go {
                    eprintln!(
                        "phaseprof: phase `{}`: `{}` probed at +{:#x} ({})",
                        spec.name,
                        site.symbol,
                        entry - func_start,
                        if entry_emulated {
                            "an instruction the kernel emulates, not single-stepped"
                        } else {
                            "its first instruction is one uprobes refuse"
                        }
                    );
                }
                site.file_offset = entry;
                self.probes.push(PhaseProbe {
                    phase,
                    site,
                    returns,
                    entry_emulated,
                });
            }
        }
        for (path, syms) in &symbols {
            let has_go_phase = self
                .probes
                .iter()
                .any(|p| p.returns.is_some() && p.site.path == *path);
            if has_go_phase && !self.go_switches.iter().any(|g| g.site.path == *path) {
                self.go_switches.extend(go_switch_probes(path, syms)?);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// Starts with `lock inc` (the atomic increment), which uprobes refuse.
    #[inline(never)]
    pub fn starts_locked(x: u64) -> u64 {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::hint::black_box(x) + 1
    }

    // Checks that an entry probe moves past a LOCK-prefixed first instruction, and stays at the
    // entry otherwise.
    #[test]
    fn entry_probe_avoids_refused_instructions() {
        assert_eq!(starts_locked(1), 2);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let syms = function_symbols(&exe).unwrap();
        let find = |suffix: &str| {
            syms.iter()
                .find(|s| s.name.ends_with(suffix))
                .unwrap()
                .clone()
        };
        let locked = find("plan::tests::starts_locked");
        let insns = decode_function(&exe, locked.file_offset, locked.size).unwrap();
        assert!(
            insns[0].has_lock_prefix(),
            "the test function must start with a locked instruction"
        );
        let entry = entry_offset(&exe, locked.file_offset, locked.size).unwrap();
        assert_eq!(entry, insns[1].ip());
        let plain = find("symbols::tests::a_phase_function_for_tests");
        assert_eq!(
            entry_offset(&exe, plain.file_offset, plain.size).unwrap(),
            plain.file_offset
        );
    }

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
