//! The units people type on command lines and in config files: durations (`1m30s`, `500ms`,
//! `7d`), byte counts (`512KiB`) and percentages (`1%`). One parser each, shared by the agent's
//! flags, agent.toml and the collector's flags, so every place accepts the same spellings and
//! refuses the same mistakes (with the same words).
use std::time::Duration;

/// A duration: one or more `NUMBER UNIT` parts, like Go's and systemd's (`30s`, `500ms`,
/// `1m30s`, `1.5h`, `7d`); units ns, us (µs), ms, s, m, h, d. A bare number is seconds.
/// Out-of-range values are refused, never wrapped or panicked on.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let example = "30s, 500ms, 1m30s or 7d";
    if t.is_empty() {
        return Err(format!("an empty duration: give one like {example}"));
    }
    if let Ok(secs) = t.parse::<f64>() {
        return Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("`{s}`: not a duration of 0 up to 2^64 s"));
    }
    let mut rest = t;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let v: f64 = num
            .parse()
            .map_err(|_| format!("`{s}` is not a duration like {example}"))?;
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            "" => return Err(format!("`{s}`: `{num}` needs a unit (ms, s, m, h, d)")),
            _ => {
                return Err(format!(
                    "`{s}`: unknown unit `{unit}` (use ns, us, ms, s, m, h or d)"
                ))
            }
        };
        let part = Duration::try_from_secs_f64(v * scale)
            .map_err(|_| format!("`{s}`: not a duration of 0 up to 2^64 s"))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| format!("`{s}`: not a duration of 0 up to 2^64 s"))?;
        rest = next;
    }
    Ok(total)
}

/// A byte count: `4096`, `512KiB`, `64k`, `1MiB`, `2m` (binary units). At least one byte.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a byte count like 4096, 512KiB or 1MiB"))?;
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (use KiB, MiB or GiB)"
            ))
        }
    };
    match n.checked_mul(mult) {
        Some(0) | None => Err(format!("`{s}`: must be between 1 byte and 2^64")),
        Some(v) => Ok(v),
    }
}

/// `1%` or `0.5%` as a fraction (0.01, 0.005); above 0% and at most 100%.
pub fn parse_percent(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let num = t
        .strip_suffix('%')
        .ok_or_else(|| format!("`{s}`: give a percentage like 1%"))?;
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a percentage like 1%"))?;
    if !(v > 0.0 && v <= 100.0) {
        return Err(format!(
            "`{s}`: the budget must be above 0% and at most 100%"
        ));
    }
    Ok(v / 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the spellings users type, compound durations included, and clear errors for
    // unknown units, missing units and out-of-range values (no panic).
    #[test]
    fn durations() {
        let d = |s| parse_duration(s).unwrap();
        assert_eq!(d("30s"), Duration::from_secs(30));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("2m"), Duration::from_secs(120));
        assert_eq!(d("3"), Duration::from_secs(3));
        assert_eq!(d("1m30s"), Duration::from_secs(90));
        assert_eq!(d("1h2m3s"), Duration::from_secs(3723));
        assert_eq!(d("1.5h"), Duration::from_secs(5400));
        assert_eq!(d("7d"), Duration::from_secs(7 * 86400));
        assert_eq!(d("250us"), Duration::from_micros(250));
        assert!(parse_duration("3 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_duration("1m30").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("99999999999999999999999h")
            .unwrap_err()
            .contains("2^64"));
    }

    // Checks byte units and the refusal of zero and overflow.
    #[test]
    fn bytes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("512KiB").unwrap(), 512 << 10);
        assert_eq!(parse_bytes("2m").unwrap(), 2 << 20);
        assert!(parse_bytes("0").is_err());
        assert!(parse_bytes("99999999999GiB").is_err());
        assert!(parse_bytes("3 parsecs").is_err());
    }

    // Checks percentages as fractions, and their range.
    #[test]
    fn percents() {
        assert_eq!(parse_percent("1%").unwrap(), 0.01);
        assert!(parse_percent("1").is_err());
        assert!(parse_percent("0%").is_err());
        assert!(parse_percent("101%").is_err());
    }
}
