//! The symbolizer over this test's own process: names come from the naming thread, a waiting
//! lookup (`record`) gets them at once, a lookup with a budget gets `file+offset` until they
//! come and then the same names.
use std::time::{Duration, Instant};

use super::{BlazeSymbolizer, Naming};
use crate::aggregate::Symbolize;
use crate::processes::Processes;

#[inline(never)]
fn named_marker_function(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(31)
}

fn marker() -> u64 {
    named_marker_function as *const () as u64
}

#[test]
fn a_waiting_lookup_gets_the_names() {
    let pid = std::process::id();
    let (mut sym, mut processes) = (BlazeSymbolizer::default(), Processes::default());
    let mut sym = Naming {
        sym: &mut sym,
        processes: &mut processes,
        probe_resumes: &Default::default(),
    };
    let frames = sym.user(pid, &[marker()]);
    let names: Vec<&str> = frames[0].iter().map(|f| f.function.as_str()).collect();
    assert!(
        names.iter().any(|n| n.contains("named_marker_function")),
        "{names:?}"
    );
    assert!(!sym.named_later(pid, marker()));
    assert_eq!(sym.sym.take_late(), 0);
}

#[test]
fn a_lookup_with_a_budget_names_later() {
    let pid = std::process::id();
    let (mut sym, mut processes) = (BlazeSymbolizer::default(), Processes::default());
    sym.name_in_background(Duration::ZERO);
    let mut sym = Naming {
        sym: &mut sym,
        processes: &mut processes,
        probe_resumes: &Default::default(),
    };
    // Reading this binary's symbols takes far longer than no time at all.
    let first = sym.user(pid, &[marker()]);
    assert!(sym.named_later(pid, marker()), "{first:?}");
    assert!(first[0][0].function.contains("+0x"), "{first:?}");
    assert_eq!(sym.sym.take_late(), 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    let named = loop {
        let frames = sym.user(pid, &[marker()]);
        if !sym.named_later(pid, marker()) {
            break frames;
        }
        assert!(Instant::now() < deadline, "no names after 60 s");
        std::thread::sleep(Duration::from_millis(10));
    };
    let names: Vec<&str> = named[0].iter().map(|f| f.function.as_str()).collect();
    assert!(
        names.iter().any(|n| n.contains("named_marker_function")),
        "{names:?}"
    );
    assert_eq!(named_marker_function(1), 31);
}
