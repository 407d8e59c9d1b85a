//! A fault-injecting HTTP proxy in front of a server (ClickHouse's HTTP interface): one request
//! per connection (it asks the server to close after each answer), and the n-th request after
//! `arm` fails, either refused (never forwarded) or forwarded and its answer dropped (the
//! server did the work; the client never learns it).
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// The connection closes before anything is forwarded.
    Refuse,
    /// Forwarded and answered by the server; the client's connection closes unanswered.
    DropAnswer,
}

#[derive(Default)]
struct State {
    /// Requests since `arm`, and the fault for request `at` of them.
    seen: usize,
    armed: Option<(usize, Fault)>,
    /// The first line (and, for a body query, its first words) of each request since `arm`.
    log: Vec<String>,
}

pub struct FaultProxy {
    pub url: String,
    state: Arc<Mutex<State>>,
}

/// Reads one request (head, and a body of its Content-Length): the bytes, and a short title.
fn read_request(c: &mut TcpStream) -> Option<(Vec<u8>, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = c.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = c.read(&mut chunk).ok().filter(|&n| n > 0)?;
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = head.lines().next().unwrap_or("").to_string();
    let query = String::from_utf8_lossy(&buf[head_end..(head_end + len).min(head_end + 60)]);
    let title = if line.contains("query=") {
        line
    } else {
        format!("{line} {query}")
    };
    // One request per connection: the server closes after its answer.
    let head = head.replacen("\r\n", "\r\nConnection: close\r\n", 1);
    let mut out = head.into_bytes();
    out.extend_from_slice(&buf[head_end..]);
    Some((out, title))
}

impl FaultProxy {
    pub fn start(upstream: std::net::SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let state = shared.clone();
                std::thread::spawn(move || serve(client, upstream, &state));
            }
        });
        FaultProxy { url, state }
    }

    /// From now on, request number `at` (0: the next) fails with `fault`; None: none fails.
    pub fn arm(&self, fault: Option<(usize, Fault)>) {
        let mut s = self.state.lock().unwrap();
        s.seen = 0;
        s.armed = fault;
        s.log.clear();
    }

    /// The requests since `arm`.
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap().log.clone()
    }
}

fn serve(mut client: TcpStream, upstream: std::net::SocketAddr, state: &Mutex<State>) {
    let Some((request, title)) = read_request(&mut client) else {
        return;
    };
    let fault = {
        let mut s = state.lock().unwrap();
        let n = s.seen;
        s.seen += 1;
        let fault = s.armed.filter(|(at, _)| *at == n).map(|(_, f)| f);
        s.log.push(format!(
            "{title}{}",
            fault.map_or(String::new(), |f| format!(" [{f:?}]"))
        ));
        fault
    };
    if fault == Some(Fault::Refuse) {
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    if server.write_all(&request).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = server.read_to_end(&mut answer);
    if fault != Some(Fault::DropAnswer) {
        let _ = client.write_all(&closing(answer));
    }
}

/// The answer with `Connection: close` in its head (any other Connection header dropped): this
/// proxy closes the client's connection after one answer, and a client not told so pools it and
/// meets a reset on its next request.
fn closing(answer: Vec<u8>) -> Vec<u8> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return answer;
    };
    let head = String::from_utf8_lossy(&answer[..end]);
    let mut lines = head.split("\r\n");
    let mut out = lines.next().unwrap_or("").to_string();
    out.push_str("\r\nConnection: close");
    for line in lines.filter(|l| !l.to_ascii_lowercase().starts_with("connection:")) {
        out.push_str("\r\n");
        out.push_str(line);
    }
    let mut out = out.into_bytes();
    out.extend_from_slice(&answer[end..]);
    out
}
