//! Delivery of windows to the collector: POST with the agent's bearer token and an
//! Idempotency-Key naming the window (the same on every retry: a window the collector stored
//! but could not acknowledge is not stored twice). When the collector cannot take them (down,
//! 5xx, 429, or it refuses the token or labels: 401/403, a configuration to fix), windows wait
//! in a bounded on-disk spool and are sent oldest first, with exponential backoff, once it
//! takes them. A window too large for it (413) is cut in halves, sent one by one. Only what
//! overflows the spool is dropped, and counted; a window the collector finds malformed (other
//! 4xx) is counted as rejected.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Counters shared with `/metrics`.
#[derive(Default)]
pub struct PushMetrics {
    pub windows_sent: AtomicU64,
    pub windows_spooled: AtomicU64,
    pub windows_dropped: AtomicU64,
    pub windows_rejected: AtomicU64,
    /// Windows sent as halves after a 413.
    pub windows_split: AtomicU64,
    /// Attempts the collector answered 401/403 (token or label pins): windows stay spooled.
    pub auth_failures: AtomicU64,
    pub spool_files: AtomicU64,
}

/// Halvings of one window at most (2^8 parts) before it is given up as too large.
const MAX_SPLITS: u32 = 8;

/// TLS (rustls) trusting only the certificates of the PEM file `path`.
fn trusting(path: &Path) -> Result<ureq::tls::TlsConfig> {
    let pem = std::fs::read(path).with_context(|| format!("reading ca_file {}", path.display()))?;
    let certs = ureq::tls::parse_pem(&pem)
        .filter_map(|item| match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("ca_file {}", path.display()))?;
    if certs.is_empty() {
        bail!("ca_file {} holds no PEM certificate", path.display());
    }
    Ok(ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs)))
        .build())
}

pub struct Sender {
    url: String,
    token: String,
    spool: PathBuf,
    limit: u64,
    seq: u64,
    /// Random per run: with the sequence number, the windows' idempotency keys.
    instance: String,
    backoff: Duration,
    retry_at: Option<Instant>,
    http: ureq::Agent,
    pub metrics: Arc<PushMetrics>,
}

enum Outcome {
    Sent,
    /// The collector is unreachable or failing: keep the window.
    Later(String),
    /// The collector refuses this agent (token, label pins): keep the window, say so loudly.
    Unauthorized(String),
    /// The collector refused this window: retrying cannot help.
    Refused(String),
}

/// A random hex id (the kernel's entropy pool).
fn random_id() -> String {
    use std::io::Read;
    let mut b = [0u8; 8];
    let ok = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if ok.is_err() {
        // Never fails on Linux; the time and pid still make keys distinct per run.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        b = (t ^ (u64::from(std::process::id()) << 40)).to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Sender {
    /// `ca_file`: PEM certificates an https collector's certificate must chain to (None: the
    /// public web roots).
    pub fn new(
        collector: &str,
        ca_file: Option<&Path>,
        token: &str,
        spool: PathBuf,
        limit: u64,
    ) -> Result<Self> {
        std::fs::create_dir_all(&spool)
            .with_context(|| format!("creating the spool {}", spool.display()))?;
        // Windows show function names, command lines and hosts: the agent's eyes only.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&spool, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("restricting the spool {} to its owner", spool.display()))?;
        let seq = Self::spooled(&spool)?
            .last()
            .map(|(n, _)| n + 1)
            .unwrap_or(0);
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(10)))
            .http_status_as_error(false);
        if let Some(path) = ca_file {
            config = config.tls_config(trusting(path)?);
        }
        let http = config.build().into();
        let s = Sender {
            url: format!("{collector}/api/v1/windows"),
            token: token.to_string(),
            spool,
            limit,
            seq,
            instance: random_id(),
            backoff: Duration::from_secs(1),
            retry_at: None,
            http,
            metrics: Arc::new(PushMetrics::default()),
        };
        s.metrics
            .spool_files
            .store(Self::spooled(&s.spool)?.len() as u64, Ordering::Relaxed);
        Ok(s)
    }

    /// Spooled windows, oldest first: (sequence number, path). A file is `SEQ-KEY.phaseprof`
    /// (`SEQ.phaseprof` from agents before idempotency keys).
    fn spooled(dir: &PathBuf) -> Result<Vec<(u64, PathBuf)>> {
        let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let stem = name.strip_suffix(".phaseprof")?;
                let n = stem.split('-').next()?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// The idempotency key a spooled file was written with.
    fn spooled_key(path: &Path) -> Option<String> {
        let name = path.file_name()?.to_str()?.strip_suffix(".phaseprof")?;
        name.split_once('-').map(|(_, key)| key.to_string())
    }

    fn post_once(&self, body: &[u8], key: Option<&str>) -> (Outcome, bool) {
        let mut req = self
            .http
            .post(&self.url)
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", "application/octet-stream");
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        match req.send(body) {
            Err(e) => (Outcome::Later(e.to_string()), false),
            Ok(r) if r.status().is_success() => (Outcome::Sent, false),
            Ok(mut r) => {
                let status = r.status();
                let reason = r.body_mut().read_to_string().unwrap_or_default();
                let why = format!("{status}: {reason}");
                match status.as_u16() {
                    413 => (Outcome::Refused(why), true),
                    401 | 403 => (Outcome::Unauthorized(why), false),
                    429 => (Outcome::Later(why), false),
                    _ if status.is_server_error() => (Outcome::Later(why), false),
                    _ => (Outcome::Refused(why), false),
                }
            }
        }
    }

    /// Posts one window; on 413 cuts it in halves (keys `KEY.1`, `KEY.2`) and posts those, so
    /// a retry after a partial failure re-sends only what may be missing, and duplicates none.
    fn post(&self, body: &[u8], key: Option<&str>) -> Outcome {
        self.post_split(body, key, 0)
    }

    fn post_split(&self, body: &[u8], key: Option<&str>, depth: u32) -> Outcome {
        let (outcome, too_large) = self.post_once(body, key);
        if !too_large || depth >= MAX_SPLITS {
            return outcome;
        }
        let halves = phaseprof_model::read_profile(body)
            .ok()
            .and_then(|p| phaseprof_model::split::halves(&p));
        let Some((a, b)) = halves else {
            return outcome;
        };
        self.metrics.windows_split.fetch_add(1, Ordering::Relaxed);
        for (i, half) in [a, b].iter().enumerate() {
            let mut bytes = Vec::new();
            if let Err(e) = phaseprof_model::write_profile_binary(half, &mut bytes) {
                return Outcome::Refused(format!("cutting a window too large: {e}"));
            }
            let key = key.map(|k| format!("{k}.{}", i + 1));
            match self.post_split(&bytes, key.as_deref(), depth + 1) {
                Outcome::Sent => {}
                other => return other,
            }
        }
        Outcome::Sent
    }

    /// Says why the collector refuses this agent, and backs off: windows stay spooled.
    fn unauthorized(&mut self, reason: &str) {
        self.metrics.auth_failures.fetch_add(1, Ordering::Relaxed);
        eprintln!(
            "phaseprof: ALERT: the collector refuses this agent ({reason}); check `token` (and the \
             labels the collector's tokens file pins) in the agent's config. Windows are kept in \
             the spool until it accepts them."
        );
        self.failed(reason);
    }

    /// Hands over one window: sent now if the collector is reachable and nothing older waits,
    /// else spooled.
    pub fn submit(&mut self, body: Vec<u8>) -> Result<()> {
        self.flush_spool(false);
        let seq = self.seq;
        self.seq += 1;
        let key = format!("{}-{seq}", self.instance);
        let waiting = self.metrics.spool_files.load(Ordering::Relaxed) > 0;
        if !waiting && self.retry_at.is_none() {
            match self.post(&body, Some(&key)) {
                Outcome::Sent => {
                    self.metrics.windows_sent.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                Outcome::Refused(reason) => {
                    self.metrics
                        .windows_rejected
                        .fetch_add(1, Ordering::Relaxed);
                    eprintln!("phaseprof: the collector refused a window: {reason}");
                    return Ok(());
                }
                Outcome::Later(reason) => self.failed(&reason),
                Outcome::Unauthorized(reason) => self.unauthorized(&reason),
            }
        }
        self.spool_window(&body, seq, &key)
    }

    fn failed(&mut self, reason: &str) {
        eprintln!(
            "phaseprof: collector unavailable ({reason}); spooling windows, retry in {:?}",
            self.backoff
        );
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
    }

    /// Writes `body` to `path` whole: under a temporary name, then renamed, so a crash never
    /// leaves half a window; a failed write leaves nothing.
    fn write_whole(path: &Path, body: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = path.with_extension("tmp");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| f.write_all(body).and_then(|()| f.sync_data()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    fn spool_window(&mut self, body: &[u8], seq: u64, key: &str) -> Result<()> {
        let path = self.spool.join(format!("{seq:020}-{key}.phaseprof"));
        let mut written = Self::write_whole(&path, body);
        if written.is_err() {
            // A full disk (or quota): the oldest window makes room for this one, counted.
            if let Some((_, oldest)) = Self::spooled(&self.spool)?.first() {
                if std::fs::remove_file(oldest).is_ok() {
                    self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
                }
                written = Self::write_whole(&path, body);
            }
        }
        if let Err(e) = written {
            // The agent records on: this window is dropped, counted and said.
            self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "phaseprof: warning: a window could not be spooled ({e}) and is dropped: {}",
                self.spool.display()
            );
            return Ok(());
        }
        self.metrics.windows_spooled.fetch_add(1, Ordering::Relaxed);
        // Over the limit: the oldest windows go first, counted.
        let mut files = Self::spooled(&self.spool)?;
        let mut total: u64 = files
            .iter()
            .filter_map(|(_, p)| p.metadata().ok())
            .map(|m| m.len())
            .sum();
        while total > self.limit && files.len() > 1 {
            let (_, oldest) = files.remove(0);
            total -= oldest.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = std::fs::remove_file(&oldest);
            self.metrics.windows_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics
            .spool_files
            .store(files.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sends spooled windows, oldest first, while the collector takes them: after the backoff,
    /// or at once when `now` (the last flush before exiting).
    pub fn flush_spool(&mut self, now: bool) {
        if !now && self.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let Ok(files) = Self::spooled(&self.spool) else {
            return;
        };
        let mut left = files.len() as u64;
        for (_, path) in files {
            let Ok(body) = std::fs::read(&path) else {
                continue;
            };
            match self.post(&body, Self::spooled_key(&path).as_deref()) {
                Outcome::Sent => self.metrics.windows_sent.fetch_add(1, Ordering::Relaxed),
                Outcome::Refused(reason) => {
                    eprintln!(
                        "phaseprof: the collector refused spooled {}: {reason}",
                        path.display()
                    );
                    self.metrics
                        .windows_rejected
                        .fetch_add(1, Ordering::Relaxed)
                }
                Outcome::Later(reason) => {
                    self.failed(&reason);
                    self.metrics.spool_files.store(left, Ordering::Relaxed);
                    return;
                }
                Outcome::Unauthorized(reason) => {
                    self.unauthorized(&reason);
                    self.metrics.spool_files.store(left, Ordering::Relaxed);
                    return;
                }
            };
            let _ = std::fs::remove_file(&path);
            left -= 1;
        }
        self.metrics.spool_files.store(0, Ordering::Relaxed);
        if self.retry_at.take().is_some() {
            eprintln!("phaseprof: collector back; spool delivered");
        }
        self.backoff = Duration::from_secs(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    /// What the fake collector saw: (Idempotency-Key, body length, status answered).
    type Seen = Arc<Mutex<Vec<(String, usize, u16)>>>;

    /// A collector stand-in on 127.0.0.1 answering each upload with `answer(body length)`.
    fn fake_collector(answer: impl Fn(usize) -> u16 + Send + 'static) -> (String, Seen) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let log = seen.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let (mut len, mut key) = (0, String::new());
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if let Some(v) = lower.strip_prefix("idempotency-key:") {
                        key = v.trim().to_string();
                    }
                }
                let mut body = vec![0u8; len];
                let _ = r.read_exact(&mut body);
                let status = answer(len);
                log.lock().unwrap().push((key, len, status));
                let mut conn = conn;
                let _ = write!(
                    conn,
                    "HTTP/1.1 {status} X\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
                );
            }
        });
        (url, seen)
    }

    /// A window of `n` cpu samples on distinct stacks.
    fn window(n: u32) -> Vec<u8> {
        let mut b = ProfileBuilder::new(
            Meta {
                events: vec![EventKind::Cpu],
                ..Meta::default()
            },
            vec![],
        );
        for i in 0..n {
            let f = b.intern_frame(Frame {
                function: format!("function_with_a_long_name_{i}"),
                module: "m".into(),
                kind: FrameKind::User,
                inlined: false,
            });
            let s = b.intern_stack(vec![f]);
            b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![1]).on(s));
        }
        let mut out = Vec::new();
        write_profile(&b.finish(), &mut out).unwrap();
        out
    }

    fn spool(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("phaseprof-push-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    // Checks a collector that refuses windows over a size (413): the window is cut in halves,
    // and halves again, until each part fits; every part carries the window's key with its
    // place (`KEY.1`, `KEY.1.2` …), and all the samples arrive.
    #[test]
    fn a_window_too_large_is_sent_in_parts() {
        let body = window(400);
        let limit = body.len() / 3;
        let (url, seen) = fake_collector(move |len| if len > limit { 413 } else { 201 });
        let mut s = Sender::new(&url, None, "t", spool("split"), 1 << 20).unwrap();
        s.submit(body).unwrap();
        let seen = seen.lock().unwrap().clone();
        let delivered: Vec<_> = seen.iter().filter(|(_, _, st)| *st == 201).collect();
        assert!(delivered.len() >= 4, "{seen:?}");
        assert!(
            delivered.iter().all(|(k, _, _)| k.contains('.')),
            "{seen:?}"
        );
        let keys: std::collections::BTreeSet<_> = delivered.iter().map(|(k, _, _)| k).collect();
        assert_eq!(keys.len(), delivered.len(), "each part its own key");
        assert_eq!(s.metrics.windows_sent.load(Ordering::Relaxed), 1);
        assert!(s.metrics.windows_split.load(Ordering::Relaxed) >= 3);
        assert_eq!(s.metrics.windows_rejected.load(Ordering::Relaxed), 0);
    }

    // Checks a collector that refuses the agent's token (401): windows are kept in the spool
    // under their keys and the failure is counted; once the collector accepts, they are sent
    // with the same keys they were spooled under.
    #[test]
    fn windows_refused_as_unauthorized_stay_spooled() {
        let accept = Arc::new(AtomicBool::new(false));
        let a = accept.clone();
        let (url, seen) =
            fake_collector(move |_| if a.load(Ordering::Relaxed) { 201 } else { 401 });
        let dir = spool("auth");
        let mut s = Sender::new(&url, None, "t", dir.clone(), 1 << 20).unwrap();
        s.submit(window(3)).unwrap();
        s.submit(window(4)).unwrap();
        assert_eq!(s.metrics.spool_files.load(Ordering::Relaxed), 2);
        assert_eq!(s.metrics.auth_failures.load(Ordering::Relaxed), 1);
        assert_eq!(s.metrics.windows_rejected.load(Ordering::Relaxed), 0);
        let spooled: Vec<String> = Sender::spooled(&dir)
            .unwrap()
            .iter()
            .filter_map(|(_, p)| Sender::spooled_key(p))
            .collect();
        accept.store(true, Ordering::Relaxed);
        s.flush_spool(true);
        assert_eq!(s.metrics.spool_files.load(Ordering::Relaxed), 0);
        assert_eq!(s.metrics.windows_sent.load(Ordering::Relaxed), 2);
        let sent: Vec<String> = (seen.lock().unwrap().iter())
            .filter(|(_, _, st)| *st == 201)
            .map(|(k, _, _)| k.clone())
            .collect();
        assert_eq!(sent, spooled);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks a spool on a full disk (a 256 KiB tmpfs; needs root, skipped without): windows
    // that cannot be written are dropped and counted, the agent goes on, and no `.tmp` is left.
    #[test]
    fn a_full_spool_disk_drops_and_counts() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED: mounting a tmpfs needs root");
            return;
        }
        let dir = spool("full");
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(&dir)
            .status()
            .is_ok_and(|st| st.success());
        assert!(mounted, "mount tmpfs");
        /// Unmounts and removes the spool however the test ends.
        struct Unmount(PathBuf);
        impl Drop for Unmount {
            fn drop(&mut self) {
                let _ = std::process::Command::new("umount").arg(&self.0).status();
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _unmount = Unmount(dir.clone());
        let (url, _) = fake_collector(|_| 503);
        let mut s = Sender::new(&url, None, "t", dir.clone(), 1 << 30).unwrap();
        let body = window(2000);
        assert!(body.len() > 10_000, "{}", body.len());
        let n = 40;
        for _ in 0..n {
            s.submit(body.clone()).unwrap();
        }
        let kept = Sender::spooled(&dir).unwrap().len() as u64;
        let dropped = s.metrics.windows_dropped.load(Ordering::Relaxed);
        let tmp = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "tmp"))
            .count();
        assert!(dropped > 0, "nothing dropped");
        assert_eq!(kept + dropped, n, "every window kept or counted");
        assert_eq!(tmp, 0, "a .tmp left behind");
    }
}
