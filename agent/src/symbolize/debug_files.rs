//! Where a stripped file's symbols are when it carries no `.gnu_debuglink` blazesym can follow:
//! a separate debug file found by the file's GNU build ID under `/usr/lib/debug/.build-id/`
//! (as perf and gdb look), or fetched from a debuginfod server when `DEBUGINFOD_URLS` is set,
//! cached where elfutils' own client caches (`$DEBUGINFOD_CACHE_PATH`, else
//! `$XDG_CACHE_HOME/debuginfod_client`, else `~/.cache/debuginfod_client`), so both share it.
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Largest debug file fetched (debug info of big programs runs to hundreds of MiB).
const MAX_FETCH_BYTES: u64 = 2 << 30;

pub struct DebugFiles {
    dirs: Vec<PathBuf>,
    urls: Vec<String>,
    cache: PathBuf,
    /// Per build ID: the debug file, or None once looked for in vain.
    found: HashMap<String, Option<PathBuf>>,
}

impl Default for DebugFiles {
    fn default() -> Self {
        let urls = std::env::var("DEBUGINFOD_URLS")
            .unwrap_or_default()
            .split_whitespace()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect();
        DebugFiles {
            dirs: vec!["/usr/lib/debug".into(), "/lib/debug".into()],
            urls,
            cache: cache_dir(),
            found: HashMap::new(),
        }
    }
}

fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("DEBUGINFOD_CACHE_PATH") {
        return p.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| "/var/cache".into());
    base.join("debuginfod_client")
}

impl DebugFiles {
    #[cfg(test)]
    pub fn with(dirs: Vec<PathBuf>, urls: Vec<String>, cache: PathBuf) -> Self {
        DebugFiles {
            dirs,
            urls,
            cache,
            found: HashMap::new(),
        }
    }

    /// The debug file of build ID `id` (lowercase hex), looked for once.
    pub fn for_build_id(&mut self, id: &str) -> Option<PathBuf> {
        if id.len() < 3 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        if let Some(found) = self.found.get(id) {
            return found.clone();
        }
        let local = self
            .dirs
            .iter()
            .map(|d| {
                d.join(".build-id")
                    .join(&id[..2])
                    .join(format!("{}.debug", &id[2..]))
            })
            .find(|p| p.is_file());
        let found = local.or_else(|| self.fetch(id));
        self.found.insert(id.to_string(), found.clone());
        found
    }

    /// From the cache, or from the first debuginfod server that has it.
    fn fetch(&self, id: &str) -> Option<PathBuf> {
        let cached = self.cache.join(id).join("debuginfo");
        if cached.is_file() {
            return Some(cached);
        }
        let http: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        for url in &self.urls {
            let Ok(mut resp) = http.get(&format!("{url}/buildid/{id}/debuginfo")).call() else {
                continue;
            };
            let mut body = Vec::new();
            let read = resp
                .body_mut()
                .as_reader()
                .take(MAX_FETCH_BYTES)
                .read_to_end(&mut body);
            if read.is_err() || !body.starts_with(b"\x7fELF") {
                continue;
            }
            // Written beside, then renamed: a reader never sees half a file.
            let dir = cached.parent()?;
            std::fs::create_dir_all(dir).ok()?;
            let tmp = dir.join(format!(".debuginfo.tmp-{}", std::process::id()));
            std::fs::write(&tmp, &body).ok()?;
            std::fs::rename(&tmp, &cached).ok()?;
            eprintln!("phaseprof: debug info of build id {id} fetched from {url}");
            return Some(cached);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the lookup by build ID in a debug directory, the cache of a debuginfod client, and
    // that a miss is remembered.
    #[test]
    fn finds_by_build_id_then_cache() {
        let root =
            std::env::temp_dir().join(format!("phaseprof-debugfiles-{}", std::process::id()));
        let dir = root.join("debug/.build-id/ab");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cdef.debug"), b"\x7fELF").unwrap();
        let cache = root.join("cache");
        std::fs::create_dir_all(cache.join("0123").join("")).unwrap();
        std::fs::write(cache.join("0123/debuginfo"), b"\x7fELF").unwrap();
        let mut d = DebugFiles::with(vec![root.join("debug")], vec![], cache.clone());
        assert_eq!(d.for_build_id("abcdef"), Some(dir.join("cdef.debug")));
        assert_eq!(d.for_build_id("0123"), Some(cache.join("0123/debuginfo")));
        assert_eq!(d.for_build_id("feed"), None);
        assert_eq!(d.for_build_id("../etc"), None);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
