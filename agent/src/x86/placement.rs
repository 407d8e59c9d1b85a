//! Where an allocator probe goes. x86 uprobes either emulate the probed instruction in the
//! kernel (relative jumps, calls and conditional branches, `push reg`, `nop`) or single-step it
//! out of line, which costs a second trap: about 30x the emulated cost here (BPF-NOTES: +17 µs
//! per `free` probed at its `test rdi, rdi`). So each function is probed at the first
//! instruction of its entry path that the kernel emulates and where the arguments are intact.
use std::path::Path;

use anyhow::{bail, Result};
use iced_x86::{
    Code, FlowControl, Formatter, Instruction, InstructionInfoFactory, IntelFormatter, OpAccess,
    Register,
};

use super::{decode_function, uprobe_refuses};

/// The chosen probe point of one function.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// File offset of the probed instruction.
    pub file_offset: u64,
    /// Its distance from the function's first byte.
    pub delta: u64,
    /// The instruction, as Intel syntax.
    pub instruction: String,
    /// Whether the kernel emulates it (else it is single-stepped: the fallback).
    pub emulated: bool,
}

/// What a function's probe needs from its site.
#[derive(Clone, Copy, Debug)]
pub struct Needs<'a> {
    /// Argument registers that must still hold the caller's values.
    pub args: &'a [Register],
    /// A uretprobe shares the site: the return address must be on top of the stack, so no
    /// instruction before the site may move the stack pointer.
    pub return_probe: bool,
    /// A NULL first argument makes the call a no-op (free): the walk may follow the non-NULL
    /// side of a `test arg0, arg0; je` and leave NULL frees unprobed.
    pub skip_null_test: bool,
}

/// Whether x86 uprobes emulate `insn` (arch/x86/kernel/uprobes.c: branch_setup_xol_ops and
/// push_setup_xol_ops), with no prefix the kernel would refuse.
pub fn kernel_emulates(insn: &Instruction) -> bool {
    match insn.code() {
        Code::Jmp_rel8_64 | Code::Jmp_rel32_64 | Code::Call_rel32_64 | Code::Nopd => {
            // Canonical encodings only: an operand-size or other prefix is not emulated.
            matches!(insn.len(), 1 | 2 | 5)
        }
        Code::Push_r64 => {
            // `push r8..r15` carries REX.B (0x41), which the kernel accepts; nothing else.
            insn.len() == 1
                || (insn.len() == 2 && insn.op0_register() as u32 >= Register::R8 as u32)
        }
        _ => {
            insn.flow_control() == FlowControl::ConditionalBranch
                && (insn.is_jcc_short() || insn.is_jcc_near())
                && matches!(insn.len(), 2 | 6)
        }
    }
}

fn written_registers(factory: &mut InstructionInfoFactory, insn: &Instruction) -> Vec<Register> {
    factory
        .info(insn)
        .used_registers()
        .iter()
        .filter(|u| {
            matches!(
                u.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            )
        })
        .map(|u| u.register().full_register())
        .collect()
}

/// `test r, r` or `cmp r, 0` on the first argument followed by `je`/`jz`: the branch is taken
/// exactly when the argument is NULL.
fn is_null_test(prev: &Instruction, branch: &Instruction, arg0: Register) -> bool {
    use iced_x86::{ConditionCode, Mnemonic, OpKind};
    let on_arg = |r: Register| r.full_register() == arg0;
    let tests = match prev.mnemonic() {
        Mnemonic::Test => {
            prev.op0_kind() == OpKind::Register
                && prev.op1_kind() == OpKind::Register
                && on_arg(prev.op0_register())
                && prev.op0_register() == prev.op1_register()
        }
        Mnemonic::Cmp => {
            prev.op0_kind() == OpKind::Register
                && on_arg(prev.op0_register())
                && prev.op1_kind() != OpKind::Register
                && prev.immediate(1) == 0
        }
        _ => false,
    };
    tests && branch.condition_code() == ConditionCode::e
}

fn describe(insn: &Instruction) -> String {
    let mut out = String::new();
    IntelFormatter::new().format(insn, &mut out);
    out
}

/// Chooses the probe point of the function at `file_offset` (`size` bytes) in `path`.
pub fn choose(path: &Path, file_offset: u64, size: u64, needs: Needs<'_>) -> Result<Placement> {
    let insns = decode_function(path, file_offset, size.clamp(1, 256))?;
    choose_in(&insns, file_offset, needs)
}

/// The function's first instruction, as a tool that probes symbols by name would use
/// (`--alloc-placement entry`, for the benchmark that measures what [`choose`] saves).
pub fn entry(path: &Path, file_offset: u64, size: u64) -> Result<Placement> {
    let insns = decode_function(path, file_offset, size.clamp(1, 16))?;
    let Some(first) = insns.first() else {
        bail!("the function is empty")
    };
    Ok(Placement {
        file_offset,
        delta: 0,
        instruction: describe(first),
        emulated: kernel_emulates(first),
    })
}

/// The walk behind [`choose`], over decoded instructions (`ip` = file offset).
pub fn choose_in(insns: &[Instruction], func: u64, needs: Needs<'_>) -> Result<Placement> {
    let Some(first) = insns.first() else {
        bail!("the function is empty")
    };
    let place = |insn: &Instruction, emulated: bool| Placement {
        file_offset: insn.ip(),
        delta: insn.ip() - func,
        instruction: describe(insn),
        emulated,
    };
    let mut factory = InstructionInfoFactory::new();
    let mut clobbered: Vec<Register> = Vec::new();
    let mut stack_moved = false;
    let mut i = 0;
    // An entry path is short; a dozen instructions is plenty to find a push or a branch.
    for _ in 0..16 {
        let Some(insn) = insns.get(i) else { break };
        if needs.skip_null_test && i > 0 {
            if let Some(&arg0) = needs.args.first() {
                if is_null_test(&insns[i - 1], insn, arg0) {
                    i += 1; // the non-NULL side falls through
                    continue;
                }
            }
        }
        let args_intact = !needs.args.iter().any(|a| clobbered.contains(a));
        if !args_intact || (needs.return_probe && stack_moved) {
            break;
        }
        if kernel_emulates(insn) && !uprobe_refuses(insn) {
            return Ok(place(insn, true));
        }
        if insn.flow_control() != FlowControl::Next {
            break; // a branch or call the kernel does not emulate: the entry path ends
        }
        clobbered.extend(written_registers(&mut factory, insn));
        stack_moved |= insn.stack_pointer_increment() != 0 || clobbered.contains(&Register::RSP);
        i += 1;
    }
    if uprobe_refuses(first) {
        bail!("no instruction of its entry path can be probed (LOCK or segment prefix)");
    }
    Ok(place(first, kernel_emulates(first)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    fn decode(bytes: &[u8]) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    const FREE: Needs<'static> = Needs {
        args: &[Register::RDI],
        return_probe: false,
        skip_null_test: true,
    };

    // Checks glibc 2.36's free: past `test rdi,rdi; je` onto the emulated `push rbp`.
    #[test]
    fn free_is_probed_past_its_null_test() {
        // test rdi,rdi; je +0xbf; push rbp; lea rsi,[rdi-0x10]
        let code = [
            0x48, 0x85, 0xff, 0x0f, 0x84, 0xbf, 0x00, 0x00, 0x00, 0x55, 0x48, 0x8d, 0x77, 0xf0,
        ];
        let p = choose_in(&decode(&code), 0x1000, FREE).unwrap();
        assert_eq!(p.delta, 9);
        assert!(p.emulated);
        assert_eq!(p.instruction, "push rbp");
    }

    // Checks that a uretprobe site stays before any stack move and that clobbered arguments
    // stop the walk: the entry is kept (single-stepped) when nothing later qualifies.
    #[test]
    fn return_probes_and_clobbered_arguments_keep_the_entry() {
        // cmp byte [rip+0x10],0; sub rsp,0x18; push rbx
        let code = [
            0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x00, 0x48, 0x83, 0xec, 0x18, 0x53,
        ];
        let needs = Needs {
            args: &[Register::RDI],
            return_probe: true,
            skip_null_test: false,
        };
        let p = choose_in(&decode(&code), 0x1000, needs).unwrap();
        assert_eq!(p.delta, 0);
        assert!(!p.emulated);
        // mov rdi,rax; push rbx: the push is emulated but rdi no longer holds the argument.
        let code = [0x48, 0x89, 0xc7, 0x53];
        let p = choose_in(&decode(&code), 0x1000, needs).unwrap();
        assert_eq!(p.delta, 0);
        // cmp byte [rip+0x10],0; push r12 (posix_memalign): the push qualifies.
        let code = [0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x00, 0x41, 0x54];
        let p = choose_in(&decode(&code), 0x1000, needs).unwrap();
        assert_eq!((p.delta, p.emulated), (7, true));
    }
}
