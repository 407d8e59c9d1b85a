//! Names of code in mapped files: symbol tables and DWARF through blazesym, a stripped file's
//! separate debug file, else the function's start from its call-frame information. The first
//! look at a big file reads and indexes megabytes (seconds for a large program's DWARF), so a
//! session cut in windows has it done by a thread of its own (`Namer::in_background`) and
//! goes on recording meanwhile; `record` waits for every name (`Namer::waiting`).
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};
use phaseprof_model::{Frame, FrameKind};

use super::cfi_functions::CfiFunctions;
use super::{debug_files, debug_link, frames_of, unknown};

/// Offsets of one mapped file to name, the file opened the guarded way while it was mapped.
pub struct Job {
    /// The mapped path as the process names it (the key of every name of the file).
    pub key: String,
    pub module: String,
    /// The process that mapped it: where its `.gnu_debuglink` is looked for.
    pub pid: u32,
    pub file: std::fs::File,
    pub offsets: Vec<u64>,
}

enum Request {
    Name(Job),
    /// After a window: files named without a debug file are named again once one has arrived;
    /// past their bounds the caches start afresh.
    Trim {
        reset: bool,
    },
    FetchInBackground,
}

enum Answer {
    /// Every offset of a job, named.
    Named(String, Vec<(u64, Vec<Frame>)>),
    /// Files whose names are to be looked up again (a debug file arrived).
    Stale(Vec<String>),
}

/// Files per name bound of `FileNames`' caches (see `BlazeSymbolizer`'s).
const MAX_FILES_HELD: usize = 1024;
/// Jobs waiting for the naming thread at most; more are asked for again later.
const QUEUE: usize = 256;

/// The naming itself, on whichever thread owns it.
struct FileNames {
    symbolizer: Symbolizer,
    /// Per mapped file: its functions from `.eh_frame`, read at its first unnamed address.
    cfi: HashMap<String, CfiFunctions>,
    debug_files: debug_files::DebugFiles,
    /// Per mapped file with unnamed addresses: its separate debug file (by build ID), if any.
    separate: HashMap<String, Option<Separate>>,
}

pub fn blazesym() -> Symbolizer {
    Symbolizer::builder()
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .enable_demangling(true)
        .build()
}

/// Whether blazesym may read `file`'s DWARF: it follows the links in there by path (beside the
/// file too), so only for files root owns or that link nowhere. Others' debug links are
/// followed by `debug_link`, the guarded way.
fn debug_syms_safe(file: &std::fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata().is_ok_and(|m| m.uid() == 0) || !crate::target_files::links_elsewhere(file)
}

impl FileNames {
    fn new() -> Self {
        FileNames {
            symbolizer: blazesym(),
            cfi: HashMap::new(),
            debug_files: debug_files::DebugFiles::default(),
            separate: HashMap::new(),
        }
    }

    /// Names every offset of `job`.
    fn name(&mut self, job: &Job) -> Vec<(u64, Vec<Frame>)> {
        let path = crate::target_files::fd_path(&job.file);
        let mut elf = Elf::new(&path);
        elf.debug_syms = debug_syms_safe(&job.file);
        let src = Source::Elf(elf);
        let results = self
            .symbolizer
            .symbolize(&src, Input::FileOffset(&job.offsets));
        let named: Vec<Option<Vec<Frame>>> = (0..job.offsets.len())
            .map(|i| match results.as_ref().ok().and_then(|r| r.get(i)) {
                Some(Symbolized::Sym(sym)) => Some(frames_of(sym, &job.module, FrameKind::User)),
                _ => None,
            })
            .collect();
        drop(results);
        let unnamed: Vec<u64> = (job.offsets.iter().zip(&named))
            .filter(|(_, n)| n.is_none())
            .map(|(o, _)| *o)
            .collect();
        let mut from_debug = self.names_from_debug_file(job, &unnamed);
        let mut out = Vec::with_capacity(job.offsets.len());
        for (&off, named) in job.offsets.iter().zip(named) {
            let frames = match named.or_else(|| from_debug.remove(&off)) {
                Some(frames) => frames,
                None => {
                    let functions = self
                        .cfi
                        .entry(job.key.clone())
                        .or_insert_with(|| CfiFunctions::of(&job.file));
                    let at = functions.start_of(off).unwrap_or(off);
                    unknown(&job.module, at, FrameKind::User)
                }
            };
            out.push((off, frames));
        }
        out
    }

    /// Names for `offsets` of a stripped file from its separate debug file (found by build ID,
    /// locally or through debuginfod), when it has one.
    fn names_from_debug_file(&mut self, job: &Job, offsets: &[u64]) -> HashMap<u64, Vec<Frame>> {
        if offsets.is_empty() {
            return HashMap::new();
        }
        let files = &mut self.debug_files;
        let separate = self
            .separate
            .entry(job.key.clone())
            .or_insert_with(|| Separate::of(job.pid, &job.file, &job.key, files));
        let Some(sep) = separate else {
            return HashMap::new();
        };
        let known: Vec<(u64, u64)> = offsets
            .iter()
            .filter_map(|&o| Some((o, sep.vaddr(o)?)))
            .collect();
        let vaddrs: Vec<u64> = known.iter().map(|(_, v)| *v).collect();
        let mut elf = Elf::new(sep.debug.path());
        if let DebugFile::Opened(f) = &sep.debug {
            elf.debug_syms = debug_syms_safe(f);
        }
        let src = Source::Elf(elf);
        let Ok(results) = self.symbolizer.symbolize(&src, Input::VirtOffset(&vaddrs)) else {
            return HashMap::new();
        };
        known
            .iter()
            .zip(results.iter())
            .filter_map(|((off, _), r)| match r {
                Symbolized::Sym(sym) => Some((*off, frames_of(sym, &job.module, FrameKind::User))),
                _ => None,
            })
            .collect()
    }

    /// The files to name again: those named without a debug file when one has arrived since.
    /// With `reset` (or past its bounds) every cache starts afresh.
    fn trim(&mut self, reset: bool) -> Vec<String> {
        let mut stale = Vec::new();
        if self.debug_files.arrived() {
            stale = self
                .separate
                .iter()
                .filter(|(_, s)| s.is_none())
                .map(|(path, _)| path.clone())
                .collect();
            for path in &stale {
                self.separate.remove(path);
            }
        }
        if reset || self.cfi.len() > MAX_FILES_HELD || self.separate.len() > MAX_FILES_HELD {
            self.cfi.clear();
            self.separate.clear();
            self.symbolizer = blazesym();
        }
        stale
    }
}

/// A stripped file's separate debug file, and the file's loadable segments (file start, size,
/// address) to turn file offsets into the addresses the debug file is indexed by.
struct Separate {
    debug: DebugFile,
    segments: Vec<(u64, u64, u64)>,
}

/// A debug file: under a debug directory of the host (or elfutils' cache), or one beside the
/// target's file, opened and checked.
enum DebugFile {
    Host(std::path::PathBuf),
    Opened(std::fs::File),
}

impl DebugFile {
    fn path(&self) -> std::path::PathBuf {
        match self {
            DebugFile::Host(p) => p.clone(),
            DebugFile::Opened(f) => crate::target_files::fd_path(f),
        }
    }
}

impl Separate {
    /// The separate debug file of `file` (mapped at `mapped_path` in `pid`'s root): by build
    /// ID, else by its `.gnu_debuglink` (see `debug_link`).
    fn of(
        pid: u32,
        file: &std::fs::File,
        mapped_path: &str,
        files: &mut debug_files::DebugFiles,
    ) -> Option<Separate> {
        use object::{Object, ObjectSegment};
        let id = crate::targets::build_id_hex(&crate::target_files::fd_path(file));
        let debug = match id.as_deref().and_then(|id| files.for_build_id(id)) {
            Some(path) => Some(DebugFile::Host(path)),
            None => {
                debug_link::find(Some(pid), file, mapped_path, id.as_deref()).map(DebugFile::Opened)
            }
        }?;
        let reader = crate::target_files::elf_reader(file.try_clone().ok()?);
        let elf = object::File::parse(&reader).ok()?;
        let segments = elf
            .segments()
            .map(|s| {
                let (start, size) = s.file_range();
                (start, size, s.address())
            })
            .collect();
        Some(Separate { debug, segments })
    }

    fn vaddr(&self, off: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(start, size, _)| *start <= off && off < start + size)
            .map(|(start, _, addr)| addr + (off - start))
    }
}

/// The naming thread, as the symbolizer sees it: jobs sent, names received, and how long a
/// lookup waits for them.
pub struct Namer {
    ask: mpsc::SyncSender<Request>,
    answers: mpsc::Receiver<Answer>,
    /// (file, offset) asked for and not named yet.
    pending: HashSet<(String, u64)>,
    /// How long a lookup waits for names; None: until named (`record`).
    wait: Option<Duration>,
}

impl Namer {
    /// A naming thread that a lookup waits for until it has named everything.
    pub fn waiting() -> Self {
        let (ask, asked) = mpsc::sync_channel::<Request>(QUEUE);
        let (answer, answers) = mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("symbols".into())
            .spawn(move || serve(asked, answer));
        if let Err(e) = spawned {
            eprintln!("phaseprof: warning: no thread to name code in ({e}): code stays unnamed");
        }
        Namer {
            ask,
            answers,
            pending: HashSet::new(),
            wait: None,
        }
    }

    /// From now on a lookup waits at most `wait`: what is not named by then is named as
    /// `file+offset` this time (see `pending`), and properly in a later lookup. Debug files are
    /// fetched in the background too.
    pub fn in_background(&mut self, wait: Duration) {
        self.wait = Some(wait);
        let _ = self.ask.try_send(Request::FetchInBackground);
    }

    pub fn is_pending(&self, key: &str, offset: u64) -> bool {
        self.pending.contains(&(key.to_string(), offset))
    }

    /// Asks for `job`'s names (those not asked for already); false when the queue is full
    /// (asked again at the next lookup).
    pub fn ask(&mut self, mut job: Job) -> bool {
        job.offsets
            .retain(|&o| !self.pending.contains(&(job.key.clone(), o)));
        if job.offsets.is_empty() {
            return true;
        }
        let keys: Vec<(String, u64)> = job.offsets.iter().map(|&o| (job.key.clone(), o)).collect();
        let sent = match self.wait {
            None => self.ask.send(Request::Name(job)).is_ok(),
            Some(_) => self.ask.try_send(Request::Name(job)).is_ok(),
        };
        if sent {
            self.pending.extend(keys);
        }
        sent
    }

    /// Takes the names that came, waiting (as long as this namer waits) while any of `wanted`
    /// is pending; `take` gets each name, `stale` each file to name again.
    pub fn receive(
        &mut self,
        wanted: &[(String, u64)],
        mut take: impl FnMut(String, u64, Vec<Frame>),
        mut stale: impl FnMut(&[String]),
    ) {
        let deadline = self.wait.map(|w| Instant::now() + w);
        loop {
            let waiting = wanted.iter().any(|k| self.pending.contains(k));
            let answer = match (waiting, deadline) {
                (false, _) => self.answers.try_recv().ok(),
                (true, None) => self.answers.recv().ok(),
                (true, Some(d)) => {
                    let left = d.saturating_duration_since(Instant::now());
                    self.answers.recv_timeout(left).ok()
                }
            };
            match answer {
                Some(Answer::Named(key, names)) => {
                    for (off, frames) in names {
                        self.pending.remove(&(key.clone(), off));
                        take(key.clone(), off, frames);
                    }
                }
                Some(Answer::Stale(paths)) => stale(&paths),
                // Nothing more now (or the thread is gone: nothing will come).
                None => return,
            }
        }
    }

    /// After a window (see `Request::Trim`).
    pub fn trim(&mut self, reset: bool) {
        let _ = self.ask.try_send(Request::Trim { reset });
    }
}

fn serve(asked: mpsc::Receiver<Request>, answer: mpsc::Sender<Answer>) {
    let mut names = FileNames::new();
    for request in asked {
        let sent = match request {
            Request::Name(job) => {
                let named = names.name(&job);
                answer.send(Answer::Named(job.key, named))
            }
            Request::Trim { reset } => {
                let stale = names.trim(reset);
                if stale.is_empty() {
                    Ok(())
                } else {
                    answer.send(Answer::Stale(stale))
                }
            }
            Request::FetchInBackground => {
                names.debug_files.fetch_in_background();
                Ok(())
            }
        };
        if sent.is_err() {
            return;
        }
    }
}
