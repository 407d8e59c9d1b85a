//! What the kernel side dropped, by reason, and what that means for phase numbers: a profile
//! says "complete" only when nothing that phases depend on was dropped.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the kernel side had to drop, by reason, plus informational counters that are not losses.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Lost {
    /// Events that were not recorded at all (a counter map full, a ring buffer full …).
    pub events: u64,
    /// Events recorded without (part of) their stack.
    pub stacks: u64,
    /// Every drop counter by its name, zero ones included.
    pub by_reason: BTreeMap<String, u64>,
    /// Syscalls already in flight when recording started: their exits are seen, their entries
    /// are not, so they are not counted. Not a loss.
    #[serde(default)]
    pub syscalls_in_flight_at_start: u64,
    /// Returns from phase functions entered before recording started. Not a loss.
    #[serde(default)]
    pub phase_exits_before_start: u64,
}

/// Drop counters after which phase numbers are missing calls or charge events to the wrong
/// phase, with what each means.
const PHASE_DROPS: &[(&str, &str)] = &[
    (
        "phase_depth_exceeded",
        "entries deeper than the 8 nested phases tracked, not counted",
    ),
    (
        "phase_exit_mismatch",
        "returns that were not of the innermost phase (its frame was unwound without returning)",
    ),
    (
        "thread_phases_full",
        "threads whose phases could not be tracked",
    ),
    (
        "goroutine_phases_full",
        "goroutine phase entries that could not be tracked",
    ),
    (
        "phase_unfinished_goroutine_exit",
        "goroutines that ended inside a phase (runtime.Goexit)",
    ),
    (
        INLINED_UNPROBED,
        "inlined copies of phase functions that could not be probed (no single end, or a \
         kernel without attach cookies): their calls are not counted",
    ),
];

/// The phase issue of inlined copies of phase functions that were not probed.
pub const INLINED_UNPROBED: &str = "phase_inlined_copies_unprobed";

impl Lost {
    /// Adds `other`'s drops to these (saturating: a merged count never wraps).
    pub fn absorb(&mut self, other: &Lost) {
        self.events = self.events.saturating_add(other.events);
        self.stacks = self.stacks.saturating_add(other.stacks);
        self.syscalls_in_flight_at_start = self
            .syscalls_in_flight_at_start
            .saturating_add(other.syscalls_in_flight_at_start);
        self.phase_exits_before_start = self
            .phase_exits_before_start
            .saturating_add(other.phase_exits_before_start);
        for (k, v) in &other.by_reason {
            let e = self.by_reason.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events == 0 && self.stacks == 0
    }

    /// Why phase numbers are incomplete, one phrase per cause with its count; empty when every
    /// phase entry was matched with its return. Calls in flight when recording began count
    /// too: their returns were seen without their entries.
    pub fn phase_issues(&self) -> Vec<(String, u64, &'static str)> {
        let mut out: Vec<(String, u64, &'static str)> = PHASE_DROPS
            .iter()
            .filter_map(|(name, what)| {
                let n = self.by_reason.get(*name).copied().unwrap_or(0);
                (n > 0).then(|| (name.to_string(), n, *what))
            })
            .collect();
        if self.phase_exits_before_start > 0 {
            out.push((
                "phase_exits_before_start".into(),
                self.phase_exits_before_start,
                "calls already running when recording began, not counted",
            ));
        }
        out
    }

    /// One line saying whether phase numbers are complete, and if not by how much and why.
    pub fn describe_phases(&self) -> String {
        let issues = self.phase_issues();
        if issues.is_empty() {
            return "complete (every phase entry matched its return)".into();
        }
        let causes: Vec<String> = issues
            .iter()
            .map(|(name, n, what)| format!("{n} {what} [{name}]"))
            .collect();
        format!("INCOMPLETE: {}", causes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that phase numbers are called complete only without any phase drop, and that the
    // sentence names each cause with its count; drops of other kinds do not make phases
    // incomplete.
    #[test]
    fn phases_are_complete_only_without_phase_drops() {
        let mut lost = Lost::default();
        lost.by_reason.insert("phase_depth_exceeded".into(), 0);
        lost.by_reason.insert("user_stack".into(), 5);
        assert!(lost.phase_issues().is_empty());
        assert!(lost.describe_phases().starts_with("complete"));
        lost.by_reason.insert("phase_depth_exceeded".into(), 12);
        lost.phase_exits_before_start = 3;
        let issues = lost.phase_issues();
        assert_eq!(issues.len(), 2);
        let text = lost.describe_phases();
        assert!(text.starts_with("INCOMPLETE: 12 entries deeper"), "{text}");
        assert!(text.contains("[phase_depth_exceeded]"), "{text}");
        assert!(
            text.contains("3 calls already running when recording began"),
            "{text}"
        );
    }
}
