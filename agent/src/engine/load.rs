//! Opening, configuring and loading the BPF object, and the ring buffers' readers.
use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::mpsc::{channel, Receiver};

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use std::os::fd::AsFd;

use libbpf_rs::{MapCore, OpenObject, RingBufferBuilder};
use phaseprof_bpf::{limits, types};
use phaseprof_bpf::{OpenPhaseprofSkel, PhaseprofSkelBuilder};
use phaseprof_model::{EventKind, SampleKind};

use super::drain::Counters;
use super::features::KernelFeatures;
use super::mapped::MappedArray;
use super::{pod, Engine, EngineConfig, TargetEvent, Uprobe, MAX_STACK_COPY, MAX_SYSCALL_COSTS};
use crate::perf_events::online_cpus;
use crate::window::{RawGoAlloc, RawStackSample};

/// The kernel's header before each ring buffer record (BPF_RINGBUF_HDR_SZ in its uapi).
const RINGBUF_HDR: u64 = 8;

/// Bytes around a stack copy in its ring record: struct stack_sample, the copy's slack (for the
/// verifier), and the ring buffer's own header.
const STACK_RECORD_OVERHEAD: u64 =
    std::mem::size_of::<types::stack_sample>() as u64 + limits::STACK_COPY_SLACK + RINGBUF_HDR;

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

/// Per-thread maps kept in task-local storage: on kernels without it, hashes keyed by tid (the
/// programs look them up by tid there, and delete a thread's entries at its exit).
/// Preallocated: those kernels let perf_event programs use no other kind of hash.
fn retype_thread_maps(open: &mut OpenPhaseprofSkel<'_>) -> Result<()> {
    for map in [
        &mut open.maps.syscall_starts,
        &mut open.maps.thread_phases,
        &mut open.maps.alloc_threads,
    ] {
        map.set_type(libbpf_rs::MapType::Hash)?;
        map.set_map_flags(0)?;
        map.set_max_entries(THREAD_ENTRIES)?;
    }
    Ok(())
}

/// Threads with per-thread state at once, where that state lives in hashes (preallocated: about
/// 1 KiB per thread in all; a thread beyond them is counted in `lost`).
const THREAD_ENTRIES: u32 = 8192;

/// Loads only the programs this recording uses, in the variants this kernel runs: an optional
/// program a kernel cannot load never blocks the rest.
fn choose_programs(
    open: &mut OpenPhaseprofSkel<'_>,
    cfg: &EngineConfig,
    features: &KernelFeatures,
) {
    let has = |k| cfg.events.contains(&k);
    let progs = &mut open.progs;
    progs.perf_event__sample.set_autoload(has(EventKind::Cpu));
    // tp_btf (typed arguments): every kernel with the BTF that CO-RE needs takes it.
    progs
        .tp_btf__sched_switch
        .set_autoload(has(EventKind::Offcpu));
    // Where the scheduler's own wait accounting is readable, the switch-in reads it.
    progs
        .tp_btf__sched_wakeup
        .set_autoload(has(EventKind::Offcpu) && !features.sched_info);
    // sys_enter also starts counting for `record -- CMD` at its execve, so it loads whenever
    // syscalls are recorded; sched_process_exec covers the other case.
    progs
        .raw_tp__sys_enter
        .set_autoload(has(EventKind::Syscall));
    progs.raw_tp__sys_exit.set_autoload(has(EventKind::Syscall));
    progs
        .raw_tp__sched_process_fork
        .set_autoload(features.atomic_or);
    progs
        .raw_tp__sched_process_fork_no_atomic_or
        .set_autoload(!features.atomic_or);
    progs.uprobe__entry_hold.set_autoload(cfg.hold_execs);
    let alloc = has(EventKind::Alloc);
    let cookies = features.attach_cookie;
    // uprobe_multi links (6.6) imply cookies (5.15).
    let multi = features.uprobe_multi && cookies;
    progs.uprobe__alloc_enter.set_autoload(alloc && multi);
    progs.uretprobe__alloc_exit.set_autoload(alloc && multi);
    progs.uprobe__free.set_autoload(alloc && multi);
    progs
        .uprobe__alloc_enter_one
        .set_autoload(alloc && !multi && cookies);
    progs
        .uretprobe__alloc_exit_one
        .set_autoload(alloc && !multi);
    progs.uprobe__free_one.set_autoload(alloc && !multi);
    // Go's sample hook carries the address of its rate in the cookie: no twin can.
    progs.uprobe__go_alloc_sample.set_autoload(alloc && cookies);
    progs
        .perf_event__pagefault
        .set_autoload(has(EventKind::Pagefault));
    // Phase probes: multi-uprobes where the kernel has them (see `phase_links_multi`), else
    // one link per probe.
    let phases_multi = cfg.phase_ids > 0 && multi && cookies;
    let phases = cfg.phase_ids > 0 && !phases_multi;
    progs.uretprobe__phase_exit.set_autoload(phases);
    progs.uprobe__go_phase_return.set_autoload(phases);
    progs.uprobe__phase_enter.set_autoload(phases && cookies);
    progs.uprobe__go_phase_enter.set_autoload(phases && cookies);
    // Inlined copies' ends must know their phase: probed only with cookies.
    progs.uprobe__phase_leave.set_autoload(phases && cookies);
    progs.uprobe__go_phase_leave.set_autoload(phases && cookies);
    progs.uprobe__go_sched.set_autoload(phases && cookies);
    for prog in [
        &mut progs.uretprobe__phase_exit_multi,
        &mut progs.uprobe__go_phase_return_multi,
        &mut progs.uprobe__phase_enter_multi,
        &mut progs.uprobe__go_phase_enter_multi,
        &mut progs.uprobe__phase_leave_multi,
        &mut progs.uprobe__go_phase_leave_multi,
        &mut progs.uprobe__go_sched_multi,
    ] {
        prog.set_autoload(phases_multi);
    }
    // Without cookies: the programs of each phase id in use, and of each scheduler point.
    for mut prog in open.open_object_mut().progs_mut() {
        let name = prog.name().to_string_lossy().into_owned();
        if let Some(wanted) = super::count_maps::wanted(cfg, &name) {
            prog.set_autoload(wanted);
            continue;
        }
        let value = |prefix: &str| name.strip_prefix(prefix)?.parse::<u64>().ok();
        let wanted = if let Some(id) =
            value(BY_COOKIE_PHASE_ENTER).or_else(|| value(BY_COOKIE_GO_PHASE_ENTER))
        {
            phases && id <= cfg.phase_ids as u64
        } else if value(BY_COOKIE_GO_SCHED).is_some() {
            phases
        } else if value(BY_COOKIE_ALLOC_ENTER).is_some() {
            alloc && !multi
        } else {
            continue;
        };
        prog.set_autoload(!cookies && wanted);
    }
}

/// On kernels without attach cookies, the program that stands for `program` with `cookie` is
/// `<prefix><cookie>` (see PROBE_FOR in phases.bpf.h).
const BY_COOKIE_PHASE_ENTER: &str = "uprobe__phase_enter_";
const BY_COOKIE_GO_PHASE_ENTER: &str = "uprobe__go_phase_enter_";
const BY_COOKIE_GO_SCHED: &str = "uprobe__go_sched_";
const BY_COOKIE_ALLOC_ENTER: &str = "uprobe__alloc_enter_kind_";

/// The name of the program that stands for `program` with `cookie` where the kernel has no
/// attach cookies; None for programs that need no cookie there.
pub(super) fn program_for_cookie(program: Uprobe, cookie: u64) -> Option<String> {
    let prefix = match program {
        Uprobe::PhaseEnter => BY_COOKIE_PHASE_ENTER,
        Uprobe::GoPhaseEnter => BY_COOKIE_GO_PHASE_ENTER,
        Uprobe::GoSched => BY_COOKIE_GO_SCHED,
        Uprobe::AllocEnter => BY_COOKIE_ALLOC_ENTER,
        _ => return None,
    };
    Some(format!("{prefix}{cookie}"))
}

fn open_skel<'obj>(
    cfg: &EngineConfig,
    storage: &'obj mut MaybeUninit<OpenObject>,
    features: &KernelFeatures,
) -> Result<OpenPhaseprofSkel<'obj>> {
    let mut open = PhaseprofSkelBuilder::default()
        .open(storage)
        .context("opening the BPF object")?;
    let rodata = open
        .maps
        .rodata_data
        .as_deref_mut()
        .context("BPF object has no rodata")?;
    rodata.syscall_stack_every = cfg.syscall_stacks.every();
    rodata.syscall_stack_walks_per_sec = cfg.syscall_stacks.walks_per_sec();
    rodata.offcpu_stack_walks_per_sec = cfg.offcpu_stacks.walks_per_sec();
    rodata.follow_children = cfg.follow_children;
    rodata.notify_exec = cfg.notify_exec;
    rodata.hold_execs = cfg.hold_execs;
    rodata.phases_enabled = cfg.phase_ids > 0;
    rodata.alloc_sample_bytes = cfg.alloc_sample_bytes.max(1);
    rodata.alloc_live = cfg.alloc_live;
    rodata.stack_copy_bytes = cfg.stack_copy_bytes.min(MAX_STACK_COPY);
    rodata.have_task_storage = features.task_storage;
    rodata.wait_from_sched_info = features.sched_info;
    rodata.have_task_pt_regs = features.task_pt_regs;
    rodata.have_attach_cookie = features.attach_cookie;
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
    open.maps.irq_stacks.set_max_entries(cfg.stack_entries)?;
    open.maps
        .unwind_rows
        .set_max_entries(cfg.unwind_rows.max(1))?;
    for map in [
        &mut open.maps.cpu_counts,
        &mut open.maps.offcpu_counts,
        &mut open.maps.syscall_counts,
        &mut open.maps.alloc_stacks,
        &mut open.maps.pagefault_counts,
    ] {
        map.set_max_entries(cfg.key_entries)?;
    }
    super::count_maps::size_maps(open.open_object_mut(), cfg.key_entries)?;
    if !features.task_storage {
        retype_thread_maps(&mut open)?;
    }
    choose_programs(&mut open, cfg, features);
    Ok(open)
}

/// A load that failed although every feature it uses was probed: the verifier of this kernel
/// refused a program. Said in one line with the kernel (the program and verifier log are in
/// the cause, shown with -v as anyhow's chain).
fn load_error(e: libbpf_rs::Error, features: &KernelFeatures) -> anyhow::Error {
    anyhow::Error::new(e).context(format!(
        "this kernel ({}) refused phaseprof's BPF programs; please \
         report it with the output of `PHASEPROF_LIBBPF_LOG=debug phaseprof record …`",
        features.release
    ))
}

/// This kernel's features, or why it cannot record what `cfg` asks for (one line).
fn probe_features_for(cfg: &EngineConfig) -> Result<KernelFeatures> {
    if std::env::var("PHASEPROF_LIBBPF_LOG").is_ok_and(|v| v == "debug") {
        // libbpf's own account of every step (and the verifier's log of a refused program).
        fn print(_: libbpf_rs::PrintLevel, msg: String) {
            eprint!("{msg}");
        }
        libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Debug, print)));
    }
    if let Some(why) = KernelFeatures::refused() {
        bail!("{why}");
    }
    let mut features = KernelFeatures::probe();
    if let Ok(names) = std::env::var("PHASEPROF_KERNEL_WITHOUT") {
        features = features.without(&names).map_err(anyhow::Error::msg)?;
    }
    if let Some(why) = features.core_missing() {
        bail!("{why}");
    }
    if cfg.phase_ids as u64 >= limits::MAX_PHASES {
        bail!(
            "{} phases: at most {} are recorded at once",
            cfg.phase_ids,
            limits::MAX_PHASES - 1
        );
    }
    Ok(features)
}

/// The unwind rows (`rows` of them) and the blocks of mappings, mapped for writing.
fn map_unwind_arrays(
    skel: &phaseprof_bpf::PhaseprofSkel<'_>,
    rows: u32,
) -> Result<(MappedArray, MappedArray)> {
    let blocks = (limits::MAX_UNWIND_BLOCKS * limits::MAX_UNWIND_MAPPINGS) as usize;
    Ok((
        MappedArray::map(skel.maps.unwind_rows.as_fd(), rows as usize * 8)?,
        MappedArray::map(
            skel.maps.unwind_mappings.as_fd(),
            blocks * std::mem::size_of::<types::unwind_mapping>(),
        )?,
    ))
}

impl<'obj> Engine<'obj> {
    /// Probes the kernel's features, then opens, configures and loads the programs once.
    pub fn load(
        cfg: &EngineConfig,
        storage: &'obj mut MaybeUninit<OpenObject>,
    ) -> Result<Engine<'obj>> {
        let features = probe_features_for(cfg)?;
        let skel = open_skel(cfg, storage, &features)?
            .load()
            .map_err(|e| load_error(e, &features))?;
        let mut builder = RingBufferBuilder::new();
        let rx = ring_records(
            &mut builder,
            &skel.maps.target_events,
            |e: types::target_event, _| target_event(e),
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
                    kind: if h.kind == types::stack_sample_kind::STACK_PAGEFAULT.0 {
                        SampleKind::Pagefault
                    } else {
                        SampleKind::Cpu
                    },
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
        let (rows, unwind_mappings) = match cfg.unwind_rows {
            0 => (None, None),
            n => {
                let (rows, mappings) = map_unwind_arrays(&skel, n)?;
                (Some(rows), Some(mappings))
            }
        };
        let target_bits = map_target_bits(&skel)?;
        Ok(Engine {
            inlined_unprobed: 0,
            probe_resumes: Default::default(),
            phases: cfg.phase_ids > 0,
            phase_totals: Default::default(),
            timed_ns_taken: Default::default(),
            rows,
            unwind_mappings,
            target_bits,
            skel,
            links: Vec::new(),
            alloc_links: HashMap::new(),
            phase_links: Default::default(),
            syscall_links: Default::default(),
            entry_holds: Default::default(),
            ring,
            events: rx,
            go_allocs: go_rx,
            stack_samples: stack_rx,
            stacks: Default::default(),
            stack_map_entries: 0,
            cpu_counts: Counters::default(),
            offcpu_counts: Counters::default(),
            offcpu_carry: Default::default(),
            syscall_counts: Counters::default(),
            alloc_totals: Counters::default(),
            alloc_stacks: Counters::default(),
            pagefault_counts: Counters::default(),
            count_maps: Default::default(),
            detached_at_ns: None,
            features,
            cpus: 0,
        })
    }
}

/// The targets bitmap (`target_bits`), mapped for user space to set and clear bits.
fn map_target_bits(skel: &phaseprof_bpf::PhaseprofSkel<'_>) -> Result<MappedArray> {
    MappedArray::map(
        skel.maps.target_bits.as_fd(),
        limits::TARGET_BIT_WORDS as usize * 8,
    )
}

/// What a record of the kernel's `target_events` ring says.
fn target_event(e: types::target_event) -> TargetEvent {
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
            stopped: e.ppid == 1,
        },
        types::target_event_kind::TEV_EXIT => TargetEvent::Exit {
            pid: e.pid,
            cpu_ns: e.cpu_ns,
            io_syscalls: e.io_syscalls,
        },
        types::target_event_kind::TEV_FORK => TargetEvent::Fork {
            pid: e.pid,
            parent: e.ppid,
        },
        types::target_event_kind::TEV_ENTRY => TargetEvent::Entry {
            pid: e.pid,
            block: e.ppid.checked_sub(1),
        },
        types::target_event_kind::TEV_THREAD_EXIT => TargetEvent::ThreadExit {
            tid: e.pid,
            comm: String::from_utf8_lossy(&comm).into_owned(),
        },
        _ => TargetEvent::MapsChanged { pid: e.pid },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DEFAULT_STACK_COPY;

    // Checks the model's copy of the wall histogram's layout (the model is built without the
    // BPF side) against the shared header, and the stack ring's sizing: a second of records of
    // the copy size with their overhead, rounded to a power of two; a page when nothing is
    // copied.
    #[test]
    fn boundary_agrees_with_the_header() {
        assert_eq!(phaseprof_model::WALL_SUB_BUCKETS, limits::WALL_SUB_BUCKETS);
        let cfg = EngineConfig {
            events: vec![EventKind::Cpu],
            freq_hz: 99,
            ..EngineConfig::default()
        };
        let record = DEFAULT_STACK_COPY as u64 + STACK_RECORD_OVERHEAD;
        assert_eq!(
            stack_ring_bytes(&cfg, 2) as u64,
            (record * 99 * 2).next_power_of_two()
        );
        let none = EngineConfig {
            stack_copy_bytes: 0,
            ..cfg
        };
        assert_eq!(stack_ring_bytes(&none, 2), 4096);
    }

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
