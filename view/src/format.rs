//! How views write numbers: durations, bytes, percents, sample counts, and the means and
//! intervals of diffs. One place, so the report, the diff and the web pages agree.
use phaseprof_model::diff::{MetricDiff, Per, Unit};
use phaseprof_model::EventKind;

/// `part` as a percentage of `whole` (0 when `whole` is 0).
pub fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Nanoseconds in the largest unit that keeps them above 1 (`1.234 ms`).
pub fn fmt_ns(ns: u64) -> String {
    let ns = ns as f64;
    if ns >= 1e9 {
        format!("{:.3} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Bytes in binary units (`1.50 MiB`).
pub fn fmt_bytes(b: u64) -> String {
    let b = b as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1 << 20) as f64 {
        format!("{:.2} MiB", b / (1 << 20) as f64)
    } else if b >= (1 << 10) as f64 {
        format!("{:.1} KiB", b / (1 << 10) as f64)
    } else {
        format!("{b:.0} B")
    }
}

/// A value of an event kind in its unit: off-CPU time, allocated bytes, or a count.
pub fn fmt_value(kind: EventKind, v: u64) -> String {
    match kind.unit() {
        "nanoseconds" => fmt_ns(v),
        "bytes" => fmt_bytes(v),
        _ => v.to_string(),
    }
}

/// A mean or a bound: whole numbers as they are, large ones in scientific notation.
pub fn fmt_num(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.4e}", v)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A value of `unit` that may be fractional or negative: `5.119 ms`, `-1.50 MiB`, `4.67`.
pub fn fmt_quantity(unit: Unit, v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = v.abs();
    let sign = if v < 0.0 { "-" } else { "" };
    let scaled = |x: f64, name: &str| {
        let digits = if x >= 100.0 {
            1
        } else if x >= 10.0 {
            2
        } else {
            3
        };
        format!("{sign}{x:.digits$} {name}")
    };
    match unit {
        Unit::Ns if a >= 1e9 => scaled(a / 1e9, "s"),
        Unit::Ns if a >= 1e6 => scaled(a / 1e6, "ms"),
        Unit::Ns if a >= 1e3 => scaled(a / 1e3, "µs"),
        Unit::Ns => scaled(a, "ns"),
        Unit::Bytes if a >= (1u64 << 30) as f64 => scaled(a / (1u64 << 30) as f64, "GiB"),
        Unit::Bytes if a >= (1 << 20) as f64 => scaled(a / (1 << 20) as f64, "MiB"),
        Unit::Bytes if a >= 1024.0 => scaled(a / 1024.0, "KiB"),
        Unit::Bytes => scaled(a, "B"),
        Unit::Count if a >= 1e9 => scaled(a / 1e9, "G"),
        Unit::Count if a >= 1e6 => scaled(a / 1e6, "M"),
        Unit::Count if a >= 1e4 => scaled(a / 1e3, "k"),
        Unit::Count => format!("{sign}{}", fmt_num(a)),
    }
}

/// A diffed metric's value with its unit and, for whole-recording rates, `/s`.
pub fn fmt_metric_value(m: &MetricDiff, v: f64) -> String {
    let q = fmt_quantity(m.unit, v);
    if m.per == Per::Second {
        format!("{q}/s")
    } else {
        q
    }
}

/// One side of a diffed metric: its mean, ± its standard deviation over several runs.
pub fn fmt_side(m: &MetricDiff, b: bool) -> String {
    let s = if b { &m.b } else { &m.a };
    if s.n > 1 {
        format!(
            "{} ± {}",
            fmt_metric_value(m, s.mean),
            fmt_quantity(m.unit, s.sd)
        )
    } else {
        fmt_metric_value(m, s.mean)
    }
}

/// B − A of a diffed metric, signed.
pub fn fmt_delta(m: &MetricDiff) -> String {
    let d = fmt_metric_value(m, m.diff.delta);
    if m.diff.delta > 0.0 {
        format!("+{d}")
    } else {
        d
    }
}

/// A diffed metric's interval for B−A, when both sides have several runs.
pub fn fmt_interval(m: &MetricDiff) -> String {
    if m.a.n > 1 && m.b.n > 1 {
        format!(
            "[{}, {}]",
            fmt_quantity(m.unit, m.diff.low),
            fmt_quantity(m.unit, m.diff.high)
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks each unit's boundaries.
    #[test]
    fn units() {
        assert_eq!(fmt_ns(999), "999 ns");
        assert_eq!(fmt_ns(1_500), "1.5 µs");
        assert_eq!(fmt_ns(2_000_000), "2.000 ms");
        assert_eq!(fmt_ns(90_000_000_000), "90.000 s");
        assert_eq!(fmt_bytes(1023), "1023 B");
        assert_eq!(fmt_bytes(3 << 20), "3.00 MiB");
        assert_eq!(fmt_value(EventKind::Cpu, 42), "42");
        assert_eq!(pct(1, 0), 0.0);
        assert_eq!(pct(1, 4), 25.0);
        assert_eq!(fmt_num(2.0), "2");
        assert_eq!(fmt_num(2.5), "2.50");
        assert_eq!(fmt_quantity(Unit::Ns, 5.1189e6), "5.119 ms");
        assert_eq!(fmt_quantity(Unit::Ns, -15183.82), "-15.18 µs");
        assert_eq!(fmt_quantity(Unit::Bytes, 1.5 * 1048576.0), "1.500 MiB");
        assert_eq!(fmt_quantity(Unit::Count, 4.666), "4.67");
        assert_eq!(fmt_quantity(Unit::Count, 2.5e6), "2.500 M");
    }
}
