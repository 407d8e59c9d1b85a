//! `report --tree` and `report --callers NAME`: the stacks of one event kind as a call tree, as
//! `perf report --children` and pprof's `-tree` show them. Top down, each function's total (its
//! callees included) and self value under its caller; or bottom up from every function whose
//! name contains NAME, its callers and their callers, with how much of NAME's total each path
//! holds. Branches under `min_percent` of the whole are folded into one `[N more under …]` line.
use std::collections::BTreeMap;
use std::io::Write;

use phaseprof_model::{EventKind, Profile};

use crate::format::{fmt_value, pct};

#[derive(Default)]
struct Node {
    total: u64,
    self_value: u64,
    children: BTreeMap<String, Node>,
}

impl Node {
    fn add(&mut self, path: &[String], value: u64) {
        self.total = self.total.saturating_add(value);
        match path.split_first() {
            None => self.self_value = self.self_value.saturating_add(value),
            Some((first, rest)) => self
                .children
                .entry(first.clone())
                .or_default()
                .add(rest, value),
        }
    }
}

/// Which tree to draw.
#[derive(Clone, Debug, PartialEq)]
pub enum TreeView {
    /// Callers above callees, from the roots.
    TopDown,
    /// From the functions whose name contains this, up through their callers.
    Callers(String),
}

fn build(p: &Profile, kind: EventKind, phase: Option<u32>, view: &TreeView) -> Node {
    let mut root = Node::default();
    for w in p.weighted_stacks(kind, phase) {
        let names = p.names_root_first(&w);
        match view {
            TreeView::TopDown => root.add(&names, w.value),
            TreeView::Callers(want) => {
                // The innermost frame that matches (a recursion counts once), then its callers.
                if let Some(at) = names.iter().rposition(|n| n.contains(want.as_str())) {
                    let up: Vec<String> = names[..=at].iter().rev().cloned().collect();
                    root.add(&up, w.value);
                }
            }
        }
    }
    root
}

/// What every line of one tree shares: its kind, the whole it is a share of, the cut.
struct Cut {
    kind: EventKind,
    whole: u64,
    min: u64,
    min_percent: f64,
}

fn write_node(
    out: &mut dyn Write,
    cut: &Cut,
    name: &str,
    node: &Node,
    depth: usize,
) -> std::io::Result<()> {
    writeln!(
        out,
        "{:>7.2}% {:>7.2}% {:>12}  {}{name}",
        pct(node.total, cut.whole),
        pct(node.self_value, cut.whole),
        fmt_value(cut.kind, node.total),
        "  ".repeat(depth)
    )?;
    let mut children: Vec<(&String, &Node)> = node.children.iter().collect();
    children.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    let (shown, folded): (Vec<_>, Vec<_>) =
        children.into_iter().partition(|(_, c)| c.total >= cut.min);
    for (child, c) in shown {
        write_node(out, cut, child, c, depth + 1)?;
    }
    if !folded.is_empty() {
        let rest: u64 = phaseprof_model::saturating_sum(folded.iter().map(|(_, c)| c.total));
        writeln!(
            out,
            "{:>7.2}% {:>8} {:>12}  {}[{} more, each under {}%]",
            pct(rest, cut.whole),
            "",
            fmt_value(cut.kind, rest),
            "  ".repeat(depth + 1),
            folded.len(),
            cut.min_percent
        )?;
    }
    Ok(())
}

/// Writes the tree of `kind` (inside `phase`); branches under `min_percent` of the whole folded.
pub fn write_tree(
    p: &Profile,
    kind: EventKind,
    phase: Option<u32>,
    view: &TreeView,
    min_percent: f64,
    mut out: impl Write,
) -> std::io::Result<()> {
    let root = build(p, kind, phase, view);
    let whole = root.total;
    let what = match view {
        TreeView::TopDown => "call tree, callers above callees".to_string(),
        TreeView::Callers(n) => format!("callers of functions named *{n}*, innermost first"),
    };
    writeln!(
        out,
        "\n== {kind}: {what}; % of {} ==",
        fmt_value(kind, whole)
    )?;
    if whole == 0 {
        return writeln!(
            out,
            "(no {kind} stacks{})",
            match view {
                TreeView::Callers(_) => " through such a function",
                TreeView::TopDown => "",
            }
        );
    }
    writeln!(
        out,
        "{:>8} {:>8} {:>12}  function",
        "total", "self", "total"
    )?;
    let cut = Cut {
        kind,
        whole,
        min: (whole as f64 * min_percent / 100.0).ceil() as u64,
        min_percent,
    };
    let mut roots: Vec<(&String, &Node)> = root.children.iter().collect();
    roots.sort_by(|a, b| b.1.total.cmp(&a.1.total).then(a.0.cmp(b.0)));
    for (name, node) in roots.into_iter().filter(|(_, n)| n.total >= cut.min) {
        write_node(&mut out, &cut, name, node, 0)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::{Frame, FrameKind, PhaseAt, ProfileBuilder, Sample, SampleKind};

    fn profile() -> Profile {
        let meta = phaseprof_model::Meta {
            events: vec![EventKind::Cpu],
            ..Default::default()
        };
        let mut b = ProfileBuilder::new(meta, vec!["(none)".into()]);
        let f = |b: &mut ProfileBuilder, n: &str| {
            b.intern_frame(Frame {
                function: n.into(),
                module: "m".into(),
                kind: FrameKind::User,
                inlined: false,
            })
        };
        let (main, a, b_, leaf) = (
            f(&mut b, "main"),
            f(&mut b, "a"),
            f(&mut b, "b"),
            f(&mut b, "leaf"),
        );
        let s1 = b.intern_stack(vec![leaf, a, main]);
        let s2 = b.intern_stack(vec![leaf, b_, main]);
        let s3 = b.intern_stack(vec![a, main]);
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![6]).on(s1));
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![3]).on(s2));
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![1]).on(s3));
        b.finish()
    }

    // Checks the top-down tree (totals include callees, self is the rest) and the callers view
    // of `leaf` (its callers a and b, with their shares of leaf's samples).
    #[test]
    fn top_down_and_callers() {
        let p = profile();
        let mut out = Vec::new();
        write_tree(&p, EventKind::Cpu, None, &TreeView::TopDown, 0.0, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("100.00%    0.00%           10  main"),
            "{text}"
        );
        assert!(
            text.contains(" 70.00%   10.00%            7    a"),
            "{text}"
        );
        assert!(
            text.contains(" 60.00%   60.00%            6      leaf"),
            "{text}"
        );
        let mut out = Vec::new();
        write_tree(
            &p,
            EventKind::Cpu,
            None,
            &TreeView::Callers("leaf".into()),
            0.0,
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("100.00%    0.00%            9  leaf"),
            "{text}"
        );
        assert!(
            text.contains(" 66.67%    0.00%            6    a"),
            "{text}"
        );
        assert!(
            text.contains(" 33.33%    0.00%            3    b"),
            "{text}"
        );
    }
}
