//! Finding phase functions in the target's ELF objects: every function symbol, demangled (Rust
//! names carry per-build hashes, so probes attach by file offset, never by raw name), matched
//! against the config's globs.
use std::path::PathBuf;

use super::config::PhaseSpec;
use crate::elf::{glob_match, FunctionSymbol, Unreadable};

/// Where a phase's probe goes.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSite {
    pub path: PathBuf,
    pub symbol: String,
    pub file_offset: u64,
    pub size: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "{file}:{line}: phase `{phase}`: function `{function}` matches no function{} in {objects}{}{}",
        if near.is_empty() { String::new() } else { format!("; closest: {}", near.join(", ")) },
        inlined.as_ref().map(|name| format!(
            "; `{name}` appears in the binary but in no symbol, so it likely exists only inlined (or was optimized away), \
             in no copy whose end can be probed: mark it #[inline(never)] / __attribute__((noinline))"
        )).unwrap_or_default(),
        if stripped.is_empty() { String::new() } else { format!(
            "; {} stripped (no symbol table: only exported functions have names) and no separate \
             debug file was found (by build ID under /usr/lib/debug/.build-id/, by its \
             .gnu_debuglink, or from DEBUGINFOD_URLS), so phases need one or a build that keeps \
             its symbols",
            stripped.join(", ") + if stripped.len() == 1 { " is" } else { " are" }) }
    )]
    NoMatch {
        file: String,
        line: usize,
        phase: String,
        function: String,
        objects: String,
        /// The name's last segment, when an object mentions it although no symbol has it.
        inlined: Option<String>,
        near: Vec<String>,
        /// Objects without a symbol table (stripped), whose functions mostly have no name; left
        /// out when a name close to the one asked for exists (a typo, not a stripped build).
        stripped: Vec<String>,
    },
    #[error(transparent)]
    Unreadable(#[from] Unreadable),
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The last `::` segment of a name.
fn tail(name: &str) -> &str {
    name.rsplit("::").next().unwrap_or(name)
}

/// The objects searched, short: the program and how many libraries (`/usr/bin/redis-server and
/// 17 libraries`).
fn describe_objects(objects: &[(PathBuf, Vec<FunctionSymbol>)]) -> String {
    let mut names = objects.iter().map(|(p, _)| p.display().to_string());
    let first = names.next().unwrap_or_default();
    match objects.len() {
        0 | 1 => first,
        2 => format!("{first} and 1 library"),
        n => format!("{first} and {} libraries", n - 1),
    }
}

/// Up to `n` names closest to `pattern` (its literal parts), for "did you mean" messages.
pub fn near_matches<'a>(
    pattern: &str,
    names: impl Iterator<Item = &'a str>,
    n: usize,
) -> Vec<String> {
    let literal: String = pattern.chars().filter(|c| *c != '*' && *c != '?').collect();
    let last = literal.rsplit("::").next().unwrap_or(&literal).to_string();
    let mut scored: Vec<(usize, &str)> = names
        .map(|name| {
            let tail = name.rsplit("::").next().unwrap_or(name);
            (
                levenshtein(&literal, name).min(levenshtein(&last, tail) + 1),
                name,
            )
        })
        .collect();
    scored.sort();
    scored.dedup_by(|a, b| a.1 == b.1);
    scored
        .into_iter()
        .take(n)
        .map(|(_, s)| s.to_string())
        .collect()
}

/// The last literal segment of `pattern` (`verify_event` of `*::verify_event*`) when one of the
/// objects contains it as a string (its DWARF names inlined functions) though no symbol matched.
fn mentioned_without_symbol(
    pattern: &str,
    objects: &[(PathBuf, Vec<FunctionSymbol>)],
) -> Option<String> {
    let tail = pattern
        .rsplit("::")
        .next()
        .unwrap_or(pattern)
        .rsplit('.')
        .next()
        .unwrap_or(pattern);
    let tail: String = tail
        .split(['*', '?'])
        .max_by_key(|s| s.len())
        .unwrap_or("")
        .to_string();
    if tail.len() < 4 {
        return None;
    }
    objects
        .iter()
        .any(|(path, _)| {
            strings_of(path).any(|bytes| memchr::memmem::find(&bytes, tail.as_bytes()).is_some())
        })
        .then_some(tail)
}

/// The sections of an ELF file that hold names (symbol strings, read-only data, DWARF strings),
/// each read alone and within the section limit.
fn strings_of(path: &std::path::Path) -> impl Iterator<Item = Vec<u8>> {
    use object::{Object, ObjectSection};
    let reader = crate::target_files::read_elf(path).ok();
    let mut out = Vec::new();
    if let Some(elf) = reader.as_ref().and_then(|r| object::File::parse(r).ok()) {
        for s in elf.sections() {
            let name = s.name().unwrap_or_default();
            if name.ends_with("str") || name.starts_with(".rodata") || name == ".debug_str" {
                if let Some(b) = crate::target_files::section_bytes(&s) {
                    out.push(b.into_owned());
                }
            }
        }
    }
    out.into_iter()
}

/// Every function of `objects` that `spec.function` matches, or an error that lists the closest
/// names.
// The error is large (near matches, the inlined name) and rare: a config error, reported once.
#[allow(clippy::result_large_err)]
pub fn resolve(
    spec: &PhaseSpec,
    file: &str,
    objects: &[(PathBuf, Vec<FunctionSymbol>)],
) -> Result<Vec<ProbeSite>, ResolveError> {
    let mut sites = Vec::new();
    for (path, syms) in objects {
        for s in syms {
            if glob_match(&spec.function, &s.name) || s.raw == spec.function {
                sites.push(ProbeSite {
                    path: path.clone(),
                    symbol: s.name.clone(),
                    file_offset: s.file_offset,
                    size: s.size,
                });
            }
        }
    }
    if sites.is_empty() {
        let names = objects
            .iter()
            .flat_map(|(_, syms)| syms.iter().map(|s| s.name.as_str()));
        let near = near_matches(&spec.function, names, 3);
        let typo = near
            .first()
            .is_some_and(|n| levenshtein(tail(&spec.function), tail(n)) <= 2);
        return Err(ResolveError::NoMatch {
            file: file.to_string(),
            line: spec.line,
            phase: spec.name.clone(),
            function: spec.function.clone(),
            objects: describe_objects(objects),
            inlined: mentioned_without_symbol(&spec.function, objects),
            near,
            stripped: (objects.iter())
                .filter(|(p, _)| !typo && crate::elf::is_stripped(p))
                .map(|(p, _)| p.display().to_string())
                .collect(),
        });
    }
    Ok(sites)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::function_symbols;

    #[inline(never)]
    pub fn a_phase_function_for_tests(x: u64) -> u64 {
        std::hint::black_box(x) * 3
    }

    // Checks resolution against a real ELF (this test binary): a demangled name resolves to its
    // file offset, a typo fails with the closest names.
    #[test]
    fn resolves_in_a_real_binary() {
        assert_eq!(a_phase_function_for_tests(2), 6);
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let syms = function_symbols(&exe).unwrap();
        let objects = vec![(exe.clone(), syms)];
        let spec = |f: &str| PhaseSpec {
            name: "p".into(),
            function: f.into(),
            line: 3,
        };
        let sites = resolve(
            &spec("*::symbols::tests::a_phase_function_for_tests"),
            "phases.toml",
            &objects,
        )
        .unwrap();
        assert_eq!(sites.len(), 1);
        assert!(sites[0].file_offset > 0);
        let err = resolve(
            &spec("phaseprof::phases::symbols::tests::a_phase_functon_for_tests"),
            "phases.toml",
            &objects,
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("phases.toml:3: phase `p`"), "{err}");
        assert!(
            err.contains(
                "matches no function; closest: phaseprof::phases::symbols::tests::a_phase_function_for_tests"
            ),
            "{err}"
        );
    }
}
