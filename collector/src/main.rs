use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use phaseprof_collector::app::{AppState, Metrics};
use phaseprof_collector::clickhouse::ClickHouseStore;
use phaseprof_collector::pages::Selections;
use phaseprof_collector::sqlite::SqliteStore;
use phaseprof_collector::store::{parse_age, Store};
use phaseprof_collector::tls::{server_config, TlsListener};
use phaseprof_collector::tokens::Tokens;

/// Receives phaseprof windows from fleet agents, stores them, and merges them by label.
#[derive(Parser, Debug)]
#[command(name = "phaseprof-collector", version)]
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
    /// Largest window accepted, in bytes as sent (gzip).
    #[arg(long, default_value_t = 16 << 20)]
    max_body: usize,
    /// Largest window accepted once inflated, in bytes: a gzip bomb stops here (413).
    #[arg(long, default_value_t = 256 << 20)]
    max_inflated: u64,
    /// Delete windows older than this (e.g. 7d, 12h).
    #[arg(long, default_value = "7d", value_parser = parse_age)]
    retain: Duration,
}

fn main() {
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
    let state = AppState {
        store: store.clone(),
        tokens: Arc::new(tokens),
        read_token: args.read_token.map(Into::into),
        max_body: args.max_body,
        max_inflated: args.max_inflated,
        metrics: Arc::new(Metrics::default()),
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
        tokio::spawn(async move {
            loop {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default();
                let before = now.saturating_sub(retain).as_nanos() as u64;
                let store = store.clone();
                match tokio::task::spawn_blocking(move || store.retain(before)).await {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => eprintln!("phaseprof-collector: retention removed {n} windows"),
                    Ok(Err(e)) => eprintln!("phaseprof-collector: retention: {e}"),
                    Err(e) => eprintln!("phaseprof-collector: retention: {e}"),
                }
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        });
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        // The ingest and query API, and `serve`'s pages over label selections (read token
        // required as for queries).
        let pages = phaseprof::web::AppState {
            source: Arc::new(Selections::new(state.store.clone())),
            token: state.read_token.clone(),
        };
        let app = phaseprof_collector::app(state).merge(phaseprof::web::app(pages));
        let stop = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        match tls {
            Some(config) => {
                eprintln!(
                    "phaseprof-collector: listening on https://{}/",
                    listener.local_addr()?
                );
                let listener = TlsListener::new(listener, config)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await?;
            }
            None => {
                eprintln!(
                    "phaseprof-collector: listening on http://{}/",
                    listener.local_addr()?
                );
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .await?;
            }
        }
        Ok(())
    })
}
