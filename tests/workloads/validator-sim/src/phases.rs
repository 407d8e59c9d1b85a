//! The phase functions phaseprof probes by name: `validator_sim::phases::{block,propose,replay,finalize}`
//! (`block` calls the other three, for nested-phase tests).
use std::hint::black_box;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::{work, Config, Truth};

/// One block: the three phases in order. Probed as a phase of its own, it nests the others.
#[inline(never)]
pub fn block(config: &Config, truth: &Truth, source: &Vec<u8>, out: &mut impl Write, block: u64) {
    truth.block_calls.fetch_add(1, Relaxed);
    propose(config, truth, block);
    replay(config, truth, source);
    finalize(config, truth, out, block);
}

#[inline(never)]
pub fn propose(config: &Config, truth: &Truth, block: u64) {
    truth.propose_calls.fetch_add(1, Relaxed);
    if config.burn_ms > 0 {
        let ns = work::burn_cpu(Duration::from_millis(config.burn_ms), block);
        truth.burn_cpu_ns.fetch_add(ns, Relaxed);
    }
}

#[inline(never)]
pub fn replay(config: &Config, truth: &Truth, source: &Vec<u8>) {
    truth.replay_calls.fetch_add(1, Relaxed);
    if config.clone_bytes > 0 {
        let copy = black_box(source.clone());
        truth.clone_bytes.fetch_add(copy.len() as u64, Relaxed);
    }
    for i in 0..config.small_allocs {
        work::small_alloc(i);
    }
    if config.leak_bytes > 0 {
        work::leak(config.leak_bytes as usize);
        truth.leaked_bytes.fetch_add(config.leak_bytes, Relaxed);
    }
}

#[inline(never)]
pub fn finalize(config: &Config, truth: &Truth, out: &mut impl Write, block: u64) {
    truth.finalize_calls.fetch_add(1, Relaxed);
    for i in 0..config.flushes {
        // Far below the buffer's capacity, so each flush is exactly one write(2).
        writeln!(out, "block {block} record {i}").expect("buffered write");
        out.flush().expect("flush");
        truth.flushes.fetch_add(1, Relaxed);
    }
    if config.sleep_ms > 0 {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(config.sleep_ms));
        truth.slept_ns.fetch_add(t.elapsed().as_nanos() as u64, Relaxed);
    }
}
