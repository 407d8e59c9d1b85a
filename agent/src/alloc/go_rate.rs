//! Go's heap-profile sampling rate in a running target. A Go program that never reads its memory
//! profile is linked with sampling disabled (the runtime zeroes `runtime.MemProfileRate` at
//! start), so its allocation hook never fires. For the recording, phaseprof sets the rate to
//! Go's default through /proc/PID/mem and puts the old value back at the end.
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

/// Go's default `runtime.MemProfileRate`.
pub const GO_DEFAULT_RATE: i64 = 512 * 1024;

fn mem(pid: u32, write: bool) -> std::io::Result<std::fs::File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .open(format!("/proc/{pid}/mem"))
}

pub fn read(pid: u32, addr: u64) -> Option<i64> {
    let mut buf = [0u8; 8];
    mem(pid, false).ok()?.read_exact_at(&mut buf, addr).ok()?;
    Some(i64::from_ne_bytes(buf))
}

pub fn write(pid: u32, addr: u64, rate: i64) -> std::io::Result<()> {
    mem(pid, true)?.write_all_at(&rate.to_ne_bytes(), addr)
}

/// One Go target whose rate phaseprof may have changed.
#[derive(Clone, Debug)]
pub struct GoRate {
    pub pid: u32,
    pub addr: u64,
    /// The target's own value, once phaseprof replaced it.
    pub replaced: Option<i64>,
}

impl GoRate {
    /// Turns sampling on if the target has it off (also after the runtime's start zeroed it).
    pub fn ensure_sampling(&mut self) {
        if read(self.pid, self.addr) == Some(0)
            && write(self.pid, self.addr, GO_DEFAULT_RATE).is_ok()
        {
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
            let _ = write(self.pid, self.addr, old);
        }
    }
}
