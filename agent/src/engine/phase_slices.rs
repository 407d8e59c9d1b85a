//! The phase probes duty-cycled (`--phase-budget`): attached for a slice, detached between
//! slices. The kernel counts a call only when its entry and its exit both fell inside one
//! slice, and charges no event to a phase entered in another: user space bumps
//! `phase_generation` at each slice's start and end, and pauses the probes while they are
//! being attached or detached.
use anyhow::Result;
use libbpf_rs::Link;

use super::{attach::retire, Engine, ProbeSpec};

/// The phase probes' links and what re-attaches them.
#[derive(Default)]
pub(super) struct PhaseLinks {
    /// Every phase probe attached so far (kept to re-attach them at each slice).
    pub probes: Vec<ProbeSpec>,
    pub links: Vec<Link>,
    /// Duty-cycled: probes are attached only during slices.
    pub sliced: bool,
    /// A slice is in force.
    pub in_force: bool,
}

impl Engine<'_> {
    /// From now on the phase probes are attached only between `start_phase_slice` and
    /// `end_phase_slice`; none is in force until the first slice.
    pub fn slice_phases(&mut self) {
        self.phase_links.sliced = true;
        self.set_phases_paused(true);
        let ptr: *mut bool = &mut self.bss().phases_sliced;
        // SAFETY: as in set_phases_paused.
        unsafe { std::ptr::write_volatile(ptr, true) };
    }

    /// Attaches the phase probes for a slice, paused: counting starts at `count_phases(true)`,
    /// once every one is in force.
    pub fn start_phase_slice(&mut self) -> Result<()> {
        let probes = std::mem::take(&mut self.phase_links.probes);
        let attached = self.attach_phase_probes(&probes, -1);
        self.phase_links.probes = probes;
        self.phase_links.links.extend(attached?);
        self.phase_links.in_force = true;
        Ok(())
    }

    /// Starts or stops counting at a slice's edge, at once: calls in flight there are void.
    pub fn count_phases(&mut self, on: bool) {
        if on {
            self.bump_phase_generation();
            self.set_phases_paused(false);
        } else {
            self.set_phases_paused(true);
            self.bump_phase_generation();
        }
    }

    /// Ends a slice: counting stops (if `count_phases(false)` did not stop it already), then
    /// the probes are detached (their grace periods waited for off this thread).
    pub fn end_phase_slice(&mut self) {
        self.set_phases_paused(true);
        self.phase_links.in_force = false;
        drop(retire(std::mem::take(&mut self.phase_links.links)));
    }

    /// Attaches `probes` now if phases are not duty-cycled or a slice is in force, and keeps
    /// them for the slices to come.
    pub(super) fn add_phase_probes(&mut self, probes: &[ProbeSpec]) -> Result<()> {
        self.probe_resumes.add(probes);
        if !self.phase_links.sliced || self.phase_links.in_force {
            let links = self.attach_phase_probes(probes, -1)?;
            self.phase_links.links.extend(links);
        }
        self.phase_links.probes.extend_from_slice(probes);
        Ok(())
    }

    fn set_phases_paused(&mut self, paused: bool) {
        let ptr: *mut bool = &mut self.bss().phases_paused;
        // SAFETY: ptr points into the .bss mmap of the loaded object; volatile because BPF
        // programs read it concurrently.
        unsafe { std::ptr::write_volatile(ptr, paused) };
    }

    fn bump_phase_generation(&mut self) {
        let ptr: *mut u32 = &mut self.bss().phase_generation;
        // SAFETY: as in set_phases_paused.
        unsafe { std::ptr::write_volatile(ptr, std::ptr::read_volatile(ptr).wrapping_add(1)) };
    }
}
