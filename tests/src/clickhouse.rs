//! A ClickHouse server of the machine's package, run for one test; or, with
//! `PHASEPROF_TEST_CHDB=1`, the current ClickHouse release embedded in chDB (PyPI
//! `chdb`) behind its HTTP interface (`tests/chdb/clickhouse_http.py`).
use std::path::Path;
use std::process::Command;

use crate::*;

/// A `clickhouse-server` of the machine's (Debian's) package run for one test on 127.0.0.1,
/// with its own ports, data directory and a password-less `default` user; killed on drop.
pub struct ClickHouse {
    child: std::process::Child,
    server: Server,
    dir: std::path::PathBuf,
    /// The HTTP interface, for `phaseprof-collector --clickhouse`.
    pub url: String,
}

/// What serves: the packaged server's binary, or chDB on this HTTP port.
#[derive(Clone, Copy)]
enum Server {
    Packaged(&'static str),
    Chdb(u16),
}

impl ClickHouse {
    /// None when clickhouse-server is not installed (`scripts/setup.sh` installs it).
    pub fn start(name: &str) -> Option<ClickHouse> {
        let dir = scratch(name);
        let (http, tcp) = (free_port(), free_port());
        let server = if std::env::var_os("PHASEPROF_TEST_CHDB").is_some() {
            Server::Chdb(http)
        } else {
            let bin = ["/usr/bin/clickhouse-server", "/usr/sbin/clickhouse-server"]
                .into_iter()
                .find(|p| Path::new(p).exists())?;
            Server::Packaged(bin)
        };
        std::fs::write(
            dir.join("users.xml"),
            "<yandex><profiles><default/></profiles><quotas><default/></quotas><users><default>\
             <password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile>\
             <quota>default</quota></default></users></yandex>\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("config.xml"),
            format!(
                "<yandex><logger><level>warning</level><console>1</console></logger>\
                 <http_port>{http}</http_port><tcp_port>{tcp}</tcp_port>\
                 <listen_host>127.0.0.1</listen_host><path>{d}/data/</path>\
                 <tmp_path>{d}/data/tmp/</tmp_path><users_config>{d}/users.xml</users_config>\
                 <default_profile>default</default_profile><default_database>default</default_database>\
                 <mark_cache_size>268435456</mark_cache_size></yandex>\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let child = spawn(server, &dir);
        // The guard first: a server that never answers is still killed.
        let server = ClickHouse {
            child,
            server,
            dir,
            url: format!("http://127.0.0.1:{http}/"),
        };
        server.wait_ready();
        Some(server)
    }

    /// Kills the server (SIGKILL: nothing flushed) and starts it again on the same data.
    pub fn kill_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn(self.server, &self.dir);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let dir = &self.dir;
        let server = self;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let ping = format!("{}ping", server.url);
        while !matches!(try_http_request("GET", &ping, "", &[]), Ok((200, _))) {
            assert!(
                std::time::Instant::now() < deadline,
                "clickhouse-server did not start: {}",
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

fn spawn(server: Server, dir: &Path) -> std::process::Child {
    let mut cmd = match server {
        Server::Packaged(bin) => {
            let mut c = Command::new(bin);
            c.arg(format!(
                "--config-file={}",
                dir.join("config.xml").display()
            ));
            c
        }
        Server::Chdb(port) => {
            let mut c = Command::new("python3");
            c.arg(root().join("tests/chdb/clickhouse_http.py"))
                .arg(port.to_string())
                .arg(dir.join("data"));
            c
        }
    };
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
        .spawn()
        .expect("starting clickhouse-server")
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
