//! The software perf events that drive on-CPU sampling (`cpu-clock`) and page-fault counting
//! (`page-faults`): libbpf-rs does not open perf events, so we call perf_event_open ourselves,
//! one event per online CPU.
use std::os::fd::{FromRawFd, OwnedFd};

use anyhow::{bail, Context, Result};

/// The online CPUs, from `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> Result<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .context("reading /sys/devices/system/cpu/online")?;
    parse_cpu_list(&text).with_context(|| format!("parsing the online CPU list `{}`", text.trim()))
}

/// Parses a kernel CPU list such as `0-3,6,8-9`.
fn parse_cpu_list(text: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>()?..=b.parse::<usize>()?),
            None => cpus.push(part.parse()?),
        }
    }
    Ok(cpus)
}

/// `struct perf_event_attr` up to PERF_ATTR_SIZE_VER5; the kernel accepts any known size.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_freq: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_COUNT_SW_PAGE_FAULTS: u64 = 2;
const PERF_ATTR_FLAG_FREQ: u64 = 1 << 10;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 1 << 3;

fn open_software(
    cpu: usize,
    config: u64,
    period_or_freq: u64,
    freq: bool,
    what: &str,
) -> Result<OwnedFd> {
    let attr = PerfEventAttr {
        kind: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config,
        sample_freq: period_or_freq,
        flags: if freq { PERF_ATTR_FLAG_FREQ } else { 0 },
        ..Default::default()
    };
    // SAFETY: attr is a valid, fully initialized perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1i32,
            cpu as i32,
            -1i32,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        bail!("perf_event_open({what}, cpu {cpu}) failed: {err}");
    }
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens a cpu-clock sampling event on `cpu` for every process, at `freq_hz`.
pub fn open_cpu_clock(cpu: usize, freq_hz: u64) -> Result<OwnedFd> {
    open_software(cpu, PERF_COUNT_SW_CPU_CLOCK, freq_hz, true, "cpu-clock")
}

/// Opens the page-faults event on `cpu` for every process with a period of 1: the program
/// sees every fault, so counts are exact.
pub fn open_page_faults(cpu: usize) -> Result<OwnedFd> {
    open_software(cpu, PERF_COUNT_SW_PAGE_FAULTS, 1, false, "page-faults")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the kernel's CPU list syntax: ranges, single CPUs, trailing newline.
    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,6,8-9\n").unwrap(),
            vec![0, 1, 2, 3, 6, 8, 9]
        );
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert!(parse_cpu_list("x").is_err());
    }
}
