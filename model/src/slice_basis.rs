//! What the totals of probes attached for slices only (a phase or allocation budget) are
//! extrapolated by: the targets' syscalls, which the kernel counts exactly in and out of slices
//! and whose number per unit of work the probes' cost does not change (a server slowed by its
//! probes serves fewer requests in a slice, and makes fewer syscalls in proportion); or their
//! own CPU time (less the probes' estimated time), which an error in the probes' cost per hit
//! moves the more the larger their share of the CPU while attached.

/// What the totals were extrapolated by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Basis {
    Syscalls,
    OwnCpu,
}

impl Basis {
    /// Its name in reports' JSON.
    pub fn name(self) -> &'static str {
        match self {
            Basis::Syscalls => "syscalls",
            Basis::OwnCpu => "cpu",
        }
    }
}

/// Syscalls inside slices below which they are never extrapolated by.
const FEWEST_SYSCALLS_TO_COUNT_BY: u64 = 25;

/// The own-CPU extrapolation's error where the probes cost nothing: the targets' CPU time also
/// goes to work outside what the probes count, which need not keep pace with it.
const CPU_ERROR_FLOOR: f64 = 0.02;

/// The basis with the smaller expected error, for `syscalls_in_slices` made while the probes
/// slowed the targets by `overhead` and left them `counted_own_ns` of own CPU time in slices:
/// syscalls err by about 1/√n for n in slices (a slice's edges cut the unit of work they come
/// in), own CPU time by a tenth of the slowdown (what a 10% error in the probes' cost moves it
/// by); the syscalls, however few, where the probes' estimated time took all of the slices'
/// CPU time (nothing own is left to scale by).
pub fn basis(syscalls_in_slices: u64, overhead: f64, counted_own_ns: u64) -> Basis {
    if counted_own_ns == 0 && syscalls_in_slices > 0 {
        return Basis::Syscalls;
    }
    if syscalls_in_slices >= FEWEST_SYSCALLS_TO_COUNT_BY
        && syscall_error(syscalls_in_slices) <= cpu_error(overhead)
    {
        Basis::Syscalls
    } else {
        Basis::OwnCpu
    }
}

/// The syscall extrapolation's expected error with `n` of them in slices.
pub fn syscall_error(n: u64) -> f64 {
    1.0 / (n.max(1) as f64).sqrt()
}

fn cpu_error(overhead: f64) -> f64 {
    (0.1 * overhead).max(CPU_ERROR_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the choice: few syscalls lose to cheap probes' CPU time, many win over costly ones;
    // with no own CPU time counted, any syscalls win.
    #[test]
    fn the_basis_that_errs_less() {
        let own = 1_000_000;
        assert_eq!(basis(24, 100.0, own), Basis::OwnCpu);
        assert_eq!(basis(100, 0.5, own), Basis::OwnCpu);
        assert_eq!(basis(400, 0.5, own), Basis::Syscalls);
        assert_eq!(basis(2_000, 0.05, own), Basis::OwnCpu);
        assert_eq!(basis(3_000, 0.05, own), Basis::Syscalls);
        assert_eq!(basis(3, 0.0, 0), Basis::Syscalls);
        assert_eq!(basis(0, 0.0, 0), Basis::OwnCpu);
    }
}
