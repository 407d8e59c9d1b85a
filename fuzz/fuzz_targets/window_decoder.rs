//! The collector's window decoder on arbitrary input: what `POST /api/v1/windows` does with a
//! body (decode, validate) and what queries later do with a stored window (merge, summarize)
//! must never panic, whatever arrives.
//!
//! The first byte picks the input's shape: raw bytes (the magic, version and gzip framing), or
//! the rest of the input gzip-compressed behind a valid header of version 1, 2 or 3 (its next
//! bits), so that the fuzzer reaches the JSON, the MessagePack of the agents' wire format and
//! the validation instead of stopping at the gzip checksum.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use phaseprof_model::{merge::merge, read_profile, summary::Summary};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let body = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut b = b"PHASEPROF\n".to_vec();
        let version = 1 + u32::from(mode >> 1) % 3;
        b.extend_from_slice(&version.to_le_bytes());
        let mut gz = flate2::write::GzEncoder::new(b, flate2::Compression::fast());
        gz.write_all(rest).unwrap();
        gz.finish().unwrap()
    };
    let Ok(profile) = read_profile(&body[..]) else {
        return;
    };
    if profile.validate().is_err() {
        return;
    }
    let merged = merge(&[&profile, &profile]);
    let _ = Summary::of(&merged);
});
