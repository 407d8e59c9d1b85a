//! Phases per target: each `[[target]]` may name its own phases file. The agent records all its
//! targets in one session, so the files' phases are merged into one list of names (a name in
//! several files is one phase) and their costs into one rule set; each file's phases are then
//! probed only in the executables of its own targets.
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use anyhow::Result;

use super::config::Target;
use crate::phases::PhaseConfig;

pub struct FleetPhases {
    /// Every file's phases and costs, merged: the session's names and cost rules.
    pub merged: PhaseConfig,
    files: Vec<PhaseFile>,
    /// Per target rule: index into `files`.
    of_target: Vec<Option<usize>>,
    /// (file, executable device and inode) already probed: a restarted target running the same
    /// executable is covered by the probes on the file; a new build is probed anew.
    probed: std::collections::BTreeSet<(usize, u64, u64)>,
}

struct PhaseFile {
    name: String,
    config: PhaseConfig,
    /// Session phase id of each of the file's phases.
    ids: Vec<u32>,
}

impl FleetPhases {
    /// Loads every phases file the targets name (each once).
    pub fn load(targets: &[Target]) -> Result<Self> {
        let mut merged = PhaseConfig::default();
        let mut files: Vec<PhaseFile> = Vec::new();
        let mut paths: Vec<PathBuf> = Vec::new();
        let mut of_target = Vec::new();
        for t in targets {
            let Some(path) = &t.phases else {
                of_target.push(None);
                continue;
            };
            if let Some(i) = paths.iter().position(|p| p == path) {
                of_target.push(Some(i));
                continue;
            }
            let config = PhaseConfig::load(path)?;
            let ids = config
                .phases
                .iter()
                .map(|spec| {
                    let at = merged.phases.iter().position(|p| p.name == spec.name);
                    let at = at.unwrap_or_else(|| {
                        merged.phases.push(spec.clone());
                        merged.phases.len() - 1
                    });
                    at as u32 + 1
                })
                .collect();
            for rule in &config.costs {
                if !merged.costs.iter().any(|r| r.name == rule.name) {
                    merged.costs.push(rule.clone());
                }
            }
            paths.push(path.clone());
            of_target.push(Some(files.len()));
            files.push(PhaseFile {
                name: path.display().to_string(),
                config,
                ids,
            });
        }
        Ok(FleetPhases {
            merged,
            files,
            of_target,
            probed: Default::default(),
        })
    }

    /// The phases file `pid` (matched by target rule `target`) needs probed, unless its
    /// executable already is: (config, file name, session ids).
    pub fn to_probe(&mut self, target: usize, pid: u32) -> Option<(&PhaseConfig, &str, &[u32])> {
        let file = (*self.of_target.get(target)?)?;
        let exe = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
        if !self.probed.insert((file, exe.dev(), exe.ino())) {
            return None;
        }
        let f = &self.files[file];
        Some((&f.config, &f.name, &f.ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::config::TargetRule;

    // Checks that two targets' phases files merge into one list of names (a shared name is one
    // phase) and that each file's phases map to their session ids.
    #[test]
    fn files_merge_by_phase_name() {
        let dir =
            std::env::temp_dir().join(format!("phaseprof-fleet-phases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, phases: &[(&str, &str)]| {
            let text: String = phases
                .iter()
                .map(|(n, f)| format!("[[phase]]\nname = \"{n}\"\nfunction = \"{f}\"\n"))
                .collect();
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let a = write(
            "a.toml",
            &[("propose", "a::propose"), ("commit", "a::commit")],
        );
        let b = write(
            "b.toml",
            &[("verify", "b::verify"), ("commit", "b::commit")],
        );
        let target = |phases: Option<PathBuf>| Target {
            rule: TargetRule::Exe("/x".into()),
            phases,
        };
        let f = FleetPhases::load(&[
            target(Some(a.clone())),
            target(None),
            target(Some(b)),
            target(Some(a)),
        ])
        .unwrap();
        let names: Vec<&str> = f.merged.phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["propose", "commit", "verify"]);
        assert_eq!(f.files.len(), 2);
        assert_eq!(f.files[0].ids, [1, 2]);
        assert_eq!(f.files[1].ids, [3, 2]);
        assert_eq!(f.of_target, [Some(0), None, Some(1), Some(0)]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
