//! ELF symbols: every symbol of an object (its symbol table, or the dynamic one when stripped),
//! function symbols demangled (Rust names carry per-build hashes, so probes attach by file
//! offset, never by raw name), and names matched by glob.
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;

use blazesym::inspect::source::{Elf, Source};
use blazesym::inspect::Inspector;
use blazesym::SymType;

/// A function defined in an ELF object.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionSymbol {
    /// Demangled (Rust without the hash, C++), or as is (C, Go).
    pub name: String,
    /// As it appears in the symbol table.
    pub raw: String,
    pub file_offset: u64,
    pub size: u64,
}

/// An object whose symbols cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the symbols of {path}: {message}")]
pub struct Unreadable {
    pub path: String,
    pub message: String,
}

/// A demangled name: Rust (legacy and v0, without the hash), then C++, else unchanged.
pub fn demangle(raw: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(raw) {
            if let Ok(s) = sym.demangle() {
                return s;
            }
        }
    }
    raw.to_string()
}

/// Calls `f` with every symbol (functions and variables, aliases included) of the ELF file at
/// `path`, from its symbol table or, when stripped, its dynamic symbol table.
pub fn for_each_symbol(
    path: &Path,
    mut f: impl FnMut(&blazesym::inspect::SymInfo<'_>),
) -> Result<(), Unreadable> {
    let inspector = Inspector::new();
    let mut src = Elf::new(path);
    src.debug_syms = false;
    inspector
        .for_each(&Source::Elf(src), |sym| {
            f(sym);
            ControlFlow::Continue(())
        })
        .map_err(|e| Unreadable {
            path: path.display().to_string(),
            message: e.to_string(),
        })
}

/// True when the ELF file at `path` has no symbol table (`strip`ped; its dynamic symbols, the
/// exported functions, are all that is left). False when it cannot be read.
pub fn is_stripped(path: &Path) -> bool {
    use object::Object;
    crate::target_files::read_elf(path).is_ok_and(|reader| {
        object::File::parse(&reader).is_ok_and(|f| f.section_by_name(".symtab").is_none())
    })
}

/// Every function symbol of the ELF file at `path` with a file offset, one per offset.
pub fn function_symbols(path: &Path) -> Result<Vec<FunctionSymbol>, Unreadable> {
    let mut by_offset: BTreeMap<u64, FunctionSymbol> = BTreeMap::new();
    for_each_symbol(path, |sym| {
        if sym.sym_type == SymType::Function {
            if let Some(off) = sym.file_offset {
                by_offset.entry(off).or_insert_with(|| FunctionSymbol {
                    name: demangle(&sym.name),
                    raw: sym.name.to_string(),
                    file_offset: off,
                    size: sym.size.unwrap_or(0) as u64,
                });
            }
        }
    })?;
    Ok(by_offset.into_values().collect())
}

/// Shell-style glob over a whole name: `*` any run of characters, `?` one character.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the glob semantics phases rely on.
    #[test]
    fn globs() {
        assert!(glob_match(
            "validator_sim::phases::propose",
            "validator_sim::phases::propose"
        ));
        assert!(!glob_match(
            "validator_sim::phases::propose",
            "validator_sim::phases::proposer"
        ));
        assert!(glob_match(
            "*::verify_event*",
            "relay::net::verify_event_batch"
        ));
        assert!(glob_match(
            "*as core::clone::Clone>::clone*",
            "<alloc::vec::Vec<u8> as core::clone::Clone>::clone"
        ));
        assert!(glob_match("main.?erify", "main.verify"));
        assert!(!glob_match("a*b", "acbd"));
        assert!(glob_match("*", ""));
    }

    // Checks Rust (hash dropped) and C++ demangling; C names unchanged.
    #[test]
    fn demangles() {
        assert_eq!(
            demangle("_ZN13validator_sim6phases7propose17h0123456789abcdefE"),
            "validator_sim::phases::propose"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("malloc"), "malloc");
    }
}
