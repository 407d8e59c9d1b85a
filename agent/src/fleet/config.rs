//! `agent.toml`: where to push, how to find targets, which labels to attach.
//!
//! ```toml
//! collector = "http://127.0.0.1:7071"      # or https://…
//! # ca_file = "/etc/phaseprof/collector-ca.pem"  # for https: trust this CA instead of the public ones
//! token_file = "/etc/phaseprof/agent.token"   # or token = "..."
//! window = "10s"
//! spool_dir = "/var/lib/phaseprof-agent/spool"
//! spool_limit = "256MiB"
//! metrics_listen = "127.0.0.1:9464"        # /metrics; on a non-loopback address also:
//! # metrics_token_file = "/etc/phaseprof/metrics.token"  # or metrics_token = "...": asked
//! #                                         # of scrapers as `Authorization: Bearer`
//! events = ["cpu", "offcpu", "syscall"]
//! unwind = "auto"                  # auto | fp | dwarf | copy (see `record --unwind`)
//! stack_copy = "16KiB"             # user stack copied per sample with `copy` unwinding
//! stack_entries = 16384            # distinct stacks the kernel holds at once (recycled per window)
//! offcpu_stacks = "sampled"        # sampled | all (see `record --offcpu-stacks`)
//! # events = [..., "alloc"]: allocator probes always attached, exact totals per phase
//! # alloc_budget = "1%"          # with alloc: probes attached for part of each window so that
//! #                              # they slow the targets by at most this; totals extrapolated
//! phases = "/etc/phaseprof/phases.toml"    # for targets without their own
//! # phase_budget = "1%"          # the default with phases: phase probes attached for slices so
//! #                              # that they slow the targets by at most this, totals estimated
//! #                              # (the report says with what coverage); "exact": always on
//! # syscall_budget = "1%"        # the default with syscall events: syscalls counted in slices
//! #                              # so that counting slows the targets by at most this, totals
//! #                              # estimated; "exact": every syscall counted
//! [labels]
//! service = "relay"
//! version = "1.5"
//! [[target]]
//! name = "relay"                   # regex on comm or command line; or:
//! # exe = "/usr/bin/relay"
//! # cgroup = "system.slice/relay.service"
//! phases = "/etc/phaseprof/relay-phases.toml"
//! ```
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use phaseprof_model::EventKind;
use regex::Regex;
use serde::Deserialize;

/// The agent's phase budget unless `phase_budget` says otherwise: a fleet runs for weeks on
/// nodes whose hottest functions may be phases, where exact phases can cost several times the
/// node's own CPU (README, Performance); a budget bounds that cost on every node.
const DEFAULT_PHASE_BUDGET: f64 = 0.01;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    collector: String,
    ca_file: Option<PathBuf>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    #[serde(default = "default_window")]
    window: String,
    spool_dir: PathBuf,
    #[serde(default = "default_spool_limit")]
    spool_limit: String,
    metrics_listen: Option<SocketAddr>,
    /// Bearer token `/metrics` asks for (needed when `metrics_listen` is not loopback).
    metrics_token: Option<String>,
    metrics_token_file: Option<PathBuf>,
    #[serde(default = "default_events")]
    events: Vec<String>,
    #[serde(default = "default_unwind")]
    unwind: String,
    #[serde(default = "default_stack_copy")]
    stack_copy: String,
    stack_entries: Option<u32>,
    #[serde(default = "default_offcpu_stacks")]
    offcpu_stacks: String,
    alloc_budget: Option<String>,
    phase_budget: Option<String>,
    syscall_budget: Option<String>,
    phases: Option<PathBuf>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(rename = "target", default)]
    targets: Vec<RawTarget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    name: Option<String>,
    exe: Option<PathBuf>,
    cgroup: Option<String>,
    phases: Option<PathBuf>,
}

fn default_window() -> String {
    "10s".into()
}
fn default_spool_limit() -> String {
    "256MiB".into()
}
fn default_unwind() -> String {
    "auto".into()
}

fn default_stack_copy() -> String {
    "16KiB".into()
}

fn default_offcpu_stacks() -> String {
    "sampled".into()
}

fn default_events() -> Vec<String> {
    vec!["cpu".into(), "offcpu".into(), "syscall".into()]
}

/// How a target is recognized.
#[derive(Clone, Debug)]
pub enum TargetRule {
    Name(crate::targets::NameMatch),
    Exe(PathBuf),
    Cgroup(String),
}

impl TargetRule {
    pub fn matches(&self, pid: u32) -> bool {
        match self {
            TargetRule::Name(name) => name.matches(pid),
            TargetRule::Exe(path) => {
                std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| &e == path)
            }
            TargetRule::Cgroup(cg) => std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|text| {
                    text.lines().any(|l| {
                        l.rsplit(':').next().is_some_and(|p| {
                            p.trim_start_matches('/') == cg.trim_start_matches('/')
                        })
                    })
                }),
        }
    }
}

/// A target rule and the phases file of its processes.
#[derive(Clone, Debug)]
pub struct Target {
    pub rule: TargetRule,
    /// The target's own `phases`, else the config's top-level one.
    pub phases: Option<PathBuf>,
}

#[derive(Clone, Debug)]
pub struct AgentConfig {
    pub collector: String,
    /// PEM certificates the collector's TLS certificate must chain to (None: the public roots).
    pub ca_file: Option<PathBuf>,
    pub token: String,
    pub window: Duration,
    pub spool_dir: PathBuf,
    pub spool_limit: u64,
    pub metrics_listen: Option<SocketAddr>,
    /// None: `/metrics` answers requests for a loopback Host only (DNS rebinding).
    pub metrics_token: Option<String>,
    pub events: Vec<EventKind>,
    pub unwind: crate::unwind::UnwindMode,
    pub stack_copy_bytes: u32,
    /// Capacity of the kernel's stack maps.
    pub stack_entries: u32,
    /// Which switch-outs carry their stacks.
    pub offcpu_stacks: crate::engine::OffcpuStacks,
    /// The allocation probes' share of the targets' CPU time (duty-cycled; None: attached).
    pub alloc_budget: Option<f64>,
    /// The phase probes' share of the targets' CPU time (duty-cycled; None: `exact`, attached).
    pub phase_budget: Option<f64>,
    /// Counting syscalls' share of the targets' CPU time (sliced; None: `exact`, every one).
    pub syscall_budget: Option<f64>,
    pub labels: BTreeMap<String, String>,
    pub targets: Vec<Target>,
}

/// The agent's token: given inline or in a file (exactly one), never empty.
fn agent_token(file: &str, token: Option<String>, token_file: Option<PathBuf>) -> Result<String> {
    let token = match (token, token_file) {
        (Some(t), None) => t,
        (None, Some(p)) => std::fs::read_to_string(&p)
            .with_context(|| format!("{file}: reading token_file {}", p.display()))?
            .trim()
            .to_string(),
        _ => bail!("{file}: give exactly one of `token` and `token_file`"),
    };
    if token.is_empty() {
        bail!("{file}: the agent token is empty");
    }
    Ok(token)
}
impl AgentConfig {
    pub fn load(path: &Path) -> Result<Self> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {file}"))?;
        Self::parse(&file, &text)
    }

    pub fn parse(file: &str, text: &str) -> Result<Self> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        if !(raw.collector.starts_with("http://") || raw.collector.starts_with("https://")) {
            bail!(
                "{file}: collector `{}` must be an http:// or https:// URL",
                raw.collector
            );
        }
        if raw.ca_file.is_some() && !raw.collector.starts_with("https://") {
            bail!("{file}: ca_file is for an https:// collector");
        }
        let token = agent_token(file, raw.token, raw.token_file)?;
        let window = phaseprof_model::units::parse_duration(&raw.window)
            .map_err(|e| anyhow::anyhow!("{file}: window: {e}"))?;
        if window < Duration::from_millis(200) {
            bail!("{file}: window must be at least 200ms");
        }
        let spool_limit = phaseprof_model::units::parse_bytes(&raw.spool_limit)
            .map_err(|e| anyhow::anyhow!("{file}: spool_limit: {e}"))?;
        let mut events = Vec::new();
        for e in &raw.events {
            let k = EventKind::parse(e)
                .ok_or_else(|| anyhow::anyhow!("{file}: unknown event `{e}`"))?;
            events.push(k);
        }
        let unwind = raw
            .unwind
            .parse()
            .map_err(|e| anyhow::anyhow!("{file}: unwind: {e}"))?;
        let stack_copy_bytes = crate::unwind::parse_stack_copy(&raw.stack_copy)
            .map_err(|e| anyhow::anyhow!("{file}: stack_copy: {e}"))?;
        let offcpu_stacks = (raw.offcpu_stacks.parse())
            .map_err(|e| anyhow::anyhow!("{file}: offcpu_stacks: {e}"))?;
        let mut targets = Vec::new();
        for (i, t) in raw.targets.into_iter().enumerate() {
            let rule = match (t.name, t.exe, t.cgroup) {
                (Some(n), None, None) => TargetRule::Name(crate::targets::NameMatch {
                    re: Regex::new(&n).map_err(|e| {
                        anyhow::anyhow!("{file}: target {}: bad regex `{n}`: {e}", i + 1)
                    })?,
                    full: false,
                }),
                (None, Some(p), None) => TargetRule::Exe(p),
                (None, None, Some(c)) => TargetRule::Cgroup(c),
                _ => bail!(
                    "{file}: target {}: give exactly one of name, exe, cgroup",
                    i + 1
                ),
            };
            targets.push(Target {
                rule,
                phases: t.phases.or_else(|| raw.phases.clone()),
            });
        }
        if targets.is_empty() {
            bail!("{file}: no [[target]]: name (regex), exe or cgroup");
        }
        let metrics_token = metrics_token(file, raw.metrics_token, raw.metrics_token_file)?;
        let stack_entries = raw
            .stack_entries
            .unwrap_or(crate::engine::DEFAULT_STACK_ENTRIES);
        if !(64..=1 << 20).contains(&stack_entries) {
            bail!("{file}: stack_entries = {stack_entries}: give 64 to 1048576");
        }
        let alloc_budget = match &raw.alloc_budget {
            None => None,
            Some(b) => {
                let share = phaseprof_model::units::parse_percent(b)
                    .map_err(|e| anyhow::anyhow!("{file}: alloc_budget: {e}"))?;
                if !events.contains(&EventKind::Alloc) {
                    bail!("{file}: alloc_budget limits the allocation probes: add \"alloc\" to events");
                }
                Some(share)
            }
        };
        // Without phases (or syscall events) there is nothing to duty-cycle.
        let phases = targets.iter().any(|t| t.phases.is_some());
        let phase_budget = exact_or_budget(file, "phase_budget", raw.phase_budget.as_deref())?
            .unwrap_or(phases.then_some(DEFAULT_PHASE_BUDGET));
        let syscalls = events.contains(&EventKind::Syscall);
        let syscall_budget =
            match exact_or_budget(file, "syscall_budget", raw.syscall_budget.as_deref())? {
                None => syscalls.then_some(crate::syscall_budget::DEFAULT_SYSCALL_BUDGET),
                Some(Some(_)) if !syscalls => bail!(
                    "{file}: syscall_budget limits syscall counting: add \"syscall\" to events"
                ),
                Some(b) => b,
            };
        if let Some(addr) = raw.metrics_listen {
            if !addr.ip().is_loopback() && metrics_token.is_none() {
                bail!(
                    "{file}: metrics_listen = \"{addr}\" is not a loopback address: set metrics_token too (scrapers send it as a bearer token)"
                );
            }
        }
        Ok(AgentConfig {
            collector: raw.collector.trim_end_matches('/').to_string(),
            ca_file: raw.ca_file,
            token,
            window,
            spool_dir: raw.spool_dir,
            spool_limit,
            metrics_listen: raw.metrics_listen,
            metrics_token,
            events,
            unwind,
            stack_copy_bytes,
            stack_entries,
            offcpu_stacks,
            alloc_budget,
            phase_budget,
            syscall_budget,
            labels: raw.labels,
            targets,
        })
    }
}

/// A budget of the config (`key`): None when not given, Some(None) for "exact", else the share.
fn exact_or_budget(file: &str, key: &str, raw: Option<&str>) -> Result<Option<Option<f64>>> {
    match raw {
        None => Ok(None),
        Some("exact") => Ok(Some(None)),
        Some(b) => Ok(Some(Some(
            phaseprof_model::units::parse_percent(b)
                .map_err(|e| anyhow::anyhow!("{file}: {key}: {e} (or \"exact\")"))?,
        ))),
    }
}

/// The bearer token `/metrics` asks for: given, read from a file, or none.
fn metrics_token(
    file: &str,
    token: Option<String>,
    path: Option<PathBuf>,
) -> Result<Option<String>> {
    let token = match (token, path) {
        (Some(t), None) => Some(t),
        (None, Some(p)) => Some(
            std::fs::read_to_string(&p)
                .with_context(|| format!("{file}: reading metrics_token_file {}", p.display()))?
                .trim()
                .to_string(),
        ),
        (None, None) => None,
        _ => bail!("{file}: give at most one of `metrics_token` and `metrics_token_file`"),
    };
    if token.as_ref().is_some_and(|t| t.is_empty()) {
        bail!("{file}: the metrics token is empty");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks a full config and the errors of bad ones.
    #[test]
    fn parses_and_refuses_clearly() {
        let c = AgentConfig::parse(
            "a.toml",
            "collector = \"http://127.0.0.1:7071/\"\ntoken = \"t\"\nwindow = \"2s\"\nspool_dir = \"/tmp/s\"\nphases = \"/p.toml\"\n[labels]\nservice = \"relay\"\n[[target]]\nname = \"relay\"\n[[target]]\ncgroup = \"/system.slice/x.service\"\nphases = \"/x.toml\"\n",
        )
        .unwrap();
        assert_eq!(c.collector, "http://127.0.0.1:7071");
        assert_eq!(c.window, Duration::from_secs(2));
        assert_eq!(c.spool_limit, 256 << 20);
        assert_eq!(c.targets.len(), 2);
        assert_eq!(c.targets[0].phases.as_deref(), Some(Path::new("/p.toml")));
        assert_eq!(c.targets[1].phases.as_deref(), Some(Path::new("/x.toml")));
        assert_eq!(c.labels["service"], "relay");
        let err = |text: &str| AgentConfig::parse("a.toml", text).unwrap_err().to_string();
        assert!(
            err("collector = \"x\"\ntoken=\"t\"\nspool_dir=\"/s\"\n[[target]]\nname=\"a\"")
                .contains("http://")
        );
        assert!(
            err("collector = \"http://x\"\nspool_dir=\"/s\"\n[[target]]\nname=\"a\"")
                .contains("token")
        );
        assert!(
            err("collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"")
                .contains("no [[target]]")
        );
        assert!(err("collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\nbogus=1\n[[target]]\nname=\"a\"").contains("bogus"));
        assert!(err("collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\n[[target]]\nname=\"a\"\nexe=\"/b\"").contains("exactly one"));
        let base = "collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\n";
        assert_eq!(c.unwind, crate::unwind::UnwindMode::Auto);
        assert_eq!(c.stack_copy_bytes, 16 << 10);
        let c = AgentConfig::parse(
            "a.toml",
            &format!("{base}unwind=\"dwarf\"\nstack_copy=\"32KiB\"\n[[target]]\nname=\"a\""),
        )
        .unwrap();
        assert_eq!(
            (c.unwind, c.stack_copy_bytes),
            (crate::unwind::UnwindMode::Dwarf, 32 << 10)
        );
        assert!(
            err(&format!("{base}unwind=\"lbr\"\n[[target]]\nname=\"a\""))
                .contains("unwind: unknown unwind mode `lbr`")
        );
        assert!(err(&format!(
            "{base}stack_copy=\"1MiB\"\n[[target]]\nname=\"a\""
        ))
        .contains("at most 64KiB"));
        let alloc = "events=[\"cpu\", \"alloc\"]\n";
        let c = AgentConfig::parse(
            "a.toml",
            &format!("{base}{alloc}alloc_budget=\"2%\"\n[[target]]\nname=\"a\""),
        )
        .unwrap();
        assert_eq!(c.alloc_budget, Some(0.02));
        assert!(err(&format!(
            "{base}alloc_budget=\"1%\"\n[[target]]\nname=\"a\""
        ))
        .contains("add \"alloc\" to events"));
        assert!(err(&format!(
            "{base}{alloc}alloc_budget=\"1\"\n[[target]]\nname=\"a\""
        ))
        .contains("alloc_budget: `1`: give a percentage like 1%"));
    }

    // Checks the phase budget: 1% with phases unless said otherwise (none without phases),
    // "exact" for probes always attached, a clear refusal of anything else.
    #[test]
    fn phase_budget_defaults_to_one_percent() {
        let base = "collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\nphases=\"/p.toml\"\n";
        let parse = |extra: &str| {
            AgentConfig::parse("a.toml", &format!("{base}{extra}[[target]]\nname=\"a\""))
        };
        assert_eq!(parse("").unwrap().phase_budget, Some(0.01));
        assert_eq!(
            parse("phase_budget=\"exact\"\n").unwrap().phase_budget,
            None
        );
        assert_eq!(
            parse("phase_budget=\"3%\"\n").unwrap().phase_budget,
            Some(0.03)
        );
        let none =
            "collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\n[[target]]\nname=\"a\"";
        assert_eq!(
            AgentConfig::parse("a.toml", none).unwrap().phase_budget,
            None
        );
        let e = parse("phase_budget=\"lots\"\n").unwrap_err().to_string();
        assert!(
            e.contains("phase_budget:") && e.contains("\"exact\""),
            "{e}"
        );
    }

    // Checks the syscall budget: 1% with syscall events unless said otherwise (none without
    // them), "exact" for every syscall counted, a refusal of a budget without syscall events.
    #[test]
    fn syscall_budget_defaults_to_one_percent() {
        let base = "collector = \"http://x\"\ntoken=\"t\"\nspool_dir=\"/s\"\n";
        let parse = |extra: &str| {
            AgentConfig::parse("a.toml", &format!("{base}{extra}[[target]]\nname=\"a\""))
        };
        assert_eq!(parse("").unwrap().syscall_budget, Some(0.01));
        let exact = parse("syscall_budget=\"exact\"\n").unwrap();
        assert_eq!(exact.syscall_budget, None);
        let cpu = parse("events=[\"cpu\"]\n").unwrap();
        assert_eq!(cpu.syscall_budget, None);
        let e = parse("events=[\"cpu\"]\nsyscall_budget=\"2%\"\n").unwrap_err();
        assert!(e.to_string().contains("add \"syscall\" to events"), "{e}");
    }
}
