//! `kiln pull -hf` / `hf://` names against a loopback stand-in for the Hugging Face Hub
//! (`fake_hub`), reached through `HF_ENDPOINT`: downloads into huggingface_hub's cache
//! layout, resumption, verification, quant tags, split models, offline use, reuse of what
//! huggingface_hub placed, and every bad input ending in one `error:` line, exit 1, and no
//! file a later run could take for a model.

mod fake_hub;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fake_hub::{file, sha256, Hub, HubFile};
use kiln::gguf::{GgufFile, GgufWriter, Value};

/// A fresh, empty directory for a test's cache.
fn scratch(tag: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hf-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `kiln ARGS` with the Hub at `endpoint` and the cache in `dir/hub`.
fn kiln(endpoint: &str, dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_CACHE", dir.join("hub"))
        .env("HF_HOME", dir.join("home")) // no login token from the real home
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

#[track_caller]
fn ok_path(out: &Output) -> PathBuf {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let s = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(s.ends_with('\n') && s.lines().count() == 1, "one line: {s:?}");
    let p = PathBuf::from(s.trim_end());
    assert!(p.is_absolute() && p.is_file(), "{p:?}");
    p
}

/// Exit 1, one `error:` line containing `want`, nothing on stdout.
#[track_caller]
fn fails(out: &Output, want: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    let last = err.lines().last().unwrap_or("");
    assert!(last.starts_with("error: ") && last.contains(want), "want {want:?} in {err}");
}

/// Every file under `dir`, relative, for checking what a failed pull left.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(d: &Path, root: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                walk(&p, root, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().display().to_string());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Nothing but lock files and empty directories: no blob, no partial file, no snapshot.
#[track_caller]
fn nothing_kept(dir: &Path) {
    let left: Vec<_> = files_under(dir).into_iter().filter(|f| !f.ends_with(".lock")).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn pull_into_the_huggingface_cache() {
    let hub = Hub::start();
    let data = bytes(300_000, 1);
    let commit = hub.add(
        "org/model-GGUF",
        vec![file("README.md", b"hi".to_vec()), file("model-Q4_K_M.gguf", data.clone())],
        None,
    );
    let dir = scratch("pull");
    let p = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/model-GGUF"], &[]));
    let repo = dir.join("hub/models--org--model-GGUF");
    assert_eq!(p, repo.join("snapshots").join(&commit).join("model-Q4_K_M.gguf"));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    // huggingface_hub's layout: a relative link into blobs/, named by the sha256; refs/main.
    let target = std::fs::read_link(&p).unwrap();
    assert_eq!(target, Path::new("../../blobs").join(sha256(&data)));
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).unwrap(), commit);
    // The API on 127.0.0.1 saw the token-less requests; the file came from the storage host.
    assert!(hub.log().iter().any(|s| s.host == "cdn"));

    // Cached: a second pull (and the hf:// spelling, and -hfr) downloads nothing.
    hub.clear_log();
    assert_eq!(
        ok_path(&kiln(&hub.endpoint, &dir, &["pull", "hf://org/model-GGUF/model-Q4_K_M.gguf"], &[])),
        p
    );
    assert_eq!(ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hfr", "org/model-GGUF:q4_k_m"], &[])), p);
    assert!(hub.log().iter().all(|s| s.host == "api" && !s.path.contains("/resolve/")), "{:?}", hub.log());
}

#[test]
fn an_interrupted_download_resumes() {
    let hub = Hub::start();
    let data = bytes(200_000, 2);
    let sha = sha256(&data);
    hub.add("org/r", vec![file("m-Q8_0.gguf", data.clone())], None);
    // Dropped halfway once: the same run resumes from there.
    hub.state.lock().unwrap().drops.insert(sha.clone(), (1, 100_000));
    let dir = scratch("resume");
    let p = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r:Q8_0"], &[]));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    let ranges: Vec<_> = hub.log().into_iter().filter(|s| s.host == "cdn").map(|s| s.range).collect();
    assert_eq!(ranges, [None, Some("bytes=100000-".to_string())]);

    // Dropped at every attempt: the run fails, keeping the partial blob (not a model)...
    let dir = scratch("resume-later");
    hub.state.lock().unwrap().drops.insert(sha.clone(), (100, 10_000));
    fails(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r"], &[]), "run the command again to resume");
    let part = dir.join(format!("hub/models--org--r/blobs/{sha}.incomplete"));
    let held = std::fs::metadata(&part).unwrap().len();
    assert!(held > 0 && held < data.len() as u64);
    assert!(!dir.join("hub/models--org--r/snapshots").exists());
    // ... and the next run picks it up where it stopped.
    hub.state.lock().unwrap().drops.clear();
    hub.clear_log();
    let p = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r"], &[]));
    assert_eq!(std::fs::read(&p).unwrap(), data);
    let ranges: Vec<_> = hub.log().into_iter().filter(|s| s.host == "cdn").map(|s| s.range).collect();
    assert_eq!(ranges, [Some(format!("bytes={held}-"))]);
    assert!(!part.exists());
}

#[test]
fn a_corrupted_body_is_rejected() {
    let hub = Hub::start();
    let data = bytes(50_000, 3);
    hub.add("org/r", vec![file("m.gguf", data.clone())], None);
    hub.state.lock().unwrap().corrupt.push(sha256(&data));
    let dir = scratch("corrupt");
    fails(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r"], &[]), "does not match the listed");
    nothing_kept(&dir.join("hub"));
}

#[test]
fn quant_tags_pick_files() {
    let hub = Hub::start();
    let names = [
        "M-Q2_K.gguf",
        "M-Q4_0.gguf",
        "M-Q4_K_M.gguf",
        "M-q8_0.gguf",
        "mmproj-M-f16.gguf",
        "sub/N-Q4_0.gguf",
    ];
    let files: Vec<HubFile> =
        names.iter().enumerate().map(|(i, n)| file(n, bytes(1000 + i, i as u8))).collect();
    hub.add("org/multi", files, None);
    let dir = scratch("tags");
    let name = |out: &Output| ok_path(out).file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(name(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/multi"], &[])), "M-Q4_K_M.gguf");
    assert_eq!(name(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/multi:Q8_0"], &[])), "M-q8_0.gguf");
    assert_eq!(name(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/multi:q2_k"], &[])), "M-Q2_K.gguf");
    // Q4_0 names two models: an error naming both; an absent tag lists what there is.
    fails(
        &kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/multi:Q4_0"], &[]),
        "M-Q4_0.gguf, sub/N-Q4_0.gguf",
    );
    fails(
        &kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/multi:Q6_K"], &[]),
        "available: Q2_K, Q4_0, Q4_K_M, Q8_0",
    );
    assert_eq!(
        name(&kiln(&hub.endpoint, &dir, &["pull", "hf://org/multi/sub/N-Q4_0.gguf"], &[])),
        "N-Q4_0.gguf"
    );
}

/// A small random-weight model, and the same model split in three as gguf-split does.
fn model_and_split() -> (Vec<u8>, Vec<Vec<u8>>) {
    let whole = kiln::model::synth::SynthSpec::default().build().unwrap().to_bytes();
    let g = GgufFile::from_bytes(whole.clone()).unwrap();
    let n = g.tensors.len();
    let mut parts = Vec::new();
    for i in 0..3usize {
        let mut w = GgufWriter::new();
        if i == 0 {
            for (k, v) in &g.metadata {
                w.set(k.clone(), v.clone());
            }
        }
        w.set("split.no", Value::U16(i as u16));
        w.set("split.count", Value::U16(3));
        w.set("split.tensors.count", Value::I32(n as i32));
        for t in g.tensors.iter().skip(i * n.div_ceil(3)).take(n.div_ceil(3)) {
            w.add_tensor(t.name.clone(), t.ty, &t.dims, g.tensor_data(t).to_vec()).unwrap();
        }
        parts.push(w.to_bytes());
    }
    (whole, parts)
}

#[test]
fn split_models_come_whole_and_load_as_one() {
    let hub = Hub::start();
    let (whole, parts) = model_and_split();
    let mut files: Vec<HubFile> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| file(&format!("S-Q8_0-{:05}-of-00003.gguf", i + 1), p.clone()))
        .collect();
    files.push(file("S-F16.gguf", whole.clone()));
    hub.add("org/split", files, None);
    let dir = scratch("split");
    let first = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/split:Q8_0"], &[]));
    assert!(first.ends_with("S-Q8_0-00001-of-00003.gguf"));
    for i in 2..=3 {
        let p = first.with_file_name(format!("S-Q8_0-{i:05}-of-00003.gguf"));
        assert_eq!(std::fs::read(p).unwrap(), parts[i - 1]);
    }
    // The split model computes what the whole one does.
    let logits = |m: &[&str]| {
        let mut args = vec!["logits", "--raw", "-p", "a b c", "--json", "--device", "cpu", "-t", "1"];
        args.extend_from_slice(m);
        let out = kiln(&hub.endpoint, &dir, &args, &[]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    };
    assert_eq!(logits(&["-hf", "org/split:Q8_0"]), logits(&["-hf", "org/split:F16"]));
    // A later part alone is refused, naming the first.
    let third = first.with_file_name("S-Q8_0-00003-of-00003.gguf");
    fails(&kiln(&hub.endpoint, &dir, &["inspect", third.to_str().unwrap()], &[]), "open the first part");
    fails(
        &kiln(&hub.endpoint, &dir, &["pull", "hf://org/split/S-Q8_0-00002-of-00003.gguf"], &[]),
        "name the first part",
    );
}

#[test]
fn offline_uses_the_cache_alone() {
    let hub = Hub::start();
    let data = bytes(10_000, 4);
    hub.add("org/r", vec![file("m-Q4_K_M.gguf", data.clone())], None);
    let dir = scratch("offline");
    let p = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r"], &[]));
    hub.clear_log();
    let off = [("HF_HUB_OFFLINE", "1")];
    assert_eq!(ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r:Q4_K_M"], &off)), p);
    assert_eq!(ok_path(&kiln("http://127.0.0.1:9", &dir, &["pull", "hf://org/r/m-Q4_K_M.gguf"], &off)), p);
    assert!(hub.log().is_empty(), "offline runs asked the hub: {:?}", hub.log());
    fails(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/other"], &off), "not in the cache");
    fails(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/r:Q8_0"], &off), "no Q8_0 file");
    // An unreachable Hub falls back to the cache too (with a note), or fails clearly.
    assert_eq!(ok_path(&kiln("http://127.0.0.1:9", &dir, &["pull", "-hf", "org/r"], &[])), p);
    fails(
        &kiln("http://127.0.0.1:9", &dir, &["pull", "-hf", "org/other"], &[]),
        "cannot reach http://127.0.0.1:9",
    );
}

#[test]
fn reuses_what_huggingface_hub_placed() {
    let hub = Hub::start();
    let data = bytes(20_000, 5);
    let commit = hub.add("org/py", vec![file("sub/m-Q4_K_M.gguf", data.clone())], None);
    // As huggingface_hub's hf_hub_download leaves it.
    let dir = scratch("reuse");
    let repo = dir.join("hub/models--org--py");
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("snapshots").join(&commit).join("sub")).unwrap();
    std::fs::write(repo.join("blobs").join(sha256(&data)), &data).unwrap();
    std::fs::write(repo.join("refs/main"), &commit).unwrap();
    let link = repo.join("snapshots").join(&commit).join("sub/m-Q4_K_M.gguf");
    std::os::unix::fs::symlink(format!("../../../blobs/{}", sha256(&data)), &link).unwrap();
    assert_eq!(ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/py"], &[])), link);
    assert!(hub.log().iter().all(|s| !s.path.contains("/resolve/") && s.host == "api"), "{:?}", hub.log());
    // A blob present under another snapshot is linked, not fetched again.
    std::fs::remove_file(&link).unwrap();
    assert_eq!(ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/py"], &[])), link);
    assert!(hub.log().iter().all(|s| s.host == "api"));
}

#[test]
fn gated_repositories_need_a_token() {
    let hub = Hub::start();
    let data = bytes(5_000, 6);
    hub.add("org/gated", vec![file("m.gguf", data.clone())], Some("hf_secret"));
    let dir = scratch("gated");
    fails(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/gated"], &[]), "HF_TOKEN");
    nothing_kept(&dir.join("hub"));
    fails(
        &kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/gated"], &[("HF_TOKEN", "hf_wrong")]),
        "check HF_TOKEN",
    );
    hub.clear_log();
    let p = ok_path(&kiln(&hub.endpoint, &dir, &["pull", "-hf", "org/gated"], &[("HF_TOKEN", "hf_secret")]));
    assert_eq!(std::fs::read(p).unwrap(), data);
    // The token goes to the Hub's host only, not to the storage host a file redirects to.
    let log = hub.log();
    assert!(log.iter().filter(|s| s.host == "api").all(|s| s.auth), "{log:?}");
    assert!(log.iter().filter(|s| s.host == "cdn").all(|s| !s.auth), "{log:?}");
}

#[test]
fn bad_input_is_a_clear_error() {
    let hub = Hub::start();
    hub.add(
        "org/docs",
        vec![file("README.md", b"no model".to_vec()), file("mmproj-x.gguf", bytes(10, 0))],
        None,
    );
    hub.add(
        "org/huge",
        vec![HubFile { path: "m.gguf".into(), data: bytes(100, 7), listed_size: Some(1 << 55) }],
        None,
    );
    let data = bytes(30_000, 8);
    hub.add("org/ok", vec![file("m.gguf", data.clone())], None);
    let dir = scratch("bad");
    let run = |args: &[&str]| kiln(&hub.endpoint, &dir, args, &[]);
    fails(&run(&["pull", "-hf", "org/nope"]), "org/nope: no such repository");
    fails(&run(&["pull", "-hf", "org/docs"]), "has no GGUF model file");
    fails(&run(&["pull", "hf://org/ok/other.gguf"]), "no file other.gguf");
    fails(&run(&["pull", "-hf", "not-a-repo"]), "not a repository name");
    fails(&run(&["run", "-hf", "org/nope", "hi"]), "no such repository");
    // A file bigger than the disk is refused before anything is written.
    fails(&run(&["pull", "-hf", "org/huge"]), "not enough disk space");
    nothing_kept(&dir.join("hub"));

    // The disk filling up midway (the partial file on /dev/full): the write error, and the
    // partial file removed.
    let blobs = dir.join("hub/models--org--ok/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let part = blobs.join(format!("{}.incomplete", sha256(&data)));
    std::os::unix::fs::symlink("/dev/full", &part).unwrap();
    fails(&run(&["pull", "-hf", "org/ok"]), "no space left on device");
    assert!(std::fs::symlink_metadata(&part).is_err());
    nothing_kept(&dir.join("hub"));

    // A cache that cannot be created (under a regular file).
    let blocker = dir.join("file");
    std::fs::write(&blocker, "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["pull", "-hf", "org/ok"])
        .env("HF_ENDPOINT", &hub.endpoint)
        .env("HF_HUB_CACHE", blocker.join("hub"))
        .env_remove("HF_HUB_OFFLINE")
        .output()
        .unwrap();
    fails(&out, "cannot create the Hugging Face cache directory");
    // HF_ENDPOINT that is not a URL.
    fails(&kiln("ftp://x", &dir, &["pull", "-hf", "org/ok"], &[]), "not an http(s):// URL");
}
