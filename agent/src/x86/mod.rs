//! x86-64 machine code of probed functions: decoding a function, where the kernel accepts and
//! emulates a uprobe, and the probe points that follow from that (entries, Go's stack check,
//! return instructions; allocator placements in `placement`).
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::{bail, Context, Result};
use iced_x86::{Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, Register};

pub mod placement;

use placement::{choose_in, kernel_emulates, Needs};

/// The instructions of the function at `file_offset`, with their file offsets as `ip`.
/// Largest function decoded (the symbol's size comes from the target's file).
const MAX_FUNCTION_BYTES: u64 = 16 << 20;

pub fn decode_function(path: &Path, file_offset: u64, size: u64) -> Result<Vec<Instruction>> {
    if size == 0 {
        bail!("the symbol has no size, so its code cannot be decoded");
    }
    if size > MAX_FUNCTION_BYTES {
        bail!("the symbol claims {size} bytes of code, more than any function has");
    }
    let mut code = vec![0u8; size as usize];
    let mut f = crate::target_files::open_host(path, &Default::default())
        .with_context(|| format!("opening {}", path.display()))?;
    f.seek(SeekFrom::Start(file_offset))?;
    f.read_exact(&mut code)?;
    let mut decoder = Decoder::with_ip(64, &code, file_offset, DecoderOptions::NONE);
    let mut insns = Vec::new();
    while decoder.can_decode() {
        insns.push(decoder.decode());
    }
    Ok(insns)
}

/// x86 uprobes refuse instructions with a LOCK or an ES/CS/DS/SS prefix (the kernel's
/// `is_prefix_bad`): a probe there is never installed, silently.
pub fn uprobe_refuses(insn: &Instruction) -> bool {
    insn.has_lock_prefix()
        || matches!(
            insn.segment_prefix(),
            Register::ES | Register::CS | Register::DS | Register::SS
        )
}

/// Where to put a function's entry probe (and its uretprobe, which reads the return address at
/// the stack top): the first instruction, or when the kernel refuses it, the first later one
/// that every call still executes exactly once with the return address on top of the stack —
/// before any branch, call or stack change, and not a branch target.
pub fn entry_offset(path: &Path, file_offset: u64, size: u64) -> Result<u64> {
    let insns = decode_function(path, file_offset, size.max(1))?;
    let Some(first) = insns.first() else {
        bail!("the function is empty")
    };
    if !uprobe_refuses(first) {
        return Ok(first.ip());
    }
    let targets: Vec<u64> = insns
        .iter()
        .filter(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            )
        })
        .map(|i| i.near_branch_target())
        .collect();
    for insn in &insns[1..] {
        let straight = insn.flow_control() == FlowControl::Next
            && insn.stack_pointer_increment() == 0
            && insn.op0_register() != Register::RSP;
        if !straight || targets.contains(&insn.ip()) {
            break;
        }
        if !uprobe_refuses(insn) {
            return Ok(insn.ip());
        }
    }
    bail!("its first instructions cannot be uprobed (LOCK or segment prefix) and no later instruction of its entry block qualifies")
}

/// Where a program stops at its entry point (see `engine::entry_holds`): its first instruction
/// the kernel emulates, if no branch, call or system call comes before it (glibc's `_start`
/// moves registers, then pushes two: only its stack pointer has moved), else the entry itself.
/// An emulated probe needs no out-of-line page in each new process nor a single step: per
/// `cat` run, ~115 µs fewer here (measured with a tracefs uprobe at `_start` and at its `push`).
pub fn program_hold_offset(path: &Path, entry: u64) -> u64 {
    /// glibc's `_start` reaches its first push in 7 instructions.
    const LOOK_AHEAD: usize = 12;
    let Ok(insns) = decode_function(path, entry, 64) else {
        return entry;
    };
    for insn in insns.iter().take(LOOK_AHEAD) {
        if placement::kernel_emulates(insn) && !uprobe_refuses(insn) {
            return insn.ip();
        }
        if insn.flow_control() != FlowControl::Next || insn.is_invalid() {
            break;
        }
    }
    entry
}

/// The entry probe of a native function, which shares its site with a uretprobe: on an
/// instruction the kernel emulates when the entry block has one before the stack moves (a
/// single-stepped probe costs a second trap, ~15 us here), else where [`entry_offset`] puts it.
/// The site must not be a branch target, or a loop back to it would count a call twice.
pub fn native_entry(path: &Path, file_offset: u64, size: u64) -> Result<(u64, bool)> {
    let insns = decode_function(path, file_offset, size.max(1))?;
    let needs = Needs {
        args: &[],
        return_probe: true,
        skip_null_test: false,
    };
    if let Ok(p) = choose_in(&insns, file_offset, needs) {
        let targeted = insns.iter().any(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) && i.near_branch_target() == p.file_offset
        });
        if p.emulated && !targeted {
            return Ok((p.file_offset, true));
        }
    }
    let entry = entry_offset(path, file_offset, size)?;
    let emulated = insns
        .iter()
        .find(|i| i.ip() == entry)
        .is_some_and(kernel_emulates);
    Ok((entry, emulated))
}

/// Go functions open with a stack check (`cmp rsp, [r14+16]; jbe morestack`) whose slow path
/// grows the stack and jumps back to the entry: a probe there would fire twice for one call.
/// The entry probe of a Go function goes right after that check; functions without one keep
/// their first instruction.
pub fn go_entry_offset(path: &Path, file_offset: u64, size: u64) -> Result<u64> {
    let insns = decode_function(path, file_offset, size)?;
    for (i, insn) in insns.iter().enumerate().take(4) {
        if insn.flow_control() == FlowControl::ConditionalBranch {
            let checks_stack = insns[..i]
                .iter()
                .any(|c| c.mnemonic() == Mnemonic::Cmp && c.memory_base() == Register::R14);
            if checks_stack {
                if let Some(body) = insns.get(i + 1) {
                    return Ok(body.ip());
                }
            }
            break;
        }
    }
    Ok(file_offset)
}

/// File offsets of every `ret` in the function at `site`, decoded from its machine code.
pub fn return_offsets(path: &Path, file_offset: u64, size: u64) -> Result<Vec<u64>> {
    let rets: Vec<u64> = decode_function(path, file_offset, size)?
        .iter()
        .filter(|i| i.mnemonic() == Mnemonic::Ret)
        .map(|i| i.ip())
        .collect();
    if rets.is_empty() {
        bail!("no return instruction found (the function never returns, or ends in a tail call)");
    }
    Ok(rets)
}

/// Whether the kernel emulates the instruction at `file_offset` of `path`.
pub fn emulated_at(path: &Path, file_offset: u64) -> bool {
    decode_function(path, file_offset, 16)
        .ok()
        .and_then(|insns| insns.first().map(kernel_emulates))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::function_symbols;

    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    /// Starts with `lock inc` (the atomic increment), which uprobes refuse.
    #[inline(never)]
    pub fn starts_locked(x: u64) -> u64 {
        CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        std::hint::black_box(x) + 1
    }

    // Checks that an entry probe moves past a LOCK-prefixed first instruction, and stays at the
    // entry otherwise.
    #[test]
    fn entry_probe_avoids_refused_instructions() {
        assert_eq!(starts_locked(1), 2);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let syms = function_symbols(&exe).unwrap();
        let find = |suffix: &str| {
            syms.iter()
                .find(|s| s.name.ends_with(suffix))
                .unwrap()
                .clone()
        };
        let locked = find("x86::tests::starts_locked");
        let insns = decode_function(&exe, locked.file_offset, locked.size).unwrap();
        assert!(
            insns[0].has_lock_prefix(),
            "the test function must start with a locked instruction"
        );
        let entry = entry_offset(&exe, locked.file_offset, locked.size).unwrap();
        assert_eq!(entry, insns[1].ip());
        let plain = find("symbols::tests::a_phase_function_for_tests");
        assert_eq!(
            entry_offset(&exe, plain.file_offset, plain.size).unwrap(),
            plain.file_offset
        );
    }

    // Checks where a program stops at its entry: glibc's `_start` (as Debian's `cat` has it) at
    // its first `push`, after register moves only; code that calls or makes a system call
    // before any instruction the kernel emulates, at the entry itself.
    #[test]
    fn program_holds_at_the_first_emulated_instruction() {
        let at = |code: &[u8]| {
            let path = std::env::temp_dir().join(format!("pp-hold-{}", std::process::id()));
            let mut bytes = vec![0x90u8; 16];
            bytes.extend_from_slice(code);
            bytes.resize(16 + 64, 0xf4);
            std::fs::write(&path, &bytes).unwrap();
            let off = program_hold_offset(&path, 16);
            std::fs::remove_file(&path).unwrap();
            off - 16
        };
        // xor ebp,ebp; mov r9,rdx; pop rsi; mov rdx,rsp; and rsp,-16; push rax
        let start = [
            0x31, 0xed, 0x49, 0x89, 0xd1, 0x5e, 0x48, 0x89, 0xe2, 0x48, 0x83, 0xe4, 0xf0, 0x50,
        ];
        assert_eq!(at(&start), 13);
        // mov eax,60; syscall; push rax
        assert_eq!(at(&[0xb8, 0x3c, 0, 0, 0, 0x0f, 0x05, 0x50]), 0);
        // call *[rip+0]; push rax
        assert_eq!(at(&[0xff, 0x15, 0, 0, 0, 0, 0x50]), 0);
        // jmp rel32 (Go's _rt0_amd64_linux): emulated, so the entry itself
        assert_eq!(at(&[0xe9, 0, 0, 0, 0]), 0);
    }

    // Checks return-instruction decoding on a real function of this test binary.
    #[test]
    fn finds_return_instructions() {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let syms = function_symbols(&exe).unwrap();
        let f = syms
            .iter()
            .find(|s| {
                s.name
                    .ends_with("symbols::tests::a_phase_function_for_tests")
            })
            .expect("the test function is in the binary");
        let rets = return_offsets(&exe, f.file_offset, f.size).unwrap();
        assert!(!rets.is_empty());
        assert!(rets
            .iter()
            .all(|&r| r >= f.file_offset && r < f.file_offset + f.size));
    }
}
