//! The fleet store: ClickHouse over its HTTP interface (`--clickhouse URL`), so several collectors
//! can share one cluster. The schema and queries stay within what Debian's clickhouse-server
//! 18.16 understands (MergeTree with a custom partition key, `ALTER … DELETE` mutations,
//! RowBinary) and current releases keep.
//!
//! Windows are inserted in batches: ClickHouse makes one part per INSERT and refuses inserts
//! once a partition holds a few hundred unmerged parts, so one INSERT per window would fail at
//! fleet rates. An agent's POST is answered only after the batch holding its window committed.
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::{Inserted, Selector, Store, StoreError, WindowInfo};

/// Windows per INSERT at most, and the least time between two INSERTs: windows arriving
/// meanwhile join the next batch, so parts are made at most ten times a second at any rate.
const BATCH_ROWS: usize = 512;
const INSERT_SPACING: Duration = Duration::from_millis(100);

struct Row {
    id: i64,
    agent: String,
    labels: String,
    start_ns: u64,
    end_ns: u64,
    body: Vec<u8>,
    idem: String,
}

type Reply = mpsc::SyncSender<Result<(), StoreError>>;

pub struct ClickHouseStore {
    http: Http,
    table: String,
    batches: Mutex<mpsc::Sender<(Row, Reply)>>,
}

/// The HTTP interface: a query (and optional data) POSTed to the server URL, whose query
/// string may carry `database`, `user` and `password`.
#[derive(Clone)]
struct Http {
    url: String,
    /// The URL's password (query `password=` or `user:password@`), never shown in errors.
    secret: Option<String>,
    agent: ureq::Agent,
}

/// The password a ClickHouse URL carries, if any.
fn url_secret(url: &str) -> Option<String> {
    let query = url.split_once('?').map(|(_, q)| q).unwrap_or("");
    let from_query = query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "password" && !v.is_empty()).then(|| v.to_string())
    });
    let from_userinfo = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split(['/', '?']).next())
        .and_then(|authority| authority.rsplit_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, pass)| pass.to_string())
        .filter(|p| !p.is_empty());
    from_query.or(from_userinfo)
}

impl Http {
    /// `text` with the password replaced, for errors that may quote the URL.
    fn redact(&self, text: &str) -> String {
        match &self.secret {
            Some(s) => text.replace(s.as_str(), "***"),
            None => text.to_string(),
        }
    }
}

impl Http {
    /// Runs `query`; for an INSERT, `data` follows it in the body.
    fn run(&self, query: &str, data: Option<&[u8]>) -> Result<Vec<u8>, StoreError> {
        let (url, body) = match data {
            // The INSERT's data is the body: the query goes in the URL.
            Some(d) => (
                format!(
                    "{}{}query={}",
                    self.url,
                    if self.url.contains('?') { "&" } else { "?" },
                    percent_encoding::utf8_percent_encode(
                        query,
                        percent_encoding::NON_ALPHANUMERIC
                    )
                ),
                d.to_vec(),
            ),
            None => (self.url.clone(), query.as_bytes().to_vec()),
        };
        let mut resp = self.agent.post(&url).send(&body[..]).map_err(|e| {
            StoreError::Backend(self.redact(&format!("ClickHouse at {}: {e}", self.url)))
        })?;
        let status = resp.status();
        let bytes = resp
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()
            .map_err(|e| StoreError::Backend(self.redact(&format!("ClickHouse reply: {e}"))))?;
        if !status.is_success() {
            return Err(StoreError::Backend(self.redact(&format!(
                "ClickHouse: {status}: {}",
                String::from_utf8_lossy(&bytes).trim()
            ))));
        }
        Ok(bytes)
    }
}

impl ClickHouseStore {
    /// Connects to `url` (e.g. `http://127.0.0.1:8123/?database=default`), creating the table
    /// `table` if it does not exist.
    pub fn open(url: &str, table: &str) -> Result<Self, StoreError> {
        if !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || table.is_empty() {
            return Err(StoreError::Backend(format!(
                "`{table}` is not a plain table name"
            )));
        }
        let http = Http {
            url: url.to_string(),
            secret: url_secret(url),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(60)))
                .http_status_as_error(false)
                .build()
                .into(),
        };
        // Partitioned by day of the window's start: retention deletes whole old parts cheaply.
        http.run(
            &format!(
                "CREATE TABLE IF NOT EXISTS {table} (
                    id Int64,
                    agent String,
                    labels String,
                    start_ns UInt64,
                    end_ns UInt64,
                    bytes UInt64,
                    body String,
                    idem String DEFAULT ''
                ) ENGINE = MergeTree()
                PARTITION BY toYYYYMMDD(toDateTime(intDiv(start_ns, 1000000000)))
                ORDER BY (start_ns, id)"
            ),
            None,
        )?;
        // Tables made before the idempotency key get its column (18.16 has no ADD COLUMN IF
        // NOT EXISTS).
        let has_key = http.run(
            &format!(
                "SELECT count() FROM system.columns WHERE database = currentDatabase() \
                 AND table = '{table}' AND name = 'idem' FORMAT TabSeparated"
            ),
            None,
        )?;
        if String::from_utf8_lossy(&has_key).trim() == "0" {
            http.run(
                &format!("ALTER TABLE {table} ADD COLUMN idem String DEFAULT ''"),
                None,
            )?;
        }
        let (tx, rx) = mpsc::channel();
        let (writer, name) = (http.clone(), table.to_string());
        std::thread::Builder::new()
            .name("clickhouse-insert".into())
            .spawn(move || insert_batches(&writer, &name, rx))
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        Ok(ClickHouseStore {
            http,
            table: table.to_string(),
            batches: Mutex::new(tx),
        })
    }

    /// Metadata of the windows starting in the selector's time range (labels are matched by
    /// the caller); the body column is never read.
    fn infos(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
        let out = self.http.run(
            &format!(
                "SELECT id, agent, labels, start_ns, end_ns, bytes FROM {} \
                 WHERE {} ORDER BY start_ns, id FORMAT RowBinary",
                self.table,
                time_range(sel)
            ),
            None,
        )?;
        let mut r = RowReader(&out);
        let mut v = Vec::new();
        while !r.0.is_empty() {
            let id = r.i64()?;
            let agent = r.string()?;
            let labels: BTreeMap<String, String> = serde_json::from_str(&r.string()?)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            let (start_ns, end_ns, bytes) = (r.u64()?, r.u64()?, r.u64()? as usize);
            if sel.matches(&labels, start_ns) {
                v.push(WindowInfo {
                    id,
                    agent,
                    labels,
                    start_ns,
                    end_ns,
                    bytes,
                });
            }
        }
        Ok(v)
    }
}

/// A ClickHouse string literal.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

fn time_range(sel: &Selector) -> String {
    let to = if sel.to_ns == 0 { u64::MAX } else { sel.to_ns };
    format!("start_ns >= {} AND start_ns < {to}", sel.from_ns)
}

/// The insert thread: takes the windows waiting (at least one), the ones that arrive until
/// `INSERT_SPACING` after the previous INSERT began, writes them as one RowBinary INSERT, and
/// answers each sender with the outcome.
fn insert_batches(http: &Http, table: &str, rx: mpsc::Receiver<(Row, Reply)>) {
    let mut last = Instant::now() - INSERT_SPACING;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        let due = last + INSERT_SPACING;
        while batch.len() < BATCH_ROWS {
            let item = match due.checked_duration_since(Instant::now()) {
                Some(left) => rx.recv_timeout(left).ok(),
                None => rx.try_recv().ok(),
            };
            match item {
                Some(item) => batch.push(item),
                None => break,
            }
        }
        last = Instant::now();
        let mut data = Vec::new();
        for (row, _) in &batch {
            put_i64(&mut data, row.id);
            put_string(&mut data, row.agent.as_bytes());
            put_string(&mut data, row.labels.as_bytes());
            put_u64(&mut data, row.start_ns);
            put_u64(&mut data, row.end_ns);
            put_u64(&mut data, row.body.len() as u64);
            put_string(&mut data, &row.body);
            put_string(&mut data, row.idem.as_bytes());
        }
        let result = http
            .run(
                &format!(
                    "INSERT INTO {table} (id, agent, labels, start_ns, end_ns, bytes, body, idem) \
                     FORMAT RowBinary"
                ),
                Some(&data),
            )
            .map(|_| ());
        for (_, reply) in batch {
            let _ = reply.send(result.as_ref().map(|_| ()).map_err(clone_err));
        }
    }
}

fn clone_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Backend(s) => StoreError::Backend(s.clone()),
        StoreError::Corrupt(s) => StoreError::Corrupt(s.clone()),
    }
}

/// A fresh id: ClickHouse has no sequences, and collectors sharing a table must not collide.
/// 63 random bits (std's per-process random hasher keys, fed the time and a counter).
fn new_id() -> i64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 1) as i64
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// RowBinary String: LEB128 length, then the bytes.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    let mut n = s.len() as u64;
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.extend_from_slice(s);
}

/// Reads RowBinary values in order.
struct RowReader<'a>(&'a [u8]);

impl RowReader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        if self.0.len() < n {
            return Err(StoreError::Corrupt("ClickHouse reply ends mid-row".into()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn i64(&mut self) -> Result<i64, StoreError> {
        Ok(self.u64()? as i64)
    }

    fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        let (mut n, mut shift) = (0u64, 0);
        loop {
            let b = self.take(1)?[0];
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(StoreError::Corrupt("bad RowBinary length".into()));
            }
        }
        Ok(self.take(n as usize)?.to_vec())
    }

    fn string(&mut self) -> Result<String, StoreError> {
        String::from_utf8(self.bytes()?).map_err(|e| StoreError::Corrupt(e.to_string()))
    }
}

impl Store for ClickHouseStore {
    /// A key seen before is looked up first. Two collectors storing the same retry at the same
    /// instant could both miss it: agents retry one at a time, after their request timed out.
    fn insert(
        &self,
        agent: &str,
        key: Option<&str>,
        labels: &BTreeMap<String, String>,
        start_ns: u64,
        end_ns: u64,
        body: &[u8],
    ) -> Result<Inserted, StoreError> {
        if let Some(key) = key {
            let out = self.http.run(
                &format!(
                    "SELECT id FROM {} WHERE agent = {} AND idem = {} LIMIT 1 FORMAT TabSeparated",
                    self.table,
                    quoted(agent),
                    quoted(key)
                ),
                None,
            )?;
            if let Ok(id) = String::from_utf8_lossy(&out).trim().parse() {
                return Ok(Inserted {
                    id,
                    duplicate: true,
                });
            }
        }
        let id = new_id();
        let row = Row {
            id,
            agent: agent.to_string(),
            labels: serde_json::to_string(labels)
                .map_err(|e| StoreError::Backend(e.to_string()))?,
            start_ns,
            end_ns,
            body: body.to_vec(),
            idem: key.unwrap_or("").to_string(),
        };
        let (tx, rx) = mpsc::sync_channel(1);
        self.batches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((row, tx))
            .map_err(|_| StoreError::Backend("the ClickHouse insert thread is gone".into()))?;
        rx.recv()
            .map_err(|_| StoreError::Backend("the ClickHouse insert thread is gone".into()))??;
        Ok(Inserted {
            id,
            duplicate: false,
        })
    }

    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
        self.infos(sel)
    }

    fn bodies(&self, sel: &Selector) -> Result<Vec<Vec<u8>>, StoreError> {
        let infos = self.infos(sel)?;
        if infos.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = infos.iter().map(|w| w.id.to_string()).collect();
        let out = self.http.run(
            &format!(
                "SELECT body FROM {} WHERE {} AND id IN ({}) ORDER BY start_ns, id \
                 FORMAT RowBinary",
                self.table,
                time_range(sel),
                ids.join(",")
            ),
            None,
        )?;
        let mut r = RowReader(&out);
        let mut v = Vec::with_capacity(infos.len());
        while !r.0.is_empty() {
            v.push(r.bytes()?);
        }
        Ok(v)
    }

    /// Counts, then deletes with a mutation, which ClickHouse applies in the background (18.16
    /// has no way to wait for it).
    fn retain(&self, before_ns: u64) -> Result<usize, StoreError> {
        let filter = format!("end_ns < {before_ns}");
        let n = self.count_where(&filter)?;
        if n > 0 {
            self.http.run(
                &format!("ALTER TABLE {} DELETE WHERE {filter}", self.table),
                None,
            )?;
        }
        Ok(n as usize)
    }

    fn count(&self) -> Result<u64, StoreError> {
        self.count_where("1")
    }
}

impl ClickHouseStore {
    fn count_where(&self, filter: &str) -> Result<u64, StoreError> {
        let out = self.http.run(
            &format!(
                "SELECT count() FROM {} WHERE {filter} FORMAT TabSeparated",
                self.table
            ),
            None,
        )?;
        String::from_utf8_lossy(&out)
            .trim()
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("count: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a ClickHouse password never reaches an error: from the query string or the
    // userinfo, and that a server that is not there yields an error without it.
    #[test]
    fn passwords_are_redacted_from_errors() {
        assert_eq!(
            url_secret("http://127.0.0.1:8123/?database=d&user=u&password=hunter2-x"),
            Some("hunter2-x".into())
        );
        assert_eq!(
            url_secret("http://u:hunter3-y@127.0.0.1:8123/?database=d"),
            Some("hunter3-y".into())
        );
        assert_eq!(url_secret("http://127.0.0.1:8123/?database=d"), None);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = ClickHouseStore::open(
            &format!("http://127.0.0.1:{port}/?user=u&password=hunter2-x"),
            "t",
        )
        .err()
        .expect("nothing listens there");
        let text = err.to_string();
        assert!(!text.contains("hunter2-x"), "{text}");
        assert!(text.contains("password=***"), "{text}");
    }

    // Checks the RowBinary encoding of strings round-trips, including a length past one LEB128
    // byte and bytes that are not UTF-8 (window bodies are gzip).
    #[test]
    fn row_binary_round_trip() {
        let long = vec![0xffu8; 300];
        let mut buf = Vec::new();
        put_i64(&mut buf, -5);
        put_string(&mut buf, b"agent");
        put_string(&mut buf, &long);
        put_u64(&mut buf, 7);
        assert_eq!(buf[8], 5);
        let mut r = RowReader(&buf);
        assert_eq!(r.i64().unwrap(), -5);
        assert_eq!(r.string().unwrap(), "agent");
        assert_eq!(r.bytes().unwrap(), long);
        assert_eq!(r.u64().unwrap(), 7);
        assert!(r.0.is_empty());
        assert!(RowReader(&[0x85]).bytes().is_err());
    }
}
