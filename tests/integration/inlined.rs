//! Phases on functions the compiler inlined into their callers: probed at each inlined copy,
//! counted against the kernel's own count of the caller.

use std::path::Path;
use std::process::Command;

use phaseprof_e2e::*;

use crate::real_servers::KernelUprobe;
use crate::require_root;

/// The file offset of function `name` in `bin`, from its symbol table (`nm`).
fn function_offset(bin: &Path, name: &str) -> u64 {
    let o = Command::new("nm").arg(bin).output().expect("running nm");
    let text = String::from_utf8_lossy(&o.stdout);
    let vaddr = (text.lines())
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in nm {}", bin.display()));
    elf_file_offset(bin, vaddr)
}

// Checks a phase on inlined-sim's apply_block, which clang inlines into its only caller
// commit_block while an out-of-line copy (its address is taken) never runs: the phase is probed
// at the inlined copy, its calls equal the kernel's own hit count of a uprobe event on
// commit_block (registered through tracefs, as `perf probe` does) and the workload's truth, every
// write is inside it, and the phases are complete.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn inlined_phase_counts_every_call() {
    require_root!();
    let bin = c_workload("inlined-sim", "", &[]);
    let _g = bpf_lock();
    let dir = scratch("inlined-cfg");
    let cfg = dir.join("phases.toml");
    std::fs::write(
        &cfg,
        "[[phase]]\nname = \"apply\"\nfunction = \"apply_block\"\n",
    )
    .unwrap();
    let hits = KernelUprobe::new("commit_block", &bin, function_offset(&bin, "commit_block"));
    let before = hits.hits();
    let opts = ["--phases", cfg.to_str().unwrap(), "--events", "cpu,syscall"];
    let (file, truth) = record_workload("inlined", &opts, &bin, &["20000"]);
    let commits = hits.hits() - before;
    let report = report_json(&file);
    let apply = phase_json(&report, "apply");
    eprintln!(
        "apply: {} calls, {} syscalls; commit_block hit {commits} times (tracefs)",
        apply["calls"], apply["syscalls"]
    );
    assert_eq!(apply["calls"].as_u64(), Some(commits));
    assert_eq!(truth["blocks"].as_u64(), Some(commits));
    assert_eq!(apply["syscalls"], truth["writes"]);
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
}
