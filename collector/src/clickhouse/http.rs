//! ClickHouse's HTTP interface: a query (and optional data) POSTed to the server URL, whose
//! query string may carry `database`, `user` and `password` (never shown in errors).
use std::time::Duration;

use crate::store::StoreError;

/// The HTTP interface: a query (and optional data) POSTed to the server URL, whose query
/// string may carry `database`, `user` and `password`.
#[derive(Clone)]
pub struct Http {
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
    pub fn run(&self, query: &str, data: Option<&[u8]>) -> Result<Vec<u8>, StoreError> {
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

impl Http {
    pub fn new(url: &str) -> Self {
        Http {
            url: url.to_string(),
            secret: url_secret(url),
            agent: ureq::Agent::config_builder()
                .timeout_global(Some(Duration::from_secs(60)))
                // Under ClickHouse's shortest keep-alive (3 s on old servers): a connection the
                // server may already have closed is not reused (its request would meet a reset).
                .max_idle_age(Duration::from_secs(2))
                .http_status_as_error(false)
                .build()
                .into(),
        }
    }

    /// A query's single number (`count()` and the like).
    pub fn number(&self, query: &str) -> Result<u64, StoreError> {
        let out = self.run(&format!("{query} FORMAT TabSeparated"), None)?;
        String::from_utf8_lossy(&out)
            .trim()
            .parse()
            .map_err(|e| StoreError::Corrupt(format!("`{query}`: {e}")))
    }
}

/// A ClickHouse string literal.
pub fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
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
        let err = super::super::ClickHouseStore::open(
            &format!("http://127.0.0.1:{port}/?user=u&password=hunter2-x"),
            "t",
        )
        .err()
        .expect("nothing listens there");
        let text = err.to_string();
        assert!(!text.contains("hunter2-x"), "{text}");
        assert!(text.contains("password=***"), "{text}");
    }
}
