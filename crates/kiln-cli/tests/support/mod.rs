//! What the CLI tests share.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// `kiln ARGS...`, its output collected.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().unwrap()
}

/// A file under the repository's `tests/fixtures/`.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// Exit 1, nothing on stdout, and a stderr starting `error: ` that contains `want`.
#[track_caller]
pub fn fails(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(out.stdout.is_empty());
    assert!(err.starts_with("error: ") && err.contains(want), "stderr: {err}");
}

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
