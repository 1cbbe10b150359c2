//! Model catalog: names -> pip packages, download, sha256 check, cache. (Filled by the
//! foundation issue's catalog work.)

use std::path::PathBuf;

use crate::error::{KilnError, Result};

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// `$KILN_HOME`, default `~/.cache/kiln`.
pub fn kiln_home() -> PathBuf {
    if let Some(h) = std::env::var_os("KILN_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("kiln")
}

/// A `.gguf` path as given, or a catalog name fetched into the cache on first use.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    Ok(PathBuf::from(spec))
}

/// The extracted llama-cpp-python 0.3.36 sdist (llama.cpp sources, vocab test files,
/// chat templates), fetched into `$KILN_HOME/src/` on first use.
pub fn llama_cpp_source() -> Result<PathBuf> {
    let dir = kiln_home().join("src").join("llama_cpp_python-0.3.36");
    if dir.join("vendor/llama.cpp").is_dir() {
        return Ok(dir);
    }
    Err(KilnError::Hub(format!("{} is missing", dir.display())))
}
