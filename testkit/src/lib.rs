//! Test helpers shared by phaseprof's crates; a dev-dependency only, so none of it ships.

/// Golden files: what a test produced, compared with a file in the repository.
pub mod golden {
    /// Compares `got` with the file at `path`, or writes it there when PHASEPROF_BLESS is set
    /// (after an intended change; review the diff).
    pub fn check(path: &std::path::Path, got: &str) {
        if std::env::var_os("PHASEPROF_BLESS").is_some() {
            std::fs::create_dir_all(path.parent().expect("a file in a directory")).unwrap();
            std::fs::write(path, got).unwrap();
            return;
        }
        let want = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e} (PHASEPROF_BLESS=1 writes it)", path.display()));
        assert!(
            want == got,
            "{} differs (PHASEPROF_BLESS=1 rewrites it); got:\n{got}",
            path.display()
        );
    }
}
