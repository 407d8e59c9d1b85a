//! How frames are named in views: kernel frames marked, names made safe for folded lines, and
//! which frames belong to allocators (skipped when a stack is named by its caller).
use crate::profile::{Frame, FrameKind};

/// How a frame is shown: kernel frames carry perf's `_[k]` suffix so flamegraph tools colour them.
pub fn display_name(frame: &Frame) -> String {
    match frame.kind {
        FrameKind::Kernel => format!("{}_[k]", frame.function),
        FrameKind::User | FrameKind::Synthetic => frame.function.clone(),
    }
}

/// `name` as one frame of a folded line (`frame;frame;… VALUE`): `;` separates frames and a
/// line ends the stack, so neither may stand in a name (a hostile or odd symbol could split a
/// line into two stacks).
pub fn folded_frame_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect()
}

/// Go's heap-sampling hook and the allocator frames under it, which every sampled Go allocation
/// stack ends in (our probe sits in the hook); Go's own heap profiles leave them out, and so do
/// allocation tables, so `self` lands on `runtime.newobject`, `makeslice` or the caller.
pub fn is_go_sampling_hook(f: &str) -> bool {
    f == "runtime.mProf_Malloc" || f == "runtime.profilealloc" || f.starts_with("runtime.mallocgc")
}

/// Frames of allocators and the language runtime's allocation paths, skipped when naming a stack.
pub fn is_allocator_frame(f: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "malloc",
        "calloc",
        "realloc",
        "free",
        "__libc_",
        "alloc::",
        "<alloc::",
        "__rust_",
        "__rdl_",
        "__rustc::",
        "std::alloc",
        "<std::alloc",
        "core::alloc",
        "runtime.",
        "je_",
        "_rjem_",
        "mi_",
    ];
    PREFIXES.iter().any(|p| f.starts_with(p))
        || f.contains("alloc::")
        || f.contains("GlobalAlloc>::")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that no frame name can split a folded line: separators and line ends are replaced.
    #[test]
    fn folded_names_keep_one_line_per_stack() {
        assert_eq!(folded_frame_name("a;b\nc\r\td"), "a:b c  d");
        assert_eq!(folded_frame_name("<T as Trait>::f"), "<T as Trait>::f");
    }

    // Checks that allocator and runtime allocation frames are recognised, and callers are not.
    #[test]
    fn allocator_frames() {
        for f in [
            "malloc",
            "__rdl_alloc",
            "alloc::vec::Vec<T>::push",
            "runtime.mallocgc",
        ] {
            assert!(is_allocator_frame(f), "{f}");
        }
        for f in ["main", "validator_sim::replay", "memcpy"] {
            assert!(!is_allocator_frame(f), "{f}");
        }
    }
}
