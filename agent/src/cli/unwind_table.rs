//! `unwind-table`: the unwind table `--unwind dwarf` would build for a binary, and what it costs
//! (rows, kernel memory, build time, rules the BPF walker cannot apply).
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use clap::Args;

use crate::unwind::eh_frame_rows::{compile, Kind};

#[derive(Args, Debug)]
pub struct UnwindTableArgs {
    /// An ELF executable or shared library.
    pub file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run_unwind_table(args: UnwindTableArgs) -> Result<i32> {
    let started = Instant::now();
    let t = compile(&args.file)?;
    let build_ms = started.elapsed().as_secs_f64() * 1e3;
    let size = std::fs::metadata(&args.file)?.len();
    let count = |k: Kind| t.rows.iter().filter(|r| r.kind == k).count();
    let bytes = t.rows.len() * 8;
    if args.json {
        let v = serde_json::json!({
            "file": args.file,
            "file_bytes": size,
            "rows": t.rows.len(),
            "table_bytes": bytes,
            "build_ms": build_ms,
            "unsupported_rows": t.unsupported,
            "frame_pointer_rows": count(Kind::Fp),
            "entry_rows": count(Kind::End),
            "plt_rows": count(Kind::Plt),
        });
        println!("{v}");
    } else {
        println!(
            "{}: {:.1} MiB file; {} rows, {:.2} MiB of kernel memory, built in {build_ms:.0} ms",
            args.file.display(),
            size as f64 / (1 << 20) as f64,
            t.rows.len(),
            bytes as f64 / (1 << 20) as f64,
        );
        println!(
            "  rules: {} rsp-based, {} rbp-based, {} PLT, {} outermost frames; {} rows walked by \
             frame pointer ({} of them rules the walker cannot apply, the rest gaps between \
             functions)",
            count(Kind::Rsp),
            count(Kind::Rbp),
            count(Kind::Plt),
            count(Kind::End),
            count(Kind::Fp),
            t.unsupported
        );
    }
    Ok(0)
}
