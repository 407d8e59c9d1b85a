//! Probes grouped by program and file: each group attached as one multi-uprobe link (Linux 6.6,
//! with cookies), which attaches and detaches (a budget's slices) all at once, or site by site
//! on kernels without them.
use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use libbpf_rs::{Link, ProgramMut};

use super::{ProbeSpec, Uprobe};

/// The offsets of one group's probes in their file, and each one's cookie.
#[derive(Default)]
pub(super) struct Sites {
    offsets: Vec<usize>,
    cookies: Vec<u64>,
}

/// `probes` grouped by (program, file).
pub(super) fn by_program_and_file<'a>(
    probes: impl IntoIterator<Item = &'a ProbeSpec>,
) -> BTreeMap<(Uprobe, &'a Path), Sites> {
    let mut groups: BTreeMap<(Uprobe, &Path), Sites> = BTreeMap::new();
    for p in probes {
        let sites = groups.entry((p.program, &p.path)).or_default();
        sites.offsets.push(p.offset as usize);
        sites.cookies.push(p.cookie);
    }
    groups
}

impl Sites {
    /// The sites as (offset, cookie) pairs, for kernels that take one uprobe per link.
    pub(super) fn each(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.offsets
            .iter()
            .copied()
            .zip(self.cookies.iter().copied())
    }

    /// Attaches `prog` at every site of `path` on one link, in process `pid` only (-1: every
    /// process); `what` names the probes in an error.
    pub(super) fn attach(
        self,
        prog: &ProgramMut<'_>,
        program: Uprobe,
        pid: i32,
        path: &Path,
        what: &str,
    ) -> Result<Link> {
        let opts = libbpf_rs::UprobeMultiOpts {
            offsets: self.offsets,
            cookies: self.cookies,
            retprobe: program.retprobe(),
            ..Default::default()
        };
        prog.attach_uprobe_multi_with_opts(pid, path, "", opts)
            .with_context(|| format!("attaching the {what} in {}", path.display()))
    }
}
