//! From a phases config and the target's ELF objects to the probes to attach: every matched
//! function with its entry offset and, for Go code, the offsets of its return instructions
//! (Go moves goroutine stacks, so a uretprobe's hijacked return address would crash it).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use phaseprof_bpf::types::{go_sched_flag, go_sched_point};

use super::config::{CostEvent, PhaseConfig};
use super::inlined::{inlined_copies, InlinedCopy};
use super::symbols::{resolve, ProbeSite};
use crate::elf::{function_symbols, glob_match, FunctionSymbol};
use crate::engine::{ProbeSpec, Uprobe, MAX_SYSCALL_COSTS};
use crate::symbolize::{debug_files::DebugFiles, debug_symbols};
use crate::x86::{emulated_at, go_entry_offset, native_entry, return_offsets};

/// One probe point of one phase.
#[derive(Clone, Debug)]
pub struct PhaseProbe {
    /// Phase id (index into the profile's phases; 0 is `(none)`).
    pub phase: u32,
    pub site: ProbeSite,
    pub exit: Exit,
    /// Whether the kernel emulates the entry's instruction (else it is single-stepped).
    pub entry_emulated: bool,
}

/// How the end of a phase function's call is seen.
#[derive(Clone, Debug, PartialEq)]
pub enum Exit {
    /// A uretprobe (native code).
    Uretprobe,
    /// Go code: probes on the file offsets of the function's return instructions.
    GoReturns(Vec<u64>),
    /// An inlined copy (`site` is its first instruction): a probe on the first instruction
    /// after it, where its caller goes on.
    Leave { offset: u64, go: bool },
}

impl PhaseProbe {
    /// Go code: its phases are kept per goroutine.
    pub fn is_go(&self) -> bool {
        matches!(self.exit, Exit::GoReturns(_) | Exit::Leave { go: true, .. })
    }
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
    /// Inlined copies of phase functions with no end to probe.
    pub inlined_unprobed: u64,
}

impl PhasePlan {
    /// The engine's probes for the plan, phase `p` of the plan counted as phase `id_of(p)`:
    /// each function's entry and its exit (a uretprobe, or for Go code uprobes on each return
    /// instruction, keeping the phases per goroutine), and the Go scheduler's switch points.
    /// Without attach `cookies`, inlined copies are left out (see `inlined_unprobed`).
    pub fn probe_specs(&self, id_of: impl Fn(u32) -> u32, cookies: bool) -> Vec<ProbeSpec> {
        let spec = |program, site: &ProbeSite, offset, cookie, kind: &str| ProbeSpec {
            program,
            path: site.path.clone(),
            offset,
            cookie,
            what: format!("{kind} probe of `{}`", site.symbol),
        };
        let mut out = Vec::new();
        for probe in &self.probes {
            let cookie = id_of(probe.phase) as u64;
            let site = &probe.site;
            match &probe.exit {
                Exit::Leave { .. } if !cookies => {}
                Exit::Leave { offset, go } => {
                    let (enter, leave) = if *go {
                        (Uprobe::GoPhaseEnter, Uprobe::GoPhaseLeave)
                    } else {
                        (Uprobe::PhaseEnter, Uprobe::PhaseLeave)
                    };
                    out.push(spec(enter, site, site.file_offset, cookie, "inlined entry"));
                    out.push(spec(leave, site, *offset, cookie, "inlined end"));
                }
                Exit::Uretprobe => {
                    out.push(spec(
                        Uprobe::PhaseEnter,
                        site,
                        site.file_offset,
                        cookie,
                        "entry",
                    ));
                    out.push(spec(
                        Uprobe::PhaseExit,
                        site,
                        site.file_offset,
                        cookie,
                        "return",
                    ));
                }
                Exit::GoReturns(offsets) => {
                    out.push(spec(
                        Uprobe::GoPhaseEnter,
                        site,
                        site.file_offset,
                        cookie,
                        "entry",
                    ));
                    for &off in offsets {
                        out.push(spec(
                            Uprobe::GoPhaseReturn,
                            site,
                            off,
                            cookie,
                            "return-instruction",
                        ));
                    }
                }
            }
        }
        for g in &self.go_switches {
            out.push(spec(
                Uprobe::GoSched,
                &g.site,
                g.site.file_offset,
                g.cookie,
                "scheduler",
            ));
        }
        out
    }
}

/// Every inlined copy, in each of `symbols`' objects, of a function some phase of `cfg` names
/// (none where an object has no DWARF or cannot be read: its copies go unseen, as before).
fn phase_copies(
    cfg: &PhaseConfig,
    symbols: &[(PathBuf, Vec<FunctionSymbol>)],
) -> Vec<(PathBuf, InlinedCopy)> {
    let wanted = |name: &str| cfg.phases.iter().any(|s| glob_match(&s.function, name));
    let mut out = Vec::new();
    for (path, syms) in symbols {
        if let Ok(copies) = inlined_copies(path, syms, wanted) {
            out.extend(copies.into_iter().map(|c| (path.clone(), c)));
        }
    }
    out
}

impl PhasePlan {
    /// Plans probes on phase `phase`'s inlined copies `copies`: at each copy's entry and at
    /// the first instruction after it; a copy without one is counted in `inlined_unprobed`.
    fn add_inlined(
        &mut self,
        phase: u32,
        name: &str,
        copies: &[&(PathBuf, InlinedCopy)],
        symbols: &[(PathBuf, Vec<FunctionSymbol>)],
    ) {
        let mut callers = Vec::new();
        for (path, copy) in copies {
            let syms = symbols.iter().find(|(p, _)| p == path).map(|(_, s)| s);
            let Some(end) = copy.exit else {
                self.inlined_unprobed += 1;
                continue;
            };
            let caller = (syms.into_iter().flatten())
                .find(|f| copy.entry >= f.file_offset && copy.entry < f.file_offset + f.size)
                .map(|f| f.name.clone())
                .unwrap_or_else(|| format!("{:#x}", copy.entry));
            callers.push(caller);
            self.probes.push(PhaseProbe {
                phase,
                site: ProbeSite {
                    path: path.clone(),
                    symbol: copy.name.clone(),
                    file_offset: copy.entry,
                    size: 0,
                },
                exit: Exit::Leave {
                    offset: end,
                    go: syms.is_some_and(|s| is_go(s)),
                },
                entry_emulated: emulated_at(path, copy.entry),
            });
        }
        let missed = copies.len() - callers.len();
        if !copies.is_empty() {
            eprintln!(
                "phaseprof: phase `{name}`: {} inlined {} probed{}{}",
                callers.len(),
                if callers.len() == 1 { "copy" } else { "copies" },
                if callers.is_empty() {
                    String::new()
                } else {
                    format!(" (in {})", callers.join(", "))
                },
                if missed > 0 {
                    format!(
                        "; {missed} cannot be (no single end): their calls are not counted, the \
                         phase table says INCOMPLETE"
                    )
                } else {
                    String::new()
                }
            );
        }
    }

    /// Attaches the plan's probes (phase `p` counted as `id_of(p)`), its inlined copies only
    /// where the kernel has attach cookies.
    pub fn attach(
        &self,
        engine: &mut crate::engine::Engine<'_>,
        id_of: impl Fn(u32) -> u32,
    ) -> Result<()> {
        let cookies = engine.features.attach_cookie;
        engine.attach_phases(
            &self.probe_specs(id_of, cookies),
            self.inlined_unprobed(cookies),
        )
    }

    /// Inlined copies that cannot be probed, those planned ones included where the kernel
    /// lacks attach cookies (their ends must know their phase).
    pub fn inlined_unprobed(&self, cookies: bool) -> u64 {
        let planned = (self.probes.iter())
            .filter(|p| matches!(p.exit, Exit::Leave { .. }))
            .count() as u64;
        self.inlined_unprobed + if cookies { 0 } else { planned }
    }
}

/// Go binaries carry `runtime.main`; their functions get return-instruction probes.
pub(crate) fn is_go(symbols: &[FunctionSymbol]) -> bool {
    symbols.iter().any(|s| s.raw == "runtime.main")
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
        let mut debug_files = DebugFiles::default();
        for path in objects {
            let mut syms = function_symbols(path)?;
            // A stripped object's static functions are named in its separate debug file only.
            if crate::elf::is_stripped(path) {
                if let Some((debug, all)) = debug_symbols::of_stripped(path, &mut debug_files) {
                    if all.len() > syms.len() {
                        eprintln!(
                            "phaseprof: phases: {} is stripped: its functions are named from {}",
                            path.display(),
                            debug.display()
                        );
                        syms = all;
                    }
                }
            }
            symbols.push((path.clone(), syms));
        }
        let copies = phase_copies(cfg, &symbols);
        for (i, spec) in cfg.phases.iter().enumerate() {
            let phase = i as u32 + 1;
            let mine: Vec<&(PathBuf, InlinedCopy)> = (copies.iter())
                .filter(|(_, c)| glob_match(&spec.function, &c.name))
                .collect();
            let sites = match resolve(spec, file, &symbols) {
                // Only inlined: its copies are its calls, if any can be probed.
                Err(_) if mine.iter().any(|(_, c)| c.exit.is_some()) => Vec::new(),
                sites => sites?,
            };
            self.add_inlined(phase, &spec.name, &mine, &symbols);
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
                let (entry, exit, entry_emulated) = if go {
                    let entry =
                        go_entry_offset(&site.path, func_start, site.size).with_context(cannot)?;
                    let returns =
                        return_offsets(&site.path, func_start, site.size).with_context(cannot)?;
                    let emulated = emulated_at(&site.path, entry);
                    (entry, Exit::GoReturns(returns), emulated)
                } else {
                    let (entry, emulated) =
                        native_entry(&site.path, func_start, site.size).with_context(cannot)?;
                    (entry, Exit::Uretprobe, emulated)
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
                    exit,
                    entry_emulated,
                });
            }
        }
        for (path, syms) in &symbols {
            let has_go_phase = self
                .probes
                .iter()
                .any(|p| p.is_go() && p.site.path == *path);
            if has_go_phase && !self.go_switches.iter().any(|g| g.site.path == *path) {
                self.go_switches.extend(go_switch_probes(path, syms)?);
            }
        }
        Ok(())
    }
}
