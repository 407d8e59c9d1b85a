//! `phaseprof soak`: memory growth of a live process. Samples `/proc/PID/smaps_rollup` every
//! interval and fits each memory class's growth by least squares, with the slope's standard
//! error, so a leak shows as "anonymous grows 6.1 ± 0.2 MiB/s" rather than as a guess.
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use phaseprof_model::{is_allocator_frame, SampleKind, FAULT_COUNT, LIVE_BYTES, LIVE_OLDEST_NS};
use serde::Serialize;

/// The memory classes reported, and the smaps_rollup field each is read from.
pub const CLASSES: &[(&str, &str)] = &[
    ("rss", "Rss"),
    ("pss", "Pss"),
    ("anonymous", "Anonymous"),
    ("private_dirty", "Private_Dirty"),
    ("file", "Pss_File"),
    ("shmem", "Pss_Shmem"),
];

/// Disjoint classes that together make up the resident memory: the one that grows fastest
/// "dominates" the growth.
const DISJOINT: &[&str] = &["anonymous", "file", "shmem"];

#[derive(Clone, Debug)]
pub struct SoakOptions {
    pub pid: u32,
    pub duration: Duration,
    pub interval: Duration,
}

/// What grew, by stack: from a recording made alongside the soak (`--events alloc,pagefault`).
#[derive(Clone, Debug, Serialize)]
pub struct StackGrowth {
    pub phase: String,
    /// Frames, leaf first.
    pub frames: Vec<String>,
    /// Live heap: estimated bytes allocated during the soak and not freed; page faults: count.
    pub value: u64,
    /// Live heap: growth in MiB/s over the soak.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mib_s: Option<f64>,
    /// Live heap: age of the oldest live allocation, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_s: Option<f64>,
}

/// Rows per stack table.
const TOP_STACKS: usize = 10;

/// The live-heap growth and page faults by stack of a profile recorded during the soak.
pub fn stack_growth(p: &phaseprof_model::Profile) -> (Vec<StackGrowth>, Vec<StackGrowth>) {
    let frames = |stack: u32| -> Vec<String> {
        p.stacks
            .get(stack as usize)
            .map(|s| {
                s.frames
                    .iter()
                    .filter_map(|&f| p.frames.get(f as usize))
                    .map(|f| f.function.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let secs = (p.duration_ns() as f64 / 1e9).max(1e-9);
    // Largest first (the first value: bytes live, faults).
    let top = |kind| {
        let mut v: Vec<&phaseprof_model::Sample> = p.samples_of(kind).collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.value(0)));
        v.truncate(TOP_STACKS);
        v
    };
    let live = (top(SampleKind::Live).into_iter())
        .map(|l| StackGrowth {
            phase: p.phase_name(l.phase).to_string(),
            frames: frames(l.stack.unwrap_or(u32::MAX)),
            value: l.value(LIVE_BYTES),
            mib_s: Some(l.value(LIVE_BYTES) as f64 / secs / (1024.0 * 1024.0)),
            oldest_s: Some(l.value(LIVE_OLDEST_NS) as f64 / 1e9),
        })
        .collect();
    let faults = (top(SampleKind::Pagefault).into_iter())
        .map(|f| StackGrowth {
            phase: p.phase_name(f.phase).to_string(),
            frames: frames(f.stack.unwrap_or(u32::MAX)),
            value: f.value(FAULT_COUNT),
            mib_s: None,
            oldest_s: None,
        })
        .collect();
    (live, faults)
}

/// One sample: seconds since the first, and bytes per class.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub t: f64,
    pub bytes: BTreeMap<String, u64>,
}

/// A least-squares line through (t, y).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fit {
    /// MiB per second.
    pub slope_mib_s: f64,
    /// Standard error of the slope, MiB per second.
    pub stderr_mib_s: f64,
    /// First and last value, MiB.
    pub start_mib: f64,
    pub end_mib: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct SoakReport {
    pub pid: u32,
    pub samples: usize,
    pub duration_s: f64,
    pub classes: BTreeMap<String, Fit>,
    /// The disjoint class (anonymous, file, shmem) that grew fastest.
    pub dominant: String,
    /// Live heap by stack: what was allocated during the soak and is still held, largest first
    /// (with `alloc` events).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub live_heap: Vec<StackGrowth>,
    /// Page faults by stack and phase, most first (with `pagefault` events).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub page_faults: Vec<StackGrowth>,
}

/// Reads the classes of `CLASSES` from a smaps_rollup text, in bytes.
pub fn parse_smaps_rollup(text: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        if let Some((class, _)) = CLASSES.iter().find(|(_, field)| *field == key) {
            let kb: u64 = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            out.insert(class.to_string(), kb * 1024);
        }
    }
    out
}

/// Ordinary least squares of y on t; the slope's standard error needs at least 3 points.
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 3 {
        return None;
    }
    let (mt, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (t, y)| (a + t / n, b + y / n));
    let sxx: f64 = points.iter().map(|(t, _)| (t - mt).powi(2)).sum();
    if sxx == 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|(t, y)| (t - mt) * (y - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mt;
    let rss: f64 = points
        .iter()
        .map(|(t, y)| (y - intercept - slope * t).powi(2))
        .sum();
    let stderr = (rss / (n - 2.0) / sxx).sqrt();
    Some((slope, stderr))
}

/// Fits every class over `samples`.
pub fn analyze(pid: u32, samples: &[Sample]) -> Result<SoakReport> {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let mut classes = BTreeMap::new();
    for (class, _) in CLASSES {
        let points: Vec<(f64, f64)> = samples
            .iter()
            .filter_map(|s| s.bytes.get(*class).map(|b| (s.t, mib(*b))))
            .collect();
        if let Some((slope, stderr)) = fit(&points) {
            classes.insert(
                class.to_string(),
                Fit {
                    slope_mib_s: slope,
                    stderr_mib_s: stderr,
                    start_mib: points.first().map(|p| p.1).unwrap_or(0.0),
                    end_mib: points.last().map(|p| p.1).unwrap_or(0.0),
                },
            );
        }
    }
    if classes.is_empty() {
        bail!("need at least 3 samples to fit a slope; got {} (lengthen --duration or shorten --interval)", samples.len());
    }
    let dominant = DISJOINT
        .iter()
        .filter_map(|c| classes.get(*c).map(|f| (*c, f.slope_mib_s)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(c, _)| c.to_string())
        .unwrap_or_default();
    Ok(SoakReport {
        pid,
        samples: samples.len(),
        duration_s: samples.last().map(|s| s.t).unwrap_or(0.0),
        classes,
        dominant,
        live_heap: Vec::new(),
        page_faults: Vec::new(),
    })
}

pub fn check_pid(pid: u32) -> Result<()> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process with pid {pid} (nothing in /proc/{pid})");
    }
    Ok(())
}

/// Samples the process until `duration` ends or it exits (then fits what was sampled).
pub fn soak(opts: &SoakOptions) -> Result<SoakReport> {
    let path = format!("/proc/{}/smaps_rollup", opts.pid);
    check_pid(opts.pid)?;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut next = start;
    while start.elapsed() <= opts.duration {
        match std::fs::read_to_string(&path) {
            Ok(text) => samples.push(Sample {
                t: start.elapsed().as_secs_f64(),
                bytes: parse_smaps_rollup(&text),
            }),
            Err(e) if samples.is_empty() => {
                return Err(e).with_context(|| format!("reading {path}"))
            }
            Err(_) => {
                eprintln!(
                    "phaseprof: pid {} exited; fitting the {} samples taken",
                    opts.pid,
                    samples.len()
                );
                break;
            }
        }
        next += opts.interval;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    analyze(opts.pid, &samples)
}

pub fn write_human(r: &SoakReport, mut out: impl std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "pid {}: {} samples over {:.1} s",
        r.pid, r.samples, r.duration_s
    )?;
    writeln!(
        out,
        "{:<14} {:>14} {:>12} {:>12} {:>12}",
        "class", "slope MiB/s", "± stderr", "start MiB", "end MiB"
    )?;
    for (class, _) in CLASSES {
        if let Some(f) = r.classes.get(*class) {
            writeln!(
                out,
                "{:<14} {:>14.3} {:>12.3} {:>12.1} {:>12.1}",
                class, f.slope_mib_s, f.stderr_mib_s, f.start_mib, f.end_mib
            )?;
        }
    }
    writeln!(out, "growth dominated by: {}", r.dominant)?;
    let leaf = |g: &StackGrowth| {
        // The innermost frame of the program's own code says most; allocator frames come first.
        g.frames
            .iter()
            .find(|f| !is_allocator_frame(f))
            .or(g.frames.first())
            .cloned()
            .unwrap_or_else(|| "[no stack]".into())
    };
    if !r.live_heap.is_empty() {
        writeln!(
            out,
            "\nlive heap growth by stack (allocated during the soak, not freed):"
        )?;
        writeln!(
            out,
            "{:>12} {:>10} {:>10}  {:<12} stack",
            "MiB", "MiB/s", "oldest s", "phase"
        )?;
        for g in &r.live_heap {
            writeln!(
                out,
                "{:>12.2} {:>10.3} {:>10.1}  {:<12} {}",
                g.value as f64 / (1024.0 * 1024.0),
                g.mib_s.unwrap_or(0.0),
                g.oldest_s.unwrap_or(0.0),
                g.phase,
                leaf(g)
            )?;
        }
    }
    if !r.page_faults.is_empty() {
        writeln!(out, "\npage faults by stack:")?;
        writeln!(out, "{:>12}  {:<12} stack", "faults", "phase")?;
        for g in &r.page_faults {
            writeln!(out, "{:>12}  {:<12} {}", g.value, g.phase, leaf(g))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the least-squares slope and its standard error on known lines.
    #[test]
    fn least_squares() {
        let exact: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 3.0 * i as f64 + 1.0)).collect();
        let (slope, se) = fit(&exact).unwrap();
        assert!((slope - 3.0).abs() < 1e-12 && se < 1e-9);
        // Residuals +1, -1 alternating around y = 2t: slope 2 exactly, a positive stderr.
        let noisy: Vec<(f64, f64)> = (0..8)
            .map(|i| {
                (
                    i as f64,
                    2.0 * i as f64 + if i % 2 == 0 { 1.0 } else { -1.0 },
                )
            })
            .collect();
        let (slope, se) = fit(&noisy).unwrap();
        assert!((slope - 2.0).abs() < 0.2, "{slope}");
        assert!(se > 0.0 && se < 0.5, "{se}");
        assert!(fit(&exact[..2]).is_none());
    }

    // Checks parsing of a real smaps_rollup layout into bytes per class.
    #[test]
    fn parses_rollup() {
        let text = "55d0-7ffe ---p 00000000 00:00 0 [rollup]\nRss:  1600 kB\nPss:  622 kB\nPss_Anon: 112 kB\nPss_File: 510 kB\nPss_Shmem: 0 kB\nPrivate_Dirty: 112 kB\nAnonymous: 112 kB\n";
        let m = parse_smaps_rollup(text);
        assert_eq!(m["rss"], 1600 * 1024);
        assert_eq!(m["file"], 510 * 1024);
        assert_eq!(m["anonymous"], 112 * 1024);
        assert_eq!(m.len(), 6);
    }

    // Checks the dominant class is the fastest-growing disjoint one.
    #[test]
    fn dominant_class() {
        let samples: Vec<Sample> = (0..5)
            .map(|i| Sample {
                t: i as f64,
                bytes: [
                    ("rss", 100 + 30 * i),
                    ("anonymous", 50 + 20 * i),
                    ("file", 50 + 10 * i),
                    ("shmem", 0),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v << 20))
                .collect(),
            })
            .collect();
        let r = analyze(1, &samples).unwrap();
        assert_eq!(r.dominant, "anonymous");
        assert!((r.classes["rss"].slope_mib_s - 30.0).abs() < 1e-9);
    }
}
