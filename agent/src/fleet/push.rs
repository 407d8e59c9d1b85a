//! Delivery of windows to the collector: POST with the agent's bearer token; when the collector
//! cannot take them (down, 5xx), windows wait in a bounded on-disk spool and are sent oldest
//! first, with exponential backoff, once it is back. Only what overflows the spool is dropped,
//! and counted; a window the collector refuses (4xx) is counted as rejected.
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
    pub spool_files: AtomicU64,
}

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
    backoff: Duration,
    retry_at: Option<Instant>,
    http: ureq::Agent,
    pub metrics: Arc<PushMetrics>,
}

enum Outcome {
    Sent,
    /// The collector is unreachable or failing: keep the window.
    Later(String),
    /// The collector refused this window: retrying cannot help.
    Refused(String),
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

    /// Spooled windows, oldest first: (sequence number, path).
    fn spooled(dir: &PathBuf) -> Result<Vec<(u64, PathBuf)>> {
        let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let n = name.strip_suffix(".phaseprof")?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        v.sort();
        Ok(v)
    }

    fn post(&self, body: &[u8]) -> Outcome {
        let resp = self
            .http
            .post(&self.url)
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", "application/octet-stream")
            .send(body);
        match resp {
            Err(e) => Outcome::Later(e.to_string()),
            Ok(r) if r.status().is_success() => Outcome::Sent,
            Ok(mut r) => {
                let status = r.status();
                let reason = r.body_mut().read_to_string().unwrap_or_default();
                if status.is_server_error() || status.as_u16() == 429 {
                    Outcome::Later(format!("{status}: {reason}"))
                } else {
                    Outcome::Refused(format!("{status}: {reason}"))
                }
            }
        }
    }

    /// Hands over one window: sent now if the collector is reachable and nothing older waits,
    /// else spooled.
    pub fn submit(&mut self, body: Vec<u8>) -> Result<()> {
        self.flush_spool(false);
        let waiting = self.metrics.spool_files.load(Ordering::Relaxed) > 0;
        if !waiting && self.retry_at.is_none() {
            match self.post(&body) {
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
            }
        }
        self.spool_window(&body)
    }

    fn failed(&mut self, reason: &str) {
        eprintln!(
            "phaseprof: collector unavailable ({reason}); spooling windows, retry in {:?}",
            self.backoff
        );
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(Duration::from_secs(30));
    }

    fn spool_window(&mut self, body: &[u8]) -> Result<()> {
        let path = self.spool.join(format!("{:020}.phaseprof", self.seq));
        self.seq += 1;
        // Written whole under a temporary name, then renamed: a crash never leaves half a window.
        let tmp = path.with_extension("tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            f.write_all(body)
                .with_context(|| format!("writing {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, &path)?;
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
            match self.post(&body) {
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
