//! Compiles every `.bpf.c` with clang and writes its libbpf-rs skeleton to OUT_DIR.
use std::env;
use std::path::PathBuf;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["phaseprof"];

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = match env::var("CARGO_CFG_TARGET_ARCH").as_deref() {
        Ok("x86_64") => "x86",
        Ok(other) => {
            panic!("no vmlinux.h checked in for {other}; add bpf/vmlinux/<arch>/vmlinux.h")
        }
        Err(_) => "x86",
    };
    for name in PROGRAMS {
        let src = format!("src/{name}.bpf.c");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args([
                "-Iinclude".to_string(),
                format!("-Ivmlinux/{arch}"),
                "-D__TARGET_ARCH_x86".to_string(),
                "-Wall".to_string(),
                "-Wno-unused-function".to_string(),
            ])
            .build_and_generate(out.join(format!("{name}.skel.rs")))
            .unwrap_or_else(|e| panic!("building {src}: {e:#}"));
        println!("cargo:rerun-if-changed={src}");
    }
    println!("cargo:rerun-if-changed=include/phaseprof.h");
}
