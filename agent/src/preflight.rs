//! Checks made before touching BPF, so users get a specific error instead of a libbpf errno.
use anyhow::{bail, Result};

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Recording needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN) and a kernel with BTF.
pub fn check_can_record() -> Result<()> {
    let caps = effective_caps();
    let has = |c: u32| caps & (1u64 << c) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        bail!(
            "phaseprof needs root (or the capabilities CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN) \
             to load BPF programs; run it with sudo"
        );
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): phaseprof's CO-RE programs \
             need a kernel built with CONFIG_DEBUG_INFO_BTF=y"
        );
    }
    Ok(())
}
