//! Whether the cpu samples cover the targets' CPU time: a sampling event that stops firing for
//! part of a recording loses samples nothing in the kernel counts, so the count is checked
//! against the CPU time the targets used while recorded.
use crate::profile::Profile;

impl Profile {
    /// The cpu samples the recording should hold: the targets' CPU time while recorded (the
    /// `targets_cpu_ns`, when every target was still there to be asked at the end) at the
    /// sampling frequency. None when unknown.
    pub fn expected_cpu_samples(&self) -> Option<u64> {
        let ns = self.meta.targets_cpu_ns?;
        (self.meta.frequency_hz > 0)
            .then(|| (ns as f64 * self.meta.frequency_hz as f64 / 1e9).round() as u64)
    }

    /// When the cpu samples fall well short of what the targets' CPU time calls for (under 80%
    /// of at least 20 expected), a sentence saying so.
    pub fn cpu_sample_shortfall(&self) -> Option<String> {
        let expected = self.expected_cpu_samples()?;
        let got = self.total(crate::SampleKind::Cpu, crate::CPU_COUNT);
        (expected >= 20 && (got as f64) < 0.8 * expected as f64).then(|| {
            format!(
                "INCOMPLETE: {got} cpu samples where the targets' {:.2} s of CPU time call for ~{expected} at {} Hz ({:.0}% missing): the sampling events fired for part of the recording",
                expected as f64 / self.meta.frequency_hz as f64,
                self.meta.frequency_hz,
                100.0 - 100.0 * got as f64 / expected as f64
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::profile::*;

    // Checks the expected cpu samples (CPU time × frequency), that a shortfall under 80% is
    // said and a small one is not, that unknown CPU time says nothing, and that merged windows
    // add their CPU time (and forget it when one window lacks it).
    #[test]
    fn cpu_samples_are_checked_against_cpu_time() {
        let with = |cpu_ns: Option<&str>, samples: u64| {
            let mut p = Profile::default();
            p.meta.frequency_hz = 100;
            p.stacks.push(Stack::default());
            p.meta.targets_cpu_ns = cpu_ns.map(|ns| ns.parse().unwrap());
            let at = crate::PhaseAt::NONE;
            p.samples
                .push(Sample::new(SampleKind::Cpu, (1, 1), at, vec![samples]).on(0));
            p
        };
        let short = with(Some("1500000000"), 12);
        assert_eq!(short.expected_cpu_samples(), Some(150));
        let why = short.cpu_sample_shortfall().unwrap();
        assert!(why.starts_with("INCOMPLETE: 12 cpu samples"), "{why}");
        assert!(why.contains("~150 at 100 Hz (92% missing)"), "{why}");
        assert_eq!(with(Some("1500000000"), 140).cpu_sample_shortfall(), None);
        assert_eq!(with(None, 1).cpu_sample_shortfall(), None);
        let merged =
            crate::merge::merge(&[&with(Some("1000000000"), 100), &with(Some("500000000"), 50)]);
        assert_eq!(merged.expected_cpu_samples(), Some(150));
        let unknown = crate::merge::merge(&[&with(Some("1000000000"), 100), &with(None, 50)]);
        assert_eq!(unknown.expected_cpu_samples(), None);
    }
}
