//! Folded stacks and flamegraph SVGs for phaseprof profiles.
//!
//! Folded output is `root;…;leaf VALUE` per line, as inferno and flamegraph.pl read it; the SVG
//! is rendered by inferno with a title naming the event kind, its unit and the target.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use phaseprof_model::threads::GroupBy;
use phaseprof_model::{EventKind, Profile, Weighted};

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
    /// One tree per process or thread, under a root frame naming it.
    pub group: Option<GroupBy>,
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
        let root = sel.group.map(|g| g.root_frame(profile, &w));
        let names: Vec<String> = root
            .into_iter()
            .chain(profile.names_root_first(&w))
            .map(|n| phaseprof_model::folded_frame_name(&n))
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

/// How a graph is drawn.
#[derive(Clone, Debug)]
pub struct GraphOptions {
    /// Root at the top, growing down (an icicle graph) instead of a flame.
    pub icicle: bool,
    /// Stacks worth less than this share of the total are folded into their nearest ancestor
    /// that is worth it (shown as `[pruned]`), so huge profiles render fast and stay small.
    pub prune_below: f64,
    /// Frames narrower than this many pixels are not drawn.
    pub min_width_px: f64,
}

impl Default for GraphOptions {
    fn default() -> Self {
        GraphOptions {
            icicle: false,
            prune_below: 0.0001,
            min_width_px: 0.1,
        }
    }
}

/// The frame that stands for the pruned stacks below a frame.
pub const PRUNED: &str = "[pruned]";

/// Folds stacks worth less than `below` of the total into their deepest ancestor worth at least
/// that much, under a `[pruned]` leaf. Input and output are folded lines; totals are kept.
pub fn prune(lines: &[String], below: f64) -> Vec<String> {
    let parsed: Vec<(&str, u64)> = lines
        .iter()
        .filter_map(|l| {
            let (stack, v) = l.rsplit_once(' ')?;
            Some((stack, v.parse().ok()?))
        })
        .collect();
    let total: u64 = parsed.iter().map(|(_, v)| v).sum();
    let threshold = (total as f64 * below).ceil() as u64;
    if threshold <= 1 {
        return lines.to_vec();
    }
    // Value of every prefix (every node of the tree).
    let mut node: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (stack, v) in &parsed {
        for (i, _) in stack.match_indices(';') {
            *node.entry(&stack[..i]).or_default() += v;
        }
        *node.entry(stack).or_default() += v;
    }
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (stack, v) in parsed {
        if node[stack] >= threshold {
            *out.entry(stack.to_string()).or_default() += v;
            continue;
        }
        let keep = stack
            .match_indices(';')
            .map(|(i, _)| &stack[..i])
            .take_while(|prefix| node[prefix] >= threshold)
            .last();
        let folded = match keep {
            Some(prefix) => format!("{prefix};{PRUNED}"),
            None => PRUNED.to_string(),
        };
        *out.entry(folded).or_default() += v;
    }
    out.into_iter().map(|(s, v)| format!("{s} {v}")).collect()
}

/// Folded lines of the selected stacks with those worth less than `below` of the total folded
/// into their deepest ancestor worth at least that much (as [`prune`], but over frame indices:
/// 50k stacks fold in tens of milliseconds, and names are only built for the lines kept).
pub fn pruned_folded_lines(
    profile: &Profile,
    sel: &Selection,
    below: f64,
) -> Result<Vec<String>, FlamegraphError> {
    if !profile.recorded(sel.kind) {
        return Err(FlamegraphError::NotRecorded(sel.kind));
    }
    let stacks = profile.weighted_stacks(sel.kind, sel.phase);
    let total: u64 = stacks.iter().map(|w| w.value).sum();
    let threshold = (total as f64 * below).ceil() as u64;
    if threshold <= 1 {
        return folded_lines(profile, sel);
    }
    // A frame is its index; a synthetic leaf label gets an id past the frames.
    let mut labels: HashMap<String, u32> = HashMap::new();
    let nframes = profile.frames.len() as u32;
    let paths: Vec<Vec<u32>> = stacks
        .iter()
        .map(|w: &Weighted| {
            let mut p: Vec<u32> = w.frames.iter().rev().copied().collect();
            if let Some(l) = &w.leaf_label {
                let next = nframes + labels.len() as u32;
                p.push(*labels.entry(l.clone()).or_insert(next));
            }
            p
        })
        .collect();
    // The call tree: node 0 is the root; (parent, frame) -> child.
    let mut children: HashMap<(u32, u32), u32> = HashMap::new();
    let mut value: Vec<u64> = vec![0];
    for (p, w) in paths.iter().zip(&stacks) {
        let mut node = 0u32;
        value[0] += w.value;
        for &f in p {
            let next = value.len() as u32;
            node = *children.entry((node, f)).or_insert(next);
            if node == next {
                value.push(0);
            }
            value[node as usize] += w.value;
        }
    }
    let label_names: HashMap<u32, &str> = labels.iter().map(|(n, id)| (*id, n.as_str())).collect();
    let name = |f: u32| -> String {
        match profile.frames.get(f as usize) {
            Some(frame) => {
                phaseprof_model::folded_frame_name(&phaseprof_model::display_name(frame))
            }
            None => phaseprof_model::folded_frame_name(label_names.get(&f).copied().unwrap_or("?")),
        }
    };
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (p, w) in paths.iter().zip(&stacks) {
        if w.value == 0 {
            continue;
        }
        let mut node = 0u32;
        let mut keep = 0;
        for (i, &f) in p.iter().enumerate() {
            node = children[&(node, f)];
            if value[node as usize] < threshold {
                break;
            }
            keep = i + 1;
        }
        let mut names: Vec<String> = p[..keep].iter().map(|&f| name(f)).collect();
        if keep < p.len() {
            names.push(PRUNED.to_string());
        }
        if names.is_empty() {
            names.push("[no stack]".into());
        }
        *out.entry(names.join(";")).or_default() += w.value;
    }
    Ok(out.into_iter().map(|(s, v)| format!("{s} {v}")).collect())
}

fn inferno_options(
    title: String,
    unit: &str,
    g: &GraphOptions,
) -> inferno::flamegraph::Options<'static> {
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = unit.to_string();
    opts.deterministic = true;
    opts.min_width = g.min_width_px;
    if g.icicle {
        opts.direction = inferno::flamegraph::Direction::Inverted;
    }
    opts
}

/// Renders an SVG flamegraph of the selected stacks.
pub fn write_svg(
    profile: &Profile,
    sel: &Selection,
    out: impl Write,
) -> Result<(), FlamegraphError> {
    write_svg_with(profile, sel, &GraphOptions::default(), out)
}

/// Renders an SVG flamegraph (or icicle graph) of the selected stacks, pruned as `g` says.
pub fn write_svg_with(
    profile: &Profile,
    sel: &Selection,
    g: &GraphOptions,
    out: impl Write,
) -> Result<(), FlamegraphError> {
    let lines = pruned_folded_lines(profile, sel, g.prune_below)?;
    if lines.is_empty() {
        return Err(FlamegraphError::Empty {
            kind: sel.kind,
            phase: sel.phase.map(|p| profile.phase_name(p).to_string()),
        });
    }
    let mut opts = inferno_options(title(profile, sel), sel.kind.unit(), g);
    inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)?;
    Ok(())
}

/// Renders a differential flamegraph of `after` against `before` (folded lines each, several
/// runs summed): frames are sized by `after` and coloured red where they grew, blue where they
/// shrank; `normalize` scales `before` to `after`'s total first (compare shapes, not volumes).
pub fn write_diff_svg(
    before: &[String],
    after: &[String],
    normalize: bool,
    title: String,
    unit: &str,
    g: &GraphOptions,
    out: impl Write,
) -> Result<(), FlamegraphError> {
    let join = |lines: &[String]| prune(lines, g.prune_below).join("\n");
    let (b, a) = (join(before), join(after));
    let mut folded = Vec::new();
    let dopts = inferno::differential::Options {
        normalize,
        ..Default::default()
    };
    inferno::differential::from_readers(dopts, b.as_bytes(), a.as_bytes(), &mut folded)?;
    let text = String::from_utf8_lossy(&folded);
    let mut opts = inferno_options(title, unit, g);
    opts.subtitle = Some(if normalize {
        "red: grew, blue: shrank (before normalized to after's total)".into()
    } else {
        "red: grew, blue: shrank (absolute)".into()
    });
    inferno::flamegraph::from_lines(&mut opts, text.lines(), out)?;
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
        b.add(Sample::new(SampleKind::Cpu, (9, 9), PhaseAt::NONE, vec![90]).on(s1));
        b.add(Sample::new(SampleKind::Cpu, (9, 10), PhaseAt::NONE, vec![5]).on(s1));
        b.add(Sample::new(SampleKind::Cpu, (9, 9), PhaseAt::NONE, vec![5]).on(s2));
        b.add(
            Sample::new(SampleKind::Syscall, (9, 9), PhaseAt::NONE, vec![4, 0])
                .on(Some(s1))
                .syscall(1),
        );
        b.finish()
    }

    // Checks folded output: root first, threads merged, kernel suffix, `;` escaped, syscall leaf.
    #[test]
    fn folded_is_root_first_and_merged() {
        let p = profile();
        let cpu = folded_lines(
            &p,
            &Selection {
                group: None,
                kind: EventKind::Cpu,
                phase: None,
            },
        )
        .unwrap();
        assert_eq!(cpu, vec!["main;burn:x 95", "main;do_syscall_64_[k] 5"]);
        let sys = folded_lines(
            &p,
            &Selection {
                group: None,
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
                group: None,
                kind: EventKind::Offcpu,
                phase: None,
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("--events offcpu"), "{err}");
    }

    /// Compares `got` with the golden file `tests/data/flamegraphs/<name>`.
    fn golden(name: &str, got: &str) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/flamegraphs");
        phaseprof_testkit::golden::check(&dir.join(name), got);
    }

    // Checks the rendered flame, icicle and differential graphs against golden files.
    #[test]
    fn graphs_match_golden_files() {
        let cpu = Selection {
            group: None,
            kind: EventKind::Cpu,
            phase: None,
        };
        let mut flame = Vec::new();
        write_svg(&profile(), &cpu, &mut flame).unwrap();
        golden("flame.svg", &String::from_utf8(flame).unwrap());
        let mut icicle = Vec::new();
        let g = GraphOptions {
            icicle: true,
            ..GraphOptions::default()
        };
        write_svg_with(&profile(), &cpu, &g, &mut icicle).unwrap();
        golden("icicle.svg", &String::from_utf8(icicle).unwrap());
        let before = vec!["main;burn 90".to_string(), "main;read 10".to_string()];
        let after = vec!["main;burn 40".to_string(), "main;read 60".to_string()];
        let mut diff = Vec::new();
        write_diff_svg(
            &before,
            &after,
            true,
            "diff".into(),
            "samples",
            &g,
            &mut diff,
        )
        .unwrap();
        let diff = String::from_utf8(diff).unwrap();
        golden("diff.svg", &diff);
        assert!(diff.contains("red: grew"));
    }

    // Checks pruning: tiny stacks fold into their deepest ancestor worth the threshold, totals
    // are kept, and big stacks are untouched.
    #[test]
    fn pruning_folds_tiny_stacks() {
        let lines: Vec<String> = ["a;b;c 980", "a;b;d 5", "a;e;f 10", "g 5"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pruned = prune(&lines, 0.02);
        assert_eq!(
            pruned,
            vec!["[pruned] 5", "a;[pruned] 10", "a;b;[pruned] 5", "a;b;c 980"]
        );
        let total = |ls: &[String]| -> u64 {
            ls.iter()
                .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
                .sum()
        };
        assert_eq!(total(&pruned), total(&lines));
    }

    // Checks that pruning over the profile's call tree gives what pruning folded text gives.
    #[test]
    fn tree_pruning_matches_text_pruning() {
        let p = profile();
        for kind in [EventKind::Cpu, EventKind::Syscall] {
            let sel = Selection {
                kind,
                phase: None,
                group: None,
            };
            let lines = folded_lines(&p, &sel).unwrap();
            for below in [0.0, 0.06, 0.5, 0.99] {
                assert_eq!(
                    pruned_folded_lines(&p, &sel, below).unwrap(),
                    prune(&lines, below),
                    "{kind} below {below}"
                );
            }
        }
    }

    // Checks that the SVG carries the title with kind, unit and target.
    #[test]
    fn svg_has_title() {
        let mut svg = Vec::new();
        write_svg(
            &profile(),
            &Selection {
                group: None,
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
