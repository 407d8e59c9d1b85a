//! The `.phaseprof` file: a magic line, a format version, then the profile as gzip-compressed
//! JSON. See `FORMAT.md` for the layout and the compatibility rules.
use std::io::{Read, Write};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use serde::Deserialize;

use crate::profile::{BorrowedFrame, Profile};

/// The first bytes of every `.phaseprof` file.
pub const MAGIC: &[u8; 10] = b"PHASEPROF\n";
/// The format version of files this build writes (gzip JSON: `zcat | jq` reads them).
pub const FORMAT_VERSION: u32 = 2;
/// The binary version agents upload windows in (gzip MessagePack of the same model: decoded
/// several times faster than JSON); the newest version this build reads.
pub const WIRE_VERSION: u32 = 3;
/// The gzip level of the binary wire format. Level 1 is zlib-rs's quick strategy: a window of
/// 500 stacks deflated in 0.35 ms to 41 KiB; level 2 in 0.5 ms to 33 KiB, which the collector
/// inflates as fast and stores a fifth smaller.
pub const WIRE_GZIP_LEVEL: u32 = 2;
/// The most JSON [`read_profile`] inflates (a gzip bomb of a few MB would otherwise inflate to
/// many GB): far above any recording's (a 30 s recording of 16 threads is a few MB of JSON).
pub const DEFAULT_MAX_INFLATED: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a .phaseprof file (it does not start with the PHASEPROF magic)")]
    NotAProfile,
    #[error(
        "this file has .phaseprof format version {found}, but this phaseprof reads versions up to \
         {supported}: upgrade phaseprof to read it"
    )]
    FutureVersion { found: u32, supported: u32 },
    #[error("the file is truncated or corrupt: {0}")]
    Corrupt(String),
    #[error("the profile inflates to more than {limit} bytes (a gzip bomb, or a limit to raise)")]
    TooLarge { limit: u64 },
    /// Past a window limit (`window_limits`): refused as it decoded.
    #[error("over the limits of one window: {0}")]
    OverLimit(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Writes `profile` in the current format version.
pub fn write_profile(profile: &Profile, mut out: impl Write) -> Result<(), FormatError> {
    out.write_all(MAGIC)?;
    out.write_all(&FORMAT_VERSION.to_le_bytes())?;
    let mut gz = GzEncoder::new(out, Compression::default());
    serde_json::to_writer(&mut gz, profile).map_err(|e| FormatError::Corrupt(e.to_string()))?;
    gz.finish()?.flush()?;
    Ok(())
}

/// Writes `profile` in the binary wire version ([`WIRE_VERSION`]), at [`WIRE_GZIP_LEVEL`]: what
/// an agent uploads.
pub fn write_profile_binary(profile: &Profile, mut out: impl Write) -> Result<(), FormatError> {
    out.write_all(MAGIC)?;
    out.write_all(&WIRE_VERSION.to_le_bytes())?;
    let mut gz = GzEncoder::new(out, Compression::new(WIRE_GZIP_LEVEL));
    rmp_serde::encode::write_named(&mut gz, profile)
        .map_err(|e| FormatError::Corrupt(e.to_string()))?;
    gz.finish()?.flush()?;
    Ok(())
}

/// Reads a profile of any format version up to [`WIRE_VERSION`], inflating at most
/// [`DEFAULT_MAX_INFLATED`] bytes.
pub fn read_profile(input: impl Read) -> Result<Profile, FormatError> {
    let (bytes, version) = inflate(input, DEFAULT_MAX_INFLATED)?;
    decode(&bytes, version).map_err(FormatError::Corrupt)
}

/// A window from an untrusted sender: [`read_profile`] inflating at most `max_inflated` bytes
/// of JSON ([`FormatError::TooLarge`] beyond: the inflation stops there), and decoding within
/// the window limits (`window_limits`), so memory and work stay bounded whatever the input.
pub fn read_profile_limited(input: impl Read, max_inflated: u64) -> Result<Profile, FormatError> {
    let (bytes, version) = inflate(input, max_inflated)?;
    decode_limited(&bytes, version)
}

/// [`read_profile_limited`] with the frames' names borrowed from the inflated bytes
/// ([`BorrowedFrame`]), for the collector's ingest: the window is handed to `f`, which returns
/// what it keeps of it (the bytes go when it returns).
pub fn read_window_limited<R>(
    input: impl Read,
    max_inflated: u64,
    f: impl FnOnce(Profile<BorrowedFrame>) -> R,
) -> Result<R, FormatError> {
    let (bytes, version) = inflate(input, max_inflated)?;
    Ok(f(decode_limited(&bytes, version)?))
}

/// [`decode`] within the window limits.
fn decode_limited<'a, F: Deserialize<'a>>(
    bytes: &'a [u8],
    version: u32,
) -> Result<Profile<F>, FormatError> {
    crate::window_limits::limited(|| decode(bytes, version)).map_err(|e| {
        match crate::window_limits::take_refusal() {
            Some(why) => FormatError::OverLimit(why),
            None => FormatError::Corrupt(e),
        }
    })
}

/// The profile in `bytes` (JSON, or MessagePack from version 3), of format `version`, upgraded
/// to the current one.
fn decode<'a, F: Deserialize<'a>>(bytes: &'a [u8], version: u32) -> Result<Profile<F>, String> {
    let mut p: Profile<F> = if version >= 3 {
        rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?
    } else {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())?
    };
    if version == 1 {
        let lists: crate::format_v1::Lists =
            serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        p.samples = lists.into_samples();
    }
    p.meta.upgrade_notes();
    Ok(p)
}

/// The JSON of a profile file and its format version: its header checked, inflated up to
/// `max_inflated` bytes.
fn inflate(mut input: impl Read, max_inflated: u64) -> Result<(Vec<u8>, u32), FormatError> {
    let mut magic = [0u8; 10];
    input
        .read_exact(&mut magic)
        .map_err(|_| FormatError::NotAProfile)?;
    if &magic != MAGIC {
        return Err(FormatError::NotAProfile);
    }
    let mut version = [0u8; 4];
    input
        .read_exact(&mut version)
        .map_err(|_| FormatError::Corrupt("no format version after the magic".into()))?;
    let found = u32::from_le_bytes(version);
    if found > WIRE_VERSION || found == 0 {
        return Err(FormatError::FutureVersion {
            found,
            supported: WIRE_VERSION,
        });
    }
    // Inflated whole, then parsed from the slice: serde_json's reader interface pulls one byte
    // per call through the decoder, which made decoding ten times slower.
    // A window inflates to a few hundred KiB: room for one from the start saves the copies of
    // growing from nothing (a tenth of the collector's ingest time went to them).
    let mut json = Vec::with_capacity((1 << 19).min(max_inflated as usize));
    GzDecoder::new(input)
        .take(max_inflated.saturating_add(1))
        .read_to_end(&mut json)
        .map_err(|e| FormatError::Corrupt(e.to_string()))?;
    if json.len() as u64 > max_inflated {
        return Err(FormatError::TooLarge {
            limit: max_inflated,
        });
    }
    Ok((json, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::*;
    use crate::PhaseAt;

    fn sample_profile() -> Profile {
        let mut b = crate::ProfileBuilder::new(
            Meta {
                pids: vec![42],
                comm: "validator".into(),
                events: vec![EventKind::Cpu, EventKind::Syscall],
                ..Meta::default()
            },
            vec![],
        );
        let f = b.intern_frame(Frame {
            function: "main".into(),
            module: "validator".into(),
            kind: FrameKind::User,
            inlined: false,
        });
        let s = b.intern_stack(vec![f]);
        b.add(Sample::new(SampleKind::Cpu, (42, 42), PhaseAt::NONE, vec![9]).on(s));
        b.add(
            Sample::new(SampleKind::Syscall, (42, 42), PhaseAt::NONE, vec![3, 300])
                .on(Some(s))
                .syscall(1),
        );
        b.finish()
    }

    // Checks that a written profile reads back identical, in both encodings, and within the
    // window limits.
    #[test]
    fn round_trip() {
        let p = sample_profile();
        let mut buf = Vec::new();
        write_profile(&p, &mut buf).unwrap();
        assert_eq!(read_profile(&buf[..]).unwrap(), p);
        let mut bin = Vec::new();
        write_profile_binary(&p, &mut bin).unwrap();
        assert_eq!(u32::from_le_bytes(bin[10..14].try_into().unwrap()), 3);
        assert_eq!(read_profile(&bin[..]).unwrap(), p);
        assert_eq!(read_profile_limited(&bin[..], 1 << 20).unwrap(), p);
    }

    // Checks that the ingest's read (names borrowed) sees the frames and the rest as the owned
    // read does, in both encodings, names JSON escapes (owned there) included, and that it
    // stops at the same limits.
    #[test]
    fn borrowed_read_matches_owned() {
        let mut p = sample_profile();
        p.frames[0].function = "quoted \"name\" and \\ a tab\t".into();
        let mut json = Vec::new();
        write_profile(&p, &mut json).unwrap();
        let mut bin = Vec::new();
        write_profile_binary(&p, &mut bin).unwrap();
        for body in [&json, &bin] {
            let owned = read_profile_limited(&body[..], 1 << 20).unwrap();
            let (frames, rest) = read_window_limited(&body[..], 1 << 20, |w| {
                let frames: Vec<Frame> = (w.frames.iter())
                    .map(|f| Frame {
                        function: f.function().to_string(),
                        module: f.module().to_string(),
                        kind: f.kind(),
                        inlined: f.inlined(),
                    })
                    .collect();
                (frames, (w.stacks, w.samples, w.phases, w.meta, w.lost))
            })
            .unwrap();
            assert_eq!(frames, owned.frames);
            assert_eq!(
                rest,
                (
                    owned.stacks,
                    owned.samples,
                    owned.phases,
                    owned.meta,
                    owned.lost
                )
            );
        }
        let e = read_window_limited(&bin[..], 100, |_| ()).unwrap_err();
        assert!(matches!(e, FormatError::TooLarge { limit: 100 }), "{e}");
    }

    // Checks that a file written when the targets' CPU time and late names were notes reads
    // them into their fields (the notes gone), in both readers; the phase probes' cost too
    // round-trips as a field.
    #[test]
    fn notes_of_older_files_become_fields() {
        let mut old = sample_profile();
        old.meta
            .notes
            .insert("targets_cpu_ns".into(), "1500".into());
        old.meta.notes.insert("names_late".into(), "3".into());
        old.meta.phase_probes = Some(PhaseProbeCost {
            calls: 10,
            probe_ns: 26_000,
            ..PhaseProbeCost::default()
        });
        let mut buf = Vec::new();
        write_profile(&old, &mut buf).unwrap();
        for p in [
            read_profile(&buf[..]).unwrap(),
            read_profile_limited(&buf[..], 1 << 20).unwrap(),
        ] {
            assert_eq!(p.meta.targets_cpu_ns, Some(1500));
            assert_eq!(p.meta.names_late, 3);
            assert_eq!(p.meta.phase_probes, old.meta.phase_probes);
            assert!(!p.meta.notes.contains_key("targets_cpu_ns"));
        }
    }

    // Checks that a version-1 file (one list per event kind) reads into the one list of
    // samples, every value where its kind lists it, in both readers.
    #[test]
    fn version_1_lists_become_samples() {
        let v1 = serde_json::json!({
            "meta": serde_json::to_value(Meta::default()).unwrap(),
            "frames": [], "stacks": [{"frames": []}], "phases": ["(none)"],
            "cpu": [{"pid": 1, "tid": 2, "phase": 0, "phase_mask": 1, "stack": 0, "count": 9}],
            "offcpu": [{"pid": 1, "tid": 2, "phase": 0, "stack": 0, "ns": 70}],
            "syscalls": [{"pid": 1, "tid": 2, "phase": 0, "nr": 1, "name": "write",
                          "stack": null, "count": 3, "total_ns": 30}],
            "allocs": [{"pid": 1, "phase": 0, "stack": 0, "bytes": 64, "count": 2.5,
                        "samples": 1}],
            "alloc_totals": [{"pid": 1, "phase": 0, "bytes": 640, "count": 25, "frees": 4}],
            "live": [{"pid": 1, "phase": 0, "stack": 0, "bytes": 32, "samples": 2,
                      "oldest_ns": 90, "mean_age_ns": 60}],
            "page_faults": [{"pid": 1, "tid": 2, "phase": 0, "stack": 0, "count": 5}],
            "lost": serde_json::to_value(crate::Lost::default()).unwrap(),
        });
        let mut buf = MAGIC.to_vec();
        buf.extend_from_slice(&1u32.to_le_bytes());
        let mut gz = GzEncoder::new(&mut buf, Compression::default());
        serde_json::to_writer(&mut gz, &v1).unwrap();
        gz.finish().unwrap();
        for p in [
            read_profile(&buf[..]).unwrap(),
            read_profile_limited(&buf[..], 1 << 20).unwrap(),
        ] {
            p.validate().unwrap();
            let values = |k| {
                p.samples_of(k)
                    .map(|s| s.values.clone())
                    .collect::<Vec<_>>()
            };
            assert_eq!(values(SampleKind::Cpu), vec![vec![9]]);
            assert_eq!(values(SampleKind::Offcpu), vec![vec![70]]);
            assert_eq!(values(SampleKind::Syscall), vec![vec![3, 30]]);
            assert_eq!(values(SampleKind::Alloc), vec![vec![64, 1, 2500]]);
            assert_eq!(values(SampleKind::AllocTotal), vec![vec![640, 25, 4]]);
            assert_eq!(values(SampleKind::Live), vec![vec![32, 2, 90, 120]]);
            assert_eq!(values(SampleKind::Pagefault), vec![vec![5]]);
            let write = p.samples_of(SampleKind::Syscall).next().unwrap();
            assert_eq!(
                (write.syscall_name().as_str(), write.stack),
                ("write", None)
            );
        }
    }

    // Checks that a file from a newer phaseprof fails with a message naming both versions.
    #[test]
    fn future_version_is_refused_clearly() {
        let mut buf = Vec::new();
        write_profile(&sample_profile(), &mut buf).unwrap();
        buf[10..14].copy_from_slice(&7u32.to_le_bytes());
        let err = read_profile(&buf[..]).unwrap_err();
        assert!(matches!(
            err,
            FormatError::FutureVersion {
                found: 7,
                supported: WIRE_VERSION
            }
        ));
        assert!(err.to_string().contains("version 7"), "{err}");
    }

    // Checks that other files and truncated profiles are refused, not misread.
    #[test]
    fn garbage_and_truncation_are_refused() {
        assert!(matches!(
            read_profile(&b"hello world, not a profile"[..]),
            Err(FormatError::NotAProfile)
        ));
        let mut buf = Vec::new();
        write_profile(&sample_profile(), &mut buf).unwrap();
        buf.truncate(buf.len() / 2);
        assert!(matches!(
            read_profile(&buf[..]),
            Err(FormatError::Corrupt(_))
        ));
    }

    // Checks a gzip bomb: 64 MiB of zeros compress to ~64 KiB; with a 1 MiB limit the read
    // stops at the limit and says so, and the real profile still reads under its own size.
    #[test]
    fn inflation_is_bounded() {
        let mut bomb = Vec::new();
        bomb.extend_from_slice(MAGIC);
        bomb.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        let mut gz = GzEncoder::new(&mut bomb, Compression::best());
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            gz.write_all(&zeros).unwrap();
        }
        gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let err = read_profile_limited(&bomb[..], 1 << 20).unwrap_err();
        assert!(
            matches!(err, FormatError::TooLarge { limit } if limit == 1 << 20),
            "{err}"
        );
        let mut buf = Vec::new();
        write_profile(&sample_profile(), &mut buf).unwrap();
        assert_eq!(
            read_profile_limited(&buf[..], 1 << 20).unwrap(),
            sample_profile()
        );
    }
}
