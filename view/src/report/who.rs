//! The report's process and thread tables.
use std::io::Write;

use phaseprof_model::threads::{self, Totals};
use phaseprof_model::Profile;

use crate::format::fmt_ns;

fn row(out: &mut dyn Write, label: &str, t: &Totals) -> std::io::Result<()> {
    writeln!(
        out,
        "{label:<34} {:>10} {:>12} {:>12} {:>10} {:>12} {:>8}",
        t.cpu_samples,
        fmt_ns(t.offcpu_ns),
        fmt_ns(t.cpu_wait_ns),
        t.syscalls,
        fmt_ns(t.syscall_ns),
        t.page_faults
    )
}

fn header(out: &mut dyn Write, what: &str) -> std::io::Result<()> {
    writeln!(
        out,
        "{what:<34} {:>10} {:>12} {:>12} {:>10} {:>12} {:>8}",
        "cpu", "off-cpu", "cpu wait", "syscalls", "syscall time", "faults"
    )
}

/// Who did the work: processes (when there are several) and the busiest threads, with cpu,
/// off-cpu (and of it the time runnable, waiting for a CPU), syscalls and page faults each.
pub(super) fn write_who_table(
    profile: &Profile,
    phase: Option<u32>,
    top: usize,
    mut out: impl Write,
) -> std::io::Result<()> {
    let rows = threads::threads(profile, phase);
    if rows.is_empty() {
        return Ok(());
    }
    let procs = threads::processes(profile, phase);
    if procs.len() > 1 {
        writeln!(out, "\n== processes ==")?;
        header(&mut out, "pid (name)")?;
        for p in procs.iter().take(top) {
            let label = format!("{} ({}, {} threads)", p.pid, p.name, p.threads);
            row(&mut out, &label, &p.totals)?;
        }
    }
    writeln!(out, "\n== threads ({} seen; cpu in samples) ==", rows.len())?;
    header(&mut out, "tid (name) of pid")?;
    for t in rows.iter().take(top) {
        row(
            &mut out,
            &format!("{} ({}) of {}", t.tid, t.name, t.pid),
            &t.totals,
        )?;
    }
    Ok(())
}
