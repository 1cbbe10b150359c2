//! huggingface_hub's cache layout, so a file fetched by either tool serves both:
//!
//! ```text
//! $HF_HUB_CACHE/models--ORG--REPO/
//!   blobs/<etag>                  file contents, named by the sha256 (LFS) or git oid
//!   blobs/<etag>.incomplete       a download in progress (resumed from its length)
//!   snapshots/<commit>/<path>     a relative symlink to ../../blobs/<etag>
//!   refs/main                     the commit `main` pointed at when last fetched
//! $HF_HUB_CACHE/.locks/models--ORG--REPO/<etag>.lock
//! ```
//!
//! The cache is `HF_HUB_CACHE`, else `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`,
//! else `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

use crate::error::{KilnError, Result};

/// The hub cache directory (it may not exist yet).
pub fn hub_cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return d;
    }
    hf_home().join("hub")
}

/// `HF_HOME`, else `XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(h) = var("HF_HOME") {
        return h;
    }
    let cache =
        var("XDG_CACHE_HOME").unwrap_or_else(|| var("HOME").unwrap_or_else(|| ".".into()).join(".cache"));
    cache.join("huggingface")
}

/// One repository's corner of the cache.
pub struct RepoCache {
    pub root: PathBuf,
    locks: PathBuf,
}

impl RepoCache {
    pub fn new(cache: &Path, repo: &str) -> Self {
        let folder = format!("models--{}", repo.replace('/', "--"));
        RepoCache { root: cache.join(&folder), locks: cache.join(".locks").join(folder) }
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    pub fn incomplete(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(format!("{etag}.incomplete"))
    }

    pub fn snapshot(&self, commit: &str, path: &str) -> PathBuf {
        self.root.join("snapshots").join(commit).join(path)
    }

    pub fn lock_path(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    /// Creates the directories a download writes to.
    pub fn create_dirs(&self) -> Result<()> {
        for d in [self.root.join("blobs"), self.root.join("refs"), self.locks.clone()] {
            std::fs::create_dir_all(&d).map_err(|e| {
                KilnError::Hub(format!("cannot create the Hugging Face cache directory {}: {e}", d.display()))
            })?;
        }
        Ok(())
    }

    /// The commit a ref (`main`) names, if the cache has it.
    pub fn read_ref(&self, name: &str) -> Option<String> {
        let s = std::fs::read_to_string(self.root.join("refs").join(name)).ok()?;
        let s = s.trim();
        is_commit(s).then(|| s.to_string())
    }

    /// Records that ref `name` points at `commit` (written whole, then renamed).
    pub fn write_ref(&self, name: &str, commit: &str) -> Result<()> {
        let path = self.root.join("refs").join(name);
        if self.read_ref(name).as_deref() == Some(commit) {
            return Ok(());
        }
        let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, commit).map_err(|e| KilnError::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| KilnError::io(&path, e))
    }

    /// The file a snapshot entry stands for, if it is complete: its path (a symlink into
    /// `blobs/`, or a file) when it resolves to a file of `size` bytes (any size if `None`).
    pub fn cached(&self, commit: &str, path: &str, size: Option<u64>) -> Option<PathBuf> {
        let p = self.snapshot(commit, path);
        let m = std::fs::metadata(&p).ok()?; // follows the link
        (m.is_file() && size.is_none_or(|s| m.len() == s)).then_some(p)
    }

    /// Points `snapshots/<commit>/<path>` at `blobs/<etag>` by a relative symlink.
    pub fn link(&self, commit: &str, path: &str, etag: &str) -> Result<PathBuf> {
        let link = self.snapshot(commit, path);
        let dir = link.parent().expect("a snapshot path has a parent");
        std::fs::create_dir_all(dir).map_err(|e| KilnError::io(dir, e))?;
        // `path` may have directories: one `..` per level back to the repository folder.
        let up = "../".repeat(2 + path.matches('/').count());
        let target = PathBuf::from(format!("{up}blobs/{etag}"));
        let _ = std::fs::remove_file(&link);
        symlink(&target, &link).map_err(|e| KilnError::io(&link, e))?;
        Ok(link)
    }

    /// The files of a snapshot (paths relative to it, `/`-separated), for offline use.
    pub fn snapshot_files(&self, commit: &str) -> Vec<String> {
        fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else { return };
            let mut entries: Vec<_> = entries.flatten().collect();
            entries.sort_by_key(|e| e.file_name());
            for e in entries {
                let name = e.file_name().to_string_lossy().into_owned();
                let rel = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
                let path = e.path();
                if path.is_dir() {
                    walk(&path, &rel, out);
                } else if path.is_file() {
                    out.push(rel);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root.join("snapshots").join(commit), "", &mut out);
        out
    }
}

/// A 40-digit hex commit id.
pub fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(windows)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::windows::fs::symlink_file(target, link)
}
