//! Model catalog: names -> pip packages, download, sha256 check, cache under `$KILN_HOME`.
//!
//! Wherever kiln takes a model, a `.gguf` path or a catalog name works: [`resolve_model`]
//! turns either into a file, fetching a catalog model on first use. Tests use the same
//! cache, so a model is downloaded once per machine.

mod catalog;
mod fetch;

use std::path::{Path, PathBuf};

pub use catalog::{catalog, CatalogEntry, Part};

use crate::error::{KilnError, Result};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// `$KILN_HOME`, default `~/.cache/kiln`.
pub fn kiln_home() -> PathBuf {
    if let Some(h) = std::env::var_os("KILN_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("kiln")
}

/// The catalog entry called `name`.
pub fn find(name: &str) -> Option<&'static CatalogEntry> {
    catalog::find(name)
}

/// Where a catalog model lives once pulled (whether or not it is there yet).
pub fn cached_path(e: &CatalogEntry) -> PathBuf {
    kiln_home().join("models").join(e.file)
}

/// A `.gguf` path as given, or a catalog name fetched into the cache on first use.
///
/// A cached file of the right size is trusted (`pull` re-checks its sha256).
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let path = Path::new(spec);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    match catalog::find(spec) {
        Some(e) => {
            let cached = cached_path(e);
            match std::fs::metadata(&cached) {
                Ok(m) if m.len() == e.size => Ok(cached),
                _ => pull(spec),
            }
        }
        None => Err(KilnError::Invalid(format!(
            "{spec}: no such file, and not a catalog model (catalog: {})",
            catalog::names()
        ))),
    }
}

/// Fetches a catalog model into `$KILN_HOME/models/` (unless a copy with the right sha256
/// is already there) and returns its absolute path. Progress goes to stderr.
pub fn pull(name: &str) -> Result<PathBuf> {
    let e = catalog::find(name).ok_or_else(|| {
        KilnError::Hub(format!("{name} is not in the catalog (catalog: {})", catalog::names()))
    })?;
    fetch::pull_entry(&kiln_home(), e)
}

/// Fetches `e` into `home/models/`: [`pull`] for an explicit home and entry (tests).
pub fn pull_into(home: &Path, e: &CatalogEntry) -> Result<PathBuf> {
    fetch::pull_entry(home, e)
}

/// The extracted llama-cpp-python 0.3.36 sdist (llama.cpp sources, vocab test files,
/// chat templates), fetched into `$KILN_HOME/src/` on first use.
pub fn llama_cpp_source() -> Result<PathBuf> {
    fetch::llama_cpp_source_in(&kiln_home())
}

/// The sha256 of a file, lowercase hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    fetch::sha256_file(path).map_err(|e| KilnError::io(path, e))
}
