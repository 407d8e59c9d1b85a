//! Attaching: the recording programs, targets (and how their stacks are walked), phase probes
//! and the allocator probes (per target, detached and re-attached when duty-cycling); detaching.
use std::os::fd::IntoRawFd;

use anyhow::{bail, Context, Result};
use libbpf_rs::skel::Skel;
use libbpf_rs::{Link, MapCore, MapFlags};
use phaseprof_bpf::{limits, types};
use phaseprof_model::EventKind;

use super::features::Needs;
use super::load::program_for_cookie;
use super::uprobe_multi::by_program_and_file;
use super::{monotonic_ns, Engine, EngineConfig, ProbeSpec, Uprobe};
use crate::perf_events::{online_cpus, open_cpu_clock, open_page_faults};

impl Engine<'_> {
    /// Attaches every loaded program; cpu sampling gets one perf event per online CPU.
    pub fn attach(&mut self, cfg: &EngineConfig) -> Result<()> {
        let counted = self.attach_count_maps(cfg)?;
        self.links.extend(counted);
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
            attach(&progs.tp_btf__sched_switch, "tp_btf/sched_switch")?;
            if !self.features.sched_info {
                attach(&progs.tp_btf__sched_wakeup, "tp_btf/sched_wakeup")?;
            }
        }

        if self.features.atomic_or {
            attach(
                &progs.raw_tp__sched_process_fork,
                "raw_tp/sched_process_fork",
            )?;
        } else {
            attach(
                &progs.raw_tp__sched_process_fork_no_atomic_or,
                "raw_tp/sched_process_fork",
            )?;
        }
        attach(
            &progs.raw_tp__sched_process_exec,
            "raw_tp/sched_process_exec",
        )?;
        attach(
            &progs.raw_tp__sched_process_exit,
            "raw_tp/sched_process_exit",
        )?;
        // Under a syscall budget, attached for slices only (`start_syscall_slice`).
        if has(EventKind::Syscall) && !self.syscall_links.sliced {
            let links = self.attach_syscall_programs()?;
            self.syscall_links.links = links;
        }
        Ok(())
    }

    /// Stops counting and detaches every program: the targets run exactly as before from
    /// here on. Counting stops at once; retiring the probes can take a while longer.
    pub fn detach(&mut self) {
        let ptr: *mut bool = &mut self.bss().stopped;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, true) };
        self.detached_at_ns = Some(monotonic_ns());
        self.retire_entry_holds();
        self.alloc_links.clear();
        self.phase_links.links.clear();
        self.syscall_links.links.clear();
        self.links.clear();
    }

    fn set_target(&self, pid: u32, state: types::target_state) -> Result<()> {
        self.skel
            .maps
            .target_pids
            .update(&pid.to_ne_bytes(), &state.0.to_ne_bytes(), MapFlags::ANY)
            .with_context(|| format!("adding pid {pid} to the targets"))?;
        // After the entry: the programs look it up once they see the bit.
        let words = limits::TARGET_BIT_WORDS as usize;
        self.target_bits
            .fetch_or_u64((pid as usize / 64) % words, 1 << (pid % 64))
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
        let _ = self.unwant_entry(pid);
    }

    /// Sends copies of `pid`'s user stack with its cpu samples and page faults, unwound in user
    /// space (`copy`), or not. A no-op when the engine copies no stacks (`stack_copy_bytes` 0).
    pub fn set_unwind(&self, pid: u32, copy: bool) -> Result<()> {
        let map = &self.skel.maps.unwind_pids;
        if copy {
            map.update(&pid.to_ne_bytes(), &1u32.to_ne_bytes(), MapFlags::ANY)
                .with_context(|| format!("switching pid {pid} to stack copies"))
        } else {
            let _ = map.delete(&pid.to_ne_bytes());
            Ok(())
        }
    }

    /// Continues `pid`, stopped at its exec or entry point (SIGCONT; harmless if it is not).
    /// No need to wait for the stop: the programs' bpf_send_signal queues the SIGSTOP before
    /// their event is written (from process context, not deferred), and a SIGCONT either ends
    /// the stop or discards the stop still pending, which is as good: the caller has done
    /// what the stop was for.
    pub fn resume(&self, pid: u32) {
        // SAFETY: kill with a valid signal.
        unsafe { libc::kill(pid as i32, libc::SIGCONT) };
    }

    /// Attaches phase probes (and the Go scheduler's), for every process mapping their files;
    /// `inlined_unprobed` inlined copies of phase functions could not be probed.
    /// Duty-cycled (`slice_phases`), they are attached during slices only.
    pub fn attach_phases(&mut self, probes: &[ProbeSpec], inlined_unprobed: u64) -> Result<()> {
        self.inlined_unprobed += inlined_unprobed;
        self.add_phase_probes(probes)
    }

    /// Attaches phase probes in process `pid` only (-1: every process mapping their files),
    /// returning their links.
    pub(super) fn attach_phase_probes(&self, probes: &[ProbeSpec], pid: i32) -> Result<Vec<Link>> {
        if self.phase_links_multi() {
            return self.attach_phase_probes_multi(probes, pid);
        }
        let mut links = Vec::with_capacity(probes.len());
        for p in probes {
            links.push(self.attach_phase_probe(p, pid)?);
        }
        Ok(links)
    }

    /// Attaches one phase probe on its own link (kernels without multi-uprobe links).
    fn attach_phase_probe(&self, p: &ProbeSpec, pid: i32) -> Result<Link> {
        let progs = &self.skel.progs;
        let stand_in = self.stand_in(p.program, p.cookie)?;
        let prog = match &stand_in {
            Some(prog) => prog,
            None => match p.program {
                Uprobe::PhaseEnter => &progs.uprobe__phase_enter,
                Uprobe::PhaseExit => &progs.uretprobe__phase_exit,
                Uprobe::GoPhaseEnter => &progs.uprobe__go_phase_enter,
                Uprobe::GoPhaseReturn => &progs.uprobe__go_phase_return,
                Uprobe::PhaseLeave => &progs.uprobe__phase_leave,
                Uprobe::GoPhaseLeave => &progs.uprobe__go_phase_leave,
                Uprobe::GoSched => &progs.uprobe__go_sched,
                other => bail!("{other:?} is not a phase probe ({})", p.what),
            },
        };
        let opts = libbpf_rs::UprobeOpts {
            // Without cookies the program stands for its cookie (libbpf refuses one it
            // cannot set).
            cookie: if self.features.attach_cookie {
                p.cookie
            } else {
                0
            },
            retprobe: p.program.retprobe(),
            ..Default::default()
        };
        prog.attach_uprobe_with_opts(pid, &p.path, p.offset as usize, opts)
            .with_context(|| format!("attaching the {} in {}", p.what, p.path.display()))
    }

    /// Whether phase probes go on multi-uprobe links (Linux 6.6, with cookies): one per program
    /// and file, which attach and detach (a phase budget's slices) all at once.
    pub fn phase_links_multi(&self) -> bool {
        self.features.uprobe_multi && self.features.attach_cookie
    }

    /// Attaches phase probes on one multi-uprobe link per program and file.
    fn attach_phase_probes_multi(&self, probes: &[ProbeSpec], pid: i32) -> Result<Vec<Link>> {
        let progs = &self.skel.progs;
        let groups = by_program_and_file(probes);
        let mut links = Vec::with_capacity(groups.len());
        for ((program, path), sites) in groups {
            let prog = match program {
                Uprobe::PhaseEnter => &progs.uprobe__phase_enter_multi,
                Uprobe::PhaseExit => &progs.uretprobe__phase_exit_multi,
                Uprobe::GoPhaseEnter => &progs.uprobe__go_phase_enter_multi,
                Uprobe::GoPhaseReturn => &progs.uprobe__go_phase_return_multi,
                Uprobe::PhaseLeave => &progs.uprobe__phase_leave_multi,
                Uprobe::GoPhaseLeave => &progs.uprobe__go_phase_leave_multi,
                Uprobe::GoSched => &progs.uprobe__go_sched_multi,
                other => bail!("{other:?} is not a phase probe"),
            };
            links.push(sites.attach(prog, program, pid, path, "phase probes")?);
        }
        Ok(links)
    }

    /// Attaches allocator probes for process `pid` only (a uprobe with a pid filter is
    /// installed in that process's memory alone, so other users of the same libc never trap).
    /// Calls already inside an allocator are not waited for after a re-attach.
    pub fn attach_alloc(&mut self, pid: u32, probes: &[ProbeSpec]) -> Result<()> {
        self.bump_alloc_generation();
        self.probe_resumes.add(probes);
        let progs = &self.skel.progs;
        let mut links = Vec::new();
        let mut uprobes = Vec::with_capacity(probes.len());
        for p in probes {
            if p.program == Uprobe::GoAllocSample {
                if let Some(why) = self.features.cannot(Needs::GoAlloc) {
                    bail!("{why} ({} in {})", p.what, p.path.display());
                }
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
            uprobes.push(p);
        }
        // One multi-uprobe link per (program, file): its offsets and their cookies.
        let groups = by_program_and_file(uprobes);
        if !(self.features.uprobe_multi && self.features.attach_cookie) {
            // One uprobe per function (kernels before uprobe_multi links).
            for (&(program, path), sites) in &groups {
                for (offset, cookie) in sites.each() {
                    links.push(self.attach_alloc_one(pid, program, path, offset, cookie)?);
                }
            }
            self.alloc_links.entry(pid).or_default().extend(links);
            return Ok(());
        }
        for ((program, path), sites) in groups {
            let prog = match program {
                Uprobe::Free => &progs.uprobe__free,
                Uprobe::AllocEnter => &progs.uprobe__alloc_enter,
                Uprobe::AllocExit => &progs.uretprobe__alloc_exit,
                other => bail!("{other:?} is not an allocator probe"),
            };
            let what = format!("allocator probes (pid {pid})");
            links.push(sites.attach(prog, program, pid as i32, path, &what)?);
        }
        self.alloc_links.entry(pid).or_default().extend(links);
        Ok(())
    }

    /// On kernels without attach cookies, the loaded program that stands for `program` with
    /// `cookie`; None where the kernel has cookies or `program` needs none there.
    fn stand_in(&self, program: Uprobe, cookie: u64) -> Result<Option<libbpf_rs::ProgramMut<'_>>> {
        if self.features.attach_cookie {
            return Ok(None);
        }
        let Some(name) = program_for_cookie(program, cookie) else {
            return Ok(None);
        };
        let prog = self
            .skel
            .object()
            .progs_mut()
            .find(|p| p.name() == name.as_str());
        prog.map(Some)
            .with_context(|| format!("no program {name} loaded"))
    }

    /// One allocator probe on its own link (kernels without uprobe_multi links); without attach
    /// cookies, the entry program of the allocator's kind stands for the cookie.
    fn attach_alloc_one(
        &self,
        pid: u32,
        program: Uprobe,
        path: &std::path::Path,
        offset: usize,
        cookie: u64,
    ) -> Result<libbpf_rs::Link> {
        let progs = &self.skel.progs;
        let cookies = self.features.attach_cookie;
        let stand_in = self.stand_in(program, cookie)?;
        let prog = match &stand_in {
            Some(prog) => prog,
            None => match program {
                Uprobe::Free => &progs.uprobe__free_one,
                Uprobe::AllocEnter => &progs.uprobe__alloc_enter_one,
                Uprobe::AllocExit => &progs.uretprobe__alloc_exit_one,
                other => bail!("{other:?} is not an allocator probe"),
            },
        };
        let opts = libbpf_rs::UprobeOpts {
            cookie: if cookies { cookie } else { 0 },
            retprobe: program.retprobe(),
            ..Default::default()
        };
        prog.attach_uprobe_with_opts(pid as i32, path, offset, opts)
            .with_context(|| {
                format!(
                    "attaching an allocator probe in {} at {offset:#x} (pid {pid})",
                    path.display()
                )
            })
    }

    /// Detaches the allocator probes of every target (duty cycling), keeping the rest. Their
    /// breakpoints go at once; the wait for the kernel's grace periods (~100 ms a probe here)
    /// is a thread's, not the recording's, and is not counted as time attached.
    pub fn detach_alloc(&mut self) {
        let links: Vec<Link> = self.alloc_links.drain().flat_map(|(_, l)| l).collect();
        drop(retire(links));
    }

    /// Pauses (or resumes) allocation counting without detaching: duty cycling counts only
    /// while every probe is in force.
    pub fn pause_alloc(&mut self, paused: bool) {
        let ptr: *mut bool = &mut self.bss().alloc_paused;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, paused) };
    }

    fn bump_alloc_generation(&mut self) {
        let ptr: *mut u32 = &mut self.bss().alloc_generation;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, std::ptr::read_volatile(ptr).wrapping_add(1)) };
    }
}

/// Retires uprobes off the calling thread, all at once: each waits for its own grace period.
pub(super) fn retire(links: Vec<Link>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let threads: Vec<_> = links
            .into_iter()
            .map(|l| std::thread::spawn(move || drop(l)))
            .collect();
        for t in threads {
            let _ = t.join();
        }
    })
}
