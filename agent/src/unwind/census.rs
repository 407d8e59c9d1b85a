//! Whether a binary was built with frame pointers, which decides `--unwind auto`.
use std::path::Path;

use anyhow::{Context, Result};

/// How much of a binary's own code keeps frame pointers: of its functions (16 bytes or more:
/// tiny leaf thunks never set one up), how many begin by saving rbp and pointing it at the frame
/// (`push rbp; mov rbp, rsp`, possibly after `endbr64` or Go's stack check). Decides
/// `--unwind auto`.
///
/// A Rust binary links the standard library precompiled by the Rust project with flags of its
/// own (partly with frame pointers, partly without), and in a small program those functions
/// outnumber the program's: validator-sim built without frame pointers has 429 of 627 functions
/// with them, built with them 494 of 630. So the census leaves out the standard library's crates
/// and counts the code the program's own build flags decided (there: 0 of 21 vs 20 of 21).
#[derive(Debug, PartialEq)]
pub struct FramePointerCensus {
    pub with: usize,
    pub functions: usize,
    /// It names a program interpreter (the dynamic loader): it maps libraries, each built with
    /// flags of its own, so its own census does not decide for them.
    pub loads_libraries: bool,
}

impl FramePointerCensus {
    /// Built with frame pointers: most functions keep them (a build without them still has a
    /// few, from hand-written assembly or functions that need rbp anyway).
    pub fn has_frame_pointers(&self) -> bool {
        self.functions > 0 && self.with * 2 >= self.functions
    }
}

pub fn frame_pointer_census(path: &Path) -> Result<FramePointerCensus> {
    use iced_x86::{Code, Decoder, DecoderOptions, Register};
    use object::ReadRef;
    let reader = crate::target_files::read_elf(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let symbols = crate::elf::function_symbols(path)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let loads_libraries = object::File::parse(&reader)
        .ok()
        .is_some_and(|o| object::Object::section_by_name(&o, ".interp").is_some());
    let mut census = FramePointerCensus {
        with: 0,
        functions: 0,
        loads_libraries,
    };
    let own: Vec<_> = symbols
        .iter()
        .filter(|f| f.size >= 16 && !from_prebuilt_rust_std(&f.name))
        .collect();
    // Nothing but the standard library (a tiny program): count that then.
    let counted: Vec<_> = if own.is_empty() {
        symbols.iter().filter(|f| f.size >= 16).collect()
    } else {
        own
    };
    for f in counted {
        let Ok(code) = (&reader).read_bytes_at(f.file_offset, f.size.min(32)) else {
            continue;
        };
        census.functions += 1;
        let mut decoder = Decoder::new(64, code, DecoderOptions::NONE);
        // `push rbp` right before `mov rbp, rsp`, among the first few instructions: a Go
        // function checks its stack bound first (`cmp rsp, [r14+16]; jbe`), C and Rust may
        // begin with `endbr64`. A build without frame pointers pushes rbp, if at all, as a
        // callee-saved register and never points it at the frame.
        let mut after_push_rbp = false;
        for _ in 0..6 {
            if !decoder.can_decode() {
                break;
            }
            let insn = decoder.decode();
            let sets_frame = matches!(insn.code(), Code::Mov_r64_rm64 | Code::Mov_rm64_r64)
                && insn.op0_register() == Register::RBP
                && insn.op1_register() == Register::RSP;
            if after_push_rbp && sets_frame {
                census.with += 1;
                break;
            }
            after_push_rbp = insn.code() == Code::Push_r64 && insn.op0_register() == Register::RBP;
        }
    }
    Ok(census)
}

/// Crates the Rust toolchain ships precompiled (the standard library and its dependencies).
const PREBUILT_RUST_CRATES: &[&str] = &[
    "std",
    "core",
    "alloc",
    "proc_macro",
    "test",
    "compiler_builtins",
    "panic_unwind",
    "panic_abort",
    "unwind",
    "std_detect",
    "hashbrown",
    "gimli",
    "addr2line",
    "object",
    "miniz_oxide",
    "adler",
    "adler2",
    "rustc_demangle",
    "memchr",
    "libc",
    "cfg_if",
];

/// Whether a demangled function name belongs to one of those crates: by the crate of its path,
/// or for `<Type as Trait>::f` of the implementing type (`<alloc::vec::Vec<T> as Clone>::clone`),
/// or of the trait when the type is a primitive (`<u64 as core::fmt::Display>::fmt`).
fn from_prebuilt_rust_std(name: &str) -> bool {
    if name == "rust_eh_personality" || name.starts_with("__rustc::") {
        return true; // the panic runtime and allocator shims
    }
    let Some(inner) = name.strip_prefix('<') else {
        return crate_of(name).is_some_and(|k| PREBUILT_RUST_CRATES.contains(&k));
    };
    let (ty, trait_) = match inner.split_once(" as ") {
        Some((ty, t)) => (ty, Some(t)),
        None => (inner.split('>').next().unwrap_or(inner), None),
    };
    let ty = ty.trim_start_matches(['&', '*', '[', '(', ' ']);
    let ty = ty.strip_prefix("mut ").unwrap_or(ty);
    let ty = ty.strip_prefix("const ").unwrap_or(ty);
    let ty = ty.strip_prefix("dyn ").unwrap_or(ty);
    match (crate_of(ty), trait_) {
        (Some(k), _) => PREBUILT_RUST_CRATES.contains(&k),
        // A primitive type: its inherent functions are the standard library's; a trait's
        // impl belongs with the trait.
        (None, None) => true,
        (None, Some(t)) => crate_of(t).is_some_and(|k| PREBUILT_RUST_CRATES.contains(&k)),
    }
}

/// The first segment of a `::` path (None for a bare name).
fn crate_of(path: &str) -> Option<&str> {
    path.split_once("::").map(|(k, _)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks which names count as the Rust standard library's.
    #[test]
    fn tells_standard_library_functions() {
        assert!(from_prebuilt_rust_std("std::rt::lang_start_internal"));
        assert!(from_prebuilt_rust_std(
            "<alloc::vec::Vec<T> as core::clone::Clone>::clone"
        ));
        assert!(from_prebuilt_rust_std(
            "<&mut core::fmt::Formatter as core::fmt::Write>::write_str"
        ));
        assert!(!from_prebuilt_rust_std("validator_sim::work::burn_cpu"));
        assert!(!from_prebuilt_rust_std(
            "<validator_sim::Config as core::fmt::Debug>::fmt"
        ));
        assert!(!from_prebuilt_rust_std("deflate"));
        assert!(!from_prebuilt_rust_std("main"));
        assert!(from_prebuilt_rust_std("<u64 as core::fmt::Display>::fmt"));
        assert!(from_prebuilt_rust_std("<&str as core::any::Any>::type_id"));
        assert!(from_prebuilt_rust_std("<u64>::from_ascii_radix"));
        assert!(from_prebuilt_rust_std("__rustc::__rust_alloc"));
        assert!(!from_prebuilt_rust_std("<u64 as my_crate::Codec>::encode"));
    }

    // Checks the census on one C file compiled twice by clang -O2: with
    // -fno-omit-frame-pointer nearly every function keeps rbp, without it none does.
    #[test]
    fn census_tells_frame_pointer_builds() {
        let dir = std::env::temp_dir().join(format!("phaseprof-census-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("f.c");
        let body: String = (0..40)
            .map(|i| {
                format!(
                    "__attribute__((noinline)) long f{i}(long *v, long n) {{ long s = 0; \
                     for (long j = 0; j < n; j++) s += v[j] * {i} + f{}(v, n / 2); return s; }}\n",
                    if i == 0 { 0 } else { i - 1 }
                )
            })
            .collect::<String>()
            .replacen("f0(v, n / 2)", "0", 1);
        std::fs::write(
            &src,
            format!("{body}int main(void) {{ long v[4] = {{0}}; return (int)f39(v, 4); }}\n"),
        )
        .unwrap();
        let census = |flag: &str| {
            let out = dir.join(format!("f{flag}"));
            let st = std::process::Command::new("clang")
                .args(["-O2", flag, "-o"])
                .arg(&out)
                .arg(&src)
                .status()
                .expect("clang (scripts/setup.sh installs it)");
            assert!(st.success());
            frame_pointer_census(&out).unwrap()
        };
        let fp = census("-fno-omit-frame-pointer");
        let nofp = census("-fomit-frame-pointer");
        assert!(fp.functions >= 40 && fp.has_frame_pointers(), "{fp:?}");
        assert!(
            nofp.functions >= 40 && !nofp.has_frame_pointers(),
            "{nofp:?}"
        );
        assert_eq!(nofp.with, 0, "{nofp:?}");
        assert!(fp.loads_libraries, "clang links libc dynamically: {fp:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
