//! The syscall programs (raw_tp sys_enter/sys_exit) duty-cycled (`--syscall-budget`): attached
//! for a slice, detached between slices. The kernel counts a syscall only when its entry and
//! its exit both fell inside one slice: user space bumps `syscall_generation` at each slice's
//! start and end, and a syscall that entered under another generation is voided at its exit.
use anyhow::{Context, Result};
use libbpf_rs::Link;
use phaseprof_bpf::types;

use super::Engine;

/// The syscall programs' links.
#[derive(Default)]
pub(super) struct SyscallLinks {
    pub links: Vec<Link>,
    /// Duty-cycled: the programs are attached only during slices.
    pub sliced: bool,
    /// Counting is paused (between a duty cycle's slices).
    pub paused: bool,
}

impl Engine<'_> {
    /// From now on (call before `attach`) the syscall programs are attached only between
    /// `start_syscall_slice` and `end_syscall_slice`.
    pub fn slice_syscalls(&mut self) {
        self.syscall_links.sliced = true;
        let ptr: *mut bool = &mut self.bss().syscalls_sliced;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, true) };
        self.set_syscalls_paused(true);
    }

    /// Attaches the syscall programs for a slice, paused: counting starts at
    /// `count_syscalls(true)`.
    pub fn start_syscall_slice(&mut self) -> Result<()> {
        let links = self.attach_syscall_programs()?;
        self.syscall_links.links = links;
        Ok(())
    }

    /// Starts or stops counting at a slice's edge, at once: syscalls in flight there are void.
    pub fn count_syscalls(&mut self, on: bool) {
        if on {
            self.bump_syscall_generation();
            self.set_syscalls_paused(false);
        } else {
            self.set_syscalls_paused(true);
            self.bump_syscall_generation();
        }
    }

    /// Ends a slice: counting stops (if `count_syscalls(false)` did not stop it already), then
    /// the programs are detached, on this thread: a raw tracepoint's detach waits for no grace
    /// period, and one still pending when the next slice attaches the same program again is
    /// refused (EEXIST, 5.10).
    pub fn end_syscall_slice(&mut self) {
        self.set_syscalls_paused(true);
        self.syscall_links.links.clear();
    }

    /// Under a syscall budget: the syscalls counted so far, and those a slice's edge cut.
    pub fn syscalls_counted(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::SYSCALLS_COUNTED)
    }

    pub fn syscalls_voided(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::SYSCALLS_VOIDED)
    }

    /// What the syscalls counted so far added to the targets' read and write syscalls (as
    /// /proc/PID/io counts them).
    pub fn io_syscalls_counted(&self) -> Result<u64> {
        self.probe_hits(types::probe_counter::IO_SYSCALLS_COUNTED)
    }

    pub(super) fn attach_syscall_programs(&self) -> Result<Vec<Link>> {
        let progs = &self.skel.progs;
        let enter = (progs.raw_tp__sys_enter.attach()).context("attaching raw_tp/sys_enter")?;
        let exit = (progs.raw_tp__sys_exit.attach()).context("attaching raw_tp/sys_exit")?;
        Ok(vec![enter, exit])
    }

    /// Under a phase budget, while the syscall programs count (attached, not paused): what
    /// the syscalls that entered while phases counted added to the targets' read and write
    /// syscalls (as /proc/PID/io counts them). None while they do not count.
    pub fn io_syscalls_in_phase_slices(&self) -> Result<Option<u64>> {
        if self.syscall_links.links.is_empty() || self.syscall_links.paused {
            return Ok(None);
        }
        self.probe_hits(types::probe_counter::IO_SYSCALLS_IN_PHASE_SLICES)
            .map(Some)
    }

    fn set_syscalls_paused(&mut self, paused: bool) {
        self.syscall_links.paused = paused;
        let ptr: *mut bool = &mut self.bss().syscalls_paused;
        // SAFETY: as in slice_syscalls.
        unsafe { std::ptr::write_volatile(ptr, paused) };
    }

    fn bump_syscall_generation(&mut self) {
        let ptr: *mut u32 = &mut self.bss().syscall_generation;
        // SAFETY: as in slice_syscalls.
        unsafe { std::ptr::write_volatile(ptr, std::ptr::read_volatile(ptr).wrapping_add(1)) };
    }
}
