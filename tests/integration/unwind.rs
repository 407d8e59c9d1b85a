//! Stacks of code built without frame pointers: walked in the kernel from unwind tables
//! (`--unwind dwarf`, for every event kind), or unwound here from stack copies (`--unwind copy`).

use std::path::Path;

use phaseprof_e2e::*;

use crate::require_root;

/// Whether a folded stack (root first) reaches a thread's entry: glibc's `start_thread` for
/// spawned threads, `main` for the main thread, or the program's `_start` at the root (the
/// dynamic loader's work before main).
pub(crate) fn reaches_entry(stack: &str) -> bool {
    stack.starts_with("_start;") || stack.split(';').any(|f| f == "main" || f == "start_thread")
}

/// Whether a folded stack has a frame in zlib (named, or by its function's start in libz).
fn in_zlib(stack: &str) -> bool {
    stack
        .split(';')
        .any(|f| f.starts_with("libz.so") || f == "deflate")
}

/// The share of cpu samples whose stack `pick` selects, in percent, and the sample count.
fn share(file: &Path, pick: impl Fn(&str) -> bool) -> (f64, u64) {
    let (total, picked) = folded_cpu_share(file, pick);
    assert!(total > 0, "no cpu samples in {}", file.display());
    (100.0 * picked as f64 / total as f64, total)
}

/// How `auto` (or the mode asked) walked the target's stacks, from `report --json`.
fn unwind_of(file: &Path) -> serde_json::Value {
    report_json(file)["events"]["cpu"]["unwind"].clone()
}

/// How the recording's `nth` target (in the order they became targets) was walked and why:
/// `fp (auto: ...)`, `dwarf (--unwind dwarf)` ...
pub(crate) fn how_walked(file: &Path, nth: usize) -> String {
    let pid = report_json(file)["target"]["pids"][nth].to_string();
    unwind_of(file)["targets"][pid]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

// Checks validator-sim built without frame pointers (a second build of the same workload)
// recorded with --unwind dwarf: at least 95% of cpu samples unwind to the thread's entry, and
// the samples naming the burn function per burned CPU second (the workload's own clock) are
// within 10% of the frame-pointer build's. Also checks what the mode is for: the kernel's
// frame-pointer walk of the same build reaches the entry for few samples; and that `auto` picks
// each build's way from its binary. Samples at 499 Hz for ~3 s × 2 threads: ~3,000 burn samples
// a side (one standard error ≈ 2%). Each run is measured against its own truth because the
// burn's share of all samples moves with the memory bandwidth the copies get on a loaded host.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_unwinds_a_build_without_frame_pointers() {
    require_root!();
    let fp = rust_workload("validator-sim");
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    // Burning in propose, copying 20 MB per block in replay (memcpy: libc, no frame pointers
    // there either), 20 write(2) per block in finalize (samples in the kernel: the user stack
    // from the syscall entry's registers).
    let args = [
        "--blocks",
        "120",
        "--threads",
        "2",
        "--burn-ms",
        "25",
        "--clone-bytes",
        "20000000",
        "--flushes",
        "20",
    ];
    let opts = |unwind: &'static str| ["--events", "cpu", "--freq", "499", "--unwind", unwind];
    let (with_fp, truth_fp) = record_workload("unwind-fp", &opts("auto"), &fp, &args);
    let burn_fn = truth_fp["burn_fn"].as_str().unwrap().to_string();
    let (dwarf, truth_dwarf) = record_workload("unwind-dwarf", &opts("dwarf"), &nofp, &args);
    assert_eq!(
        tracer_frames_in(&dwarf, "cpu").1,
        0,
        "tracer frames in {dwarf:?}"
    );
    let (fp_walk, _) = record_workload("unwind-fpwalk", &opts("fp"), &nofp, &args);
    let (auto_nofp, _) = record_workload("unwind-auto", &opts("auto"), &nofp, &["--blocks", "1"]);

    let burns = |stack: &str| stack.split(';').any(|f| f == burn_fn);
    let (entry_dwarf, n_dwarf) = share(&dwarf, reaches_entry);
    let (entry_fp_walk, _) = share(&fp_walk, reaches_entry);
    let (entry_fp_build, n_fp) = share(&with_fp, reaches_entry);
    // Burn samples per burned CPU second, over the 499 a second the clock asks for.
    let per_burned_second = |file: &Path, truth: &serde_json::Value| {
        let (_, burning) = folded_cpu_share(file, burns);
        burning as f64 / (truth["burn_cpu_ns"].as_f64().unwrap() / 1e9) / 499.0
    };
    let burn_dwarf = per_burned_second(&dwarf, &truth_dwarf);
    let burn_fp = per_burned_second(&with_fp, &truth_fp);
    let u = unwind_of(&dwarf);
    eprintln!(
        "without frame pointers, dwarf: {entry_dwarf:.1}% of {n_dwarf} samples reach the entry, \
         burn sampled {burn_dwarf:.3}× its CPU time; fp walk of that build: {entry_fp_walk:.1}% \
         reach the entry; frame-pointer build: {entry_fp_build:.1}% of {n_fp} reach the entry, \
         burn sampled {burn_fp:.3}×; \
         unwind {u}"
    );
    assert!(entry_dwarf >= 95.0, "{entry_dwarf:.1}% reach the entry");
    assert!(
        (burn_dwarf / burn_fp - 1.0).abs() <= 0.10,
        "burn sampled {burn_dwarf:.3}× its CPU time vs {burn_fp:.3}× with frame pointers"
    );
    assert!(
        entry_fp_walk < 50.0,
        "the fp walk reached the entry for {entry_fp_walk:.1}%"
    );
    // Every stack was walked from the tables, and the walker's own count of walks that reached
    // the thread's entry agrees with the symbols.
    let walks = &u["walks"];
    // (A sample during the exec itself, before the target's tables exist, is the kernel's
    // frame-pointer walk.)
    assert!(
        walks["stacks"].as_f64().unwrap_or(0.0) >= 0.99 * n_dwarf as f64,
        "{u}"
    );
    assert!(
        walks["complete"].as_f64().unwrap_or(0.0) >= 0.95 * walks["stacks"].as_f64().unwrap(),
        "{u}"
    );
    assert_eq!(report_json(&dwarf)["lost"]["stacks"].as_u64(), Some(0));

    // The older way, stack copies unwound here, on the same build: every sample came through
    // the copy, or is counted lost for want of room in the copy ring (it can fill while a loaded
    // machine keeps the agent from reading it); few are.
    let (copy, _) = record_workload("unwind-copy", &opts("copy"), &nofp, &args);
    let (entry_copy, n_copy) = share(&copy, reaches_entry);
    let u = unwind_of(&copy);
    eprintln!("copy: {entry_copy:.1}% of {n_copy} samples reach the entry; unwind {u}");
    assert!(entry_copy >= 95.0, "{entry_copy:.1}% reach the entry");
    let lost = report_json(&copy)["lost"].clone();
    let ring_full = lost["by_reason"]["stack_copy_ringbuf_full"]
        .as_u64()
        .unwrap_or(0);
    assert_eq!(
        u["unwound_samples"].as_u64().unwrap_or(0) + ring_full,
        n_copy,
        "{u} lost {lost}"
    );
    assert!(ring_full * 100 <= n_copy, "lost {lost} of {n_copy}");
    let complete = u["complete"].as_u64().unwrap_or(0);
    assert!(complete as f64 >= 0.95 * n_copy as f64, "{u}");
    assert_eq!(lost["stacks"].as_u64(), Some(ring_full), "{lost}");
    let how = |file: &Path| how_walked(file, 0);
    assert!(
        how(&dwarf).starts_with("dwarf (--unwind dwarf"),
        "{}",
        how(&dwarf)
    );
    // A program with frame pointers maps libc without them: walked per module.
    let per_module = "dwarf (auto: per module; the program keeps frame pointers";
    assert!(how(&with_fp).starts_with(per_module), "{}", how(&with_fp));
    assert!(
        how(&auto_nofp).starts_with("dwarf (auto"),
        "{}",
        how(&auto_nofp)
    );
    // The text report says the same in its header.
    let line = stacks_line(&dwarf);
    assert!(
        line.contains(": dwarf (--unwind dwarf)")
            && line.contains("stacks walked from unwind tables"),
        "{line}"
    );
    let line = stacks_line(&copy);
    assert!(
        line.contains(": copy (--unwind copy)")
            && line.contains(&format!("{n_copy} samples unwound from stack copies")),
        "{line}"
    );
}

/// The `stacks: ` line of a recording's text report.
/// The `stacks:` line of `report -v` (without `-v` the report leaves it out).
fn stacks_line(file: &Path) -> String {
    let plain = phaseprof_ok(&["report", file.to_str().unwrap()]);
    let stacks = |out: &[u8]| {
        String::from_utf8_lossy(out)
            .lines()
            .find(|l| l.starts_with("stacks: "))
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(stacks(&plain.stdout), "", "only with -v");
    stacks(&phaseprof_ok(&["report", "-v", file.to_str().unwrap()]).stdout)
}

// Checks that phases leave stacks whole: with phase probes on validator-sim built without frame
// pointers, a thread inside a phase has a uretprobe trampoline's address where its phase
// function's return address was; restored from the kernel's record of it, at least 95% of cpu
// samples still unwind to the thread's entry, and phase calls stay exact. The frame-pointer
// build walked with `--unwind fp` and phases reaches the entry as often.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_stacks_are_unchanged_by_phases() {
    require_root!();
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    let phases = root().join("tests/workloads/validator-sim/phases.toml");
    let opts = [
        "--events",
        "cpu",
        "--freq",
        "499",
        "--unwind",
        "dwarf",
        "--phases",
        phases.to_str().unwrap(),
    ];
    let args = [
        "--blocks",
        "60",
        "--threads",
        "2",
        "--burn-ms",
        "25",
        "--clone-bytes",
        "20000000",
    ];
    let (file, truth) = record_workload("unwind-phases", &opts, &nofp, &args);
    let (entry, n) = share(&file, reaches_entry);
    let (_, in_propose) = folded_cpu_share_in_phase(&file, "propose", |_| true);
    eprintln!(
        "with phases, dwarf: {entry:.1}% of {n} samples reach the entry; {in_propose} in propose"
    );
    assert!(entry >= 95.0, "{entry:.1}% reach the entry");
    // Most samples are taken inside a phase (burning in propose), so the trampoline was there.
    assert!(
        in_propose as f64 >= 0.5 * n as f64,
        "{in_propose} of {n} in propose"
    );
    let report = report_json(&file);
    for name in ["propose", "replay", "finalize"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    // The kernel's frame-pointer walk of the frame-pointer build puts the real return
    // addresses back itself (Linux >= 6.11): the same share reaches the entry with phases.
    let fp = rust_workload("validator-sim");
    let mut fp_opts = opts;
    fp_opts[5] = "fp";
    let (fp_file, _) = record_workload("unwind-phases-fp", &fp_opts, &fp, &args);
    let (fp_entry, fp_n) = share(&fp_file, reaches_entry);
    eprintln!("with phases, fp: {fp_entry:.1}% of {fp_n} samples reach the entry");
    assert!(fp_entry >= 95.0, "{fp_entry:.1}% reach the entry");
}

// Checks a C program compressing with Debian's zlib (no frame pointers in libz) under
// --unwind dwarf: the samples in zlib's code unwind through the library's frames back into the
// caller, compress_block, and on to main. The frame-pointer walk of the same run loses the
// caller for most of them (printed for comparison, asserted below half).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_unwinds_through_a_library_into_its_caller() {
    require_root!();
    let bin = c_workload("zlib-sim", "", &["-lz"]);
    let _g = bpf_lock();
    let opts = |unwind: &'static str| ["--events", "cpu", "--freq", "499", "--unwind", unwind];
    let (dwarf, truth) = record_workload("zlib-dwarf", &opts("dwarf"), &bin, &["8"]);
    let (fp_walk, _) = record_workload("zlib-fp", &opts("fp"), &bin, &["8"]);
    let caller = truth["caller"].as_str().unwrap().to_string();
    let through =
        |stack: &str| in_zlib(stack) && stack.contains(&format!("main;run;{caller};compress2;"));
    let (zlib_dwarf, n) = share(&dwarf, in_zlib);
    let (_, zlib_samples) = folded_cpu_share(&dwarf, in_zlib);
    let (_, through_samples) = folded_cpu_share(&dwarf, through);
    let (_, fp_zlib) = folded_cpu_share(&fp_walk, in_zlib);
    let (_, fp_through) = folded_cpu_share(&fp_walk, |s| in_zlib(s) && s.contains(&caller));
    let pct = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    eprintln!(
        "zlib: {zlib_dwarf:.1}% of {n} samples in libz; dwarf: {through_samples}/{zlib_samples} \
         ({:.1}%) reach main;run;{caller}; fp walk: {fp_through}/{fp_zlib} ({:.1}%) reach {caller}",
        pct(through_samples, zlib_samples),
        pct(fp_through, fp_zlib)
    );
    assert!(zlib_samples >= 500, "{zlib_samples} samples in zlib");
    assert!(
        pct(through_samples, zlib_samples) >= 95.0,
        "{through_samples}/{zlib_samples}"
    );
    assert!(pct(fp_through, fp_zlib) < 50.0, "{fp_through}/{fp_zlib}");
}

// Checks a library loaded after recording began: zlib-sim built to dlopen libz after ~300 ms of
// warm-up, recorded with --unwind dwarf from its start. The first samples in libz fall outside
// every module the unwinder knows; it re-reads the mappings, adds libz, and those samples unwind
// back into compress_block as with a linked libz.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_follows_a_library_loaded_later() {
    require_root!();
    let bin = c_workload("zlib-sim", "-dlopen", &["-DLOAD_ZLIB_LATE", "-ldl"]);
    let _g = bpf_lock();
    let opts = ["--events", "cpu", "--freq", "499", "--unwind", "dwarf"];
    let (file, truth) = record_workload("zlib-dlopen", &opts, &bin, &["4"]);
    let caller = truth["caller"].as_str().unwrap().to_string();
    let (_, zlib_samples) = folded_cpu_share(&file, in_zlib);
    let (_, through) = folded_cpu_share(&file, |s| {
        in_zlib(s) && s.contains(&format!("main;run;{caller};"))
    });
    let (_, warm_up) = folded_cpu_share(&file, |s| s.split(';').any(|f| f == "warm_up"));
    eprintln!("dlopen'ed libz: {through}/{zlib_samples} samples reach {caller}; warm-up {warm_up}");
    assert!(warm_up >= 50, "{warm_up} samples before the dlopen");
    assert!(zlib_samples >= 300, "{zlib_samples} samples in zlib");
    assert!(
        through as f64 >= 0.95 * zlib_samples as f64,
        "{through}/{zlib_samples}"
    );
}

// Checks page faults of a build without frame pointers under --unwind dwarf: validator-sim leaks
// 400 KB per block through validator_sim::work::leak, touching every page; ≥95% of the faults'
// stacks unwind to the thread's entry, and the faults under `leak` cover every leaked page (the
// count is exact either way: one event per fault).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_unwinds_page_faults() {
    require_root!();
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    let opts = ["--events", "pagefault", "--unwind", "dwarf"];
    // Sleeping 10 ms a block keeps the process alive for a while: its mappings are read at
    // the first samples, after the loader mapped libc (a process that exits within a few ms of
    // starting may be gone before its mappings are read; its stacks then stop early, as
    // `unwind.complete` shows).
    let args = [
        "--blocks",
        "30",
        "--leak-bytes",
        "400000",
        "--sleep-ms",
        "10",
    ];
    let (file, truth) = record_workload("unwind-faults", &opts, &nofp, &args);
    let (total, reaching) = folded_event_share(&file, "pagefault", reaches_entry);
    let (_, in_leak) = folded_event_share(&file, "pagefault", |s| {
        reaches_entry(s) && s.split(';').any(|f| f == "validator_sim::work::leak")
    });
    let pages = truth["leaked_bytes"].as_u64().unwrap() / 4096;
    eprintln!("page faults: {reaching}/{total} reach the entry; {in_leak} under leak for {pages} leaked pages");
    assert!(reaching as f64 >= 0.95 * total as f64, "{reaching}/{total}");
    assert!(
        in_leak >= pages,
        "{in_leak} faults under leak, {pages} pages leaked"
    );
    assert_eq!(report_json(&file)["lost"]["stacks"].as_u64(), Some(0));
}

// Checks a target that execs another program mid-recording: `sh -c 'exec validator-sim …'`, and
// one that forks it as a child. The shell (Debian's dash) is inspected at the start, the new
// program again at its exec: under `auto` the frame-pointer build ends up walked per module (its
// own frames by frame pointers, libc's from tables); under `dwarf` the build without them is unwound with the new program's modules (the
// shell's are forgotten at the exec), and its samples reach the entry.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn exec_switches_programs() {
    require_root!();
    let fp = rust_workload("validator-sim");
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    let via_shell = |name: &str, unwind: &str, sim: &Path| {
        let script = format!("exec {} --blocks 40 --burn-ms 25", sim.display());
        let opts = ["--events", "cpu", "--freq", "499", "--unwind", unwind];
        record_workload(name, &opts, Path::new("/bin/sh"), &["-c", &script]).0
    };
    let auto = via_shell("exec-auto", "auto", &fp);
    let dwarf = via_shell("exec-dwarf", "dwarf", &nofp);
    // Not exec but fork + exec: `; true` keeps the shell, which forks the program as a child
    // (followed under `-- CMD`); the child starts with the shell's way and is decided again.
    let script = format!("{} --blocks 40 --burn-ms 25; true", nofp.display());
    let opts = ["--events", "cpu", "--freq", "499"];
    let (forked, _) = record_workload("fork-auto", &opts, Path::new("/bin/sh"), &["-c", &script]);
    let pids = report_json(&forked)["target"]["pids"].clone();
    let child_how = how_walked(&forked, 1);
    let (fork_entry, fork_n) = share(&forked, reaches_entry);
    let how = how_walked(&auto, 0);
    let (entry, n) = share(&dwarf, reaches_entry);
    eprintln!(
        "after exec: auto chose `{how}`; dwarf: {entry:.1}% of {n} samples reach the entry; \
         forked child (pids {pids}): `{child_how}`, {fork_entry:.1}% of {fork_n} reach the entry"
    );
    let per_module = "dwarf (auto: per module; the program keeps frame pointers";
    assert!(how.starts_with(per_module), "{how}");
    assert!(entry >= 95.0, "{entry:.1}% of {n}");
    assert!(child_how.starts_with("dwarf (auto"), "{pids} {child_how}");
    assert!(fork_entry >= 95.0, "{fork_entry:.1}% of {fork_n}");
}

/// Per event kind (as `export --event` names it): how much of its weight reaches the thread's
/// entry, in percent, and the total weight.
pub(crate) fn entry_share_by_event(file: &Path, events: &[&str]) -> Vec<(String, f64, u64)> {
    events
        .iter()
        .map(|ev| {
            let (total, reaching) = folded_event_share(file, ev, reaches_entry);
            let pct = 100.0 * reaching as f64 / total.max(1) as f64;
            (ev.to_string(), pct, total)
        })
        .collect()
}

/// Asserts that every kind's stacks have weight, reach the entry for at least 95% of it, and
/// hold no frame of the tracing machinery.
pub(crate) fn assert_whole_stacks(file: &Path, shares: &[(String, f64, u64)]) {
    for (ev, pct, total) in shares {
        assert!(*total > 0, "no {ev} events in {file:?}");
        assert!(*pct >= 95.0, "{ev}: {pct:.1}% of {total} reach the entry");
        let (_, tracer) = tracer_frames_in(file, ev);
        assert_eq!(tracer, 0, "{ev}: {tracer} with tracer frames");
    }
}

// Checks a C program whose waits, syscalls and allocations all start in Debian's libc (no frame
// pointers there, none in the program either): under the default `--unwind auto` (which picks
// the tables for this binary) at least 95% of its off-CPU time, syscalls and allocated bytes
// have stacks that reach the thread's entry, through the program's functions. With the default
// sampled syscall stacks the counts by stack are estimates within 2% of the truth (syscall
// totals stay exact); with `--syscall-stacks all` they are exact. The frame-pointer walk of the
// same program loses the callers of nearly all of them (printed, asserted below half).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_walks_every_event_kind_through_libc() {
    require_root!();
    let bin = c_workload("libc-sim", "", &["-lpthread"]);
    let _g = bpf_lock();
    let kinds = ["offcpu", "syscall", "alloc"];
    let events = ["--events", "cpu,offcpu,syscall,alloc"];
    let args = ["2", "200", "20"];
    let (file, truth) = record_workload("libc-dwarf", &events, &bin, &args);
    let all = [&events[..], &["--syscall-stacks", "all"]].concat();
    let (exact, _) = record_workload("libc-dwarf-all", &all, &bin, &args);
    let fp = [&events[..], &["--unwind", "fp"]].concat();
    let (fp, _) = record_workload("libc-fp", &fp, &bin, &args);
    let shares = entry_share_by_event(&file, &kinds);
    let fp_shares = entry_share_by_event(&fp, &kinds);
    let how = how_walked(&file, 0);
    eprintln!("libc-sim, {how}: {shares:?}; fp walk: {fp_shares:?}");
    assert!(how.starts_with("dwarf (auto"), "{how}");
    assert_whole_stacks(&file, &shares);
    assert_whole_stacks(&exact, &entry_share_by_event(&exact, &kinds));
    let (_, fp_offcpu, _) = &fp_shares[0];
    assert!(
        *fp_offcpu < 50.0,
        "the fp walk reached the entry for {fp_offcpu:.1}%"
    );
    // The workers' own functions are on the way: writes under flush_records, sleeps under
    // round_once (pause_briefly tail-calls usleep: no frame of its own), allocations under
    // build_batch.
    let under = |file: &Path, ev: &str, f: &str| {
        folded_event_share(file, ev, |s| {
            reaches_entry(s) && s.split(';').any(|x| x == "worker") && s.split(';').any(|x| x == f)
        })
        .1
    };
    let (writes, sleeps) = (
        truth["writes"].as_u64().unwrap(),
        truth["sleeps"].as_u64().unwrap(),
    );
    for f in [&file, &exact] {
        let report = report_json(f);
        let n = report["events"]["syscall"]["by_name"]["write"]["count"].as_u64();
        assert_eq!(n, Some(writes + 1), "writes (+ the truth line)");
    }
    assert_eq!(under(&exact, "syscall", "flush_records"), writes);
    assert_eq!(under(&exact, "syscall", "usleep"), sleeps);
    let est_writes = under(&file, "syscall", "flush_records") as f64;
    let est_sleeps = under(&file, "syscall", "usleep") as f64;
    eprintln!("sampled syscall stacks: {est_writes} writes (truth {writes}), {est_sleeps} sleeps (truth {sleeps})");
    assert!(
        (est_writes / writes as f64 - 1.0).abs() <= 0.02,
        "{est_writes} writes"
    );
    assert!(
        (est_sleeps / sleeps as f64 - 1.0).abs() <= 0.02,
        "{est_sleeps} sleeps"
    );
    let batch = under(&file, "alloc", "build_batch");
    assert!(
        batch as f64 >= 0.95 * truth["alloc_bytes"].as_f64().unwrap(),
        "{batch}"
    );
}

// Checks validator-sim built without frame pointers (Rust's release build, libc's code under
// it): at least 95% of its cpu samples, off-CPU time, syscalls and allocated bytes have stacks
// that reach the thread's entry, walked in the kernel from the tables.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_walks_every_event_kind_without_frame_pointers() {
    require_root!();
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    let opts = [
        "--events",
        "cpu,offcpu,syscall,alloc",
        "--freq",
        "499",
        "--unwind",
        "dwarf",
    ];
    let args = [
        "--blocks",
        "60",
        "--threads",
        "2",
        "--burn-ms",
        "10",
        "--clone-bytes",
        "20000000",
        "--flushes",
        "20",
        "--sleep-ms",
        "5",
    ];
    let (file, truth) = record_workload("nofp-every-kind", &opts, &nofp, &args);
    let shares = entry_share_by_event(&file, &["cpu", "offcpu", "syscall", "alloc"]);
    eprintln!(
        "validator-sim without frame pointers: {shares:?}; {}",
        unwind_of(&file)
    );
    assert_whole_stacks(&file, &shares);
    let report = report_json(&file);
    let writes = report["events"]["syscall"]["by_name"]["write"]["count"].as_u64();
    assert_eq!(writes, truth["write_syscalls"].as_u64(), "write(2) count");
}
