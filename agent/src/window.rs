//! What one drain of the kernel maps yields: raw keys with stack addresses, not yet symbolized.
//!
//! This is the seam between recording and processing: the BPF engine produces [`RawWindow`]s,
//! the aggregator consumes them, and tests can build them by hand without root.

/// User or kernel return addresses, leaf first (index 0 is the sampled instruction pointer).
pub type Addrs = Vec<u64>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawWindow {
    pub cpu: Vec<RawCpu>,
    pub offcpu: Vec<RawOffCpu>,
    pub syscalls: Vec<RawSyscall>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawCpu {
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub kernel: Option<Addrs>,
    pub count: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawOffCpu {
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub kernel: Option<Addrs>,
    pub ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawSyscall {
    pub pid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub nr: u32,
    pub user: Option<Addrs>,
    pub count: u64,
    pub total_ns: u64,
}

impl RawWindow {
    pub fn is_empty(&self) -> bool {
        self.cpu.is_empty() && self.offcpu.is_empty() && self.syscalls.is_empty()
    }
}
