//! `completions` and `man`: shell completion scripts and man pages generated from the same clap
//! definitions as `--help`, so they never drift from the flags.
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory};

#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// Shell to complete for; install e.g. with
    /// `phaseprof completions bash > /etc/bash_completion.d/phaseprof`.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write phaseprof.1 and one page per subcommand (phaseprof-record.1, …) into this
    /// directory instead of printing phaseprof.1 to standard output.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run_completions(args: CompletionsArgs) -> Result<i32> {
    let mut cmd = super::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "phaseprof", &mut std::io::stdout());
    Ok(0)
}

pub fn run_man(args: ManArgs) -> Result<i32> {
    let cmd = super::Cli::command();
    let Some(dir) = args.dir else {
        clap_mangen::Man::new(cmd).render(&mut std::io::stdout().lock())?;
        return Ok(0);
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    clap_mangen::generate_to(cmd, &dir)
        .with_context(|| format!("writing pages into {}", dir.display()))?;
    eprintln!("phaseprof: man pages written into {}", dir.display());
    Ok(0)
}
