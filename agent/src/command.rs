//! The command `record -- CMD` starts: forked and held before its execve until every probe is in
//! place, then stopped the way `timeout` and `perf record` stop theirs — a signal forwarded
//! (a terminal's Ctrl-C reached it already), SIGKILL after a grace period, a second Ctrl-C at
//! once — and its exit status returned as phaseprof's own, so no command outlives its recording
//! unsaid and scripts see the command's status.
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::signals::{signal_name, Interrupt};

/// How long a command may take to exit after the signal that asks it to, before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A child forked for `record -- CMD` and held before its execve until every probe is attached.
pub struct HeldChild {
    pub pid: u32,
    release_fd: i32,
}

impl HeldChild {
    /// Forks a child that waits on a pipe, then execs `argv` (argv[0] already resolved).
    pub fn spawn(path: &Path, argv: &[String]) -> Result<HeldChild> {
        let c_path =
            CString::new(path.as_os_str().as_bytes()).context("command path contains NUL")?;
        let c_args: Vec<CString> = argv
            .iter()
            .map(|a| CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .context("command argument contains NUL")?;
        let mut c_argv: Vec<*const libc::c_char> = c_args.iter().map(|a| a.as_ptr()).collect();
        c_argv.push(std::ptr::null());
        let ignored = crate::signals::ignored_on_entry();
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: fork in a multithreaded process; the child only calls async-signal-safe
        // functions (read, close, execv, _exit) on memory prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: child side, see above; all pointers stay valid (copied address space).
            unsafe {
                libc::close(fds[1]);
                let mut b = 0u8;
                let n = libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
                if n != 1 {
                    libc::_exit(126); // phaseprof went away before releasing us
                }
                libc::close(fds[0]);
                // Ignored signals survive exec; start the command with the defaults a shell
                // would give it (Rust ignores SIGPIPE), as std's Command does, and with what
                // phaseprof's own caller ignored ignored again (our handlers replaced that).
                libc::signal(libc::SIGPIPE, libc::SIG_DFL);
                for &sig in &ignored {
                    libc::signal(sig, libc::SIG_IGN);
                }
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                libc::execv(c_path.as_ptr(), c_argv.as_ptr());
                libc::_exit(127);
            }
        }
        // SAFETY: closing our copy of the read end, which we own.
        unsafe { libc::close(fds[0]) };
        Ok(HeldChild {
            pid: pid as u32,
            release_fd: fds[1],
        })
    }

    /// Lets the child exec.
    pub fn release(self) -> Result<()> {
        let b = 1u8;
        // SAFETY: release_fd is the pipe's write end, owned by us; one byte from a valid buffer.
        let n = unsafe { libc::write(self.release_fd, (&b as *const u8).cast(), 1) };
        // SAFETY: closing the fd we own, once.
        unsafe { libc::close(self.release_fd) };
        if n != 1 {
            bail!(
                "could not release the command: {}",
                std::io::Error::last_os_error()
            );
        }
        Ok(())
    }
}

/// A process that outlives phaseprof to continue what it holds. A command (and each program
/// it execs, when its tables are built first) is held stopped (SIGSTOP from BPF) until
/// phaseprof continues it; killed outright (SIGKILL, OOM), phaseprof would leave it stopped
/// forever. The watchdog waits on a pipe only phaseprof writes: at EOF without a word (phaseprof
/// is gone; its probes go with its descriptors) it sends SIGCONT to the command and to
/// phaseprof's process group, which the command and what it starts share, a few times over a
/// second while the kernel retires the probes. A normal end says `stand_down` first.
pub struct HoldWatchdog {
    fd: i32,
}

/// When the watchdog continues the held processes after phaseprof is gone (ms after EOF).
const WATCHDOG_ROUNDS_MS: [u32; 5] = [0, 50, 200, 500, 1000];

impl HoldWatchdog {
    pub fn start(command: u32) -> Result<HoldWatchdog> {
        let mut fds = [0i32; 2];
        // SAFETY: fds is a valid array of two ints for pipe2 to fill.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            bail!("pipe2: {}", std::io::Error::last_os_error());
        }
        // SAFETY: getpgrp cannot fail.
        let group = unsafe { libc::getpgrp() };
        // SAFETY: fork in a multithreaded process; the children call only async-signal-safe
        // functions (fork, setsid, signal, read, kill, nanosleep, _exit) on values prepared
        // before. The middle child exits at once, so the watchdog is nobody's to wait for.
        let middle = unsafe { libc::fork() };
        if middle < 0 {
            bail!("fork: {}", std::io::Error::last_os_error());
        }
        if middle == 0 {
            // SAFETY: see above.
            unsafe {
                if libc::fork() == 0 {
                    watch(fds, command as i32, group);
                }
                libc::_exit(0);
            }
        }
        // SAFETY: reaping our own child; closing our copy of the read end.
        unsafe {
            libc::waitpid(middle, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
        }
        Ok(HoldWatchdog { fd: fds[1] })
    }

    /// phaseprof ends normally (every hold released): the watchdog leaves without a signal.
    pub fn stand_down(self) {
        let b = 0u8;
        // SAFETY: one byte to the pipe we own, then closing it once.
        unsafe {
            libc::write(self.fd, (&b as *const u8).cast(), 1);
            libc::close(self.fd);
        }
    }
}

/// The watchdog's body (a forked child: async-signal-safe calls only).
fn watch(fds: [i32; 2], command: i32, group: i32) -> ! {
    // SAFETY: a forked child's own descriptors and signals; pointers to its own locals.
    unsafe {
        // Nothing of phaseprof's may live on in here: its BPF links and perf events must close
        // when it dies, and a pipe it writes must see its end.
        let keep = fds[0] as u32;
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32);
        }
        if libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32) != 0 {
            // Before 5.9: one by one, up to the open-file limit.
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
            for fd in 0..lim.rlim_cur.min(1 << 20) as i32 {
                if fd != fds[0] {
                    libc::close(fd);
                }
            }
        }
        // A terminal's Ctrl-C reaches the whole foreground group: it must not end the watchdog.
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGTSTP,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut b = 0u8;
        let n = loop {
            let n = libc::read(fds[0], (&mut b as *mut u8).cast(), 1);
            if !(n < 0 && *libc::__errno_location() == libc::EINTR) {
                break n;
            }
        };
        if n != 1 {
            let mut slept = 0;
            for at in WATCHDOG_ROUNDS_MS {
                let wait = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: ((at - slept) as i64) * 1_000_000,
                };
                libc::nanosleep(&wait, std::ptr::null_mut());
                slept = at;
                libc::kill(command, libc::SIGCONT);
                libc::kill(-group, libc::SIGCONT);
            }
        }
        libc::_exit(0)
    }
}

/// Exit status as a shell reports it: the code, or 128 + the signal that killed it.
pub fn exit_status(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        -1
    }
}

/// The running command, and what phaseprof did to end it.
pub struct CommandChild {
    pub pid: u32,
    status: Option<i32>,
    /// The signal sent (or seen sent by the terminal), why, and when.
    asked: Option<(i32, String, Instant)>,
    killed: bool,
}

impl CommandChild {
    pub fn new(pid: u32) -> CommandChild {
        CommandChild {
            pid,
            status: None,
            asked: None,
            killed: false,
        }
    }

    /// Its exit status once it has ended (reaped here, without blocking).
    pub fn exited(&mut self) -> Option<i32> {
        if self.status.is_none() {
            let mut raw = 0;
            // SAFETY: waitpid on our own child with a valid status pointer.
            let r = unsafe { libc::waitpid(self.pid as i32, &mut raw, libc::WNOHANG) };
            if r == self.pid as i32 {
                self.status = Some(exit_status(raw));
            } else if r < 0 {
                self.status = Some(-1);
            }
        }
        self.status
    }

    /// Signals the command and the processes it started, as a terminal's Ctrl-C reaches a
    /// whole job: a shell's children are not left running when the shell goes.
    fn send(&self, sig: i32) {
        // Our child is not reaped yet, so its pid is still ours; its descendants are scanned now.
        for pid in crate::targets::process_tree(self.pid) {
            // SAFETY: kill with a valid signal.
            unsafe { libc::kill(pid as i32, sig) };
        }
    }

    /// phaseprof was interrupted: the command is asked to stop too. A terminal's signal reached
    /// it already (same foreground group) and is not sent twice; a second interrupt kills it.
    pub fn interrupted(&mut self, i: Interrupt) {
        if self.asked.is_some() {
            if i.count >= 2 && !self.killed {
                self.kill("a second interrupt");
            }
            return;
        }
        if !i.from_terminal {
            self.send(i.signal);
        }
        let how = if i.from_terminal {
            format!("{} (which reached it too)", i.describe())
        } else {
            format!("{}, forwarded to it", i.describe())
        };
        self.asked = Some((i.signal, how, Instant::now()));
    }

    /// `--duration` ended: SIGTERM, as `timeout` sends.
    pub fn duration_ended(&mut self) {
        if self.asked.is_none() {
            self.send(libc::SIGTERM);
            self.asked = Some((
                libc::SIGTERM,
                "SIGTERM at the end of --duration".into(),
                Instant::now(),
            ));
        }
    }

    /// SIGKILL once the command has had `grace` to honour the signal it was sent.
    pub fn kill_if_overdue(&mut self, grace: Duration) {
        if let Some((sig, _, at)) = &self.asked {
            if !self.killed && at.elapsed() >= grace {
                let why = format!(
                    "no exit {:.0} s after {}",
                    grace.as_secs_f64(),
                    signal_name(*sig)
                );
                self.kill(&why);
            }
        }
    }

    fn kill(&mut self, why: &str) {
        self.send(libc::SIGKILL);
        self.killed = true;
        let what = self
            .asked
            .take()
            .map(|(s, how, at)| (s, format!("{how}; then SIGKILL: {why}"), at));
        self.asked =
            what.or_else(|| Some((libc::SIGKILL, format!("SIGKILL: {why}"), Instant::now())));
    }

    /// What ended it: `exited with status 3`, `exited with status 130 after SIGINT from the
    /// terminal (which reached it too)`.
    pub fn fate(&self) -> String {
        let status = match self.status {
            Some(s) if s > 128 => format!("status {s} ({})", signal_name(s - 128)),
            Some(s) => format!("status {s}"),
            None => "no status".into(),
        };
        match &self.asked {
            Some((_, how, _)) => format!(
                "the command (pid {}) exited with {status} after {how}",
                self.pid
            ),
            None => format!("the command (pid {}) exited with {status}", self.pid),
        }
    }
}
