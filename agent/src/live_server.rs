//! `phaseprof attach --pid PID`: records a live process in windows (default 10 s), keeps a
//! bounded ring of them (default the last 10 minutes) and serves them over HTTP while it runs —
//! the same pages as `serve`, the index refreshing itself, any two windows diffable (before and
//! after an operator flips a flag). Ctrl-C detaches cleanly; `-o` saves the ring as one
//! `.phaseprof`, and any window or range downloads from the page.
use std::collections::VecDeque;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use phaseprof_model::{write_profile, Profile};

use crate::phases::{PhaseConfig, PhasePlan};
use crate::record::{open_session, RecordOptions};
use crate::session::Turn;
use crate::targets::{self, TargetSpec};
use phaseprof_view::web::{AppState, ProfileEntry, ProfileSource};

/// Everything `attach` needs beyond a recording's options.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The recording: target `--pid`, events, phases, window length (`opts.window`).
    pub record: RecordOptions,
    /// How much history the ring keeps.
    pub keep: Duration,
    pub listen: SocketAddr,
    pub token: Option<String>,
}

/// The ring of windows, newest last, as the web app's profile source.
pub struct LiveWindows {
    heading: String,
    refresh_s: u32,
    capacity: usize,
    ring: Mutex<Ring>,
}

/// Windows taken so far, and the ones kept (each with its entry in the page's list).
type Ring = (u64, VecDeque<(ProfileEntry, Arc<Profile>)>);

impl LiveWindows {
    pub fn new(heading: String, window: Duration, keep: Duration) -> Self {
        let capacity = (keep.as_secs_f64() / window.as_secs_f64().max(0.001))
            .ceil()
            .max(1.0) as usize;
        LiveWindows {
            heading,
            refresh_s: window.as_secs().clamp(1, 60) as u32,
            capacity,
            ring: Mutex::new((0, VecDeque::new())),
        }
    }

    /// Adds a window, dropping the oldest beyond the capacity.
    pub fn push(&self, p: Profile) {
        let mut guard = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let (next, ring) = &mut *guard;
        let name = format!("window {next}");
        ring.push_back((ProfileEntry::of(next.to_string(), name, &p), Arc::new(p)));
        *next += 1;
        while ring.len() > self.capacity {
            ring.pop_front();
        }
    }

    /// Every window kept, oldest first.
    pub fn all(&self) -> Vec<Arc<Profile>> {
        let guard = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.iter().map(|(_, p)| p.clone()).collect()
    }
}

impl ProfileSource for LiveWindows {
    fn list(&self) -> Vec<ProfileEntry> {
        let guard = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        guard.1.iter().rev().map(|(e, _)| e.clone()).collect()
    }
    fn get(&self, id: &str) -> Option<Arc<Profile>> {
        let guard = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        guard
            .1
            .iter()
            .find(|(e, _)| e.id == id)
            .map(|(_, p)| p.clone())
    }
    fn refresh_s(&self) -> u32 {
        self.refresh_s
    }
    fn heading(&self) -> String {
        self.heading.clone()
    }
}

/// Attaches, records windows and serves them until `interrupted` (Ctrl-C). Returns the ring,
/// saved to `opts.record.output` when that is set.
pub fn attach(
    opts: &AttachOptions,
    output: Option<PathBuf>,
    interrupted: Arc<AtomicBool>,
) -> Result<()> {
    crate::preflight::check_can_record()?;
    phaseprof_view::web::check_listen(opts.listen, opts.token.as_deref())?;
    let TargetSpec::Pids(pids) = &opts.record.target else {
        anyhow::bail!("attach takes --pid");
    };
    let pid = pids[0];
    let info = targets::describe(pid)?;
    let plan = match &opts.record.phases {
        None => PhasePlan::default(),
        Some(file) => {
            let cfg = PhaseConfig::load(file)?;
            PhasePlan::build(
                &cfg,
                &file.display().to_string(),
                &targets::code_objects(pid, &crate::processes::read_once(pid)?)?,
            )?
        }
    };
    let mut storage = MaybeUninit::uninit();
    let (mut session, _) = open_session(&opts.record, plan, None, &mut storage)?;
    session.add_target(pid)?;
    let window = opts.record.window;
    let windows = Arc::new(LiveWindows::new(
        format!(
            "Live: {} (pid {pid}), windows of {:.0} s",
            info.comm,
            window.as_secs_f64()
        ),
        window,
        opts.keep,
    ));
    let state = AppState {
        source: windows.clone(),
        token: opts.token.as_deref().map(Into::into),
        tls: false,
    };
    let stop = Arc::new(tokio::sync::Notify::new());
    let server = {
        let (stop, addr) = (stop.clone(), opts.listen);
        std::thread::spawn(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the HTTP runtime")?;
            rt.block_on(phaseprof_view::web::serve(addr, state, async move {
                stop.notified().await
            }))
        })
    };
    eprintln!(
        "phaseprof: attached to pid {pid} ({}); a window every {:.0} s, the last {:.0} s kept; Ctrl-C detaches",
        info.comm,
        window.as_secs_f64(),
        opts.keep.as_secs_f64()
    );
    session.name_in_background();
    let (target_gone, start) = session.run_until(window, None, |session, turn| {
        if let Turn::Window { start, end } = turn {
            windows.push(session.take_window(start, end)?);
            return Ok(None);
        }
        if interrupted.load(Ordering::SeqCst) || server.is_finished() {
            return Ok(Some(false));
        }
        if session.prune_exited() == 0 {
            eprintln!("phaseprof: pid {pid} exited; detaching and serving the windows recorded (Ctrl-C to stop)");
            return Ok(Some(true));
        }
        Ok(None)
    })?;
    // The last, partial window, then detach: the target runs exactly as before.
    let last = session.finish(start, SystemTime::now())?;
    windows.push(last);
    eprintln!("phaseprof: detached from pid {pid}");
    if target_gone {
        while !interrupted.load(Ordering::SeqCst) && !server.is_finished() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if let Some(path) = output {
        let all = windows.all();
        let merged =
            phaseprof_model::merge::merge(&all.iter().map(|p| p.as_ref()).collect::<Vec<_>>());
        let f = std::fs::File::create(&path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        write_profile(&merged, std::io::BufWriter::new(f))?;
        eprintln!(
            "phaseprof: wrote the {} windows kept to {}",
            all.len(),
            path.display()
        );
    }
    stop.notify_one();
    match server.join() {
        Ok(r) => r,
        Err(_) => anyhow::bail!("the HTTP server thread panicked"),
    }
}
