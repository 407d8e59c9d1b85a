//! The bodies the hostile-client suite (`hostile`) sends: gzip bombs, a window of 100,000
//! phases, a window whose one stack holds 33 million frames.
const MIB: u64 = 1 << 20;
use std::time::{SystemTime, UNIX_EPOCH};

use phaseprof_model::*;

pub(crate) fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A gzip bomb of `body_bytes` behind a valid phaseprof header: 1 MiB of zeros per ~1 KiB,
/// built from one fully flushed deflate chunk repeated (each chunk starts from an empty
/// history, so repeating its bytes repeats its zeros), with a correct CRC and length.
pub(crate) fn bomb(body_bytes: usize) -> (Vec<u8>, u64) {
    use flate2::{Compress, Compression, FlushCompress};
    let zeros = vec![0u8; MIB as usize];
    let mut c = Compress::new(Compression::best(), false);
    let mut chunk = |flush| {
        let mut out = Vec::with_capacity(64 * 1024);
        let input: &[u8] = if flush == FlushCompress::Finish {
            &[]
        } else {
            &zeros
        };
        c.compress_vec(input, &mut out, flush).unwrap();
        out
    };
    let first = chunk(FlushCompress::Full);
    let steady = chunk(FlushCompress::Full);
    let finish = chunk(FlushCompress::Finish);
    let mut b = b"PHASEPROF\n".to_vec();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 3]);
    b.extend_from_slice(&first);
    let mut chunks = 1u64;
    while b.len() + steady.len() + finish.len() + 8 < body_bytes {
        b.extend_from_slice(&steady);
        chunks += 1;
    }
    b.extend_from_slice(&finish);
    let mut one = crc32fast::Hasher::new();
    one.update(&zeros);
    let mut crc = crc32fast::Hasher::new();
    for _ in 0..chunks {
        crc.combine(&one);
    }
    let inflated = chunks * MIB;
    b.extend_from_slice(&crc.finalize().to_le_bytes());
    b.extend_from_slice(&(inflated as u32).to_le_bytes());
    (b, inflated)
}

/// The meta of a cpu window of agent 0 (`host=h0`) that ended just now.
fn recent_cpu_window() -> Meta {
    Meta {
        events: vec![EventKind::Cpu],
        start_unix_ns: now_ns() - 1_000_000,
        end_unix_ns: now_ns(),
        labels: [("host".to_string(), "h0".to_string())]
            .into_iter()
            .collect(),
        ..Meta::default()
    }
}

/// A window with 100,000 phases (each with totals): the collector caps phases per window.
pub(crate) fn many_phases() -> Vec<u8> {
    let phases: Vec<String> = std::iter::once("(none)".to_string())
        .chain((1..100_000).map(|i| format!("phase_{i}")))
        .collect();
    let mut b = ProfileBuilder::new(recent_cpu_window(), phases);
    *b.phase_stats_mut() = vec![
        PhaseStats {
            calls: 1,
            ..PhaseStats::default()
        };
        100_000
    ];
    let mut out = Vec::new();
    write_profile(&b.finish(), &mut out).unwrap();
    out
}

/// A window whose one stack holds 33,000,000 frames: 66 MB of JSON, ~69 KB gzipped (under
/// `--max-body` and `--max-inflated`), as the hostile round of issue 24 sent it.
pub(crate) fn deep_stack() -> Vec<u8> {
    let mut b = ProfileBuilder::new(recent_cpu_window(), vec![]);
    let f = b.intern_frame(Frame {
        function: "deep".into(),
        module: "m".into(),
        kind: FrameKind::User,
        inlined: false,
    });
    let s = b.intern_stack(vec![f; 33_000_000]);
    b.add(Sample::new(SampleKind::Cpu, (7, 7), PhaseAt::NONE, vec![1]).on(s));
    let mut out = Vec::new();
    write_profile(&b.finish(), &mut out).unwrap();
    out
}
