//! Where a stripped file's symbols are when it carries no `.gnu_debuglink` blazesym can follow:
//! a separate debug file found by the file's GNU build ID under `/usr/lib/debug/.build-id/`
//! (as perf and gdb look), or fetched from a debuginfod server when `DEBUGINFOD_URLS` is set,
//! cached where elfutils' own client caches (`$DEBUGINFOD_CACHE_PATH`, else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`), so both share it.
//!
//! A server is trusted with nothing: an answer is streamed to a file (never held in memory),
//! cut at the size its own ELF header gives, within a time budget shared by all fetches of a
//! recording, and enters the cache only if it is an ELF file with the build ID asked for.
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Largest debug file fetched (debug info of big programs runs to hundreds of MiB).
const MAX_FETCH_BYTES: u64 = 2 << 30;
/// Time all fetches of one recording may take together: past it, no more are tried.
const FETCH_BUDGET: Duration = Duration::from_secs(10);

pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    urls: Vec<String>,
    cache: PathBuf,
    /// Per build ID: the debug file, or None once looked for in vain.
    found: HashMap<String, Option<PathBuf>>,
    /// When fetching must have ended (set at the first fetch).
    deadline: Option<Instant>,
    /// Fetches made by a thread of their own (see `fetch_in_background`).
    background: Option<Background>,
}

/// A fetching thread: build IDs go to it through a bounded queue, and come back fetched or not.
struct Background {
    ask: mpsc::SyncSender<String>,
    answers: mpsc::Receiver<(String, bool)>,
    /// Asked for and not answered yet.
    pending: HashSet<String>,
}

/// Build IDs waiting for the fetching thread at most; more are asked for again later.
const BACKGROUND_QUEUE: usize = 64;

impl Default for DebugFiles {
    fn default() -> Self {
        let urls = std::env::var("DEBUGINFOD_URLS")
            .unwrap_or_default()
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        let dirs = vec!["/usr/lib/debug".into(), "/lib/debug".into()];
        DebugFiles::with_sources(dirs, urls, cache_dir())
    }
}

fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("DEBUGINFOD_CACHE_PATH") {
        return p.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| "/var/cache".into());
    base.join("debuginfod_client")
}

impl DebugFiles {
    fn with_sources(dirs: Vec<PathBuf>, urls: Vec<String>, cache: PathBuf) -> Self {
        DebugFiles {
            dirs,
            urls,
            cache,
            found: HashMap::new(),
            deadline: None,
            background: None,
        }
    }

    /// The debug file of build ID `id` (lowercase hex), looked for once.
    pub fn for_build_id(&mut self, id: &str) -> Option<PathBuf> {
        if id.len() < 3 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        if let Some(found) = self.found.get(id) {
            return found.clone();
        }
        let local = self
            .dirs
            .iter()
            .map(|d| {
                d.join(".build-id")
                    .join(&id[..2])
                    .join(format!("{}.debug", &id[2..]))
            })
            .find(|p| p.is_file());
        if local.is_none() && self.background.is_some() {
            return self.ask_in_background(id);
        }
        let found = local.or_else(|| self.fetch(id));
        self.found.insert(id.to_string(), found.clone());
        found
    }

    /// From now on, fetches are made by a thread of their own, each within `FETCH_BUDGET`: a
    /// process that runs for weeks (the agent) never waits on a server; what it asked for is
    /// None until fetched, then found in the cache (`arrived` says when to look again).
    pub fn fetch_in_background(&mut self) {
        if self.urls.is_empty() || self.background.is_some() {
            return;
        }
        let (ask, asked) = mpsc::sync_channel::<String>(BACKGROUND_QUEUE);
        let (answer, answers) = mpsc::channel();
        let mut fetcher =
            DebugFiles::with_sources(self.dirs.clone(), self.urls.clone(), self.cache.clone());
        let spawned = std::thread::Builder::new()
            .name("debuginfod".into())
            .spawn(move || {
                for id in asked {
                    // Each fetch has a budget of its own (the one-shot budget is per recording).
                    fetcher.deadline = None;
                    let ok = fetcher.fetch(&id).is_some();
                    if answer.send((id, ok)).is_err() {
                        return;
                    }
                }
            });
        if spawned.is_ok() {
            self.background = Some(Background {
                ask,
                answers,
                pending: HashSet::new(),
            });
        }
    }

    fn ask_in_background(&mut self, id: &str) -> Option<PathBuf> {
        let cached = self.cache.join(id).join("debuginfo");
        if cached.is_file() {
            self.found.insert(id.to_string(), Some(cached.clone()));
            return Some(cached);
        }
        let bg = self.background.as_mut()?;
        // A full queue: asked again at the next lookup.
        if !bg.pending.contains(id) && bg.ask.try_send(id.to_string()).is_ok() {
            bg.pending.insert(id.to_string());
        }
        None
    }

    /// Takes the fetching thread's answers: true when a debug file arrived since the last call
    /// (names given without it are to be looked up again).
    pub fn arrived(&mut self) -> bool {
        let Some(bg) = &mut self.background else {
            return false;
        };
        let mut any = false;
        while let Ok((id, ok)) = bg.answers.try_recv() {
            bg.pending.remove(&id);
            let cached = self.cache.join(&id).join("debuginfo");
            // Not fetched: not asked for again.
            self.found.insert(id, ok.then_some(cached));
            any |= ok;
        }
        any
    }

    /// From the cache, or from the first debuginfod server that has it.
    fn fetch(&mut self, id: &str) -> Option<PathBuf> {
        let cached = self.cache.join(id).join("debuginfo");
        // What phaseprof puts there is verified first (see fetch_one); elfutils' client too.
        if cached.is_file() {
            return Some(cached);
        }
        if self.urls.is_empty() {
            return None;
        }
        let deadline = *self.deadline.get_or_insert(Instant::now() + FETCH_BUDGET);
        for url in &self.urls {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                eprintln!(
                    "phaseprof: warning: debuginfod: the {} s budget for fetching is spent; \
                     build id {id} not fetched",
                    FETCH_BUDGET.as_secs()
                );
                return None;
            }
            match fetch_one(url, id, &cached, left) {
                Ok(()) => {
                    eprintln!("phaseprof: debug info of build id {id} fetched from {url}");
                    return Some(cached);
                }
                Err(e) => eprintln!("phaseprof: warning: debuginfod {url}: build id {id}: {e}"),
            }
        }
        None
    }
}

/// The size an ELF file's own header implies: the end of its section or program headers,
/// whichever is last (a debug file's section headers come last). None: not a 64-bit ELF.
fn elf_size(header: &[u8]) -> Option<u64> {
    if header.len() < 64 || !header.starts_with(b"\x7fELF") || header[4] != 2 {
        return None;
    }
    let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes(header[o..o + 2].try_into().unwrap()) as u64;
    let sections = u64_at(0x28).checked_add(u16_at(0x3a) * u16_at(0x3c))?;
    let segments = u64_at(0x20).checked_add(u16_at(0x36) * u16_at(0x38))?;
    Some(sections.max(segments))
}

/// Fetches `id` from `url` into `cached`, within `time`: streamed to a file beside it, cut at the
/// size the ELF header gives, renamed into place only when its build ID is `id`.
fn fetch_one(url: &str, id: &str, cached: &Path, time: Duration) -> Result<(), String> {
    let http: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(time))
        .build()
        .into();
    let mut resp = http
        .get(&format!("{url}/buildid/{id}/debuginfo"))
        .call()
        .map_err(|e| e.to_string())?;
    let mut body = resp
        .body_mut()
        .with_config()
        .limit(MAX_FETCH_BYTES)
        .reader();
    let mut header = [0u8; 64];
    body.read_exact(&mut header).map_err(|e| e.to_string())?;
    let size = elf_size(&header).ok_or("not a 64-bit ELF file")?;
    if size > MAX_FETCH_BYTES {
        return Err(format!("its header claims {size} bytes, over the limit"));
    }
    let dir = cached.parent().ok_or("no cache directory")?;
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!(".debuginfo.tmp-{}", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        out.write_all(&header)?;
        std::io::copy(&mut body.take(size.saturating_sub(64)), &mut out)?;
        out.into_inner()?.sync_all()
    })();
    let verified = written.map_err(|e| e.to_string()).and_then(|()| {
        match crate::targets::build_id_hex(&tmp) {
            Some(got) if got == id => Ok(()),
            got => Err(format!("the answer's build id is {got:?}")),
        }
    });
    // Renamed only when verified: a reader of the shared cache never sees a bad file.
    match verified.and_then(|()| std::fs::rename(&tmp, cached).map_err(|e| e.to_string())) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the lookup by build ID in a debug directory, the cache of a debuginfod client, and
    // that a miss is remembered.
    #[test]
    fn finds_by_build_id_then_cache() {
        let root =
            std::env::temp_dir().join(format!("phaseprof-debugfiles-{}", std::process::id()));
        let dir = root.join("debug/.build-id/ab");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cdef.debug"), b"\x7fELF").unwrap();
        let cache = root.join("cache");
        std::fs::create_dir_all(cache.join("0123").join("")).unwrap();
        std::fs::write(cache.join("0123/debuginfo"), b"\x7fELF").unwrap();
        let mut d = DebugFiles::with_sources(vec![root.join("debug")], vec![], cache.clone());
        assert_eq!(d.for_build_id("abcdef"), Some(dir.join("cdef.debug")));
        assert_eq!(d.for_build_id("0123"), Some(cache.join("0123/debuginfo")));
        assert_eq!(d.for_build_id("feed"), None);
        assert_eq!(d.for_build_id("../etc"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }

    /// A debuginfod server that answers every request with `file` after `delay`.
    fn slow_server(file: PathBuf, delay: Duration) -> String {
        use std::io::BufRead;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let mut reader = std::io::BufReader::new(&conn);
                while reader.read_line(&mut String::new()).is_ok_and(|n| n > 2) {}
                std::thread::sleep(delay);
                let body = std::fs::read(&file).unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let mut conn = &conn;
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(&body);
            }
        });
        url
    }

    // Checks fetching in the background: a lookup never waits on the server (which answers after
    // 1 s), the debug file is found once `arrived` says so; a wrong answer is not asked again.
    #[test]
    fn fetches_in_the_background_without_waiting() {
        let elf = PathBuf::from("/bin/true");
        let Some(id) = crate::targets::build_id_hex(&elf) else {
            eprintln!("SKIPPED: /bin/true has no build ID");
            return;
        };
        let root = std::env::temp_dir().join(format!("phaseprof-bgfetch-{}", std::process::id()));
        let cache = root.join("cache");
        let url = slow_server(elf, Duration::from_secs(1));
        let mut d = DebugFiles::with_sources(vec![], vec![url], cache.clone());
        d.fetch_in_background();
        let asked = Instant::now();
        assert_eq!(d.for_build_id(&id), None);
        assert_eq!(
            d.for_build_id("abcdef01"),
            None,
            "another build: the server sends the wrong file"
        );
        assert!(
            asked.elapsed() < Duration::from_millis(500),
            "{:?}",
            asked.elapsed()
        );
        let mut arrived = false;
        while !arrived && asked.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(50));
            arrived = d.arrived();
        }
        assert!(arrived);
        assert_eq!(d.for_build_id(&id), Some(cache.join(&id).join("debuginfo")));
        while d.background.as_ref().is_some_and(|b| !b.pending.is_empty()) {
            assert!(asked.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(50));
            d.arrived();
        }
        assert_eq!(d.for_build_id("abcdef01"), None);
        assert!(
            d.background.as_ref().unwrap().pending.is_empty(),
            "not asked again"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
