fn main() {
    // Behave like other Unix tools when piped into `head`: die quietly on a closed pipe.
    // SAFETY: resetting a signal disposition to its default before any other thread exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = phaseprof::cli::Cli::from_args();
    match phaseprof::cli::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("phaseprof: error: {e:#}");
            std::process::exit(1);
        }
    }
}
