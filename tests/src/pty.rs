//! A program run on a pseudo-terminal as its controlling terminal, as a user's shell runs it:
//! what a test types (Ctrl-C is byte 0x03) reaches its whole foreground process group as the
//! terminal's signals do.
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default dispositions for the signals a terminal sends, as a login shell on a terminal has
/// them (a test harness started in the background may run with SIGINT ignored, and ignoring is
/// inherited through exec). Async-signal-safe: for `pre_exec`.
pub fn default_signals() {
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: resetting a disposition to its default.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

pub struct Pty {
    pub child: Child,
    master: std::fs::File,
    output: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Pty {
    /// Starts `program args` in a new session whose controlling terminal is a fresh pty.
    pub fn spawn(program: &std::path::Path, args: &[&str]) -> Pty {
        let (mut master, mut slave) = (0, 0);
        // SAFETY: openpty fills two fds; no name, termios or window size asked for.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both fds were just opened and are owned here.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                OwnedFd::from_raw_fd(slave),
            )
        };
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup of the pty"));
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(io(&slave))
            .stdout(io(&slave))
            .stderr(io(&slave));
        // SAFETY: setsid and ioctl are async-signal-safe; run in the child before exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                default_signals();
                Ok(())
            });
        }
        let child = cmd.spawn().expect("starting a program on a pty");
        drop(slave);
        let output = Arc::new(Mutex::new(String::new()));
        let (mut reader, sink) = (
            master.try_clone().expect("dup of the master"),
            output.clone(),
        );
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once every slave fd is closed: the program and its children are gone.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Pty {
            child,
            master,
            output,
            reader: Some(reader),
        }
    }

    /// Everything the program printed so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Waits (at most `limit`) until the output contains `text`.
    pub fn wait_for(&self, text: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.output().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no `{text}` within {limit:?}; output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Types `bytes` at the terminal.
    pub fn type_bytes(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).expect("writing to the pty");
    }

    /// The program's exit code, waiting at most `limit` (then it is killed and the test fails).
    pub fn wait_exit(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self.child.try_wait().expect("waiting for the program") {
                // Its last lines may still be in the pty: read up to the end.
                if let Some(r) = self.reader.take() {
                    r.join().expect("pty reader");
                }
                return st
                    .code()
                    .unwrap_or_else(|| panic!("killed by a signal: {st:?}"));
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("still running after {limit:?}; output:\n{}", self.output());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
