//! `phases.toml`: `[[phase]]` entries (name + function glob) and `[[cost]]` rules. Errors name
//! the file, the line and the problem.
use std::collections::HashSet;
use std::path::Path;

use phaseprof_model::summary::FLUSH_SYSCALLS;
use serde::Deserialize;
use toml::Spanned;

/// Phases a config may define (ids 1..=MAX_PHASES; 0 is `(none)`): the kernel's phase masks
/// have MAX_PHASES bits in the shared header, bit 0 for `(none)`.
pub const MAX_PHASES: usize = phaseprof_bpf::limits::MAX_PHASES as usize - 1;

/// Globs that match the frames of copies, for the built-in `clone_bytes` cost.
pub const CLONE_FRAMES: &[&str] = &[
    "*as core::clone::Clone>::clone*",
    "*::to_vec*",
    "*::to_owned*",
    "bytes.Clone",
    "slices.Clone",
];

#[derive(Clone, Debug, PartialEq)]
pub struct PhaseSpec {
    pub name: String,
    /// A demangled function name or glob (`*`, `?`).
    pub function: String,
    /// 1-based line of the entry, for error messages.
    pub line: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CostEvent {
    Syscall,
    Alloc,
}

#[derive(Clone, Debug, PartialEq)]
pub struct CostRule {
    pub name: String,
    pub event: CostEvent,
    /// For syscall costs: syscall names.
    pub syscalls: Vec<String>,
    /// For alloc costs: frame globs.
    pub frames: Vec<String>,
    /// 0 for built-in rules.
    pub line: usize,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct PhaseConfig {
    pub phases: Vec<PhaseSpec>,
    /// The built-in rules (possibly redefined) followed by the file's own.
    pub costs: Vec<CostRule>,
}

#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    phase: Vec<Spanned<RawPhase>>,
    #[serde(default)]
    cost: Vec<Spanned<RawCost>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPhase {
    name: String,
    function: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCost {
    name: String,
    event: String,
    #[serde(default)]
    syscalls: Vec<String>,
    #[serde(default)]
    frames: Vec<String>,
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The built-in cost rules, as PRODUCT.md defines them.
pub fn builtin_costs() -> Vec<CostRule> {
    vec![
        CostRule {
            name: "clone_bytes".into(),
            event: CostEvent::Alloc,
            syscalls: vec![],
            frames: CLONE_FRAMES.iter().map(|s| s.to_string()).collect(),
            line: 0,
        },
        CostRule {
            name: "flush_syscalls".into(),
            event: CostEvent::Syscall,
            syscalls: FLUSH_SYSCALLS.iter().map(|s| s.to_string()).collect(),
            frames: vec![],
            line: 0,
        },
    ]
}

impl PhaseConfig {
    /// Only the built-in costs, no phases.
    pub fn builtin() -> Self {
        PhaseConfig {
            phases: vec![],
            costs: builtin_costs(),
        }
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            message: format!("cannot read the phases file: {e}"),
        })?;
        Self::parse(&file, &text)
    }

    /// Parses `text`, naming `file` in errors.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        let err = |line: usize, message: String| ConfigError {
            file: file.to_string(),
            line,
            message,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            err(line, e.message().trim().to_string())
        })?;
        let mut cfg = PhaseConfig::builtin();
        let mut names = HashSet::new();
        for p in &raw.phase {
            let line = line_of(text, p.span().start);
            let RawPhase { name, function } = p.get_ref();
            if name.is_empty() || name == phaseprof_model::PHASE_NONE_NAME {
                return Err(err(line, format!("`{name}` cannot name a phase")));
            }
            if function.trim().is_empty() {
                return Err(err(line, format!("phase `{name}` has an empty `function`")));
            }
            if !names.insert(name.clone()) {
                return Err(err(line, format!("phase `{name}` is defined twice")));
            }
            cfg.phases.push(PhaseSpec {
                name: name.clone(),
                function: function.trim().to_string(),
                line,
            });
        }
        if cfg.phases.len() > MAX_PHASES {
            return Err(err(
                0,
                format!(
                    "{} phases defined; at most {MAX_PHASES} are supported",
                    cfg.phases.len()
                ),
            ));
        }
        let mut cost_names = HashSet::new();
        for c in &raw.cost {
            let line = line_of(text, c.span().start);
            let RawCost {
                name,
                event,
                syscalls,
                frames,
            } = c.get_ref();
            if !cost_names.insert(name.clone()) {
                return Err(err(line, format!("cost `{name}` is defined twice")));
            }
            let event = match event.as_str() {
                "syscall" => CostEvent::Syscall,
                "alloc" => CostEvent::Alloc,
                other => {
                    return Err(err(
                        line,
                        format!(
                            "cost `{name}`: unknown event `{other}` (use \"syscall\" or \"alloc\")"
                        ),
                    ))
                }
            };
            match event {
                CostEvent::Syscall => {
                    if syscalls.is_empty() {
                        return Err(err(
                            line,
                            format!("cost `{name}`: a syscall cost needs `syscalls = [...]`"),
                        ));
                    }
                    if let Some(bad) = syscalls
                        .iter()
                        .find(|s| phaseprof_model::syscall_nr(s).is_none())
                    {
                        return Err(err(
                            line,
                            format!("cost `{name}`: `{bad}` is not an x86_64 syscall name"),
                        ));
                    }
                }
                CostEvent::Alloc => {
                    if frames.is_empty() {
                        return Err(err(
                            line,
                            format!("cost `{name}`: an alloc cost needs `frames = [...]`"),
                        ));
                    }
                }
            }
            let rule = CostRule {
                name: name.clone(),
                event,
                syscalls: syscalls.clone(),
                frames: frames.clone(),
                line,
            };
            // A rule named like a built-in one redefines it.
            match cfg.costs.iter_mut().find(|r| r.name == rule.name) {
                Some(existing) => *existing = rule,
                None => cfg.costs.push(rule),
            }
        }
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[[phase]]
name = "propose"
function = "validator_sim::phases::propose"

[[phase]]
name = "verify"
function = "*::verify_event*"

[[cost]]
name = "flush_syscalls"
event = "syscall"
syscalls = ["write", "fsync"]

[[cost]]
name = "reads"
event = "syscall"
syscalls = ["read", "pread64"]
"#;

    // Checks that PRODUCT.md's format parses, with lines, and that a cost redefines a built-in.
    #[test]
    fn parses_phases_and_costs() {
        let c = PhaseConfig::parse("phases.toml", EXAMPLE).unwrap();
        assert_eq!(c.phases.len(), 2);
        assert_eq!(c.phases[0].name, "propose");
        assert_eq!(c.phases[0].line, 2);
        assert_eq!(c.phases[1].function, "*::verify_event*");
        let names: Vec<&str> = c.costs.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["clone_bytes", "flush_syscalls", "reads"]);
        assert_eq!(c.costs[1].syscalls, vec!["write", "fsync"]);
        assert_eq!(c.costs[0].frames.len(), CLONE_FRAMES.len());
    }

    // Checks that every kind of mistake names the file, the line and the problem.
    #[test]
    fn errors_name_file_line_and_problem() {
        let cases = [
            ("[[phase]]\nname = \"a\"\n", "phases.toml:1:", "function"),
            ("[[phase]]\nname = \"a\"\nfunction = \"f\"\n\n[[phase]]\nname = \"a\"\nfunction = \"g\"\n", "phases.toml:5:", "defined twice"),
            ("[[phase]]\nname = \"a\"\nfuncton = \"f\"\n", "phases.toml:", "funct"),
            ("[[cost]]\nname = \"c\"\nevent = \"syscall\"\nsyscalls = [\"wrte\"]\n", "phases.toml:1:", "`wrte` is not an x86_64 syscall"),
            ("[[cost]]\nname = \"c\"\nevent = \"disk\"\n", "phases.toml:1:", "unknown event `disk`"),
            ("[[phase]\n", "phases.toml:1:", ""),
        ];
        for (text, prefix, needle) in cases {
            let e = PhaseConfig::parse("phases.toml", text)
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(prefix), "{text:?}: {e}");
            assert!(e.contains(needle), "{text:?}: {e}");
        }
    }
}
