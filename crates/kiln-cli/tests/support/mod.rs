//! What the CLI tests share.

use std::path::PathBuf;

/// The model file `models/STEM.gguf` under `$KILN_HOME`, or None (saying the test skips)
/// where it is absent.
pub fn model(stem: &str) -> Option<PathBuf> {
    let p = kiln::hub::kiln_home().join("models").join(format!("{stem}.gguf"));
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipping: {} is absent", p.display());
        None
    }
}
