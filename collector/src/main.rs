use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use phaseprof_collector::app::{AppState, IngestLimits, Metrics, RateLimit};
use phaseprof_collector::clickhouse::ClickHouseStore;
use phaseprof_collector::pages::Selections;
use phaseprof_collector::sqlite::SqliteStore;
use phaseprof_collector::store::{Store, StoreError};
use phaseprof_collector::tls::{handshake, server_config};
use phaseprof_collector::tokens::Tokens;
use phaseprof_model::units::parse_duration;
use phaseprof_view::web::server::{fit_connections, listen, plain, serve, Limits};

/// Receives phaseprof windows from fleet agents, stores them, and merges them by label.
#[derive(Parser, Debug)]
#[command(name = "phaseprof-collector", version = phaseprof_model::VERSION)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:7071")]
    listen: SocketAddr,
    /// Directory of the embedded store (SQLite).
    #[arg(long, default_value = "/var/lib/phaseprof-collector")]
    data: PathBuf,
    /// Store windows in ClickHouse instead, e.g. `http://127.0.0.1:8123/?database=default`
    /// (credentials as `&user=…&password=…`; give a URL with a password through the
    /// environment, PHASEPROF_CLICKHOUSE_URL, to keep it out of the process list; errors never
    /// show it); several collectors may share it.
    #[arg(
        long,
        value_name = "URL",
        env = "PHASEPROF_CLICKHOUSE_URL",
        hide_env_values = true
    )]
    clickhouse: Option<String>,
    /// The ClickHouse table (created if missing).
    #[arg(long, default_value = "phaseprof_windows")]
    clickhouse_table: String,
    /// Agent tokens: lines of `AGENT-NAME TOKEN`.
    #[arg(long, value_name = "FILE")]
    tokens: PathBuf,
    /// Bearer token for queries (required when listening beyond loopback).
    #[arg(long, env = "PHASEPROF_READ_TOKEN", hide_env_values = true)]
    read_token: Option<String>,
    /// Serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Largest window accepted, in bytes as sent (gzip). Windows are tens of KiB; an agent cuts
    /// one that is refused as too large in halves.
    #[arg(long, default_value_t = 4 << 20)]
    max_body: usize,
    /// Largest window accepted once inflated, in bytes: a gzip bomb stops here (413).
    #[arg(long, default_value_t = 64 << 20)]
    max_inflated: u64,
    /// Uploads read, decoded and stored at once; more wait up to 5 s, then get 503 (agents
    /// retry). Bodies in memory are at most this times --max-body. Stores batch what arrives
    /// together, so this is also the most a batch holds.
    #[arg(long, default_value_t = 64)]
    max_uploads: usize,
    /// Queries that merge or compare windows (merged views, downloads, diffs) run at once; more
    /// wait their turn.
    #[arg(long, default_value_t = 2)]
    max_queries: usize,
    /// An upload's body must arrive within this (e.g. 30s, 2m); else 408.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    body_timeout: Duration,
    /// Open connections at most (TLS handshakes included); more are closed at once. The
    /// open-file limit is raised to fit, up to its hard limit.
    #[arg(long, default_value_t = phaseprof_view::web::server::MAX_CONNECTIONS)]
    max_connections: usize,
    /// Open connections from one client address at most; more are closed at once, so one
    /// client cannot hold the slots of all others.
    #[arg(long, default_value_t = phaseprof_view::web::server::PER_ADDRESS_CONNECTIONS)]
    max_connections_per_address: usize,
    /// A TLS handshake, and each request's head, must arrive within this; else the connection
    /// is closed.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// A connection silent this long either way is closed.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Windows per second each agent may upload (a burst of 20 times this is allowed, for
    /// spools being flushed); beyond, 429.
    #[arg(long, default_value_t = 50.0)]
    agent_rate: f64,
    /// Delete windows older than this (e.g. 7d, 12h).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    retain: Duration,
}

fn main() {
    // The package's build writes the man page with this (its only use, so not in --help).
    if std::env::args().nth(1).as_deref() == Some("--man") {
        use clap::CommandFactory;
        let page = clap_mangen::Man::new(Args::command()).render(&mut std::io::stdout().lock());
        std::process::exit(i32::from(page.is_err()));
    }
    if let Err(e) = run(Args::parse()) {
        eprintln!("phaseprof-collector: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    if args
        .read_token
        .as_deref()
        .is_some_and(|t| t.trim().is_empty())
    {
        bail!("--read-token (or PHASEPROF_READ_TOKEN) is empty: an empty token would let anyone read; give a real one, or none on loopback");
    }
    if !args.listen.ip().is_loopback() && args.read_token.is_none() {
        bail!("refusing to serve queries on {} without --read-token: stored profiles show function names and hosts", args.listen);
    }
    let file = args.tokens.display().to_string();
    let text = std::fs::read_to_string(&args.tokens).with_context(|| format!("reading {file}"))?;
    let tokens = Tokens::parse(&file, &text).map_err(anyhow::Error::msg)?;
    let store: Arc<dyn Store> = match &args.clickhouse {
        Some(url) => Arc::new(ClickHouseStore::open(url, &args.clickhouse_table)?),
        None => Arc::new(SqliteStore::open(&args.data)?),
    };
    if !args.agent_rate.is_finite() || args.agent_rate <= 0.0 {
        bail!("--agent-rate must be above 0 windows per second");
    }
    let state = AppState {
        store: store.clone(),
        tokens: Arc::new(tokens),
        read_token: args.read_token.map(Into::into),
        limits: IngestLimits::new(
            args.max_body,
            args.max_inflated,
            args.max_uploads,
            args.body_timeout,
            RateLimit::new(args.agent_rate, args.agent_rate * 20.0),
        ),
        queries: Arc::new(tokio::sync::Semaphore::new(args.max_queries.max(1))),
        metrics: Arc::new(Metrics::default()),
    };
    let stored = store.count()?;
    state
        .metrics
        .windows_stored
        .store(stored, Ordering::Relaxed);
    let limits = Limits {
        max_connections: fit_connections(args.max_connections),
        per_address: args.max_connections_per_address.max(1),
        header_timeout: args.header_timeout,
        idle_timeout: args.idle_timeout,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(server_config(cert, key)?),
        _ => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let retain = args.retain;
        let metrics = state.metrics.clone();
        tokio::spawn(async move {
            loop {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let before = now.saturating_sub(retain).as_nanos() as u64;
                let store = store.clone();
                // The recount also picks up windows other collectors stored in a shared table.
                let pass = move || Ok::<_, StoreError>((store.retain(before)?, store.count()?));
                match tokio::task::spawn_blocking(pass).await {
                    Ok(Ok((removed, stored))) => {
                        metrics.windows_stored.store(stored, Ordering::Relaxed);
                        if removed > 0 {
                            eprintln!("phaseprof-collector: retention removed {removed} windows");
                        }
                    }
                    Ok(Err(e)) => eprintln!("phaseprof-collector: retention: {e}"),
                    Err(e) => eprintln!("phaseprof-collector: retention: {e}"),
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        });
        let listener =
            listen(args.listen).with_context(|| format!("cannot listen on {}", args.listen))?;
        // The ingest and query API, and `serve`'s pages over label selections (read token
        // required as for queries).
        let pages = phaseprof_view::web::AppState {
            source: Arc::new(Selections::new(state.store.clone(), state.queries.clone())),
            token: state.read_token.clone(),
            tls: tls.is_some(),
        };
        let counters = state.metrics.connections.clone();
        let app = phaseprof_collector::app(state).merge(phaseprof_view::web::app(pages));
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        eprintln!(
            "phaseprof-collector: listening on {scheme}://{}/",
            listener.local_addr()?
        );
        match tls {
            Some(config) => serve(listener, app, limits, counters, handshake(config), stop).await?,
            None => serve(listener, app, limits, counters, plain, stop).await?,
        }
        Ok(())
    })
}
