//! `phaseprof record`: attach, record in windows until the target exits, the duration ends or
//! Ctrl-C, and write a `.phaseprof`.
use std::fs::File;
use std::io::BufWriter;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use phaseprof_model::{write_profile, EventKind, Meta, Profile};

use crate::alloc::recorder::AllocRecorder;
use crate::command::{CommandChild, HeldChild, HoldWatchdog, STOP_GRACE};
use crate::engine::SyscallStacks;
use crate::engine::{Engine, EngineConfig};
use crate::phases::{PhaseConfig, PhasePlan};
use crate::session::{DeferredPhases, Session, Turn};
use crate::targets::{self, TargetSpec};
use crate::targets_slowdown;
use crate::unwind::UnwindMode;

/// Everything `record` needs, independent of how the CLI spells it.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub target: TargetSpec,
    /// Stop after this long (the command's end, or Ctrl-C, may come first).
    pub duration: Option<Duration>,
    pub engine: EngineConfig,
    /// How user stacks are walked (`--unwind`); with `Fp` the engine copies none.
    pub unwind: UnwindMode,
    pub output: PathBuf,
    /// phases.toml, if phases are to be probed.
    pub phases: Option<PathBuf>,
    /// How often the kernel maps are drained into the profile.
    pub window: Duration,
    /// Keep the allocation probes' slowdown under this fraction (duty cycling).
    pub alloc_budget: Option<f64>,
    /// Keep the phase probes' slowdown under this fraction (duty cycling; totals estimated).
    pub phase_budget: Option<f64>,
    /// Keep counting syscalls' slowdown under this fraction (duty cycling; totals estimated).
    pub syscall_budget: Option<f64>,
    /// Probe allocator functions at their first instruction instead of the chosen one.
    pub alloc_at_entry: bool,
    /// With pids: how long their CPU time per unit of work is watched before anything is
    /// attached, to measure phaseprof's whole cost in them (zero: not measured).
    pub baseline: Duration,
    pub verbose: bool,
}

/// Why recording ended.
#[derive(Debug, PartialEq)]
pub enum StopReason {
    Duration,
    Interrupted,
    /// The command's exit status (as a shell gives it) and what ended it.
    CommandExited {
        status: i32,
        fate: String,
    },
    TargetsExited,
}

pub struct Recorded {
    pub profile: Profile,
    pub stop: StopReason,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Records per `opts` and writes the file. `interrupted` is set by the Ctrl-C handler.
pub fn record(opts: &RecordOptions, interrupted: Arc<AtomicBool>) -> Result<Recorded> {
    crate::preflight::check_can_record()?;

    // Validate targets and output before anything is loaded or started.
    let command_path = match &opts.target {
        TargetSpec::Pids(pids) => {
            for &pid in pids {
                targets::describe(pid)?;
            }
            None
        }
        TargetSpec::Command(argv) => Some(targets::resolve_command(&argv[0])?),
        TargetSpec::Name(_) => None,
    };
    // Phases resolve in the target's objects now, or for --name in the first process found.
    let mut deferred = None;
    let plan = match &opts.phases {
        None => PhasePlan::default(),
        Some(file) => {
            let cfg = PhaseConfig::load(file)?;
            let file = file.display().to_string();
            let mut plan = PhasePlan::from_config(&cfg, &file)?;
            match (&opts.target, &command_path) {
                (TargetSpec::Pids(pids), _) => {
                    let vmas = crate::processes::read_once(pids[0])?;
                    plan.resolve(&cfg, &file, &targets::code_objects(pids[0], &vmas)?)?
                }
                (TargetSpec::Command(argv), Some(path)) => {
                    // A wrapper (`env`, `timeout`, `nice`, `sh -c`) runs the program later:
                    // the phases then resolve in the first program the command execs that
                    // defines them. Without another program in its arguments the error is
                    // the command's own (a typo fails before anything runs).
                    let mut tried = plan.clone();
                    match tried.resolve(&cfg, &file, std::slice::from_ref(path)) {
                        Ok(()) => plan = tried,
                        Err(e) if names_another_program(&argv[1..]) => {
                            deferred = Some(DeferredPhases::at_exec(cfg, file, path, e))
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => deferred = Some(DeferredPhases::FirstTarget(cfg, file)),
            }
            plan
        }
    };
    // A regular file is written under a temporary name beside it and renamed at the end, so
    // an existing file is never truncated by a recording that then dies (SIGKILL, a failed
    // attach); a device or pipe (`-o /dev/stdout`) is written as it is.
    let special = std::fs::metadata(&opts.output).is_ok_and(|m| !m.is_file());
    let write_to = if special {
        opts.output.clone()
    } else {
        let mut name = opts.output.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".tmp-{}", std::process::id()));
        opts.output.with_file_name(name)
    };
    let out_file = File::create(&write_to)
        .with_context(|| format!("cannot write the output file {}", opts.output.display()))?;

    let result = record_into(opts, command_path, plan, deferred, interrupted);
    match result {
        Ok(recorded) => {
            let mut w = BufWriter::new(out_file);
            write_profile(&recorded.profile, &mut w)
                .with_context(|| format!("writing {}", opts.output.display()))?;
            std::io::Write::flush(&mut w)?;
            if !special {
                keep_as_old(&opts.output)?;
                std::fs::rename(&write_to, &opts.output)
                    .with_context(|| format!("writing {}", opts.output.display()))?;
            }
            Ok(recorded)
        }
        Err(e) => {
            drop(out_file);
            if !special {
                let _ = std::fs::remove_file(&write_to);
            }
            Err(e)
        }
    }
}

/// An existing output file is kept as `FILE.old` (one generation, as perf keeps perf.data.old),
/// never silently overwritten.
fn keep_as_old(output: &std::path::Path) -> Result<()> {
    if output.is_file() {
        let mut old = output.as_os_str().to_os_string();
        old.push(".old");
        std::fs::rename(output, &old)
            .with_context(|| format!("keeping the previous {} as .old", output.display()))?;
        eprintln!(
            "phaseprof: kept the previous {} as {}",
            output.display(),
            std::path::Path::new(&old).display()
        );
    }
    Ok(())
}

/// Whether a command's arguments name another program it may run (a word of an argument, as
/// `sh -c` takes them, that is an executable file or in PATH): `env FOO=1 ./server`,
/// `timeout 60 server`, `sh -c 'exec server --port 1'`.
fn names_another_program(args: &[String]) -> bool {
    (args.iter())
        .flat_map(|a| a.split_whitespace())
        .filter(|w| !w.starts_with('-') && !w.contains('='))
        .any(|w| targets::resolve_command(w).is_ok())
}

/// Loads and attaches the engine for `opts` and `plan` (phase probes included) and wraps it in
/// a session with no targets yet; `storage` holds the BPF object. Shared by
/// `record` and `attach`.
pub fn open_session<'obj>(
    opts: &RecordOptions,
    mut plan: PhasePlan,
    deferred: Option<DeferredPhases>,
    storage: &'obj mut MaybeUninit<libbpf_rs::OpenObject>,
) -> Result<(Session<'obj>, EngineConfig)> {
    if opts.phases.is_none() {
        // Without a phases file the built-in costs still apply to the whole recording.
        plan.alloc_costs =
            PhasePlan::from_config(&PhaseConfig::builtin(), "(built-in)")?.alloc_costs;
    }
    let mut engine_cfg = opts.engine.clone();
    opts.unwind.configure(&mut engine_cfg);
    engine_cfg.phase_ids = plan.names.len() as u32;
    // Duty cycling misses the frees of off-slices, so a live heap would only grow: not tracked.
    engine_cfg.alloc_live = opts.alloc_budget.is_none();
    engine_cfg.syscall_costs = plan
        .syscall_costs
        .iter()
        .map(|(_, nrs)| nrs.clone())
        .collect();
    engine_cfg.notify_exec = matches!(opts.target, TargetSpec::Name(_));
    // Only for our own command (and its children): a stop is visible to a process's parent.
    engine_cfg.hold_execs = matches!(opts.target, TargetSpec::Command(_))
        && engine_cfg.follow_children
        && engine_cfg.unwind_rows > 0;

    let mut engine = Engine::load(&engine_cfg, storage)?;
    let phases = engine_cfg.phase_ids > 0;
    // What this kernel cannot run, and what runs instead: one line each.
    for (_, why) in engine.features.fallbacks(&engine_cfg.events, phases) {
        eprintln!("phaseprof: kernel {}: {why}", engine.features.release);
    }
    if opts.syscall_budget.is_some() {
        engine.slice_syscalls();
    }
    engine.attach(&engine_cfg)?;
    if opts.phase_budget.is_some() {
        engine.slice_phases();
    }
    plan.attach(&mut engine, |p| p)?;
    let mut meta = Meta {
        host: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        kernel_features: engine.features.summary(&engine_cfg.events, phases),
        arch: std::env::consts::ARCH.to_string(),
        events: engine_cfg.events.clone(),
        frequency_hz: if engine_cfg.events.contains(&EventKind::Cpu) {
            engine_cfg.freq_hz
        } else {
            0
        },
        syscall_stacks: engine_cfg.syscall_stacks != SyscallStacks::None,
        syscall_stack_every: engine_cfg.syscall_stacks.every() as u64,
        syscall_stack_walks_per_sec: engine_cfg.syscall_stacks.walks_per_sec().into(),
        offcpu_stack_walks_per_sec: engine_cfg.offcpu_stacks.walks_per_sec().into(),
        ..Meta::default()
    };
    meta.notes
        .insert("phaseprof_version".into(), env!("CARGO_PKG_VERSION").into());
    let mut session = Session::new(engine, meta, &plan, opts.verbose);
    session.resolve_phases_later(deferred);
    if let Some(budget) = opts.phase_budget {
        session.budget_phases(budget);
    }
    if let Some(budget) = opts.syscall_budget {
        session.budget_syscalls(budget);
    }
    session.unwind_stacks(
        opts.unwind,
        engine_cfg.stack_copy_bytes,
        engine_cfg.hold_execs,
    );
    if engine_cfg.events.contains(&EventKind::Alloc) {
        session.record_allocations(AllocRecorder::new(
            engine_cfg.alloc_sample_bytes,
            opts.alloc_budget,
            opts.alloc_at_entry,
        ));
    }
    Ok((session, engine_cfg))
}

fn record_into(
    opts: &RecordOptions,
    command_path: Option<PathBuf>,
    plan: PhasePlan,
    deferred: Option<DeferredPhases>,
    interrupted: Arc<AtomicBool>,
) -> Result<Recorded> {
    // Before anything is attached: the targets' work as it is without phaseprof.
    let before = match &opts.target {
        TargetSpec::Pids(pids) if !opts.baseline.is_zero() => {
            if opts.verbose {
                eprintln!(
                    "phaseprof: watching the targets' work for {:.1} s before attaching \
                     (--baseline)",
                    opts.baseline.as_secs_f64()
                );
            }
            targets_slowdown::measure_before(pids, opts.baseline).map(|b| (b, pids))
        }
        _ => None,
    };
    let t0 = Instant::now();
    let mut storage = MaybeUninit::uninit();
    let (mut session, engine_cfg) = open_session(opts, plan, deferred, &mut storage)?;

    let start = SystemTime::now();
    let mut child: Option<CommandChild> = None;
    let mut watchdog: Option<HoldWatchdog> = None;
    match &opts.target {
        TargetSpec::Pids(pids) => {
            for &pid in pids {
                session.add_target(pid)?;
            }
        }
        TargetSpec::Name(name) => {
            for pid in name.scan() {
                session.add_target(pid)?;
                let pick = targets::NameMatch::describe_pick(pid);
                eprintln!("phaseprof: recording {pick} (its {name} matches)");
            }
            if session.live().is_empty() {
                eprintln!("phaseprof: no process's {name} matches yet; waiting for one to start (Ctrl-C to stop)");
            }
        }
        TargetSpec::Command(argv) => {
            let path = command_path.expect("resolved before recording");
            let (c, w) = start_command(&mut session, &path, argv)?;
            child = Some(c);
            watchdog = Some(w);
        }
    }
    // Targets are in the map now: from this line on, nothing they do is missed.
    let attach_time = t0.elapsed();
    let measuring = before.and_then(|(b, pids)| targets_slowdown::Measuring::attached(b, pids));
    if opts.verbose {
        let e = session.engine();
        eprintln!(
            "phaseprof: probes attached in {:.1} ms ({} cpus sampled at {} Hz)",
            attach_time.as_secs_f64() * 1e3,
            e.cpus,
            engine_cfg.freq_hz
        );
    }
    if opts.verbose {
        for p in session.alloc_probes() {
            eprintln!("phaseprof: allocator probe {p}");
        }
    }
    session.meta_mut().notes.insert(
        "attach_ms".into(),
        format!("{:.1}", attach_time.as_secs_f64() * 1e3),
    );

    let name = match &opts.target {
        TargetSpec::Name(re) => Some(re),
        _ => None,
    };
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let by_pid = matches!(opts.target, TargetSpec::Pids(_));
    let (stop, _) = session.run_until(opts.window, name, |session, turn| {
        if let Turn::Window { .. } = turn {
            session.drain_window()?;
            return Ok(None);
        }
        let duration_over = deadline.is_some_and(|d| Instant::now() >= d);
        if let Some(c) = &mut child {
            // The command decides when recording ends: until it exits, its shutdown is its work.
            // An interrupt is taken first: a terminal's Ctrl-C may have ended the command already.
            if let Some(i) = crate::signals::last().filter(|_| interrupted.load(Ordering::SeqCst)) {
                c.interrupted(i);
            }
            if let Some(status) = c.exited() {
                return Ok(Some(StopReason::CommandExited {
                    status,
                    fate: c.fate(),
                }));
            }
            if duration_over {
                c.duration_ended();
            }
            c.kill_if_overdue(STOP_GRACE);
            return Ok(None);
        }
        Ok(if interrupted.load(Ordering::SeqCst) {
            Some(StopReason::Interrupted)
        } else if duration_over {
            Some(StopReason::Duration)
        } else if by_pid && session.prune_exited() == 0 {
            Some(StopReason::TargetsExited)
        } else {
            None
        })
    })?;
    if let Some(why) = session.unresolved_phases() {
        eprintln!("phaseprof: warning: {why}; the phases counted nothing");
    }
    match measuring.as_ref().map(|m| m.finish()) {
        Some(Ok(t)) => session.meta_mut().targets_slowdown = Some(t),
        Some(Err(why)) => eprintln!("phaseprof: not measured in the targets: {why}"),
        None => {}
    }
    let profile = session.finish(start, SystemTime::now())?;
    if let Some(w) = watchdog {
        w.stand_down();
    }
    if profile.meta.pids.is_empty() {
        if let Some(re) = name {
            bail!("no process whose {re} matches appeared during the recording; nothing recorded");
        }
    }
    Ok(Recorded { profile, stop })
}

/// Forks `argv` held before its execve, with the watchdog that continues it should phaseprof
/// die, makes it the target, notes what it is, and lets it exec.
fn start_command(
    session: &mut Session,
    path: &std::path::Path,
    argv: &[String],
) -> Result<(CommandChild, HoldWatchdog)> {
    let held = HeldChild::spawn(path, argv)?;
    let watchdog = HoldWatchdog::start(held.pid)?;
    session.add_held_child(held.pid, path)?;
    // Named as run: the command's path, when it is a symlink to the program (see `run_name`).
    let canonical = std::fs::canonicalize(path).unwrap_or(path.to_path_buf());
    let canonical = canonical.to_string_lossy().into_owned();
    let exe = if crate::run_name::links_to(path, Path::new(&canonical)) {
        let run = path.to_string_lossy().into_owned();
        session.name_as_run(&canonical, &run);
        run
    } else {
        canonical
    };
    let meta = session.meta_mut();
    meta.command = argv.to_vec();
    meta.exe = exe;
    meta.comm = path
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    meta.build_id = targets::build_id_hex(path);
    let child = CommandChild::new(held.pid);
    held.release()?;
    Ok((child, watchdog))
}
