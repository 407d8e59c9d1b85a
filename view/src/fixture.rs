//! A small profile the view tests share: two phases, cpu and syscall stacks.
use phaseprof_model::*;

/// A profile with two phases, cpu and syscall stacks; `flushes` writes per finalize call.
pub fn two_phases(flushes: u64) -> Profile {
    let mut b = ProfileBuilder::new(
        Meta {
            pids: vec![42],
            comm: "validator".into(),
            events: vec![EventKind::Cpu, EventKind::Syscall],
            frequency_hz: 99,
            start_unix_ns: 1_000,
            end_unix_ns: 2_000_000_000,
            ..Meta::default()
        },
        vec!["propose".into(), "finalize".into()],
    );
    let mut f = |n: &str| {
        b.intern_frame(Frame {
            function: n.into(),
            module: "validator".into(),
            kind: FrameKind::User,
            inlined: false,
        })
    };
    let (main, propose, burn, finalize, write) = (
        f("main"),
        f("propose"),
        f("burn"),
        f("finalize"),
        f("write"),
    );
    let s1 = b.intern_stack(vec![burn, propose, main]);
    let s2 = b.intern_stack(vec![write, finalize, main]);
    let at = |phase: u32| PhaseAt {
        phase,
        mask: 1 << phase,
    };
    b.add(Sample::new(SampleKind::Cpu, (42, 42), at(1), vec![90]).on(s1));
    b.add(Sample::new(SampleKind::Cpu, (42, 42), at(2), vec![10]).on(s2));
    b.add(
        Sample::new(
            SampleKind::Syscall,
            (42, 43),
            at(2),
            vec![flushes * 10, 5_000],
        )
        .on(Some(s2))
        .syscall(1),
    );
    let mut stats = vec![PhaseStats::default(); 3];
    for (i, st) in stats.iter_mut().enumerate().skip(1) {
        st.calls = 10;
        st.wall_ns = 1_000_000;
        st.wall_hist = vec![(200, 10)];
        st.costs.insert(
            "flush_syscalls".into(),
            if i == 2 { flushes * 10 } else { 0 },
        );
    }
    *b.phase_stats_mut() = stats;
    b.finish()
}
