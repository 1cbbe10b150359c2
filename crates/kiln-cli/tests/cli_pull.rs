//! `kiln pull` per docs/cli.md. Fetches go to scratch `KILN_HOME`s under the target dir (only
//! the 2.8 MB tiny model is downloaded); the real cache is only read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kiln(home: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    if let Some(h) = home {
        c.env("KILN_HOME", h);
    }
    c.args(args).output().unwrap()
}

/// A fresh, empty `KILN_HOME`.
fn scratch_home(tag: &str) -> PathBuf {
    let h = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("kiln-home-{tag}"));
    let _ = std::fs::remove_dir_all(&h);
    std::fs::create_dir_all(&h).unwrap();
    h
}

const TINY_SHA256: &str = "f411bb6b67997e9d9e769c2d8438acd9759a4a3b2dc258500eeeb3c715d23e96";

/// stdout is exactly the absolute path of the verified file.
#[track_caller]
fn pulled(out: &Output) -> PathBuf {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let s = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(s.ends_with('\n') && s.lines().count() == 1, "one line: {s:?}");
    let p = PathBuf::from(s.trim_end_matches('\n'));
    assert!(p.is_absolute() && p.is_file(), "{p:?}");
    p
}

#[test]
fn list() {
    let out = kiln(None, &["pull", "--list"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    let names: Vec<_> = s.lines().map(|l| l.split_whitespace().next().unwrap()).collect();
    assert_eq!(
        names,
        [
            "smollm2-135m",
            "gemma3-270m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "tiny-random-llama",
            "nomic-embed-text-v1.5"
        ]
    );
    let smol = s.lines().next().unwrap();
    assert!(smol.contains("98.4 MB") && smol.contains("llama") && smol.contains("default"), "{smol}");
    assert!(s.lines().nth(1).unwrap().contains("gemma3"));
}

#[test]
fn unknown_name_exits_1() {
    let out = kiln(None, &["pull", "llama-70b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("llama-70b") && err.contains("tiny-random-llama"),
        "{err}"
    );
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(kiln(None, &["pull"]).status.code(), Some(2));
    assert_eq!(kiln(None, &["pull", "--list", "smollm2-135m"]).status.code(), Some(2));
}

/// Two pulls of one model at once into an empty cache: one fetches, the other waits for
/// the lock and finds the verified file; both print its path; no scratch files remain.
#[test]
fn concurrent_pulls_into_empty_cache() {
    let home = scratch_home("concurrent");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .env("KILN_HOME", &home)
            .args(["pull", "tiny-random-llama"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (pa, pb) = (pulled(&a), pulled(&b));
    assert_eq!(pa, pb);
    assert_eq!(pa, std::path::absolute(home.join("models/tiny.gguf")).unwrap());
    assert_eq!(kiln::hub::sha256_file(&pa).unwrap(), TINY_SHA256);
    let mut left: Vec<_> =
        std::fs::read_dir(home.join("models")).unwrap().map(|e| e.unwrap().file_name()).collect();
    left.sort();
    assert_eq!(left, [".tiny.gguf.lock", "tiny.gguf"]);
    assert_eq!(std::fs::read_dir(home.join("tmp")).unwrap().count(), 0, "scratch removed");

    // A damaged cached file is noticed and fetched again; leftovers of an interrupted
    // pull are cleared.
    std::fs::write(&pa, b"not a model").unwrap();
    std::fs::write(home.join("models/.tiny.gguf.partial-99999"), b"half").unwrap();
    std::fs::create_dir_all(home.join("tmp/pull-tiny-random-llama-99999")).unwrap();
    let out = kiln(Some(&home), &["pull", "tiny-random-llama"]);
    assert_eq!(pulled(&out), pa);
    assert!(String::from_utf8_lossy(&out.stderr).contains("fetching it again"));
    assert_eq!(kiln::hub::sha256_file(&pa).unwrap(), TINY_SHA256);
    assert_eq!(std::fs::read_dir(home.join("models")).unwrap().count(), 2);
    assert_eq!(std::fs::read_dir(home.join("tmp")).unwrap().count(), 0);
}

/// A catalog name works wherever a model is taken: fetched on first use, progress on
/// stderr, the command's own output alone on stdout.
#[test]
fn model_fetched_on_first_use() {
    let home = scratch_home("first-use");
    let out = kiln(Some(&home), &["inspect", "--json", "-m", "tiny-random-llama"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["architecture"], "llama");
    assert!(String::from_utf8_lossy(&out.stderr).contains("pulling tiny-random-llama"));
    assert!(home.join("models/tiny.gguf").is_file());
}

/// The models `.ci/run` pulls are in the default cache and verify.
#[test]
fn default_cache_models_verify() {
    for (name, file) in
        [("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("tiny-random-llama", "tiny.gguf")]
    {
        let p = pulled(&kiln(None, &["pull", name]));
        assert_eq!(p.file_name().unwrap(), file);
        assert_eq!(p, std::path::absolute(kiln::hub::kiln_home().join("models").join(file)).unwrap());
    }
}

/// The llama.cpp source the tests read (fetched by `.ci/run`).
#[test]
fn llama_cpp_source() {
    let out = kiln(None, &["pull", "--llama-cpp-source"]);
    let p = pulled_dir(&out);
    assert!(p.ends_with("src/llama_cpp_python-0.3.36"), "{p:?}");
    assert!(p.join("vendor/llama.cpp/include/llama.h").is_file());
    assert!(p.join("vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf").is_file());
}

fn pulled_dir(out: &Output) -> PathBuf {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let p = PathBuf::from(String::from_utf8(out.stdout.clone()).unwrap().trim_end_matches('\n'));
    assert!(p.is_absolute() && p.is_dir(), "{p:?}");
    p
}
