//! `phaseprof record`: attach, record in windows until the target exits, the duration ends or
//! Ctrl-C, and write a `.phaseprof`.
use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::BufWriter;
use std::mem::MaybeUninit;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use phaseprof_model::{write_profile, EventKind, Meta, Profile};

use crate::aggregate::Aggregator;
use crate::engine::{Engine, EngineConfig, TargetEvent};
use crate::symbolize::BlazeSymbolizer;
use crate::targets::{self, HeldChild, TargetSpec};

/// Everything `record` needs, independent of how the CLI spells it.
#[derive(Clone, Debug)]
pub struct RecordOptions {
    pub target: TargetSpec,
    /// Stop after this long (the command's end, or Ctrl-C, may come first).
    pub duration: Option<Duration>,
    pub engine: EngineConfig,
    pub output: PathBuf,
    /// How often the kernel maps are drained into the profile.
    pub window: Duration,
    pub verbose: bool,
}

/// Why recording ended.
#[derive(Debug, PartialEq)]
pub enum StopReason {
    Duration,
    Interrupted,
    CommandExited(i32),
    TargetsExited,
}

pub struct Recorded {
    pub profile: Profile,
    pub stop: StopReason,
}

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
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
    let out_file = File::create(&opts.output)
        .with_context(|| format!("cannot write the output file {}", opts.output.display()))?;

    let result = record_into(opts, command_path, interrupted);
    match result {
        Ok(recorded) => {
            let mut w = BufWriter::new(out_file);
            write_profile(&recorded.profile, &mut w)
                .with_context(|| format!("writing {}", opts.output.display()))?;
            std::io::Write::flush(&mut w)?;
            Ok(recorded)
        }
        Err(e) => {
            drop(out_file);
            let _ = std::fs::remove_file(&opts.output);
            Err(e)
        }
    }
}

fn record_into(
    opts: &RecordOptions,
    command_path: Option<PathBuf>,
    interrupted: Arc<AtomicBool>,
) -> Result<Recorded> {
    let mut engine_cfg = opts.engine.clone();
    engine_cfg.follow_children = matches!(opts.target, TargetSpec::Command(_));
    engine_cfg.notify_exec = matches!(opts.target, TargetSpec::Name(_));

    let t0 = Instant::now();
    let mut storage = MaybeUninit::uninit();
    let mut fallback_storage = MaybeUninit::uninit();
    let mut engine = Engine::load(&engine_cfg, &mut storage, &mut fallback_storage)?;
    engine.attach(&engine_cfg)?;
    let mut sym = BlazeSymbolizer::default();
    let mut meta = Meta {
        host: read_trimmed("/proc/sys/kernel/hostname"),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        arch: std::env::consts::ARCH.to_string(),
        events: engine_cfg.events.clone(),
        frequency_hz: if engine_cfg.events.contains(&EventKind::Cpu) {
            engine_cfg.freq_hz
        } else {
            0
        },
        syscall_stacks: engine_cfg.syscall_stacks,
        ..Meta::default()
    };
    meta.notes
        .insert("phaseprof_version".into(), env!("CARGO_PKG_VERSION").into());
    meta.notes
        .insert("sched_switch".into(), format!("{:?}", engine.flavour));

    let mut live: BTreeSet<u32> = BTreeSet::new();
    let mut child: Option<u32> = None;
    let add = |pid: u32,
               engine: &Engine,
               sym: &mut BlazeSymbolizer,
               meta: &mut Meta,
               live: &mut BTreeSet<u32>|
     -> Result<()> {
        engine.add_target(pid)?;
        sym.track(pid);
        if meta.pids.is_empty() {
            // The first target names the profile (unless it is already gone again).
            if let Ok(info) = targets::describe(pid) {
                meta.comm = info.comm;
                meta.exe = info.exe;
                meta.build_id = info.build_id;
            }
        }
        if !meta.pids.contains(&pid) {
            meta.pids.push(pid);
        }
        live.insert(pid);
        Ok(())
    };

    let start = SystemTime::now();
    match &opts.target {
        TargetSpec::Pids(pids) => {
            for &pid in pids {
                add(pid, &engine, &mut sym, &mut meta, &mut live)?;
            }
        }
        TargetSpec::Name(re) => {
            for pid in targets::scan_name(re) {
                if opts.verbose {
                    eprintln!("phaseprof: pid {pid} matches /{re}/: recording it");
                }
                add(pid, &engine, &mut sym, &mut meta, &mut live)?;
            }
            if live.is_empty() {
                eprintln!("phaseprof: no process matches /{re}/ yet; waiting for one to start (Ctrl-C to stop)");
            }
        }
        TargetSpec::Command(argv) => {
            let path = command_path.expect("resolved above");
            let held = HeldChild::spawn(&path, argv)?;
            engine.arm_target(held.pid)?;
            meta.pids.push(held.pid);
            meta.command = argv.clone();
            meta.exe = path.to_string_lossy().into_owned();
            meta.comm = path
                .file_name()
                .map(|n| n.to_string_lossy().chars().take(15).collect())
                .unwrap_or_default();
            meta.build_id = targets::build_id_hex(&path);
            live.insert(held.pid);
            child = Some(held.pid);
            held.release()?;
        }
    }
    // Targets are in the map now: from this line on, nothing they do is missed.
    let attach_time = t0.elapsed();
    if opts.verbose {
        eprintln!(
            "phaseprof: probes attached in {:.1} ms (sched_switch via {:?}, {} cpus sampled at {} Hz)",
            attach_time.as_secs_f64() * 1e3,
            engine.flavour,
            engine.cpus,
            engine_cfg.freq_hz
        );
    }

    meta.notes.insert(
        "attach_ms".into(),
        format!("{:.1}", attach_time.as_secs_f64() * 1e3),
    );

    let mut agg = Aggregator::new(meta, vec![]);
    let mut seen_tids: HashSet<u32> = HashSet::new();
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let mut next_drain = Instant::now() + opts.window;
    let stop = loop {
        for ev in engine.poll_events(Duration::from_millis(20)) {
            match ev {
                TargetEvent::Exec { pid, .. } => {
                    if let TargetSpec::Name(re) = &opts.target {
                        if !live.contains(&pid) && targets::matches_name(pid, re) {
                            if opts.verbose {
                                eprintln!("phaseprof: pid {pid} matches /{re}/: recording it");
                            }
                            let b = agg.builder_mut();
                            add(pid, &engine, &mut sym, b.meta_mut(), &mut live)?;
                            continue;
                        }
                    }
                    if live.contains(&pid) {
                        sym.track(pid);
                    }
                }
                TargetEvent::Fork { pid, .. } => {
                    let b = agg.builder_mut();
                    add(pid, &engine, &mut sym, b.meta_mut(), &mut live)?;
                }
                TargetEvent::MapsChanged { pid } => sym.track(pid),
                TargetEvent::Exit { pid } => {
                    live.remove(&pid);
                }
            }
        }
        if let Some(pid) = child {
            if let Some(status) = targets::child_exited(pid) {
                break StopReason::CommandExited(status);
            }
        }
        if interrupted.load(Ordering::SeqCst) {
            break StopReason::Interrupted;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break StopReason::Duration;
        }
        if let TargetSpec::Pids(_) = opts.target {
            live.retain(|&pid| targets::process_alive(pid));
            if live.is_empty() {
                break StopReason::TargetsExited;
            }
        }
        if Instant::now() >= next_drain {
            let w = engine.drain(false)?;
            note_threads(&w, &mut seen_tids, &mut agg);
            agg.add_window(&w, &mut sym);
            next_drain += opts.window;
        }
    };
    let end = SystemTime::now();
    engine.detach();
    let w = engine.drain(true)?;
    note_threads(&w, &mut seen_tids, &mut agg);
    agg.add_window(&w, &mut sym);
    let lost = engine.lost()?;
    {
        let b = agg.builder_mut();
        *b.lost_mut() = lost;
        let m = b.meta_mut();
        m.start_unix_ns = unix_ns(start);
        m.end_unix_ns = unix_ns(end);
        if m.pids.is_empty() {
            if let TargetSpec::Name(re) = &opts.target {
                bail!("no process matching /{re}/ appeared during the recording; nothing recorded");
            }
        }
    }
    Ok(Recorded {
        profile: agg.finish(),
        stop,
    })
}

/// Names threads the first time they appear (while they are alive to be asked).
fn note_threads(w: &crate::window::RawWindow, seen: &mut HashSet<u32>, agg: &mut Aggregator) {
    let tids = w
        .cpu
        .iter()
        .map(|s| (s.pid, s.tid))
        .chain(w.offcpu.iter().map(|s| (s.pid, s.tid)));
    for (pid, tid) in tids {
        if seen.insert(tid) {
            if let Some(name) = targets::read_comm(pid, tid) {
                agg.builder_mut().meta_mut().threads.insert(tid, name);
            }
        }
    }
}
