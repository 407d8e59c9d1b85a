//! What a phase probe's hit costs on this machine, measured before the phase probes go on: the
//! kernel's uprobe machinery (a trap, an emulated or single-stepped instruction, a return
//! trampoline) costs several times more on one machine than another, and on a shared VM from
//! one week to the next (a Go call: 17.6 µs one day, 6.6 µs another), so an assumed constant
//! put a Go server's probe time 2.3x over what its cpu samples measured.
//!
//! The phase programs are attached, in this process only, to copies of one small function that
//! a thread of phaseprof calls in a loop, and the thread's CPU time per call is compared with
//! an unprobed copy's: the programs find no target there and return at once, so nothing is
//! counted and phaseprof never sees itself. What they do for a target beyond that (a few map
//! updates) is not in this measurement: they time it themselves (NS_PHASE_WORK), and the
//! estimate adds it (`PhaseProbeOverhead`).
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::{attach::retire, Engine, ProbeSpec, Uprobe};
use crate::probe_costs::{MechanismCosts, PhaseHitCosts};

// Five copies of a frame-pointer prologue and epilogue: `push rbp` (the kernel emulates a
// probe on it, as on a usual entry), `mov rbp, rsp` (single-stepped), `pop rbp`, `ret`
// (single-stepped: a Go function's exit probe). Each copy gets its own probes.
std::arch::global_asm!(
    ".pushsection .text.phaseprof_calibration,\"ax\",@progbits",
    ".p2align 4",
    ".globl phaseprof_calibration_0",
    ".hidden phaseprof_calibration_0",
    "phaseprof_calibration_0:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl phaseprof_calibration_1",
    ".hidden phaseprof_calibration_1",
    "phaseprof_calibration_1:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl phaseprof_calibration_2",
    ".hidden phaseprof_calibration_2",
    "phaseprof_calibration_2:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl phaseprof_calibration_3",
    ".hidden phaseprof_calibration_3",
    "phaseprof_calibration_3:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl phaseprof_calibration_4",
    ".hidden phaseprof_calibration_4",
    "phaseprof_calibration_4:",
    "push rbp",
    "mov rbp, rsp",
    "pop rbp",
    "ret",
    ".popsection",
);

extern "C" {
    fn phaseprof_calibration_0();
    fn phaseprof_calibration_1();
    fn phaseprof_calibration_2();
    fn phaseprof_calibration_3();
    fn phaseprof_calibration_4();
}

/// Offsets in a copy: its `mov rbp, rsp` and its `ret`.
const MOV_AT: u64 = 1;
const RET_AT: u64 = 5;

/// Calls of each copy per round, and rounds (alternating the copies; each copy's median round
/// counts). A round takes ~13 ms here, ~40 ms where a Go call costs 17 µs. The median, not the
/// fastest: a target's hits run at the machine's speed of the moment too, which moved all five
/// copies together by ±15% between recordings one minute apart on the development VM.
const CALLS: u32 = 1_000;
const ROUNDS: usize = 7;

type Copy = unsafe extern "C" fn();

/// The copies: unprobed; an entry probe; an entry and a uretprobe (a native phase call); a Go
/// entry and a probe on the return instruction (a Go phase call); an entry probe on a
/// single-stepped instruction.
const COPIES: [Copy; 5] = [
    phaseprof_calibration_0,
    phaseprof_calibration_1,
    phaseprof_calibration_2,
    phaseprof_calibration_3,
    phaseprof_calibration_4,
];

impl Engine<'_> {
    /// Measures the phase probes' cost per hit (see the module); the probes of the measurement
    /// are detached in the background. x86-64 only, as the phase probes' placement.
    pub fn calibrate_phase_hits(&self) -> Result<PhaseHitCosts> {
        let started = Instant::now();
        let exe = std::path::PathBuf::from("/proc/self/exe");
        let spec = |copy: usize, program: Uprobe, at: u64| -> Result<ProbeSpec> {
            Ok(ProbeSpec {
                program,
                path: exe.clone(),
                offset: file_offset(COPIES[copy] as usize as u64)? + at,
                cookie: 1,
                what: format!("calibration probe {program:?}"),
            })
        };
        let probes = [
            spec(1, Uprobe::PhaseEnter, 0)?,
            spec(2, Uprobe::PhaseEnter, 0)?,
            spec(2, Uprobe::PhaseExit, 0)?,
            spec(3, Uprobe::GoPhaseEnter, 0)?,
            spec(3, Uprobe::GoPhaseReturn, RET_AT)?,
            spec(4, Uprobe::PhaseEnter, MOV_AT)?,
        ];
        let pid = std::process::id() as i32;
        // One call: a failure partway drops (detaches) what it attached.
        let links = self.attach_phase_probes(&probes, pid)?;
        let mut rounds = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let mut round = [0.0; COPIES.len()];
            for (ns, copy) in round.iter_mut().zip(COPIES) {
                *ns = ns_per_call(copy)?;
            }
            rounds.push(round);
        }
        drop(retire(links));
        let median = |i: usize| {
            let mut ns: Vec<f64> = rounds.iter().map(|r| r[i]).collect();
            ns.sort_by(f64::total_cmp);
            ns[ns.len() / 2]
        };
        let over = |i: usize| (median(i) - median(0)).max(0.0);
        let mechanism = MechanismCosts {
            entry_ns: over(1),
            native_call_ns: over(2),
            go_call_ns: over(3),
            single_step_entry_ns: over(4),
            took: started.elapsed(),
        };
        Ok(PhaseHitCosts::measured(mechanism))
    }
}

/// The file offset of code at `addr` in this process's executable (a uprobe's offset).
fn file_offset(addr: u64) -> Result<u64> {
    let vmas = crate::procmaps::read_vmas(std::process::id())
        .context("reading this process's mappings")?;
    match vmas.iter().find(|v| v.start <= addr && addr < v.end) {
        Some(v) => Ok(addr - v.start + v.offset),
        None => bail!("no executable mapping of phaseprof holds {addr:#x}"),
    }
}

/// This thread's CPU time per call of `copy`, in ns, over CALLS calls.
fn ns_per_call(copy: Copy) -> Result<f64> {
    let before = thread_cpu_ns()?;
    for _ in 0..CALLS {
        // SAFETY: the copies take no arguments, touch only rbp (restored) and the stack.
        unsafe { std::hint::black_box(copy)() };
    }
    Ok(thread_cpu_ns()?.saturating_sub(before) as f64 / CALLS as f64)
}

fn thread_cpu_ns() -> Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        bail!(
            "reading this thread's CPU time: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}
