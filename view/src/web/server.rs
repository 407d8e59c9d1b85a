//! The accept loop of every phaseprof HTTP server (`serve`, `attach --listen`, the collector over
//! TCP or TLS), instead of `axum::serve`, which has no timeouts and no connection limit: a client
//! that opens connections and sends nothing, or sends its request a byte at a time, would
//! otherwise hold a task and a file descriptor for as long as it likes.
//!
//! - At most `max_connections` at once (TLS handshakes included), and at most `per_address`
//!   from one client address; beyond either a new connection is closed at once and counted, so
//!   the ones already open keep being served and one client (5,000 idle connections, a
//!   reconnect loop) cannot take the slots of all others.
//! - A TLS handshake, and each request's head, must arrive within `header_timeout`.
//! - A connection on which no byte has moved either way for `idle_timeout` is closed (a request
//!   in progress finishes first, unless it also stays silent that long).
//! - Request bodies get their own deadline where they are read (the collector's ingest).
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tower::ServiceExt;

/// The defaults of `--max-connections`, and the deadlines.
pub const MAX_CONNECTIONS: usize = 4096;
/// The default of `--max-connections-per-address`: a browser opens 6, an agent 1, a scraper 1.
pub const PER_ADDRESS_CONNECTIONS: usize = 64;
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A request head larger than this is refused (hyper's default is 400 KiB per connection).
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// File descriptors kept for everything else (the store, logs, the BPF objects of `attach`).
const SPARE_FDS: u64 = 64;

#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub per_address: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            per_address: PER_ADDRESS_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
        }
    }
}

/// What the accept loop did, for `/metrics`.
#[derive(Default, Debug)]
pub struct ConnectionCounters {
    pub open: AtomicU64,
    /// Closed at accept: `max_connections` were open.
    pub refused: AtomicU64,
    /// Closed at accept: `per_address` were open from that client's address.
    pub refused_per_address: AtomicU64,
    /// Closed for a TLS handshake or a request head past its deadline, or idle past
    /// `idle_timeout`.
    pub timed_out: AtomicU64,
}

/// Raises the soft limit of open files to the hard one and returns how many connections fit
/// under it: `wanted`, or fewer (with a warning) when the hard limit is lower.
pub fn fit_connections(wanted: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write only the struct passed.
    let limit = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return wanted;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    };
    let room = limit.saturating_sub(SPARE_FDS) as usize;
    if room < wanted {
        eprintln!(
            "phaseprof: the open-file limit ({limit}) allows {room} connections, not {wanted}: raise it (LimitNOFILE, ulimit -n)"
        );
        return room.max(1);
    }
    wanted
}

/// Connections the kernel queues for `accept` (capped by `net.core.somaxconn`). tokio's
/// `bind` asks for 1,024: a burst of more connects than that overflows the queue, and the
/// kernel drops the surplus SYNs, which clients resend only after a second, so a scrape landing
/// in such a burst would wait a whole second before its connection is even seen.
const ACCEPT_BACKLOG: u32 = 4096;

/// A listener on `addr` with a deep accept queue (see ACCEPT_BACKLOG).
pub fn listen(addr: std::net::SocketAddr) -> io::Result<TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(ACCEPT_BACKLOG)
}

/// Connections open per client address.
#[derive(Default)]
struct PerAddress {
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One connection's place in its address's count, given back when dropped.
struct AddressSlot {
    table: Arc<PerAddress>,
    addr: std::net::IpAddr,
}

impl PerAddress {
    fn take(table: &Arc<PerAddress>, addr: std::net::IpAddr, max: usize) -> Option<AddressSlot> {
        let addr = match addr {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, std::net::IpAddr::V4),
            v4 => v4,
        };
        let mut open = table.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(addr).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot {
            table: table.clone(),
            addr,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.table.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.addr);
            }
        }
    }
}

/// Serves `app` on `listener` until `stop` resolves, then lets open requests finish (up to
/// `idle_timeout`). `handshake` turns an accepted TCP stream into the connection's stream: TLS,
/// or the stream itself (`plain`).
pub async fn serve<IO, H, F>(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    counters: Arc<ConnectionCounters>,
    handshake: H,
    stop: impl Future<Output = ()> + Send,
) -> io::Result<()>
where
    H: Fn(TcpStream) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = io::Result<IO>> + Send,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let per_address = Arc::new(PerAddress::default());
    let (stopping, stop_rx) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    eprintln!("phaseprof: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(address_slot) = PerAddress::take(&per_address, peer.ip(), limits.per_address)
        else {
            counters.refused_per_address.fetch_add(1, Ordering::Relaxed);
            drop(tcp);
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (app, limits, counters, handshake, stop_rx) = (
            app.clone(),
            limits.clone(),
            counters.clone(),
            handshake.clone(),
            stop_rx.clone(),
        );
        counters.open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            match tokio::time::timeout(limits.header_timeout, handshake(tcp)).await {
                Ok(Ok(io)) => serve_connection(io, app, &limits, &counters, stop_rx).await,
                Ok(Err(_)) => {}
                Err(_) => {
                    counters.timed_out.fetch_add(1, Ordering::Relaxed);
                }
            }
            counters.open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
            drop(address_slot);
        });
    }
    let _ = stopping.send(true);
    // Every connection holds a slot: all of them back means all connections ended.
    let _ = tokio::time::timeout(limits.idle_timeout, slots.acquire_many(max as u32)).await;
    Ok(())
}

/// `serve`'s handshake for plain TCP.
pub async fn plain(tcp: TcpStream) -> io::Result<TcpStream> {
    Ok(tcp)
}

async fn serve_connection<IO>(
    io: IO,
    app: Router,
    limits: &Limits,
    counters: &ConnectionCounters,
    mut stop: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let io = Watched {
        inner: io,
        started,
        last: last.clone(),
    };
    let service = TowerToHyperService::new(
        app.map_request(|r: hyper::Request<hyper::body::Incoming>| r.map(axum::body::Body::new)),
    );
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let idle = |now: Instant| {
        let at = Duration::from_millis(last.load(Ordering::Relaxed));
        now.duration_since(started).saturating_sub(at)
    };
    let mut check = tokio::time::interval((limits.idle_timeout / 4).max(Duration::from_millis(50)));
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if r.is_err_and(|e| e.is_timeout()) {
                    counters.timed_out.fetch_add(1, Ordering::Relaxed); // the head's deadline
                }
                return;
            }
            _ = check.tick() => {
                if idle(Instant::now()) >= limits.idle_timeout {
                    if closing {
                        // Asked to close an idle-timeout ago and still silent: drop it.
                        counters.timed_out.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    counters.timed_out.fetch_add(1, Ordering::Relaxed);
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    last.store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                }
            }
            changed = stop.changed(), if !closing => {
                let _ = changed;
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// A stream that notes when a byte last moved either way (milliseconds after `started`).
struct Watched<IO> {
    inner: IO,
    started: Instant,
    last: Arc<AtomicU64>,
}

impl<IO> Watched<IO> {
    fn moved(&self) {
        self.last
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        r
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(limits: Limits) -> (std::net::SocketAddr, Arc<ConnectionCounters>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(ConnectionCounters::default());
        let app = Router::new().route("/", get(|| async { "ok" }));
        let c = counters.clone();
        tokio::spawn(serve(
            listener,
            app,
            limits,
            c,
            plain,
            std::future::pending(),
        ));
        (addr, counters)
    }

    async fn get_ok(addr: std::net::SocketAddr) -> bool {
        let Ok(mut s) = TcpStream::connect(addr).await else {
            return false;
        };
        let req = b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        if s.write_all(req).await.is_err() {
            return false;
        }
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
        out.starts_with(b"HTTP/1.1 200")
    }

    // Checks that a handshake (TLS's, here one that waits for bytes that never come) runs
    // under the header deadline and inside the connection limit: the silent client is closed
    // and counted, and its slot serves the next connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn handshakes_have_a_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(ConnectionCounters::default());
        let limits = Limits {
            max_connections: 1,
            per_address: PER_ADDRESS_CONNECTIONS,
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_secs(5),
        };
        let waits_for_a_hello = |mut tcp: TcpStream| async move {
            let mut hello = [0u8; 1];
            tcp.read_exact(&mut hello).await?;
            Ok(tcp)
        };
        let app = Router::new().route("/", get(|| async { "ok" }));
        tokio::spawn(serve(
            listener,
            app,
            limits,
            counters.clone(),
            waits_for_a_hello,
            std::future::pending(),
        ));
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let mut b = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_secs(3), silent.read(&mut b)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "closed at the deadline"
        );
        tokio::time::sleep(Duration::from_millis(50)).await; // the task gives its slot back
        assert_eq!(counters.timed_out.load(Ordering::Relaxed), 1);
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"!GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }

    // Checks the per-address limit: with 2 silent connections from 127.0.0.1 (its limit), a
    // third from there is refused and counted, while a client from 127.0.0.2 is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_address_cannot_take_every_slot() {
        let limits = Limits {
            per_address: 2,
            ..Limits::default()
        };
        let (addr, counters) = start(limits).await;
        let mut silent = Vec::new();
        for _ in 0..2 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!get_ok(addr).await, "a third from the same address");
        assert_eq!(counters.refused_per_address.load(Ordering::Relaxed), 1);
        let other = tokio::net::TcpSocket::new_v4().unwrap();
        other.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut s = other.connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await;
        assert!(
            out.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&out)
        );
    }

    // Checks the connection limit and the deadlines: with 2 slots held by silent clients a
    // third connection is refused (closed, counted), and once the header deadline closes the
    // silent ones a request is served again; a client idle after its request is closed too.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_clients_are_closed_and_the_limit_holds() {
        let limits = Limits {
            max_connections: 2,
            per_address: PER_ADDRESS_CONNECTIONS,
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(600),
        };
        let (addr, counters) = start(limits).await;
        let mut silent = Vec::new();
        for _ in 0..2 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!get_ok(addr).await, "a third connection is refused");
        assert_eq!(counters.refused.load(Ordering::Relaxed), 1);
        tokio::time::sleep(Duration::from_millis(600)).await;
        for s in &mut silent {
            let mut b = [0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b)).await;
            assert!(matches!(n, Ok(Ok(_)) | Ok(Err(_))), "closed by the server");
        }
        assert!(
            get_ok(addr).await,
            "served again once the silent ones are gone"
        );
        // Keep-alive client that goes quiet after one request.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut b = vec![0u8; 4096];
        let n = s.read(&mut b).await.unwrap();
        assert!(b[..n].starts_with(b"HTTP/1.1 200"));
        let rest = tokio::time::timeout(Duration::from_secs(3), s.read(&mut b)).await;
        assert!(
            matches!(rest, Ok(Ok(0)) | Ok(Err(_))),
            "idle keep-alive closed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(counters.open.load(Ordering::Relaxed), 0);
    }
}
