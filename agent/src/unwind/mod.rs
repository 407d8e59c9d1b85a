//! User stacks of code built without frame pointers. The kernel's frame-pointer walk gives the
//! leaf and garbage there, so for such targets (`--unwind dwarf`; by default per module, for
//! every module without frame pointers) user space compiles each module's call-frame
//! information (`.eh_frame`) into compact tables shared in BPF maps, and the BPF programs walk
//! every event's stack (cpu, off-CPU, syscalls, allocations, page faults) from them, by frame
//! pointers per frame where a module has no rule or keeps frame pointers (`auto`). The older way is kept as `--unwind copy` (and as a check in
//! tests): a cpu sample or page fault carries a copy of the stack, unwound here with framehop.
//!
//! - [`census`]: does a binary keep frame pointers (decides `--unwind auto`)?
//! - [`table`]: one file's call-frame information compiled into rows.
//! - [`kernel_tables`]: the rows and each target's mappings in the kernel.
//! - [`process`]: one process's modules and the unwind of one copied stack.
//! - [`samples`]: stack copies in, cpu samples out, per target, following exec and dlopen.
//! - [`walks`]: per target, which way, following exec, dlopen and exit; counts per window.
pub mod census;
pub mod eh_frame_rows;
pub mod kernel_tables;
pub mod process;
pub mod samples;
pub mod walks;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub use census::{frame_pointer_census, FramePointerCensus};
pub use process::{ProcessUnwinder, StackCopy, Unwound};
pub use samples::SampleUnwinder;
pub use walks::StackWalks;

/// How user stacks are walked (`--unwind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// Per module: frame pointers where a module keeps them, unwind tables where it does not,
    /// in one walk (a static program with frame pointers: the kernel's frame-pointer walk).
    #[default]
    Auto,
    /// The kernel's frame-pointer walk (cheap; flat stacks for code without frame pointers).
    Fp,
    /// Unwind tables walked in the kernel, for every event kind.
    Dwarf,
    /// A copy of the user stack per cpu sample and page fault, unwound in user space (other
    /// events: frame pointers).
    Copy,
}

impl std::str::FromStr for UnwindMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(UnwindMode::Auto),
            "fp" => Ok(UnwindMode::Fp),
            "dwarf" => Ok(UnwindMode::Dwarf),
            "copy" => Ok(UnwindMode::Copy),
            _ => Err(format!(
                "unknown unwind mode `{s}`: use auto, fp, dwarf or copy"
            )),
        }
    }
}

impl UnwindMode {
    /// The engine's configuration for this mode: stack copies only for `copy`, table rows
    /// only where tables may be used.
    pub fn configure(self, cfg: &mut crate::engine::EngineConfig) {
        if self != UnwindMode::Copy {
            cfg.stack_copy_bytes = 0;
        }
        if matches!(self, UnwindMode::Fp | UnwindMode::Copy) {
            cfg.unwind_rows = 0;
        }
    }
}

/// How one target's user stacks are walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Walk {
    Fp,
    Tables,
    Copy,
}

impl Walk {
    /// As reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Walk::Fp => "fp",
            Walk::Tables => "dwarf",
            Walk::Copy => "copy",
        }
    }
}

/// A stack-copy size (`--stack-copy`, agent.toml's `stack_copy`): bytes (`16KiB`), a multiple
/// of 8 up to the programs' 64 KiB.
pub fn parse_stack_copy(s: &str) -> Result<u32, String> {
    let n = phaseprof_model::units::parse_bytes(s)?;
    if n == 0 || n > crate::engine::MAX_STACK_COPY as u64 || n % 8 != 0 {
        return Err(format!(
            "`{s}`: the stack copy must be a multiple of 8 bytes, at most 64KiB"
        ));
    }
    Ok(n as u32)
}

/// How one target's stacks are walked, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub walk: Walk,
    pub why: String,
}

/// Decides per target under a mode, inspecting each executable once (by device and inode, so a
/// rebuilt binary at the same path is inspected again).
#[derive(Default)]
pub struct UnwindPolicy {
    pub mode: UnwindMode,
    census: HashMap<(u64, u64), Result<FramePointerCensus, String>>,
}

impl UnwindPolicy {
    pub fn new(mode: UnwindMode) -> Self {
        UnwindPolicy {
            mode,
            census: HashMap::new(),
        }
    }

    pub fn decide(&mut self, exe: &Path) -> Decision {
        let fixed = |walk: Walk, why: &str| Decision {
            walk,
            why: why.to_string(),
        };
        match self.mode {
            UnwindMode::Fp => fixed(Walk::Fp, "--unwind fp"),
            UnwindMode::Dwarf => fixed(Walk::Tables, "--unwind dwarf"),
            UnwindMode::Copy => fixed(Walk::Copy, "--unwind copy"),
            UnwindMode::Auto => {
                let key = std::fs::metadata(exe)
                    .map(|m| (m.dev(), m.ino()))
                    .unwrap_or_default();
                let census = self
                    .census
                    .entry(key)
                    .or_insert_with(|| frame_pointer_census(exe).map_err(|e| format!("{e:#}")));
                match census {
                    Ok(c) if c.has_frame_pointers() && !c.loads_libraries => Decision {
                        walk: Walk::Fp,
                        why: format!(
                            "auto: {} of {} functions keep frame pointers",
                            c.with, c.functions
                        ),
                    },
                    // Its libraries are built with flags of their own (Debian's libc without
                    // frame pointers under a program with them): one walk, each module's
                    // frames by frame pointers or from tables as its own census says.
                    Ok(c) if c.has_frame_pointers() => Decision {
                        walk: Walk::Tables,
                        why: format!(
                            "auto: per module; the program keeps frame pointers ({} of {} \
                             functions), its libraries are walked from tables where they lack them",
                            c.with, c.functions
                        ),
                    },
                    Ok(c) => Decision {
                        walk: Walk::Tables,
                        why: format!(
                            "auto: per module; only {} of {} functions keep frame pointers",
                            c.with, c.functions
                        ),
                    },
                    // Unreadable executable: unwinding works whatever the build.
                    Err(e) => Decision {
                        walk: Walk::Tables,
                        why: format!("auto: executable not inspected ({e})"),
                    },
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the accepted `--stack-copy` sizes and the refused ones.
    #[test]
    fn stack_copy_sizes() {
        assert_eq!(parse_stack_copy("16KiB").unwrap(), 16384);
        assert_eq!(parse_stack_copy("64KiB").unwrap(), 65536);
        assert!(parse_stack_copy("65KiB")
            .unwrap_err()
            .contains("at most 64KiB"));
        assert!(parse_stack_copy("0").is_err());
        assert!(parse_stack_copy("1001")
            .unwrap_err()
            .contains("multiple of 8"));
    }
}
