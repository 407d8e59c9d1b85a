//! The BPF lifecycle: open → configure → load (with a load probe for the sched_switch flavour)
//! → attach; then windows drained from the kernel maps; then detach.
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::IntoRawFd;
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};
use phaseprof_bpf::types;
use phaseprof_bpf::{OpenPhaseprofSkel, PhaseprofSkel, PhaseprofSkelBuilder};
use phaseprof_model::{EventKind, Lost, PhaseStats};

use crate::perf_events::{online_cpus, open_cpu_clock, open_page_faults};
use crate::window::{
    RawAlloc, RawAllocTotal, RawCpu, RawGoAlloc, RawLive, RawOffCpu, RawStackSample, RawSyscall,
    RawWindow,
};

/// How to configure the programs before loading them.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub events: Vec<EventKind>,
    pub freq_hz: u64,
    pub syscall_stacks: bool,
    /// Make children forked by a target targets too (`record -- CMD`, like `strace -f`).
    pub follow_children: bool,
    /// Report every exec on the host (needed to find processes by name).
    pub notify_exec: bool,
    pub stack_entries: u32,
    pub key_entries: u32,
    /// Phase probes will be attached: every event looks up its thread's phases.
    pub phases_enabled: bool,
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
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            events: vec![EventKind::Cpu, EventKind::Offcpu, EventKind::Syscall],
            freq_hz: 99,
            syscall_stacks: true,
            follow_children: false,
            notify_exec: false,
            stack_entries: 16384,
            key_entries: 65536,
            phases_enabled: false,
            syscall_costs: Vec::new(),
            alloc_sample_bytes: 512 * 1024,
            alloc_live: true,
            stack_copy_bytes: DEFAULT_STACK_COPY,
        }
    }
}

/// A process event from the kernel (decoded `struct target_event`).
#[derive(Clone, Debug, PartialEq)]
pub enum TargetEvent {
    Exec { pid: u32, comm: String },
    Exit { pid: u32 },
    Fork { pid: u32, parent: u32 },
    MapsChanged { pid: u32 },
}

/// Which sched_switch program the load probe picked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SwitchFlavour {
    TpBtf,
    RawTp,
}

pub struct Engine<'obj> {
    skel: PhaseprofSkel<'obj>,
    links: Vec<Link>,
    /// Allocator probes, by target: detached and re-attached when duty-cycling.
    alloc_links: HashMap<u32, Vec<Link>>,
    ring: RingBuffer<'static>,
    events: Receiver<TargetEvent>,
    /// Go samples with the hash of their stack, which the drain resolves.
    go_allocs: Receiver<(u64, RawGoAlloc)>,
    /// Stack copies with the hash of their kernel stack, which `take_stack_samples` resolves.
    stack_samples: Receiver<(u64, RawStackSample)>,
    stack_cache: HashMap<u64, Vec<u64>>,
    cpu_counts: Counters,
    offcpu_counts: Counters,
    syscall_counts: Counters,
    alloc_totals: Counters,
    alloc_stacks: Counters,
    pagefault_counts: Counters,
    /// CLOCK_MONOTONIC (the clock of bpf_ktime_get_ns) when the probes were detached.
    detached_at_ns: Option<u64>,
    pub flavour: SwitchFlavour,
    pub cpus: usize,
}

/// Default user-stack copy per sample: enough for the deepest stacks of the workloads we know
/// (a frame-pointer-less Rust thread rarely uses more than a few KiB between leaf and entry).
pub const DEFAULT_STACK_COPY: u32 = 16 << 10;
/// Largest copy the programs can carry (MAX_STACK_COPY in the shared header).
pub const MAX_STACK_COPY: u32 = 64 << 10;
/// Bytes around a stack copy in its ring record: struct stack_sample, the copy's slack
/// (STACK_COPY_SLACK), and the ring buffer's own header.
const STACK_RECORD_OVERHEAD: u64 = std::mem::size_of::<types::stack_sample>() as u64 + 2 * 512 + 8;

/// The stack-copy ring's size: a full second of samples of every CPU at the sampling rate
/// (user space reads it every 20 ms; a second covers a slow symbolization pass), four times that
/// when page faults send copies too (their rate is the target's), a power of two as the kernel
/// wants it.
fn stack_ring_bytes(cfg: &EngineConfig, cpus: usize) -> u32 {
    if cfg.stack_copy_bytes == 0 {
        return 4096;
    }
    let record = cfg.stack_copy_bytes as u64 + STACK_RECORD_OVERHEAD;
    let mut second = record * cfg.freq_hz * cpus.max(1) as u64;
    if cfg.events.contains(&EventKind::Pagefault) {
        second *= 4;
    }
    second.clamp(256 << 10, 256 << 20).next_power_of_two() as u32
}

/// Puts back into a stack copy (taken from `sp` up) the return addresses that pending
/// uretprobes replaced with their trampoline's: `slots[i]` held `addrs[i]` (slot 0: none).
fn restore_return_addresses(stack: &mut [u8], sp: u64, slots: &[u64], addrs: &[u64]) {
    for (&slot, &addr) in slots.iter().zip(addrs) {
        let Some(off) = slot.checked_sub(sp) else {
            continue;
        };
        let off = off as usize;
        if slot != 0 && off + 8 <= stack.len() {
            stack[off..off + 8].copy_from_slice(&addr.to_ne_bytes());
        }
    }
}

/// The BPF program a uprobe runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Uprobe {
    /// A phase function's entry, and its exit (a uretprobe).
    PhaseEnter,
    PhaseExit,
    /// A Go phase function's entry, and each of its return instructions (per goroutine).
    GoPhaseEnter,
    GoPhaseReturn,
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

/// Syscall cost rules the kernel counts per phase (MAX_SYSCALL_COSTS in the shared header).
pub const MAX_SYSCALL_COSTS: usize = 8;
/// Buckets of the kernel's wall-time histogram (WALL_BUCKETS in the shared header).
const WALL_BUCKETS: usize = 1024;

/// Reads the records of ring buffer `map`: each starts with a `T` of the shared header (the rest
/// is its payload); `decode` turns it into what the returned channel carries. Shorter records
/// are skipped.
fn ring_records<'slf, T: Copy, X: Send + 'static>(
    builder: &mut RingBufferBuilder<'slf, 'static>,
    map: &'slf dyn MapCore,
    decode: impl Fn(T, &[u8]) -> X + 'static,
) -> Result<Receiver<X>> {
    let (tx, rx) = channel();
    builder.add(map, move |data: &[u8]| {
        let n = std::mem::size_of::<T>();
        if data.len() >= n {
            let _ = tx.send(decode(pod(&data[..n]), &data[n..]));
        }
        0
    })?;
    Ok(rx)
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

/// A stack captured at a return probe starts with the return address: moved back into the call
/// instruction, its leaf symbolizes to the call (with its inlined callers), not to what follows.
fn into_call(mut stack: Vec<u64>) -> Vec<u64> {
    if let Some(leaf) = stack.first_mut() {
        *leaf = leaf.saturating_sub(1);
    }
    stack
}

/// Removes and returns every entry of a map whose key `wanted` selects (used once probes are
/// detached, when nothing writes any more).
fn take_window<K: Copy, V: Copy>(
    map: &dyn MapCore,
    wanted: impl Fn(&K) -> bool,
) -> Result<Vec<(K, V)>> {
    let mut taken = Vec::new();
    for key in map.keys().collect::<Vec<_>>() {
        let k: K = pod(&key);
        if wanted(&k) {
            if let Some(v) = map.lookup_and_delete(&key)? {
                taken.push((k, pod::<V>(&v)));
            }
        }
    }
    Ok(taken)
}

/// Drains a counters map (values made of u64 counters) without racing its writers.
///
/// A program that read the old window parity just before the flip may still add to an
/// old-parity entry after the drain's grace period: a vCPU the hypervisor deschedules mid-program
/// stalls for milliseconds. Deleting the entry then would lose that increment (it would land in
/// a freed element). So a drain reads entries and reports their growth since the last read, and
/// deletes an entry only after a whole parity cycle (two windows) without change.
#[derive(Default)]
struct Counters {
    seen: HashMap<Vec<u8>, Vec<u8>>,
}

fn sub_counters(new: &[u8], old: &[u8]) -> Vec<u8> {
    new.chunks_exact(8)
        .zip(old.chunks_exact(8))
        .flat_map(|(n, o)| {
            let n = u64::from_ne_bytes(n.try_into().expect("8 bytes"));
            let o = u64::from_ne_bytes(o.try_into().expect("8 bytes"));
            n.wrapping_sub(o).to_ne_bytes()
        })
        .collect()
}

impl Counters {
    /// Increments since the last drain of the entries `wanted` selects; `everything` (after
    /// detach) takes and deletes every entry.
    fn take<K: Copy, V: Copy>(
        &mut self,
        map: &dyn MapCore,
        wanted: impl Fn(&K) -> bool,
        everything: bool,
    ) -> Result<Vec<(K, V)>> {
        let mut taken = Vec::new();
        for key in map.keys().collect::<Vec<_>>() {
            let k: K = pod(&key);
            if !wanted(&k) {
                continue;
            }
            let value = if everything {
                map.lookup_and_delete(&key)?
            } else {
                map.lookup(&key, MapFlags::ANY)?
            };
            let Some(value) = value else { continue };
            let delta = match self.seen.get(&key) {
                Some(prev) => sub_counters(&value, prev),
                None => value.clone(),
            };
            if everything {
                self.seen.remove(&key);
            } else if self.seen.get(&key) == Some(&value) {
                // Unchanged for a whole parity cycle: no writer can still hold it.
                map.delete(&key)?;
                self.seen.remove(&key);
            } else {
                self.seen.insert(key.clone(), value);
            }
            if delta.iter().any(|&b| b != 0) {
                taken.push((k, pod::<V>(&delta)));
            }
        }
        Ok(taken)
    }
}

fn open_skel<'obj>(
    cfg: &EngineConfig,
    storage: &'obj mut MaybeUninit<OpenObject>,
    flavour: SwitchFlavour,
) -> Result<OpenPhaseprofSkel<'obj>> {
    let mut open = PhaseprofSkelBuilder::default()
        .open(storage)
        .context("opening the BPF object")?;
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("BPF object has no rodata")?;
    rodata.syscall_stacks = cfg.syscall_stacks;
    rodata.follow_children = cfg.follow_children;
    rodata.notify_exec = cfg.notify_exec;
    rodata.phases_enabled = cfg.phases_enabled;
    rodata.alloc_sample_bytes = cfg.alloc_sample_bytes.max(1);
    rodata.alloc_live = cfg.alloc_live;
    rodata.stack_copy_bytes = cfg.stack_copy_bytes.min(MAX_STACK_COPY);
    open.maps
        .stack_samples
        .set_max_entries(stack_ring_bytes(cfg, online_cpus()?.len()))?;
    for (i, nrs) in cfg.syscall_costs.iter().enumerate().take(MAX_SYSCALL_COSTS) {
        for &nr in nrs {
            if let Some(bits) = rodata.syscall_cost_bits.get_mut(nr as usize) {
                *bits |= 1 << i;
            }
        }
    }
    open.maps.stacks.set_max_entries(cfg.stack_entries)?;
    for map in [
        &mut open.maps.cpu_counts,
        &mut open.maps.offcpu_counts,
        &mut open.maps.syscall_counts,
        &mut open.maps.alloc_stacks,
        &mut open.maps.pagefault_counts,
    ] {
        map.set_max_entries(cfg.key_entries)?;
    }
    let has = |k| cfg.events.contains(&k);
    open.progs
        .perf_event__sample
        .set_autoload(has(EventKind::Cpu));
    open.progs
        .tp_btf__sched_switch
        .set_autoload(has(EventKind::Offcpu) && flavour == SwitchFlavour::TpBtf);
    open.progs
        .raw_tp__sched_switch
        .set_autoload(has(EventKind::Offcpu) && flavour == SwitchFlavour::RawTp);
    // sys_enter also starts counting for `record -- CMD` at its execve, so it loads whenever
    // syscalls are recorded; sched_process_exec covers the other case.
    open.progs
        .raw_tp__sys_enter
        .set_autoload(has(EventKind::Syscall));
    open.progs
        .raw_tp__sys_exit
        .set_autoload(has(EventKind::Syscall));
    for prog in [
        &mut open.progs.uprobe__alloc_enter,
        &mut open.progs.uretprobe__alloc_exit,
        &mut open.progs.uprobe__free,
        &mut open.progs.uprobe__go_alloc_sample,
    ] {
        prog.set_autoload(has(EventKind::Alloc));
    }
    open.progs
        .perf_event__pagefault
        .set_autoload(has(EventKind::Pagefault));
    Ok(open)
}

impl<'obj> Engine<'obj> {
    /// Opens, configures and loads the programs. Tries the tp_btf flavour of sched_switch first
    /// and falls back to raw_tp when it does not load (the load is the probe).
    pub fn load(
        cfg: &EngineConfig,
        storage: &'obj mut MaybeUninit<OpenObject>,
        fallback_storage: &'obj mut MaybeUninit<OpenObject>,
    ) -> Result<Engine<'obj>> {
        let (skel, flavour) = match open_skel(cfg, storage, SwitchFlavour::TpBtf)?.load() {
            Ok(skel) => (skel, SwitchFlavour::TpBtf),
            Err(btf_err) => {
                let skel = open_skel(cfg, fallback_storage, SwitchFlavour::RawTp)?
                    .load()
                    .with_context(|| {
                        format!("loading the BPF programs (tp_btf flavour failed too: {btf_err})")
                    })?;
                (skel, SwitchFlavour::RawTp)
            }
        };
        let mut builder = RingBufferBuilder::new();
        let rx = ring_records(
            &mut builder,
            &skel.maps.target_events,
            |e: types::target_event, _| {
                let comm: Vec<u8> = e
                    .comm
                    .iter()
                    .take_while(|&&c| c != 0)
                    .map(|&c| c as u8)
                    .collect();
                match types::target_event_kind(e.kind) {
                    types::target_event_kind::TEV_EXEC => TargetEvent::Exec {
                        pid: e.pid,
                        comm: String::from_utf8_lossy(&comm).into_owned(),
                    },
                    types::target_event_kind::TEV_EXIT => TargetEvent::Exit { pid: e.pid },
                    types::target_event_kind::TEV_FORK => TargetEvent::Fork {
                        pid: e.pid,
                        parent: e.ppid,
                    },
                    _ => TargetEvent::MapsChanged { pid: e.pid },
                }
            },
        )?;
        let go_rx = ring_records(
            &mut builder,
            &skel.maps.alloc_samples,
            |s: types::go_alloc_sample, _| {
                let sample = RawGoAlloc {
                    pid: s.tgid,
                    phase: s.phase,
                    phase_mask: s.phase_mask,
                    user: None,
                    size: s.size,
                    rate: s.rate,
                };
                (s.user_stack, sample)
            },
        )?;
        let stack_rx = ring_records(
            &mut builder,
            &skel.maps.stack_samples,
            |h: types::stack_sample, rest: &[u8]| {
                let len = (h.len as usize).min(rest.len());
                let mut stack = rest[..len].to_vec();
                restore_return_addresses(&mut stack, h.sp, &h.ret_slots, &h.ret_addrs);
                let sample = RawStackSample {
                    page_fault: h.kind == types::stack_sample_kind::STACK_PAGEFAULT.0,
                    pid: h.tgid,
                    tid: h.tid,
                    phase: h.phase,
                    phase_mask: h.phase_mask,
                    kernel: None,
                    ip: h.ip,
                    sp: h.sp,
                    bp: h.bp,
                    stack,
                };
                (h.kernel_stack, sample)
            },
        )?;
        let ring = builder.build()?;
        Ok(Engine {
            skel,
            links: Vec::new(),
            alloc_links: HashMap::new(),
            ring,
            events: rx,
            go_allocs: go_rx,
            stack_samples: stack_rx,
            stack_cache: HashMap::new(),
            cpu_counts: Counters::default(),
            offcpu_counts: Counters::default(),
            syscall_counts: Counters::default(),
            alloc_totals: Counters::default(),
            alloc_stacks: Counters::default(),
            pagefault_counts: Counters::default(),
            detached_at_ns: None,
            flavour,
            cpus: 0,
        })
    }

    /// Attaches every loaded program; cpu sampling gets one perf event per online CPU.
    pub fn attach(&mut self, cfg: &EngineConfig) -> Result<()> {
        let progs = &self.skel.progs;
        let has = |k| cfg.events.contains(&k);
        if has(EventKind::Cpu) {
            let cpus = online_cpus()?;
            self.cpus = cpus.len();
            for cpu in cpus {
                let fd = open_cpu_clock(cpu, cfg.freq_hz)?;
                // The link owns the fd from here on and closes it on detach.
                let link = progs
                    .perf_event__sample
                    .attach_perf_event(fd.into_raw_fd())
                    .with_context(|| format!("attaching the cpu sampler on cpu {cpu}"))?;
                self.links.push(link);
            }
        }
        if has(EventKind::Pagefault) {
            for cpu in online_cpus()? {
                let fd = open_page_faults(cpu)?;
                let link = progs
                    .perf_event__pagefault
                    .attach_perf_event(fd.into_raw_fd())
                    .with_context(|| format!("attaching the page-fault counter on cpu {cpu}"))?;
                self.links.push(link);
            }
        }
        let mut attach = |prog: &libbpf_rs::ProgramMut<'_>, what: &str| -> Result<()> {
            let link = prog.attach().with_context(|| format!("attaching {what}"))?;
            self.links.push(link);
            Ok(())
        };
        if has(EventKind::Offcpu) {
            match self.flavour {
                SwitchFlavour::TpBtf => attach(&progs.tp_btf__sched_switch, "tp_btf/sched_switch")?,
                SwitchFlavour::RawTp => attach(&progs.raw_tp__sched_switch, "raw_tp/sched_switch")?,
            }
        }
        if has(EventKind::Syscall) {
            attach(&progs.raw_tp__sys_enter, "raw_tp/sys_enter")?;
            attach(&progs.raw_tp__sys_exit, "raw_tp/sys_exit")?;
        }
        attach(
            &progs.raw_tp__sched_process_fork,
            "raw_tp/sched_process_fork",
        )?;
        attach(
            &progs.raw_tp__sched_process_exec,
            "raw_tp/sched_process_exec",
        )?;
        attach(
            &progs.raw_tp__sched_process_exit,
            "raw_tp/sched_process_exit",
        )?;
        Ok(())
    }

    /// Stops counting and detaches every program: the targets run exactly as before from
    /// here on. Counting stops at once; retiring the probes can take a while longer.
    pub fn detach(&mut self) {
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("BPF object has a .bss");
        let ptr: *mut bool = &mut bss.stopped;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, true) };
        self.detached_at_ns = Some(monotonic_ns());
        self.alloc_links.clear();
        self.links.clear();
    }

    fn set_target(&self, pid: u32, state: types::target_state) -> Result<()> {
        self.skel
            .maps
            .target_pids
            .update(&pid.to_ne_bytes(), &state.0.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("adding pid {pid} to the targets"))
    }

    /// Records `pid` (all its threads, present and future) from now on.
    pub fn add_target(&self, pid: u32) -> Result<()> {
        self.set_target(pid, types::target_state::TARGET_ACTIVE)
    }

    /// Registers a forked, not yet exec'd `record -- CMD` child: counting starts at its execve.
    pub fn arm_target(&self, pid: u32) -> Result<()> {
        self.set_target(pid, types::target_state::TARGET_ARMED)
    }

    pub fn remove_target(&self, pid: u32) {
        let _ = self.skel.maps.target_pids.delete(&pid.to_ne_bytes());
        let _ = self.skel.maps.unwind_pids.delete(&pid.to_ne_bytes());
    }

    /// Walks `pid`'s user stacks from a copy unwound in user space (`dwarf`) or by frame
    /// pointers. A no-op when the engine copies no stacks (`stack_copy_bytes` 0).
    pub fn set_unwind(&self, pid: u32, dwarf: bool) -> Result<()> {
        let map = &self.skel.maps.unwind_pids;
        if dwarf {
            map.update(&pid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                .with_context(|| format!("switching pid {pid} to stack copies"))
        } else {
            let _ = map.delete(&pid.to_ne_bytes());
            Ok(())
        }
    }

    /// Stack copies that arrived since the last call (the ring is read by `poll_events` and
    /// `drain`), kernel stacks resolved.
    pub fn take_stack_samples(&mut self) -> Vec<RawStackSample> {
        let got: Vec<(u64, RawStackSample)> = self.stack_samples.try_iter().collect();
        got.into_iter()
            .map(|(kernel, mut s)| {
                s.kernel = self.stack(kernel);
                s
            })
            .collect()
    }

    /// Process events that arrived since the last call, waiting at most `timeout` for the first.
    pub fn poll_events(&self, timeout: Duration) -> Vec<TargetEvent> {
        let _ = self.ring.poll(timeout);
        // The stack-copy ring wakes no one per sample (see send_stack_copy): read it too.
        let _ = self.ring.consume();
        self.events.try_iter().collect()
    }

    fn window_ptr(&mut self) -> *mut u32 {
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("BPF object has a .bss");
        &mut bss.window
    }

    /// Drains one window. While attached: flips the window parity, gives programs that read
    /// the old parity time to finish, then takes the growth of every old-parity key (see
    /// `Counters` for why keys are not deleted right away). After `detach`, `everything` drains
    /// both parities.
    pub fn drain(&mut self, everything: bool) -> Result<RawWindow> {
        let ptr = self.window_ptr();
        // SAFETY: ptr points into the .bss mmap of the loaded object, which lives as long as
        // self.skel; volatile because BPF programs read it concurrently.
        let old = unsafe { std::ptr::read_volatile(ptr) };
        if !everything {
            // SAFETY: as above.
            unsafe { std::ptr::write_volatile(ptr, old ^ 1) };
            // A program runs for microseconds without sleeping; 2 ms covers any that read the
            // old parity just before the flip.
            std::thread::sleep(Duration::from_millis(2));
        }
        let take = |w: u32| everything || w == old;
        let mut raw = RawWindow::default();

        let maps = &self.skel.maps;
        let cpu = self.cpu_counts.take::<types::cpu_key, u64>(
            &maps.cpu_counts,
            |k| take(k.window),
            everything,
        )?;
        let offcpu = self.offcpu_counts.take::<types::offcpu_key, u64>(
            &maps.offcpu_counts,
            |k| take(k.window),
            everything,
        )?;
        let syscalls = self
            .syscall_counts
            .take::<types::syscall_key, types::syscall_value>(
                &maps.syscall_counts,
                |k| take(k.window),
                everything,
            )?;
        let alloc_totals = self
            .alloc_totals
            .take::<types::alloc_key, types::alloc_value>(
                &maps.alloc_totals,
                |k| take(k.window),
                everything,
            )?;
        let alloc_stacks = self
            .alloc_stacks
            .take::<types::alloc_stack_key, types::alloc_stack_value>(
                &maps.alloc_stacks,
                |k| take(k.window),
                everything,
            )?;
        let faults = self.pagefault_counts.take::<types::cpu_key, u64>(
            &maps.pagefault_counts,
            |k| take(k.window),
            everything,
        )?;
        for (k, v) in alloc_totals {
            raw.alloc_totals.push(RawAllocTotal {
                pid: k.tgid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                bytes: v.bytes,
                count: v.count,
                frees: v.frees,
            });
        }
        for (k, v) in alloc_stacks {
            raw.allocs.push(RawAlloc {
                pid: k.tgid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                user: self.stack(k.user_stack).map(into_call),
                est_bytes: v.est_bytes,
                samples: v.samples,
                sampled_bytes: v.sampled_bytes,
            });
        }
        for (k, count) in faults {
            raw.page_faults.push(RawCpu {
                pid: k.tgid,
                tid: k.tid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                user: self.stack(k.user_stack),
                kernel: None,
                count,
            });
        }
        let _ = self.ring.consume();
        let go: Vec<(u64, RawGoAlloc)> = self.go_allocs.try_iter().collect();
        for (stack, mut g) in go {
            g.user = self.stack(stack);
            raw.go_allocs.push(g);
        }
        for (k, count) in cpu {
            raw.cpu.push(RawCpu {
                pid: k.tgid,
                tid: k.tid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                user: self.stack(k.user_stack),
                kernel: self.stack(k.kernel_stack),
                count,
            });
        }
        for (k, ns) in offcpu {
            raw.offcpu.push(RawOffCpu {
                pid: k.tgid,
                tid: k.tid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                user: self.stack(k.user_stack),
                kernel: self.stack(k.kernel_stack),
                ns,
            });
        }
        if let (true, Some(end)) = (everything, self.detached_at_ns) {
            // Threads still off-CPU when recording stopped: count their time up to the stop,
            // so off-CPU time covers the whole recording as on-CPU samples do.
            let in_progress =
                take_window::<u32, types::offcpu_start>(&self.skel.maps.offcpu_starts, |_| true)?;
            for (tid, start) in in_progress {
                if start.ts < end {
                    raw.offcpu.push(RawOffCpu {
                        pid: start.tgid,
                        tid,
                        phase: start.phase,
                        phase_mask: start.phase_mask,
                        user: self.stack(start.user_stack),
                        kernel: self.stack(start.kernel_stack),
                        ns: end - start.ts,
                    });
                }
            }
        }
        for (k, v) in syscalls {
            raw.syscalls.push(RawSyscall {
                pid: k.tgid,
                phase: k.phase,
                phase_mask: k.phase_mask,
                nr: k.nr,
                user: self.stack(k.user_stack),
                count: v.count,
                total_ns: v.total_ns,
            });
        }
        Ok(raw)
    }

    /// Sampled allocations not freed yet (the live heap), read without removing them.
    pub fn live_heap(&mut self) -> Result<Vec<RawLive>> {
        let mut out = Vec::new();
        let map = &self.skel.maps.live_allocs;
        let entries: Vec<(types::live_key, types::live_alloc)> = map
            .keys()
            .filter_map(|k| {
                let v = map.lookup(&k, MapFlags::ANY).ok()??;
                Some((pod(&k), pod(&v)))
            })
            .collect();
        for (k, v) in entries {
            out.push(RawLive {
                pid: k.tgid,
                phase: v.phase,
                phase_mask: v.phase_mask,
                user: self.stack(v.user_stack).map(into_call),
                est_bytes: v.est_bytes,
                size: v.size,
                allocated_at_ns: v.ts,
            });
        }
        Ok(out)
    }

    /// Attaches allocator probes for process `pid` only (a uprobe with a pid filter is
    /// installed in that process's memory alone, so other users of the same libc never trap).
    /// Calls already inside an allocator are not waited for after a re-attach.
    pub fn attach_alloc(&mut self, pid: u32, probes: &[ProbeSpec]) -> Result<()> {
        self.bump_alloc_generation();
        let progs = &self.skel.progs;
        // One multi-uprobe link per (program, file): its offsets and their cookies.
        type Sites = (Vec<usize>, Vec<u64>);
        let mut groups: std::collections::BTreeMap<(Uprobe, &std::path::Path), Sites> =
            Default::default();
        let mut links = Vec::new();
        for p in probes {
            if p.program == Uprobe::GoAllocSample {
                let opts = libbpf_rs::UprobeOpts {
                    cookie: p.cookie,
                    ..Default::default()
                };
                let link = progs
                    .uprobe__go_alloc_sample
                    .attach_uprobe_with_opts(pid as i32, &p.path, p.offset as usize, opts)
                    .with_context(|| {
                        format!("attaching {} in {} (pid {pid})", p.what, p.path.display())
                    })?;
                links.push(link);
                continue;
            }
            let (offsets, cookies) = groups.entry((p.program, &p.path)).or_default();
            offsets.push(p.offset as usize);
            cookies.push(p.cookie);
        }
        for ((program, path), (offsets, cookies)) in groups {
            let prog = match program {
                Uprobe::Free => &progs.uprobe__free,
                Uprobe::AllocEnter => &progs.uprobe__alloc_enter,
                Uprobe::AllocExit => &progs.uretprobe__alloc_exit,
                other => bail!("{other:?} is not an allocator probe"),
            };
            let opts = libbpf_rs::UprobeMultiOpts {
                offsets,
                cookies,
                retprobe: program.retprobe(),
                ..Default::default()
            };
            let link = prog
                .attach_uprobe_multi_with_opts(pid as i32, path, "", opts)
                .with_context(|| {
                    format!(
                        "attaching the allocator probes in {} (pid {pid})",
                        path.display()
                    )
                })?;
            links.push(link);
        }
        self.alloc_links.entry(pid).or_default().extend(links);
        Ok(())
    }

    /// Detaches the allocator probes of every target (duty cycling), keeping the rest.
    pub fn detach_alloc(&mut self) {
        self.alloc_links.clear();
    }

    /// Pauses (or resumes) allocation counting without detaching: duty cycling counts only
    /// while every probe is in force.
    pub fn pause_alloc(&mut self, paused: bool) {
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("BPF object has a .bss");
        let ptr: *mut bool = &mut bss.alloc_paused;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, paused) };
    }

    fn bump_alloc_generation(&mut self) {
        let bss = self
            .skel
            .maps
            .bss_data
            .as_deref_mut()
            .expect("BPF object has a .bss");
        let ptr: *mut u32 = &mut bss.alloc_generation;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, std::ptr::read_volatile(ptr).wrapping_add(1)) };
    }

    /// Allocator probe hits so far, summed over CPUs: (entries + returns + frees + Go samples).
    pub fn alloc_probe_hits(&self) -> Result<u64> {
        use types::probe_counter as c;
        let mut total = 0;
        for counter in [
            c::HITS_ALLOC_ENTRY,
            c::HITS_ALLOC_EXIT,
            c::HITS_FREE,
            c::HITS_GO_SAMPLE,
        ] {
            total += self.probe_hits(counter)?;
        }
        Ok(total)
    }

    /// Hits of the Go scheduler's switch points (goroutine phases) so far.
    pub fn go_switch_hits(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::HITS_GO_SCHED)
    }

    fn probe_hits(&self, counter: types::probe_counter) -> Result<u64> {
        let per_cpu = self
            .skel
            .maps
            .probe_hits
            .lookup_percpu(&counter.0.to_ne_bytes(), MapFlags::ANY)?;
        Ok(per_cpu
            .unwrap_or_default()
            .iter()
            .map(|v| pod::<u64>(v))
            .sum())
    }

    /// The addresses of stack `id` (its hash), leaf first. A stack's entry never changes once
    /// stored, so each is read from the kernel once.
    fn stack(&mut self, id: u64) -> Option<Vec<u64>> {
        if id == 0 {
            return None;
        }
        if let Some(s) = self.stack_cache.get(&id) {
            return Some(s.clone());
        }
        let bytes = self
            .skel
            .maps
            .stacks
            .lookup(&id.to_ne_bytes(), MapFlags::ANY)
            .ok()??;
        let st: types::stack_trace = pod(&bytes);
        let len = (st.len as usize).min(st.ips.len());
        let addrs = st.ips[..len].to_vec();
        self.stack_cache.insert(id, addrs.clone());
        Some(addrs)
    }

    /// Attaches phase probes (and the Go scheduler's), for every process mapping their files.
    pub fn attach_phases(&mut self, probes: &[ProbeSpec]) -> Result<()> {
        for p in probes {
            let progs = &self.skel.progs;
            let prog = match p.program {
                Uprobe::PhaseEnter => &progs.uprobe__phase_enter,
                Uprobe::PhaseExit => &progs.uretprobe__phase_exit,
                Uprobe::GoPhaseEnter => &progs.uprobe__go_phase_enter,
                Uprobe::GoPhaseReturn => &progs.uprobe__go_phase_return,
                Uprobe::GoSched => &progs.uprobe__go_sched,
                other => bail!("{other:?} is not a phase probe ({})", p.what),
            };
            let opts = libbpf_rs::UprobeOpts {
                cookie: p.cookie,
                retprobe: p.program.retprobe(),
                ..Default::default()
            };
            let link = prog
                .attach_uprobe_with_opts(-1, &p.path, p.offset as usize, opts)
                .with_context(|| format!("attaching the {} in {}", p.what, p.path.display()))?;
            self.links.push(link);
        }
        Ok(())
    }

    /// Exact per-phase totals so far, by phase id (0 = `(none)`), summed over CPUs; syscall cost
    /// rule i is reported under `cost_names[i]`.
    pub fn phase_stats(&self, phases: usize, cost_names: &[String]) -> Result<Vec<PhaseStats>> {
        let mut out = Vec::with_capacity(phases);
        for id in 0..phases as u32 {
            let per_cpu = self
                .skel
                .maps
                .phase_stats
                .lookup_percpu(&id.to_ne_bytes(), MapFlags::ANY)?;
            let mut total = PhaseStats::default();
            let mut costs = [0u64; MAX_SYSCALL_COSTS];
            let mut hist = vec![0u64; WALL_BUCKETS];
            for bytes in per_cpu.unwrap_or_default() {
                let st: types::phase_stats = pod(&bytes);
                total.calls += st.calls;
                total.wall_ns += st.wall_ns;
                total.wall_max_ns = total.wall_max_ns.max(st.wall_max_ns);
                total.cpu_ns += st.cpu_ns;
                total.offcpu_ns += st.offcpu_ns;
                total.gowait_ns += st.gowait_ns;
                total.syscalls += st.syscalls;
                total.syscall_ns += st.syscall_ns;
                total.alloc_bytes += st.alloc_bytes;
                total.allocs += st.allocs;
                total.frees += st.frees;
                total.page_faults += st.page_faults;
                for (t, c) in costs.iter_mut().zip(st.costs) {
                    *t += c;
                }
                for (h, c) in hist.iter_mut().zip(st.wall_hist) {
                    *h += c;
                }
            }
            total.wall_hist = hist
                .into_iter()
                .enumerate()
                .filter(|(_, c)| *c > 0)
                .map(|(i, c)| (i as u32, c))
                .collect();
            total.costs = cost_names.iter().cloned().zip(costs).collect();
            out.push(total);
        }
        Ok(out)
    }

    /// Everything the kernel side dropped so far, summed over CPUs.
    pub fn lost(&self) -> Result<Lost> {
        let mut lost = Lost::default();
        for i in 0..types::drop_reason::DROP_MAX.0 {
            let per_cpu = self
                .skel
                .maps
                .drops
                .lookup_percpu(&i.to_ne_bytes(), MapFlags::ANY)?;
            let n: u64 = per_cpu
                .unwrap_or_default()
                .iter()
                .map(|v| pod::<u64>(v))
                .sum();
            let reason = types::drop_reason(i);
            let name = match reason {
                types::drop_reason::DROP_USER_STACK => "user_stack",
                types::drop_reason::DROP_KERNEL_STACK => "kernel_stack",
                types::drop_reason::DROP_CPU_KEY => "cpu_counts_full",
                types::drop_reason::DROP_OFFCPU_KEY => "offcpu_counts_full",
                types::drop_reason::DROP_OFFCPU_START => "offcpu_starts_full",
                types::drop_reason::DROP_SYSCALL_KEY => "syscall_counts_full",
                types::drop_reason::DROP_SYSCALL_START => "syscall_starts_full",
                types::drop_reason::DROP_TARGET_FULL => "target_pids_full",
                types::drop_reason::DROP_EVENT_RINGBUF => "event_ringbuf_full",
                types::drop_reason::DROP_PHASE_DEPTH => "phase_depth_exceeded",
                types::drop_reason::DROP_PHASE_THREAD => "thread_phases_full",
                types::drop_reason::DROP_PHASE_MISMATCH => "phase_exit_mismatch",
                types::drop_reason::DROP_ALLOC_KEY => "alloc_totals_full",
                types::drop_reason::DROP_ALLOC_STACK_KEY => "alloc_stacks_full",
                types::drop_reason::DROP_LIVE_FULL => "live_allocs_full",
                types::drop_reason::DROP_ALLOC_THREAD => "alloc_thread_state",
                types::drop_reason::DROP_ALLOC_RINGBUF => "alloc_samples_ringbuf_full",
                types::drop_reason::DROP_PAGEFAULT_KEY => "pagefault_counts_full",
                types::drop_reason::DROP_STACK_COPY => "stack_copy_ringbuf_full",
                types::drop_reason::DROP_GOROUTINE_FULL => "goroutine_phases_full",
                types::drop_reason::DROP_PHASE_UNFINISHED => "phase_unfinished_goroutine_exit",
                types::drop_reason::INFO_PHASE_EXIT_UNMATCHED => {
                    lost.phase_exits_before_start = n;
                    continue;
                }
                types::drop_reason::INFO_SYSCALL_EXIT_UNMATCHED => {
                    lost.syscalls_in_flight_at_start = n;
                    continue;
                }
                _ => "unknown",
            };
            match reason {
                types::drop_reason::DROP_USER_STACK
                | types::drop_reason::DROP_KERNEL_STACK
                | types::drop_reason::DROP_STACK_COPY => lost.stacks += n,
                _ => lost.events += n,
            }
            lost.by_reason.insert(name.to_string(), n);
        }
        Ok(lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that a stack copy gets back the return addresses pending uretprobes replaced:
    // slots inside the copy are rewritten, slots outside it (or none) leave it alone.
    #[test]
    fn return_addresses_are_restored_in_the_copy() {
        let sp = 0x7fff_0000u64;
        let trampoline = 0x7fff_ffff_e000u64.to_ne_bytes();
        let mut stack = [trampoline, trampoline, [7; 8]].concat();
        let slots = [sp + 8, sp + 64, sp - 8, 0];
        let addrs = [0x5555_1234, 0x5555_9999, 0x5555_8888, 0x5555_7777];
        restore_return_addresses(&mut stack, sp, &slots, &addrs);
        let word = |i: usize| u64::from_ne_bytes(stack[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(word(0), 0x7fff_ffff_e000);
        assert_eq!(word(1), 0x5555_1234);
        assert_eq!(stack[16..], [7; 8]);
    }
}
