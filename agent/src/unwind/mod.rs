//! User stacks of code built without frame pointers. The kernel's frame-pointer walk gives the
//! leaf and garbage there, so for such targets a cpu sample carries the user registers and a copy
//! of the stack from `sp` up (BPF reads it in chunks and stops at the first fault), and user space
//! unwinds it with framehop from each module's call-frame information (`.eh_frame` with its
//! `.eh_frame_hdr` index, `.debug_frame` when present), falling back to frame pointers where a
//! module has none.
//!
//! - [`census`]: does a binary keep frame pointers (decides `--unwind auto`)?
//! - [`process`]: one process's modules and the unwind of one copied stack.
//! - [`samples`]: stack copies in, cpu samples out, per target, following exec and dlopen.
pub mod census;
pub mod process;
pub mod samples;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

pub use census::{frame_pointer_census, FramePointerCensus};
pub use process::{ProcessUnwinder, StackCopy, Unwound};
pub use samples::SampleUnwinder;

/// How user stacks are walked (`--unwind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UnwindMode {
    /// Per target: frame pointers when its executable keeps them, else `Dwarf`.
    #[default]
    Auto,
    /// The kernel's frame-pointer walk (cheap; flat stacks for code without frame pointers).
    Fp,
    /// A copy of the user stack per sample, unwound from call-frame information.
    Dwarf,
}

impl std::str::FromStr for UnwindMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(UnwindMode::Auto),
            "fp" => Ok(UnwindMode::Fp),
            "dwarf" => Ok(UnwindMode::Dwarf),
            _ => Err(format!("unknown unwind mode `{s}`: use auto, fp or dwarf")),
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
    pub dwarf: bool,
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
        match self.mode {
            UnwindMode::Fp => Decision {
                dwarf: false,
                why: "--unwind fp".into(),
            },
            UnwindMode::Dwarf => Decision {
                dwarf: true,
                why: "--unwind dwarf".into(),
            },
            UnwindMode::Auto => {
                let key = std::fs::metadata(exe)
                    .map(|m| (m.dev(), m.ino()))
                    .unwrap_or_default();
                let census = self
                    .census
                    .entry(key)
                    .or_insert_with(|| frame_pointer_census(exe).map_err(|e| format!("{e:#}")));
                match census {
                    Ok(c) if c.has_frame_pointers() => Decision {
                        dwarf: false,
                        why: format!(
                            "auto: {} of {} functions keep frame pointers",
                            c.with, c.functions
                        ),
                    },
                    Ok(c) => Decision {
                        dwarf: true,
                        why: format!(
                            "auto: only {} of {} functions keep frame pointers",
                            c.with, c.functions
                        ),
                    },
                    // Unreadable executable: unwinding works whatever the build.
                    Err(e) => Decision {
                        dwarf: true,
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
