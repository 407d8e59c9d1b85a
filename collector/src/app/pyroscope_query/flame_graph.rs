//! Pyroscope's flame graphs: one kind's merged stacks as a tree of frame names from the root,
//! encoded level by level, for one selection (`FlameGraph`) or two side by side (a diff's
//! `FlameGraphDiff`: left, then right, in every node).
use std::collections::{BTreeMap, HashMap};

use phaseprof_model::{EventKind, Profile};
use phaseprof_view::pprof::frames_leaf_first;

use super::messages::{FlameGraph, FlameGraphDiff, Level};

/// The side a selection's stacks go to: the only one of a flame graph, a diff's left or right.
pub const LEFT: usize = 0;
pub const RIGHT: usize = 1;

#[derive(Default)]
struct Node {
    total: [i64; 2],
    own: [i64; 2],
    name: usize,
    children: BTreeMap<String, usize>,
}

/// Stacks merged by frame name from the root ("total"), each node's total and self per side.
pub struct Tree {
    nodes: Vec<Node>,
    names: Vec<String>,
    name_ids: HashMap<String, usize>,
}

impl Tree {
    pub fn new() -> Tree {
        Tree {
            nodes: vec![Node::default()],
            names: vec!["total".into()],
            name_ids: HashMap::new(),
        }
    }

    /// Adds `kind`'s stacks of `p` (those of `phase` only, if given) to `side`.
    pub fn add(&mut self, p: &Profile, kind: EventKind, phase: Option<u32>, side: usize) {
        for w in p.weighted_stacks(kind, phase) {
            let v = w.value as i64;
            let mut at = 0;
            self.nodes[0].total[side] += v;
            for (name, _) in frames_leaf_first(p, &w).into_iter().rev() {
                at = self.child(at, name);
                self.nodes[at].total[side] += v;
            }
            self.nodes[at].own[side] += v;
        }
    }

    /// `parent`'s child named `name`, added if new.
    fn child(&mut self, parent: usize, name: String) -> usize {
        if let Some(&n) = self.nodes[parent].children.get(&name) {
            return n;
        }
        let id = *self.name_ids.entry(name.clone()).or_insert_with(|| {
            self.names.push(name.clone());
            self.names.len() - 1
        });
        self.nodes.push(Node {
            name: id,
            ..Node::default()
        });
        let n = self.nodes.len() - 1;
        self.nodes[parent].children.insert(name, n);
        n
    }

    pub fn flame_graph(self, max_nodes: Option<i64>) -> FlameGraph {
        let (levels, max_self) = self.levels(1, max_nodes);
        FlameGraph {
            total: self.nodes[0].total[LEFT],
            names: self.names,
            levels,
            max_self,
        }
    }

    /// Both sides; the total is both sides' ticks together, as Pyroscope counts a diff's.
    pub fn diff(self, max_nodes: Option<i64>) -> FlameGraphDiff {
        let (levels, max_self) = self.levels(2, max_nodes);
        let [left, right] = self.nodes[0].total;
        FlameGraphDiff {
            names: self.names,
            levels,
            total: left + right,
            max_self,
            left_ticks: left,
            right_ticks: right,
        }
    }

    /// The levels, root first: per node depth first (children by name), for each of the
    /// first `sides` sides its x offset from the end of the node before it on that level, its
    /// total and its self, then its name's index. With `max_nodes`, nodes whose total (both
    /// sides) is under the largest `max_nodes` totals are folded into their parent's self.
    /// Also the largest self.
    fn levels(&self, sides: usize, max_nodes: Option<i64>) -> (Vec<Level>, i64) {
        let sum = |n: &Node| n.total[LEFT] + n.total[RIGHT];
        let floor = match max_nodes.filter(|&m| m > 0 && (m as usize) < self.nodes.len()) {
            Some(m) => {
                let mut totals: Vec<i64> = self.nodes.iter().map(sum).collect();
                totals.sort_unstable_by(|a, b| b.cmp(a));
                totals[m as usize - 1]
            }
            None => i64::MIN,
        };
        let mut levels: Vec<Vec<i64>> = Vec::new();
        let mut level_end: Vec<[i64; 2]> = Vec::new();
        let mut max_self = 0;
        // Depth first; each node at its absolute x on each side.
        let mut stack = vec![(0usize, 0usize, [0i64; 2])];
        while let Some((n, depth, x)) = stack.pop() {
            let node = &self.nodes[n];
            let (kept, folded): (Vec<usize>, Vec<usize>) =
                (node.children.values()).partition(|&&c| sum(&self.nodes[c]) >= floor);
            if levels.len() <= depth {
                levels.push(Vec::new());
                level_end.push([0; 2]);
            }
            for side in 0..sides {
                let folded: i64 = folded.iter().map(|&c| self.nodes[c].total[side]).sum();
                let own = node.own[side] + folded;
                max_self = max_self.max(own);
                let values = [x[side] - level_end[depth][side], node.total[side], own];
                levels[depth].extend(values);
                level_end[depth][side] = x[side] + node.total[side];
            }
            levels[depth].push(node.name as i64);
            let mut child_x = x;
            let mut children = Vec::with_capacity(kept.len());
            for c in kept {
                children.push((c, depth + 1, child_x));
                for (side, at) in child_x.iter_mut().enumerate() {
                    *at += self.nodes[c].total[side];
                }
            }
            stack.extend(children.into_iter().rev());
        }
        let levels = levels.into_iter().map(|values| Level { values }).collect();
        (levels, max_self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(p: &Profile, phase: Option<u32>, max_nodes: Option<i64>) -> FlameGraph {
        let mut t = Tree::new();
        t.add(p, EventKind::Cpu, phase, LEFT);
        t.flame_graph(max_nodes)
    }

    fn selfs(levels: &[Level], width: usize) -> Vec<i64> {
        let mut out = vec![0; width / 3];
        for q in levels.iter().flat_map(|l| l.values.chunks(width + 1)) {
            for (side, s) in out.iter_mut().enumerate() {
                *s += q[side * 3 + 2];
            }
        }
        out
    }

    // Checks the flame graph's encoding on the shared fixture (main → propose → burn: 90 cpu
    // samples; main → finalize → write: 10): the root's total, every node's self summing to it,
    // offsets relative to the node before on the same level, and a node folded into its parent
    // under max_nodes.
    #[test]
    fn flame_graph_levels_sum_to_the_total() {
        let p = phaseprof_view::fixture::two_phases(1);
        let fg = graph(&p, None, None);
        assert_eq!(fg.total, 100);
        assert_eq!(selfs(&fg.levels, 3), vec![100]);
        assert_eq!(fg.levels[0].values, vec![0, 100, 0, 0]);
        // main, then propose (90) and finalize (10) under it, by name: finalize first.
        let names = |l: &Level| -> Vec<&str> {
            l.values
                .chunks(4)
                .map(|q| fg.names[q[3] as usize].as_str())
                .collect()
        };
        assert_eq!(names(&fg.levels[2]), vec!["finalize", "propose"]);
        assert_eq!(fg.levels[2].values, vec![0, 10, 0, 4, 0, 90, 0, 2]);
        let small = graph(&p, None, Some(4));
        assert_eq!(selfs(&small.levels, 3), vec![100]);
        assert_eq!(graph(&p, p.phase_index("finalize"), None).total, 10);
    }

    // Checks a diff: each node carries both sides (x, total, self for left, then right), each
    // side's selves sum to its ticks, and a frame only one side has is zero on the other.
    #[test]
    fn a_diff_carries_both_sides() {
        let p = phaseprof_view::fixture::two_phases(1);
        let mut t = Tree::new();
        t.add(&p, EventKind::Cpu, None, LEFT);
        t.add(&p, EventKind::Cpu, p.phase_index("finalize"), RIGHT);
        let d = t.diff(None);
        assert_eq!((d.left_ticks, d.right_ticks, d.total), (100, 10, 110));
        assert_eq!(selfs(&d.levels, 6), vec![100, 10]);
        assert_eq!(d.levels[0].values, vec![0, 100, 0, 0, 10, 0, 0]);
        // propose: 90 on the left, none on the right, after finalize (10 | 10).
        assert_eq!(
            d.levels[2].values,
            vec![0, 10, 0, 0, 10, 0, 4, 0, 90, 0, 0, 0, 0, 2]
        );
    }
}
