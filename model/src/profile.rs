//! The profile itself: metadata, interned frames and stacks, samples per event kind.
use std::collections::BTreeMap;

pub use crate::kinds::{EventKind, SampleKind};
use crate::unwind_info::UnwindInfo;
use serde::{Deserialize, Serialize};

use crate::lost::Lost;
use crate::phase_stats::PhaseStats;
use crate::probe_cost::{OwnSamples, MIN_OWN_SAMPLES, UPROBE_PROBES_FRAME};

/// Phase index 0: events on a thread that was in no probed phase.
pub const PHASE_NONE: u32 = 0;
/// The display name of [`PHASE_NONE`].
pub const PHASE_NONE_NAME: &str = "(none)";

/// Where a frame's code lives.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    User,
    Kernel,
    /// Not code: a label phaseprof adds, such as the syscall a stack ended in.
    Synthetic,
}

/// One symbolized frame. Frames are interned: samples refer to them by index.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frame {
    /// Demangled function name, or `module+0xoffset` when it could not be symbolized.
    pub function: String,
    /// File name of the ELF object (`libc.so.6`, `validator-sim`), or `[kernel]`.
    pub module: String,
    pub kind: FrameKind,
    /// True for a function inlined into the frame below it (same machine address). Written
    /// only when true: most frames are not, and a window has thousands.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inlined: bool,
}

/// A frame as a window being ingested reads it: its names borrowed from the decoded bytes where
/// the encoding allows (MessagePack always does; JSON without escapes), since the collector
/// stores most names once and only hashes them afterwards (copying each cost ingest about a
/// twentieth of its CPU time).
#[derive(Deserialize, Debug)]
pub struct BorrowedFrame<'a> {
    #[serde(borrow)]
    pub function: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub module: std::borrow::Cow<'a, str>,
    pub kind: FrameKind,
    #[serde(default)]
    pub inlined: bool,
}

/// A frame's names and kind, however it was decoded.
pub trait FrameFields {
    fn function(&self) -> &str;
    fn module(&self) -> &str;
    fn kind(&self) -> FrameKind;
    fn inlined(&self) -> bool;
}

// The same fields by the same names in both frame types: one body for the two.
macro_rules! frame_fields {
    ($($t:ty),+) => {$(
        impl FrameFields for $t {
            fn function(&self) -> &str {
                &self.function
            }
            fn module(&self) -> &str {
                &self.module
            }
            fn kind(&self) -> FrameKind {
                self.kind
            }
            fn inlined(&self) -> bool {
                self.inlined
            }
        }
    )+};
}

frame_fields!(Frame, BorrowedFrame<'_>);

/// A call stack as frame indices, leaf first (as pprof orders them).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stack {
    #[serde(deserialize_with = "crate::window_limits::stack_frames")]
    pub frames: Vec<u32>,
}

/// A mapped file that frames come from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ModuleInfo {
    /// Its path as the target mapped it.
    pub path: String,
    /// GNU build ID, hex.
    pub build_id: Option<String>,
    /// The executable mapping: start and end address, and the file offset of its start.
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}

/// Metadata about what was recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Meta {
    /// Processes recorded (tgids), in the order they became targets.
    pub pids: Vec<u32>,
    /// `comm` of the first target.
    pub comm: String,
    /// Executable path of the first target.
    pub exe: String,
    /// GNU build id of that executable, hex.
    pub build_id: Option<String>,
    /// The command phaseprof started (`record -- CMD`), empty when attaching.
    #[serde(default)]
    pub command: Vec<String>,
    pub host: String,
    /// `uname -r` of the recording machine.
    pub kernel: String,
    /// What this kernel's BPF could run, by feature: `yes`, or what was used instead and why
    /// (`per-function uprobes: uprobe_multi links need Linux 6.6`), or `no: …`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_features: BTreeMap<String, String>,
    pub arch: String,
    /// Wall-clock start and end of the recording, ns since the Unix epoch.
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub events: Vec<EventKind>,
    /// cpu-clock sampling frequency.
    pub frequency_hz: u64,
    /// Whether syscall samples carry user stacks.
    pub syscall_stacks: bool,
    /// One syscall in this many per thread carried its stack (1: every one; 0: unknown, an
    /// older recording: every one). The others are counted without one (`stack: None`) and
    /// spread over the sampled stacks of the same process, phase and syscall when shown.
    #[serde(default)]
    pub syscall_stack_every: u64,
    /// With sampled stacks, each thread's one-in-N grew so that it walked no more stacks a
    /// second than this (0: N stayed `syscall_stack_every`).
    #[serde(default)]
    pub syscall_stack_walks_per_sec: u64,
    /// Off-CPU stacks were sampled: each thread walked at most this many a second; the time of
    /// its other switch-outs went to the stacks sampled for the same thread and phase in the
    /// same window, by their weights (0: every switch-out's stack).
    #[serde(default)]
    pub offcpu_stack_walks_per_sec: u64,
    /// Of the off-CPU time, what had a stack of its own (the rest was spread; see above).
    #[serde(default)]
    pub offcpu_own_stack_ns: u64,
    /// Thread names seen, by tid.
    #[serde(default)]
    pub threads: BTreeMap<u32, String>,
    /// The files frames name as their module, by that name: where each was found and mapped
    /// (the first mapping seen), for exports that carry mappings (pprof).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, ModuleInfo>,
    /// Everything else worth knowing, for people (the version of phaseprof …): nothing reads
    /// a note back; what is read back has a field of its own.
    #[serde(default)]
    pub notes: BTreeMap<String, String>,
    /// The targets' CPU time while recorded, which says how many cpu samples the recording
    /// should hold (None: unknown, a target gone before it could be asked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_cpu_ns: Option<u64>,
    /// Of that time, the ns the scheduler's programs ran at switches to the targets (the kernel
    /// charges them to the thread switched in) and at wakeups the targets made, with interrupts
    /// off: no cpu sample sees them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub switch_probe_ns: u64,
    /// And the ns the cpu sampling program ran on the targets' CPU (an interrupt of the target
    /// sampled, which no other sample sees; a kernel that accounts interrupt time apart charges
    /// it to no one, but the node pays it all the same).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub sample_probe_ns: u64,
    /// phaseprof's whole cost measured in the targets: their CPU time per unit of work before
    /// it attached and while it recorded (None: not measured; see `targets_slowdown`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets_slowdown: Option<crate::TargetsSlowdown>,
    /// Addresses named `file+offset` because their names came after their window was taken.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub names_late: u64,
    /// The phase probes' estimated cost to the targets over the recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_probes: Option<PhaseProbeCost>,
    /// Phases recorded under a budget: how much was counted (None: exact, probes always on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase_budget: Option<crate::BudgetInfo>,
    /// Syscalls recorded under a budget: how much was counted (None: exact, always counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall_budget: Option<crate::BudgetInfo>,
    /// How allocations were recorded, when they were.
    #[serde(default)]
    pub alloc: Option<AllocInfo>,
    /// How user stacks of cpu samples and page faults were walked, when those were recorded.
    #[serde(default)]
    pub unwind: Option<UnwindInfo>,
    /// Labels a fleet agent attaches to its windows (`host`, `service`, `version`, `build_id`,
    /// and the user's own), by which the collector selects and merges them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Meta {
    /// Recordings made before these were fields carried them as notes: moved where they are
    /// read now.
    pub fn upgrade_notes(&mut self) {
        let mut take = |key: &str| self.notes.remove(key)?.parse::<u64>().ok();
        let cpu = take("targets_cpu_ns");
        let late = take("names_late");
        self.targets_cpu_ns = self.targets_cpu_ns.or(cpu);
        self.names_late = self.names_late.max(late.unwrap_or(0));
    }
}

/// What the phase probes cost the targets, estimated from the kernel's counts and the measured
/// cost of each probe hit.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
pub struct PhaseProbeCost {
    /// Phase calls (an entry and an exit each).
    pub calls: u64,
    /// Go scheduler switch-point hits (goroutine phases).
    pub switch_hits: u64,
    /// The probes' estimated time.
    pub probe_ns: u64,
    /// The targets' CPU time meanwhile, the probes' included (0: unknown, the targets gone).
    pub target_cpu_ns: u64,
}

impl PhaseProbeCost {
    /// The probes' cost measured from `own` of `all` cpu samples taken in them (see
    /// `Profile::own_samples`, its uprobes), in words: the share of the targets' CPU time, with its
    /// binomial standard error, and the model's figure beside it. The model alone with too few
    /// samples or without the targets' CPU time.
    pub fn describe_measured(&self, sampled: (u64, u64)) -> String {
        let Some((ns, err)) = self.measured(sampled) else {
            return self.describe(None);
        };
        let (own, all) = sampled;
        let mut out = format!("{:.0} calls", self.calls);
        if self.switch_hits > 0 {
            out += &format!(" and {} goroutine switch-point hits", self.switch_hits);
        }
        out += &format!(
            "; every probe of phaseprof took {:.1} ± {:.1} ms, {:.2}% of the target's CPU time \
             (measured: {own} of {all} cpu samples in {UPROBE_PROBES_FRAME}); hits × cost per hit \
             would say {:.1} ms",
            ns / 1e6,
            err / 1e6,
            100.0 * own as f64 / all as f64,
            self.probe_ns as f64 / 1e6
        );
        out
    }

    /// The probes' time in ns measured from `own` of `all` cpu samples taken in them, and its
    /// binomial standard error: None with too few samples or without the targets' CPU time.
    pub fn measured(&self, (own, all): (u64, u64)) -> Option<(f64, f64)> {
        if own < MIN_OWN_SAMPLES {
            return None;
        }
        let samples = OwnSamples {
            uprobes: own,
            all,
            ..OwnSamples::default()
        };
        samples.measured(own, self.target_cpu_ns)
    }

    /// In words, as totals, or as rates over `secs`.
    pub fn describe(&self, secs: Option<f64>) -> String {
        let (per, unit) = match secs {
            Some(s) => (1.0 / s.max(1e-9), "/s"),
            None => (1.0, ""),
        };
        let mut out = format!("{:.0} calls{unit}", self.calls as f64 * per);
        if self.switch_hits > 0 {
            out += &format!(
                " and {:.0} goroutine switch-point hits{unit}",
                self.switch_hits as f64 * per
            );
        }
        out += &format!(
            ", estimated probe time {:.1} ms",
            self.probe_ns as f64 / 1e6
        );
        // The measured CPU time includes the probes'. A target that has exited has no CPU time
        // to read any more: then only the probes' time is said.
        if self.target_cpu_ns > 0 {
            let share = (self.probe_ns as f64 / self.target_cpu_ns as f64).min(1.0);
            out += &format!(", {:.2}% of the target's CPU time", 100.0 * share);
        }
        out
    }
}

/// How allocations were recorded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct AllocInfo {
    /// Stacks were sampled once per this many bytes (1: every allocation).
    pub sample_bytes: u64,
    /// Where each allocator probe went (function, offset, instruction, emulated or not).
    pub probes: Vec<String>,
    /// Probes were duty-cycled to stay within this slowdown (0.01 = 1%); None: always on.
    pub budget: Option<f64>,
    /// Fraction of the recording the probes were attached (1 without a budget). Totals and
    /// stacks were scaled up by its inverse.
    pub attached_fraction: f64,
    /// Estimated slowdown of the target while the probes were attached.
    pub estimated_overhead: f64,
    /// The cost of a probe hit those estimates (and a budget's extrapolation) used, in ns,
    /// and whether it was measured while recording (else assumed).
    #[serde(default)]
    pub ns_per_hit: f64,
    #[serde(default)]
    pub ns_per_hit_measured: bool,
    /// Go targets: allocations are Go's own heap-profile samples, weighed by its rate, so
    /// totals are estimates.
    pub go_sampled: bool,
    /// Under a budget: the targets' read and write syscalls while allocations were counted,
    /// and in all (the kernel's per-process counts), which the totals are extrapolated by
    /// when they err less than the targets' own CPU time (see `slice_basis`).
    #[serde(default)]
    pub syscalls_in_slices: u64,
    #[serde(default)]
    pub syscalls: u64,
    /// Under a budget: the targets' own CPU time (the probes' estimated time left out) while
    /// allocations were counted, in ns.
    #[serde(default)]
    pub counted_own_ns: u64,
}

impl AllocInfo {
    /// What a budget's totals were extrapolated by.
    pub fn basis(&self) -> crate::slice_basis::Basis {
        let io = crate::slice_basis::Io {
            syscalls_in_slices: self.syscalls_in_slices,
            syscalls: self.syscalls,
            ..Default::default()
        };
        crate::slice_basis::basis(&io, self.estimated_overhead, self.counted_own_ns)
    }
}

/// Events of one key: (kind, process, thread, innermost phase, phase set, stack, syscall),
/// with the kind's values (see `kinds`: their names, units and how they sum).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub kind: SampleKind,
    pub pid: u32,
    /// The thread; 0 for kinds counted per process (allocations), and in a store's merged
    /// views, which sum threads.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack when it happened (bit i: phase i; bit 0 alone: none).
    pub phase_mask: u64,
    /// None for a kind without stacks, or a syscall counted without its stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
    /// The syscall number (syscall samples; 0 for the others).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub nr: u32,
    /// The kind's values, in the order `kinds` lists them (missing ones are 0).
    #[serde(deserialize_with = "crate::window_limits::sample_values")]
    pub values: Vec<u64>,
}

fn is_zero32(n: &u32) -> bool {
    *n == 0
}

impl Sample {
    /// Value `i` (0 when the sample has fewer).
    pub fn value(&self, i: usize) -> u64 {
        self.values.get(i).copied().unwrap_or(0)
    }

    /// The syscall's name (syscall samples).
    pub fn syscall_name(&self) -> String {
        crate::syscall_name(self.nr)
    }
}

/// A recorded profile. See the crate docs and `FORMAT.md`. Its frames are `Frame`s but for a
/// window the collector ingests (`BorrowedFrame`, see `read_window_limited`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(bound(deserialize = "F: Deserialize<'de>"))]
pub struct Profile<F = Frame> {
    pub meta: Meta,
    #[serde(deserialize_with = "crate::window_limits::items")]
    pub frames: Vec<F>,
    #[serde(deserialize_with = "crate::window_limits::items")]
    pub stacks: Vec<Stack>,
    /// Phase names by index; index 0 is always `(none)`.
    #[serde(deserialize_with = "crate::window_limits::items")]
    pub phases: Vec<String>,
    /// Every sample, of every kind.
    #[serde(default, deserialize_with = "crate::window_limits::items")]
    pub samples: Vec<Sample>,
    /// Exact per-phase totals by phase index (inclusive of nested phases); empty without phases.
    #[serde(default, deserialize_with = "crate::window_limits::items")]
    pub phase_stats: Vec<PhaseStats>,
    /// Named costs over the whole recording that are computed from stacks (`event = "alloc"`).
    #[serde(default)]
    pub costs: BTreeMap<String, u64>,
    pub lost: Lost,
}

/// The most phases one recording can have, `(none)` included: phase masks are 64 bits wide.
pub const MAX_WINDOW_PHASES: usize = 64;

impl<F> Default for Profile<F> {
    fn default() -> Self {
        Profile {
            meta: Meta::default(),
            frames: Vec::new(),
            stacks: Vec::new(),
            phases: Vec::new(),
            samples: Vec::new(),
            phase_stats: Vec::new(),
            costs: BTreeMap::new(),
            lost: Lost::default(),
        }
    }
}

impl<F> Profile<F> {
    /// Checks that every index points where it must (stacks at frames, samples at stacks and
    /// phases) and that the time range is ordered: a profile from the network is checked before
    /// anything else reads it, since a bad index would otherwise panic later.
    pub fn validate(&self) -> Result<(), String> {
        // Phase masks are 64 bits wide: a recording has at most 64 phases ((none) included).
        if self.phases.len() > MAX_WINDOW_PHASES || self.phase_stats.len() > MAX_WINDOW_PHASES {
            return Err(format!(
                "{} phases; a recording has at most {MAX_WINDOW_PHASES} (the width of its phase masks)",
                self.phases.len().max(self.phase_stats.len())
            ));
        }
        let nframes = self.frames.len();
        for (i, s) in self.stacks.iter().enumerate() {
            if let Some(f) = s.frames.iter().find(|&&f| f as usize >= nframes) {
                return Err(format!(
                    "stack {i} refers to frame {f}, but there are {nframes} frames"
                ));
            }
        }
        let nstacks = self.stacks.len();
        let nphases = self.phases.len().max(1);
        for (i, s) in self.samples.iter().enumerate() {
            let spec = s.kind.spec();
            if let Some(st) = s.stack.filter(|&st| st as usize >= nstacks) {
                return Err(format!(
                    "{} sample {i} refers to stack {st}, but there are {nstacks} stacks",
                    spec.name
                ));
            }
            if s.phase as usize >= nphases {
                return Err(format!(
                    "{} sample {i} refers to phase {}, but there are {nphases} phases",
                    spec.name, s.phase
                ));
            }
            if s.values.len() > spec.values.len() {
                return Err(format!(
                    "{} sample {i} has {} values; the kind has {}",
                    spec.name,
                    s.values.len(),
                    spec.values.len()
                ));
            }
        }
        if !self.phase_stats.is_empty() && self.phase_stats.len() != self.phases.len() {
            return Err(format!(
                "{} phase totals for {} phases",
                self.phase_stats.len(),
                self.phases.len()
            ));
        }
        if self.meta.end_unix_ns < self.meta.start_unix_ns {
            return Err("the recording ends before it starts".into());
        }
        Ok(())
    }
}

impl Profile {
    /// Whether the phase numbers are complete, and if not by how much and why (see
    /// [`Lost::describe_phases`]). A recording that attached to running processes adds what
    /// no counter can show: a native call already running when the probes went in has no
    /// return probe (a uretprobe is armed at the entry), so it is neither counted nor charged.
    pub fn describe_phases(&self) -> String {
        let mut text = self.lost.describe_phases();
        if self.meta.command.is_empty() {
            text += "; native calls already running when phaseprof attached are not seen";
        }
        text
    }

    pub fn duration_ns(&self) -> u64 {
        self.meta
            .end_unix_ns
            .saturating_sub(self.meta.start_unix_ns)
    }

    pub fn phase_name(&self, phase: u32) -> &str {
        self.phases
            .get(phase as usize)
            .map(String::as_str)
            .unwrap_or(PHASE_NONE_NAME)
    }

    /// The index of phase `name`, if the profile has it.
    pub fn phase_index(&self, name: &str) -> Option<u32> {
        if name == PHASE_NONE_NAME {
            return Some(PHASE_NONE);
        }
        self.phases.iter().position(|p| p == name).map(|i| i as u32)
    }

    pub fn recorded(&self, kind: EventKind) -> bool {
        self.meta.events.contains(&kind)
    }

    /// The samples of `kind`.
    pub fn samples_of(&self, kind: SampleKind) -> impl Iterator<Item = &Sample> + '_ {
        self.samples.iter().filter(move |s| s.kind == kind)
    }

    /// Off-CPU time recorded with a stack of its own: under `--offcpu-stacks sampled`, the rest
    /// was spread over the sampled stacks of its thread and phase.
    pub fn offcpu_with_stack_ns(&self) -> u64 {
        match self.meta.offcpu_stack_walks_per_sec {
            0 => self.total(SampleKind::Offcpu, crate::kinds::OFFCPU_NS),
            _ => self.meta.offcpu_own_stack_ns,
        }
    }

    /// The sum of value `i` over the samples of `kind` (saturating).
    pub fn total(&self, kind: SampleKind, i: usize) -> u64 {
        crate::saturating_sum(self.samples_of(kind).map(|s| s.value(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the probes' cost measured from cpu samples: 97 of 107 samples of 1,063.6 ms of CPU
    // time are 964.2 ms ± 29.9 (binomial standard error); with fewer than 10 samples in the
    // tower, the model's figure alone is said.
    #[test]
    fn probe_cost_is_measured_from_the_samples_in_the_tower() {
        let cost = PhaseProbeCost {
            calls: 96_020,
            switch_hits: 783,
            probe_ns: 1_729_534_500,
            target_cpu_ns: 1_063_587_282,
        };
        let (ns, err) = cost.measured((97, 107)).unwrap();
        assert_eq!(((ns / 1e5).round(), (err / 1e5).round()), (9642.0, 299.0));
        let line = cost.describe_measured((97, 107));
        assert!(line.contains("took 964.2 ± 29.9 ms, 90.65%"), "{line}");
        assert!(line.contains("would say 1729.5 ms"), "{line}");
        assert_eq!(cost.measured((9, 107)), None);
        assert!(cost
            .describe_measured((9, 107))
            .contains("estimated probe time"));
    }

    // Checks the cap on phases at validation: a window of 100,000 phases (a hostile upload that
    // made every merge quadratic) is refused; 64 are fine.
    #[test]
    fn windows_have_at_most_64_phases() {
        let mut p: Profile = Profile {
            phases: (0..100_000).map(|i| format!("p{i}")).collect(),
            ..Profile::default()
        };
        let err = p.validate().unwrap_err();
        assert!(err.contains("at most 64"), "{err}");
        p.phases.truncate(MAX_WINDOW_PHASES);
        assert!(p.validate().is_ok());
    }
}
