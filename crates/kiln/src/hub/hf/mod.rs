//! Models from the Hugging Face Hub: `hf://ORG/REPO[:QUANT]` (the file a quant tag picks,
//! as llama.cpp's `-hf`) and `hf://ORG/REPO/PATH.gguf` (that file).
//!
//! The repository's current commit and file list come from the Hub's API; each file of
//! the model (every part of a split one) is reused from the cache when there, else
//! downloaded, resumed after an interruption, verified against the sha256 the listing
//! gives, and moved into place whole. The cache is huggingface_hub's ([`cache`]), so a
//! file fetched by either tool serves both. With `HF_HUB_OFFLINE=1`, or when the Hub cannot
//! be reached, a name resolves from the cache alone.

mod cache;
mod http;
pub mod select;

use std::path::PathBuf;

use serde_json::Value;

pub use cache::hub_cache_dir;
use cache::{is_commit, RepoCache};
use http::{Client, Expect, Unreachable};

use crate::error::{KilnError, Result};
use crate::progress::{report, ProgressFn, Stage};

/// The prefix of a Hub model name.
pub const SCHEME: &str = "hf://";

/// A parsed `hf://` name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HfName {
    /// `ORG/REPO`.
    pub repo: String,
    /// The quant tag (`ORG/REPO:TAG`), or the file (`ORG/REPO/PATH`); neither: the default.
    pub tag: Option<String>,
    pub file: Option<String>,
}

impl HfName {
    /// Parses `hf://ORG/REPO[:QUANT]` or `hf://ORG/REPO/PATH.gguf`; `None` for names
    /// without the `hf://` prefix.
    pub fn parse(spec: &str) -> Option<Result<HfName>> {
        let rest = spec.strip_prefix(SCHEME)?;
        let bad = |why: &str| {
            KilnError::invalid(format!(
                "{spec}: {why} (expected hf://ORG/REPO[:QUANT] or hf://ORG/REPO/PATH.gguf)"
            ))
        };
        let mut parts = rest.splitn(3, '/');
        let (org, repo_tag, file) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next());
        let (repo, tag) = match (repo_tag.split_once(':'), file) {
            (Some((r, t)), None) => (r, Some(t)),
            (Some(_), Some(_)) => return Some(Err(bad("a quant tag and a file path together"))),
            (None, _) => (repo_tag, None),
        };
        let repo = format!("{org}/{repo}");
        if !valid_repo(&repo) {
            return Some(Err(bad("not a repository name")));
        }
        if tag.is_some_and(|t| t.is_empty() || !t.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')) {
            return Some(Err(bad("a quant tag is letters, digits and _")));
        }
        if let Some(f) = file {
            if !valid_path(f) || select::split_parts(f).is_none() {
                return Some(Err(bad("the file must be a .gguf path inside the repository")));
            }
        }
        Some(Ok(HfName { repo, tag: tag.map(str::to_string), file: file.map(str::to_string) }))
    }

    /// The name as `hf://...`.
    pub fn spec(&self) -> String {
        match (&self.tag, &self.file) {
            (Some(t), _) => format!("{SCHEME}{}:{t}", self.repo),
            (_, Some(f)) => format!("{SCHEME}{}/{f}", self.repo),
            _ => format!("{SCHEME}{}", self.repo),
        }
    }
}

/// `ORG/REPO`: letters, digits, `_`, and `-` `.` between them; one `/`.
fn valid_repo(repo: &str) -> bool {
    repo.len() <= 256
        && repo.matches('/').count() == 1
        && repo.split('/').all(|part| {
            let b = part.as_bytes();
            let base = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
            !b.is_empty()
                && base(b[0])
                && base(b[b.len() - 1])
                && b.windows(2).all(|w| base(w[0]) || base(w[1]))
                && b.iter().all(|&c| base(c) || c == b'-' || c == b'.')
        })
}

/// A relative path with no empty, `.` or `..` segment (nothing outside the snapshot).
fn valid_path(p: &str) -> bool {
    !p.is_empty() && !p.contains('\\') && p.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
}

fn valid_hex(s: &str, lens: &[usize]) -> bool {
    lens.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// A file as the Hub lists it.
struct Remote {
    path: String,
    size: u64,
    sha256: Option<String>,
    git_oid: Option<String>,
}

impl Remote {
    /// The blob name: the LFS sha256, else the git object id (as huggingface_hub names it).
    fn etag(&self) -> &str {
        self.sha256.as_deref().or(self.git_oid.as_deref()).unwrap_or("")
    }
}

/// The local path of the model `name` names (its first part, for a split model), fetching
/// what the cache lacks. Download progress goes to `progress`.
pub fn resolve(name: &HfName, progress: Option<&ProgressFn>) -> Result<PathBuf> {
    let cache = RepoCache::new(&hub_cache_dir(), &name.repo);
    if offline() {
        return resolve_cached(name, &cache).map_err(|e| match e {
            KilnError::Hub(m) => {
                KilnError::Hub(format!("{m} (HF_HUB_OFFLINE is set: only the cache is used)"))
            }
            e => e,
        });
    }
    let client = Client::from_env()?;
    let fallback = |why: String| match resolve_cached(name, &cache) {
        Ok(p) => {
            eprintln!("kiln: cannot reach {} ({why}); using the cached {}", client.endpoint, p.display());
            Ok(p)
        }
        Err(_) => Err(KilnError::Hub(format!(
            "cannot reach {} ({why}); {} is not in the cache (set HF_HUB_OFFLINE=1 to use only the cache)",
            client.endpoint,
            name.spec()
        ))),
    };
    let url = format!("{}/api/models/{}", client.endpoint, name.repo);
    let info = match client.api_json(&url, &name.repo) {
        Err(Unreachable(why)) => return fallback(why),
        Ok(r) => r?.0,
    };
    let commit = info
        .get("sha")
        .and_then(Value::as_str)
        .filter(|c| is_commit(c))
        .ok_or_else(|| KilnError::Hub(format!("{url}: the answer has no commit id (\"sha\")")))?;
    let listing = match list_files(&client, &name.repo, commit) {
        Err(Unreachable(why)) => return fallback(why),
        Ok(r) => r?,
    };
    let names: Vec<String> = listing.iter().map(|f| f.path.clone()).collect();
    let wanted = choose(name, &names)?;
    let total = wanted.len();
    let mut first = None;
    for (i, path) in wanted.iter().enumerate() {
        let remote = listing.iter().find(|f| &f.path == path).expect("chosen from the listing");
        let local = fetch(&client, &cache, &name.repo, commit, remote, (i + 1, total), progress)?;
        first.get_or_insert(local);
    }
    cache.write_ref("main", commit)?;
    let first = first.expect("select returns at least one file");
    std::path::absolute(&first).map_err(|e| KilnError::io(&first, e))
}

/// The files of the model `name` picks among a repository's `names`.
fn choose(name: &HfName, names: &[String]) -> Result<Vec<String>> {
    match &name.file {
        None => select::select(&name.repo, names, name.tag.as_deref()),
        Some(f) => {
            if !names.contains(f) {
                return Err(KilnError::Hub(format!("{}: no file {f} in the repository", name.repo)));
            }
            match select::split_parts(f) {
                Some((_, no, count)) if no > 1 => Err(KilnError::Hub(format!(
                    "{f} is part {no} of {count} of a split model: name the first part, {}",
                    select::part_name(f, 1, count)
                ))),
                _ => select::parts_of(&name.repo, names, f),
            }
        }
    }
}

/// The model from the cache alone: the commit `refs/main` names and its snapshot's files.
fn resolve_cached(name: &HfName, cache: &RepoCache) -> Result<PathBuf> {
    let commit = cache.read_ref("main").ok_or_else(|| {
        KilnError::Hub(format!("{} is not in the cache ({})", name.repo, cache.root.display()))
    })?;
    let names = cache.snapshot_files(&commit);
    let wanted = choose(name, &names)?;
    let first = cache.cached(&commit, &wanted[0], None).expect("listed from the snapshot");
    std::path::absolute(&first).map_err(|e| KilnError::io(&first, e))
}

/// Every file of `repo` at `commit`, with sizes and hashes (following pagination).
fn list_files(
    client: &Client,
    repo: &str,
    commit: &str,
) -> std::result::Result<Result<Vec<Remote>>, Unreachable> {
    let mut url = Some(format!("{}/api/models/{repo}/tree/{commit}?recursive=true", client.endpoint));
    let mut out = Vec::new();
    while let Some(u) = url.take() {
        let (v, next) = match client.api_json(&u, repo)? {
            Ok(x) => x,
            Err(e) => return Ok(Err(e)),
        };
        let Some(items) = v.as_array() else {
            return Ok(Err(KilnError::Hub(format!("{u}: expected a JSON array of files"))));
        };
        for item in items {
            if item.get("type").and_then(Value::as_str) != Some("file") {
                continue;
            }
            let (Some(path), Some(size)) =
                (item.get("path").and_then(Value::as_str), item.get("size").and_then(Value::as_u64))
            else {
                continue;
            };
            if !valid_path(path) {
                continue; // never a file outside the snapshot
            }
            let lfs = item.get("lfs");
            let sha256 =
                lfs.and_then(|l| l.get("oid")).and_then(Value::as_str).filter(|s| valid_hex(s, &[64]));
            let size = lfs.and_then(|l| l.get("size")).and_then(Value::as_u64).unwrap_or(size);
            let git_oid = item.get("oid").and_then(Value::as_str).filter(|s| valid_hex(s, &[40, 64]));
            out.push(Remote {
                path: path.to_string(),
                size,
                sha256: sha256.map(str::to_ascii_lowercase),
                git_oid: git_oid.map(str::to_ascii_lowercase),
            });
        }
        url = next;
    }
    Ok(Ok(out))
}

/// One file into the cache (unless there), returning its snapshot path.
fn fetch(
    client: &Client,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    f: &Remote,
    (no, count): (usize, usize),
    progress: Option<&ProgressFn>,
) -> Result<PathBuf> {
    if let Some(p) = cache.cached(commit, &f.path, Some(f.size)) {
        return Ok(p);
    }
    let etag = f.etag();
    if etag.is_empty() {
        return Err(KilnError::Hub(format!("{repo}/{}: the listing gives no hash to verify it by", f.path)));
    }
    cache.create_dirs()?;
    let lock_path = cache.lock_path(etag);
    // huggingface_hub locks the same file.
    let _lock = super::lock(&lock_path, "download", &f.path)?;
    let blob = cache.blob(etag);
    if !std::fs::metadata(&blob).is_ok_and(|m| m.is_file() && m.len() == f.size) {
        let part = cache.incomplete(etag);
        let of = if count > 1 { format!(" (part {no} of {count})") } else { String::new() };
        eprintln!("kiln: downloading {repo}/{}{of}, {:.1} MB", f.path, f.size as f64 / 1e6);
        let want = Expect { size: f.size, sha256: f.sha256.clone(), git_oid: f.git_oid.clone() };
        let label = f.path.rsplit('/').next().unwrap_or(&f.path).to_string();
        let mut on_bytes = |done: u64, total: u64| report(progress, Stage::Download, &label, done, total);
        client.download(repo, commit, &f.path, &want, &part, &mut on_bytes)?;
        std::fs::rename(&part, &blob).map_err(|e| KilnError::io(&blob, e))?;
    }
    cache.link(commit, &f.path, etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let p = |s: &str| HfName::parse(s).unwrap();
        assert_eq!(
            p("hf://ggml-org/Qwen2.5-0.5B-GGUF:q4_k_m").unwrap(),
            HfName { repo: "ggml-org/Qwen2.5-0.5B-GGUF".into(), tag: Some("q4_k_m".into()), file: None }
        );
        assert_eq!(p("hf://o/r").unwrap().tag, None);
        assert_eq!(p("hf://o/r/dir/m.gguf").unwrap().file.as_deref(), Some("dir/m.gguf"));
        assert_eq!(p("hf://o/r/dir/m.gguf").unwrap().spec(), "hf://o/r/dir/m.gguf");
        for bad in [
            "hf://o",
            "hf://o/",
            "hf://o/r:",
            "hf://o/r:a b",
            "hf://o/r/x.bin",
            "hf://o/r/../x.gguf",
            "hf://-o/r",
            "hf://o/r:Q4/x.gguf",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(HfName::parse("smollm2-135m").is_none());
    }
}
