//! Go: the toolchain, workloads built from tests/workloads, third-party servers from the
//! module proxy, and where a function's body starts in a Go binary.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::*;

/// The Go toolchain, if installed (`/usr/local/go/bin/go`, Debian's, or on PATH).
pub fn go_binary() -> Option<PathBuf> {
    let known = ["/usr/local/go/bin/go", "/usr/lib/go/bin/go", "/usr/bin/go"];
    known
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| {
            let o = Command::new("sh")
                .args(["-c", "command -v go"])
                .output()
                .ok()?;
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).trim().into())
        })
}

/// Builds the Go workload `tests/workloads/<name>` once per process; None when Go is absent.
pub fn go_workload(name: &str) -> Option<PathBuf> {
    let go = go_binary()?;
    let bin = root().join("target/go-workloads").join(name);
    build_once(&bin.to_string_lossy(), || {
        let status = Command::new(go)
            .args(["build", "-o", bin.to_str().expect("UTF-8 temp dir"), "."])
            .current_dir(root().join("tests/workloads").join(name))
            .env("GOFLAGS", "-mod=mod")
            .status()
            .expect("running go build");
        assert!(status.success(), "building Go workload {name} failed");
    });
    Some(bin)
}

/// Builds a program written by others from the Go module proxy (`go install module@version`)
/// into `target/third-party/`, once (kept across runs: the module is pinned); None when Go is
/// absent.
pub fn go_third_party(module: &str, version: &str, binary: &str) -> Option<PathBuf> {
    let go = go_binary()?;
    let dir = root().join("target/third-party").join(version);
    let bin = dir.join(binary);
    build_once(&bin.to_string_lossy(), || {
        if bin.exists() {
            return;
        }
        let status = Command::new(go)
            .args(["install", &format!("{module}@{version}")])
            .env("GOBIN", &dir)
            .status()
            .expect("running go install");
        assert!(
            status.success(),
            "go install {module}@{version} failed (the Go module proxy must be reachable)"
        );
    });
    Some(bin)
}

/// File offset of the first instruction of Go function `name` in `bin` after its stack-check
/// prologue (`cmp rsp, [r14+16]; jbe morestack`), from `go tool objdump`: a probe there counts
/// calls once, where one on the first instruction fires again when the stack grows.
pub fn go_body_offset(bin: &Path, name: &str) -> u64 {
    let go = go_binary().expect("Go is installed");
    let pattern = format!("^{}$", regex_escape(name));
    let o = Command::new(go)
        .args(["tool", "objdump", "-s", &pattern])
        .arg(bin)
        .output()
        .expect("running go tool objdump");
    let text = String::from_utf8_lossy(&o.stdout);
    // Lines: "  file.go:123<TAB>0x81a0e0<TAB><TAB>493b6610<TAB><TAB>CMPQ SP, 0x10(R14)..." (empty fields).
    let insns: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l
                .split('\t')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .collect();
            let addr = u64::from_str_radix(f.get(1)?.trim_start_matches("0x"), 16).ok()?;
            Some((addr, *f.get(3)?))
        })
        .collect();
    let jbe = insns
        .iter()
        .take(4)
        .position(|(_, i)| i.starts_with("JBE"))
        .unwrap_or_else(|| panic!("no stack check at the start of {name}: {text}"));
    let vaddr = insns[jbe + 1].0;
    elf_file_offset(bin, vaddr)
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "()*.+?[]{}|^$\\".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// The file offset of virtual address `vaddr` in ELF executable `bin` (from its program headers).
pub fn elf_file_offset(bin: &Path, vaddr: u64) -> u64 {
    let o = Command::new("readelf")
        .args(["-lW"])
        .arg(bin)
        .output()
        .expect("running readelf");
    let text = String::from_utf8_lossy(&o.stdout);
    for l in text.lines().filter(|l| l.trim_start().starts_with("LOAD")) {
        // LOAD Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
        let f: Vec<&str> = l.split_whitespace().collect();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let (off, va, size) = (hex(f[1]), hex(f[2]), hex(f[4]));
        if (va..va + size).contains(&vaddr) {
            return vaddr - va + off;
        }
    }
    panic!("{vaddr:#x} is in no LOAD segment of {}", bin.display());
}

/// A running nats-server v2.15.2 (from the Go module proxy) on loopback, killed when dropped.
pub struct NatsServer {
    pub process: Killed,
    /// Its executable (for uprobes on its functions).
    pub binary: PathBuf,
    /// Its client port and its monitoring port (`/varz`).
    pub port: u16,
    pub http: u16,
}

impl NatsServer {
    /// Builds (once) and starts the server, listening on both ports; None when Go is absent.
    pub fn start() -> Option<NatsServer> {
        let binary = go_third_party(
            "github.com/nats-io/nats-server/v2",
            "v2.15.2",
            "nats-server",
        )?;
        let (port, http) = (free_port(), free_port());
        let process = Killed(
            Command::new(&binary)
                .args(["-a", "127.0.0.1", "-p", &port.to_string()])
                .args(["-m", &http.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("starting nats-server"),
        );
        wait_listening(port);
        wait_listening(http);
        Some(NatsServer {
            process,
            binary,
            port,
            http,
        })
    }
}
