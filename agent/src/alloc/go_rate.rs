//! Go's heap-profile sampling rate in a running target. A Go program that never reads its memory
//! profile is linked with sampling disabled (the runtime zeroes `runtime.MemProfileRate` at
//! start), so its allocation hook never fires. For the recording, phaseprof sets the rate to
//! Go's default through /proc/PID/mem and puts the old value back at the end.
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// Go's default `runtime.MemProfileRate`.
pub const GO_DEFAULT_RATE: i64 = 512 * 1024;

/// One Go target whose rate phaseprof may have changed.
///
/// `/proc/PID/mem` is opened for each read and write, so it follows the target across its
/// `execve` (a `-- CMD` target is found before it execs). After each open, the process's start
/// time is compared with the one seen when the target was found: a descriptor opened on a pid
/// that was reused by another program is never read or written, and one opened before the
/// target exits stays bound to its memory (writes then fail).
#[derive(Debug)]
pub struct GoRate {
    pub pid: u32,
    pub addr: u64,
    /// Clock ticks after boot at which the target started (`/proc/PID/stat`, field 22).
    started: u64,
    /// The target's own value, once phaseprof replaced it.
    pub replaced: Option<i64>,
}

/// When `pid` started, in clock ticks after boot.
fn start_time(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace()
        .nth(22 - 3)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("/proc/{pid}/stat: no start time")))
}

impl GoRate {
    pub fn open(pid: u32, addr: u64) -> std::io::Result<Self> {
        Ok(GoRate {
            pid,
            addr,
            started: start_time(pid)?,
            replaced: None,
        })
    }

    /// The target's memory, if the pid still names the process found.
    fn mem(&self) -> std::io::Result<std::fs::File> {
        let mem = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{}/mem", self.pid))?;
        if start_time(self.pid)? != self.started {
            return Err(std::io::Error::other(format!(
                "pid {} is another process now",
                self.pid
            )));
        }
        Ok(mem)
    }

    pub fn read(&self) -> Option<i64> {
        let mut buf = [0u8; 8];
        self.mem().ok()?.read_exact_at(&mut buf, self.addr).ok()?;
        Some(i64::from_ne_bytes(buf))
    }

    fn write(&self, rate: i64) -> std::io::Result<()> {
        self.mem()?.write_all_at(&rate.to_ne_bytes(), self.addr)
    }

    /// Turns sampling on if the target has it off (also after the runtime's start zeroed it).
    pub fn ensure_sampling(&mut self) {
        if self.read() == Some(0) && self.write(GO_DEFAULT_RATE).is_ok() {
            if self.replaced.is_none() {
                eprintln!(
                    "phaseprof: pid {}: Go heap sampling is off in this program (it never reads its memory profile); \
                     sampling at Go's default {} KiB for this recording, restored at the end",
                    self.pid,
                    GO_DEFAULT_RATE / 1024
                );
            }
            self.replaced = Some(0);
        }
    }

    /// Puts the target's own value back, if phaseprof changed it and the target still runs.
    pub fn restore(&mut self) {
        if let Some(old) = self.replaced.take() {
            let _ = self.write(old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the rate word is reached only while the pid names the process found: read
    // while the child lives (also after it execs), refused once it has exited, and refused
    // when the recorded start time is another process's (a reused pid).
    #[test]
    fn writes_never_reach_a_process_that_reused_the_pid() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "exec sleep 30"])
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut g = GoRate::open(pid, 0).unwrap();
        // Past the exec, then any mapped address of the child: its first code mapping's start.
        std::thread::sleep(std::time::Duration::from_millis(100));
        g.addr = crate::procmaps::read_vmas(pid).unwrap()[0].start;
        assert!(
            g.read().is_some(),
            "readable while the child lives, after its exec"
        );
        let other = GoRate {
            started: g.started + 1,
            ..GoRate::open(pid, g.addr).unwrap()
        };
        assert!(
            other.read().is_none() && other.write(1).is_err(),
            "another process's start"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(g.read().is_none());
        assert!(g.write(1).is_err());
    }
}
