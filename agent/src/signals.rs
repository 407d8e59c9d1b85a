//! Ctrl-C, SIGTERM and SIGHUP as a flag the commands' loops stop at, remembering which signal
//! came and whether the terminal sent it: a terminal's Ctrl-C or hang-up reaches the whole
//! foreground process group (a `record -- CMD` command too), a `kill` reaches phaseprof alone,
//! so only the latter is forwarded to the command.
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::{bail, Result};

static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
static LAST_SIGNAL: AtomicI32 = AtomicI32::new(0);
static FROM_TERMINAL: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU32 = AtomicU32::new(0);
/// Bit `sig` set: the signal was ignored when the handlers were installed.
static IGNORED_ON_ENTRY: AtomicU32 = AtomicU32::new(0);

/// The signals (of those handled here) that were ignored when phaseprof started.
pub fn ignored_on_entry() -> Vec<i32> {
    let bits = IGNORED_ON_ENTRY.load(Ordering::SeqCst);
    [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
        .into_iter()
        .filter(|s| bits & (1 << s) != 0)
        .collect()
}

/// The last interrupting signal, and how many came.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interrupt {
    pub signal: i32,
    /// Sent by the kernel for the terminal (Ctrl-C, hang-up) to the whole foreground group.
    pub from_terminal: bool,
    pub count: u32,
}

impl Interrupt {
    /// `SIGINT from the terminal`, `SIGTERM from a process`.
    pub fn describe(&self) -> String {
        let from = if self.from_terminal {
            "the terminal"
        } else {
            "a process"
        };
        format!("{} from {from}", signal_name(self.signal))
    }
}

pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        n => format!("signal {n}"),
    }
}

extern "C" fn on_signal(sig: i32, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Async-signal-safe: atomics only (the flag is initialized before the handler exists).
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let code = unsafe { (*info).si_code };
    FROM_TERMINAL.store(code == libc::SI_KERNEL, Ordering::SeqCst);
    LAST_SIGNAL.store(sig, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Installs the handlers (once per process) and returns the flag they raise. SIGINT and SIGTERM
/// always stop phaseprof (as perf's do); a SIGHUP ignored when it started (`nohup`) stays
/// ignored. Whatever was ignored on entry is ignored again in the command `record -- CMD` starts
/// (`ignored_on_entry`), so it runs as it would have without phaseprof (as under strace).
pub fn on_interrupt() -> Result<Arc<AtomicBool>> {
    let flag = FLAG
        .get_or_init(|| Arc::new(AtomicBool::new(false)))
        .clone();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction filled with a handler of the SA_SIGINFO signature; the
        // query (a null new action) only reads the current one.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut current);
            if current.sa_sigaction == libc::SIG_IGN {
                IGNORED_ON_ENTRY.fetch_or(1 << sig, Ordering::SeqCst);
                if sig == libc::SIGHUP {
                    continue;
                }
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                bail!(
                    "installing the {} handler: {}",
                    signal_name(sig),
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    Ok(flag)
}

/// The interrupt so far, if any came.
pub fn last() -> Option<Interrupt> {
    let count = COUNT.load(Ordering::SeqCst);
    (count > 0).then(|| Interrupt {
        signal: LAST_SIGNAL.load(Ordering::SeqCst),
        from_terminal: FROM_TERMINAL.load(Ordering::SeqCst),
        count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a signal sent with kill(2) raises the flag and is known as a process's.
    #[test]
    fn a_killed_signal_raises_the_flag() {
        let flag = on_interrupt().unwrap();
        // SAFETY: signalling ourselves; the handler above is installed.
        unsafe { libc::kill(libc::getpid(), libc::SIGHUP) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !flag.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let got = last().expect("an interrupt");
        assert_eq!(got.signal, libc::SIGHUP);
        assert!(!got.from_terminal);
        assert_eq!(got.describe(), "SIGHUP from a process");
    }
}
