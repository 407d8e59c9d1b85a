//! Folded stacks and flamegraph SVGs for phaseprof profiles.
//!
//! Folded output is `root;…;leaf VALUE` per line, as inferno and flamegraph.pl read it; the SVG
//! is rendered by inferno with a title naming the event kind, its unit and the target.

use std::collections::BTreeMap;
use std::io::Write;

use phaseprof_model::{EventKind, Profile};

#[derive(Debug, thiserror::Error)]
pub enum FlamegraphError {
    #[error("the profile has no {0} events: it was recorded without `--events {0}`")]
    NotRecorded(EventKind),
    #[error("no {kind} stacks to draw{}", phase.as_ref().map(|p| format!(" in phase `{p}`")).unwrap_or_default())]
    Empty {
        kind: EventKind,
        phase: Option<String>,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Which stacks of a profile to fold.
#[derive(Clone, Debug)]
pub struct Selection {
    pub kind: EventKind,
    /// Only stacks recorded in this phase (by index).
    pub phase: Option<u32>,
}

/// Folded lines (`root;…;leaf VALUE`), one per distinct stack, sorted so output is stable.
pub fn folded_lines(profile: &Profile, sel: &Selection) -> Result<Vec<String>, FlamegraphError> {
    if !profile.recorded(sel.kind) {
        return Err(FlamegraphError::NotRecorded(sel.kind));
    }
    let mut summed: BTreeMap<String, u64> = BTreeMap::new();
    for w in profile.weighted_stacks(sel.kind, sel.phase) {
        if w.value == 0 {
            continue;
        }
        // `;` separates frames in the folded format: keep it out of names.
        let names: Vec<String> = profile
            .names_root_first(&w)
            .into_iter()
            .map(|n| n.replace(';', ":"))
            .collect();
        *summed.entry(names.join(";")).or_default() += w.value;
    }
    Ok(summed
        .into_iter()
        .map(|(stack, v)| format!("{stack} {v}"))
        .collect())
}

pub fn write_folded(
    profile: &Profile,
    sel: &Selection,
    mut out: impl Write,
) -> Result<(), FlamegraphError> {
    for line in folded_lines(profile, sel)? {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The title of a graph: event kind, unit, target and phase.
pub fn title(profile: &Profile, sel: &Selection) -> String {
    let m = &profile.meta;
    let target = if m.pids.len() == 1 {
        format!("{} (pid {})", m.comm, m.pids[0])
    } else {
        format!("{} ({} processes)", m.comm, m.pids.len())
    };
    let phase = sel
        .phase
        .map(|p| format!(", phase {}", profile.phase_name(p)))
        .unwrap_or_default();
    format!("{} — {} — {target}{phase}", sel.kind, sel.kind.unit())
}

/// Renders an SVG flamegraph of the selected stacks.
pub fn write_svg(
    profile: &Profile,
    sel: &Selection,
    out: impl Write,
) -> Result<(), FlamegraphError> {
    let lines = folded_lines(profile, sel)?;
    if lines.is_empty() {
        return Err(FlamegraphError::Empty {
            kind: sel.kind,
            phase: sel.phase.map(|p| profile.phase_name(p).to_string()),
        });
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title(profile, sel);
    opts.count_name = sel.kind.unit().to_string();
    opts.deterministic = true;
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::*;

    fn profile() -> Profile {
        let mut b = ProfileBuilder::new(
            Meta {
                pids: vec![9],
                comm: "sim".into(),
                events: vec![EventKind::Cpu, EventKind::Syscall],
                ..Meta::default()
            },
            vec![],
        );
        let f = |b: &mut ProfileBuilder, n: &str, kind| {
            b.intern_frame(Frame {
                function: n.into(),
                module: "m".into(),
                kind,
                inlined: false,
            })
        };
        let main = f(&mut b, "main", FrameKind::User);
        let burn = f(&mut b, "burn;x", FrameKind::User);
        let k = f(&mut b, "do_syscall_64", FrameKind::Kernel);
        let s1 = b.intern_stack(vec![burn, main]);
        let s2 = b.intern_stack(vec![k, main]);
        b.add_cpu(9, 9, PhaseAt::NONE, s1, 90);
        b.add_cpu(9, 10, PhaseAt::NONE, s1, 5);
        b.add_cpu(9, 9, PhaseAt::NONE, s2, 5);
        b.add_syscall(9, PhaseAt::NONE, 1, Some(s1), 4, 0);
        b.finish()
    }

    // Checks folded output: root first, threads merged, kernel suffix, `;` escaped, syscall leaf.
    #[test]
    fn folded_is_root_first_and_merged() {
        let p = profile();
        let cpu = folded_lines(
            &p,
            &Selection {
                kind: EventKind::Cpu,
                phase: None,
            },
        )
        .unwrap();
        assert_eq!(cpu, vec!["main;burn:x 95", "main;do_syscall_64_[k] 5"]);
        let sys = folded_lines(
            &p,
            &Selection {
                kind: EventKind::Syscall,
                phase: None,
            },
        )
        .unwrap();
        assert_eq!(sys, vec!["main;burn:x;syscall:write 4"]);
    }

    // Checks that asking for an event kind that was not recorded is an error, not an empty graph.
    #[test]
    fn unrecorded_kind_is_an_error() {
        let err = folded_lines(
            &profile(),
            &Selection {
                kind: EventKind::Offcpu,
                phase: None,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("--events offcpu"), "{err}");
    }

    // Checks that the SVG carries the title with kind, unit and target.
    #[test]
    fn svg_has_title() {
        let mut svg = Vec::new();
        write_svg(
            &profile(),
            &Selection {
                kind: EventKind::Cpu,
                phase: None,
            },
            &mut svg,
        )
        .unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("cpu — samples — sim (pid 9)"));
        assert!(svg.contains("burn:x"));
    }
}
