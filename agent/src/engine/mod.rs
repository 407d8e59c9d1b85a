//! The BPF lifecycle, one room per stage: `load` (probe the kernel's features, open,
//! configure, load once), `attach` (programs, targets, phase and allocator probes), `drain`
//! (windows taken from the kernel maps, the ring buffers read), `stats` (exact phase totals,
//! probe hits, what the kernel side dropped), `unwind_maps` (the unwind tables' kernel maps);
//! then detach.
use std::collections::HashMap;
use std::sync::mpsc::Receiver;

use libbpf_rs::{Link, RingBuffer};
use phaseprof_bpf::{limits, types, PhaseprofSkel};
use phaseprof_model::EventKind;

use crate::window::{RawGoAlloc, RawStackSample};
use drain::Counters;

mod attach;
mod count_maps;
mod drain;
mod entry_holds;
pub mod features;
mod hit_calibration;
mod load;
mod mapped;
mod offcpu_carry;
mod offcpu_spread;
mod phase_slices;
mod phase_totals;
pub mod probe_resumes;
mod stacks;
mod stats;
mod syscall_slices;
mod unwind_maps;
mod uprobe_multi;

pub use stats::StackUsage;
pub use unwind_maps::{
    FileRowsInfo, TableMapping, DEFAULT_UNWIND_ROWS, ENTRY_BLOCKS, MAX_UNWIND_BLOCKS,
    MAX_UNWIND_MAPPINGS, UNWIND_COUNTERS,
};

/// How to configure the programs before loading them.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub events: Vec<EventKind>,
    pub freq_hz: u64,
    /// Which syscalls carry a user stack (counts and latency are exact either way).
    pub syscall_stacks: SyscallStacks,
    /// Which switch-outs carry their stacks (off-CPU time is exact either way).
    pub offcpu_stacks: OffcpuStacks,
    /// Make children forked by a target targets too (`record -- CMD`, like `strace -f`).
    pub follow_children: bool,
    /// Report every exec on the host (needed to find processes by name).
    pub notify_exec: bool,
    pub stack_entries: u32,
    pub key_entries: u32,
    /// Phases recorded (ids 1..=phase_ids); above 0, phase probes will be attached and every
    /// event looks up its thread's phases.
    pub phase_ids: u32,
    /// Syscall cost rules counted per phase in the kernel: rule i counts these syscall numbers
    /// (at most MAX_SYSCALL_COSTS rules).
    pub syscall_costs: Vec<Vec<u32>>,
    /// Allocation stacks are sampled once per this many bytes (1: every allocation).
    pub alloc_sample_bytes: u64,
    /// Track sampled allocations until freed (the live heap).
    pub alloc_live: bool,
    /// Bytes of user stack copied per sample for targets switched to stack copies one by one
    /// (`Engine::set_unwind`); 0: every user stack is the kernel's frame-pointer walk.
    pub stack_copy_bytes: u32,
    /// Stop each target at its exec until `Engine::resume` (`record -- CMD` with unwind
    /// tables: the new program's tables go in before it runs).
    pub hold_execs: bool,
    /// Capacity of the unwind tables' rows array (`--unwind dwarf`); 0: no tables.
    pub unwind_rows: u32,
}

/// Which syscalls carry a user stack (`--syscall-stacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyscallStacks {
    None,
    All,
    /// One syscall in N on average per thread; the others are counted under the stacks sampled
    /// in the same process, phase and syscall, in proportion (exact totals, estimated split).
    OneIn(u32),
    /// As `OneIn(DEFAULT_SYSCALL_STACK_EVERY)`, with N raised per thread so that it walks at
    /// most `SAMPLED_STACK_WALKS_PER_SEC` stacks a second (the default).
    #[default]
    Sampled,
}

/// Default syscall stack sampling: a stack walk costs ten to twenty times a syscall's own
/// probes (unwind tables: ~2-4 us), so one in 16 at most...
pub const DEFAULT_SYSCALL_STACK_EVERY: u32 = 16;
/// ...and no more walks than this per thread and second: on redis (~100,000 syscalls a second
/// on its one thread) one in 16 cost 6% of its CPU; at this rate a thread's walks cost ~0.03%.
pub const SAMPLED_STACK_WALKS_PER_SEC: u32 = 100;

impl SyscallStacks {
    /// The programs' `syscall_stack_every`: 0 none, 1 all, N one in N (at least).
    pub fn every(self) -> u32 {
        match self {
            SyscallStacks::None => 0,
            SyscallStacks::All => 1,
            SyscallStacks::OneIn(n) => n.max(1),
            SyscallStacks::Sampled => DEFAULT_SYSCALL_STACK_EVERY,
        }
    }

    /// The programs' `syscall_stack_walks_per_sec`: with `sampled`, a thread's N grows so
    /// that it walks no more stacks a second than this; 0: N stays.
    pub fn walks_per_sec(self) -> u32 {
        match self {
            SyscallStacks::Sampled => SAMPLED_STACK_WALKS_PER_SEC,
            _ => 0,
        }
    }
}

impl std::str::FromStr for SyscallStacks {
    type Err = String;
    /// `sampled` (one in DEFAULT_SYSCALL_STACK_EVERY), `all`, `none`, `1/N` or `N` (one in N);
    /// `true` and `false` as before sampling existed.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sampled" => Ok(SyscallStacks::default()),
            "all" | "true" => Ok(SyscallStacks::All),
            "none" | "false" => Ok(SyscallStacks::None),
            _ => {
                let n = s.strip_prefix("1/").unwrap_or(s);
                match n.parse::<u32>() {
                    Ok(1) => Ok(SyscallStacks::All),
                    Ok(n) if (2..=1_000_000).contains(&n) => Ok(SyscallStacks::OneIn(n)),
                    _ => Err(format!(
                        "`{s}`: use sampled, all, none, or 1/N for one syscall stack in N \
                         (N up to 1000000)"
                    )),
                }
            }
        }
    }
}

/// Which switch-outs carry their stacks (`--offcpu-stacks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OffcpuStacks {
    All,
    /// Every one while a thread switches out fewer than `SAMPLED_STACK_WALKS_PER_SEC` times a
    /// second, else one in N (its N grown or halved every 100 ms to hold that rate); the
    /// time of the others goes to the stacks sampled for the same thread and phase at the
    /// drain, by weight (`offcpu_spread`). The default: the walks were 3.2 of the 3.9 us the
    /// switch program took on `perf bench sched pipe -T`, +177% of its CPU.
    #[default]
    Sampled,
}

impl OffcpuStacks {
    /// The programs' `offcpu_stack_walks_per_sec` (0: every switch-out's stack).
    pub fn walks_per_sec(self) -> u32 {
        match self {
            OffcpuStacks::All => 0,
            OffcpuStacks::Sampled => SAMPLED_STACK_WALKS_PER_SEC,
        }
    }
}

impl std::str::FromStr for OffcpuStacks {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sampled" => Ok(OffcpuStacks::Sampled),
            "all" => Ok(OffcpuStacks::All),
            _ => Err(format!("`{s}`: use sampled or all")),
        }
    }
}

/// Defaults of the recording options: the CLI flags take theirs from here, and a test
/// (`cli::engine_args`) checks that agent.toml's and `EngineConfig::default()` agree with them.
pub const DEFAULT_FREQ_HZ: u64 = 99;
/// Distinct stacks the kernel side holds (preallocated, ~1 KiB each).
pub const DEFAULT_STACK_ENTRIES: u32 = 16384;
/// Allocation stacks are sampled once per this many bytes (jemalloc's heap profiler's period).
pub const DEFAULT_ALLOC_SAMPLE_BYTES: u64 = 512 * 1024;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            events: vec![EventKind::Cpu, EventKind::Offcpu, EventKind::Syscall],
            freq_hz: DEFAULT_FREQ_HZ,
            syscall_stacks: SyscallStacks::default(),
            offcpu_stacks: OffcpuStacks::default(),
            follow_children: false,
            notify_exec: false,
            stack_entries: DEFAULT_STACK_ENTRIES,
            key_entries: 65536,
            phase_ids: 0,
            syscall_costs: Vec::new(),
            alloc_sample_bytes: DEFAULT_ALLOC_SAMPLE_BYTES,
            alloc_live: true,
            stack_copy_bytes: DEFAULT_STACK_COPY,
            unwind_rows: DEFAULT_UNWIND_ROWS,
            hold_execs: false,
        }
    }
}

/// A process event from the kernel (decoded `struct target_event`).
#[derive(Clone, Debug, PartialEq)]
pub enum TargetEvent {
    Exec {
        pid: u32,
        comm: String,
        /// Stopped at the exec (`record -- CMD` holds): continue it with `Engine::resume`.
        stopped: bool,
    },
    /// A target process exited: its CPU time (ns) and read and write syscalls, as the kernel
    /// counted them at its last thread's exit (its parent may reap it before /proc is read).
    Exit {
        pid: u32,
        cpu_ns: u64,
        io_syscalls: u64,
    },
    Fork {
        pid: u32,
        parent: u32,
    },
    MapsChanged {
        pid: u32,
    },
    /// A held command reached its entry point (see `Engine::hold_at_entry`): stopped there
    /// (`block` None), or running on with an entry block the kernel filled (its slot).
    Entry {
        pid: u32,
        block: Option<u32>,
    },
    /// A target's thread exited, named as it was then.
    ThreadExit {
        tid: u32,
        comm: String,
    },
}

/// What a drain takes: one window while attached (the parity flips, programs still write), or
/// everything left once the programs are detached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drain {
    Window,
    Final,
}

pub struct Engine<'obj> {
    skel: PhaseprofSkel<'obj>,
    links: Vec<Link>,
    /// Entry-point holds of commands (see `entry_holds.rs`).
    entry_holds: entry_holds::EntryHolds,
    /// Allocator probes, by target: detached and re-attached when duty-cycling.
    alloc_links: HashMap<u32, Vec<Link>>,
    /// Phase probes: detached and re-attached under a phase budget.
    phase_links: phase_slices::PhaseLinks,
    /// raw_tp sys_enter/sys_exit: detached and re-attached under a syscall budget.
    syscall_links: syscall_slices::SyscallLinks,
    ring: RingBuffer<'static>,
    events: Receiver<TargetEvent>,
    /// Go samples with the hash of their stack, which the drain resolves.
    go_allocs: Receiver<(u64, RawGoAlloc)>,
    /// Stack copies with the hash of their kernel stack, which `take_stack_samples` resolves.
    stack_samples: Receiver<(u64, RawStackSample)>,
    stacks: stacks::StackCache,
    /// Entries left in the kernel's stack maps after the last prune.
    stack_map_entries: usize,
    cpu_counts: Counters,
    offcpu_counts: Counters,
    /// The stacks each thread and phase was last shown with, for windows that sampled none.
    offcpu_carry: offcpu_carry::OffcpuCarry,
    syscall_counts: Counters,
    alloc_totals: Counters,
    alloc_stacks: Counters,
    pagefault_counts: Counters,
    /// The counts maps of `count_maps::COUNT_MAPS`, by name.
    count_maps: count_maps::CountMapCounters,
    /// The unwind tables' rows, mapped (None: no tables).
    rows: Option<mapped::MappedArray>,
    /// The targets' blocks of mappings into them, mapped (None: no tables).
    unwind_mappings: Option<mapped::MappedArray>,
    /// The targets bitmap (`target_bits`), mapped.
    target_bits: mapped::MappedArray,
    /// CLOCK_MONOTONIC (the clock of bpf_ktime_get_ns) when the probes were detached.
    detached_at_ns: Option<u64>,
    /// Inlined copies of phase functions that could not be probed (their calls go unseen).
    inlined_unprobed: u64,
    /// Where the targets' entry probes resume (cpu samples there are the probes').
    pub probe_resumes: probe_resumes::ProbeResumes,
    /// Phases recorded: the drains take the kernel's per-phase totals.
    phases: bool,
    /// The per-phase totals the drains took, per window and in all.
    phase_totals: phase_totals::PhaseTotals,
    /// NS_SWITCH_TO_TARGET and NS_SAMPLE_ON_TARGET as of the last `take_timed_ns`.
    timed_ns_taken: stats::TimedProbeNs,
    /// What this kernel's BPF can do, and so which programs were loaded.
    pub features: features::KernelFeatures,
    pub cpus: usize,
}

impl Engine<'_> {
    /// The object's `.bss`: the globals the programs read (window parity, stop flag, allocator
    /// pause and generation). Write them with `write_volatile`: programs read them concurrently.
    fn bss(&mut self) -> &mut types::bss {
        self.skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("BPF object has a .bss")
    }
}

/// Default user-stack copy per sample: enough for the deepest stacks of the workloads we know
/// (a frame-pointer-less Rust thread rarely uses more than a few KiB between leaf and entry).
pub const DEFAULT_STACK_COPY: u32 = 16 << 10;

/// Largest copy the programs can carry.
pub const MAX_STACK_COPY: u32 = limits::MAX_STACK_COPY as u32;

/// Syscall cost rules the kernel counts per phase.
pub const MAX_SYSCALL_COSTS: usize = limits::MAX_SYSCALL_COSTS as usize;

/// Buckets of the kernel's wall-time histogram.
const WALL_BUCKETS: usize = limits::WALL_BUCKETS as usize;

/// The BPF program a uprobe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Uprobe {
    /// A phase function's entry, and its exit (a uretprobe).
    PhaseEnter,
    PhaseExit,
    /// The first instruction after an inlined copy of a phase function (its caller's next).
    PhaseLeave,
    /// A Go phase function's entry, and each of its return instructions (per goroutine), and
    /// the first instruction after an inlined copy.
    GoPhaseEnter,
    GoPhaseReturn,
    GoPhaseLeave,
    /// A switch point of Go's scheduler (the cookie says which).
    GoSched,
    /// An allocator's entry and its exit (a uretprobe), `free`, Go's allocation sampler.
    AllocEnter,
    AllocExit,
    Free,
    GoAllocSample,
}

impl Uprobe {
    fn retprobe(self) -> bool {
        matches!(self, Uprobe::PhaseExit | Uprobe::AllocExit)
    }
}

/// One uprobe to attach: the program, at a file offset of an object, with a cookie the program
/// reads (a phase id, a scheduler point, an allocator kind). `what` names it in errors.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSpec {
    pub program: Uprobe,
    pub path: std::path::PathBuf,
    pub offset: u64,
    pub cookie: u64,
    pub what: String,
}

/// Reads a plain-old-data record of the shared header from map bytes.
fn pod<T: Copy>(bytes: &[u8]) -> T {
    assert_eq!(
        bytes.len(),
        std::mem::size_of::<T>(),
        "map record size differs from the header"
    );
    // SAFETY: the size matches and T is a `#[repr(C)]` integer-only record generated from the
    // BPF object's BTF, for which every bit pattern is valid; read_unaligned needs no alignment.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) }
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec for clock_gettime to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
