//! The Hub's HTTP API as kiln uses it: repository info and file listings
//! (`/api/models/...`), and file downloads from `/{repo}/resolve/{commit}/{path}`, resumed
//! with `Range` after an interruption and checked against the hash the Hub lists.
//!
//! `HF_ENDPOINT` (default `https://huggingface.co`; plain `http://` works too) and
//! `HF_TOKEN` (else the token file huggingface_hub's login writes) are read here. Redirects
//! are followed by hand so the token goes only to the endpoint's own host, never to the
//! storage host a file redirects to.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sha2::Digest;

use crate::error::{KilnError, Result};

const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Attempts at a download before giving up (each resumes where the last stopped).
const ATTEMPTS: u32 = 6;
const MAX_REDIRECTS: u32 = 10;
const AUTH_HINT: &str = "set HF_TOKEN to an access token (https://huggingface.co/settings/tokens) \
                         or log in with `hf auth login`";

/// A request that never reached an answer (connection refused, reset, timed out...).
pub struct Unreachable(pub String);

pub struct Client {
    agent: ureq::Agent,
    pub endpoint: String,
    token: Option<String>,
}

/// What a download must come out as.
pub struct Expect {
    pub size: u64,
    /// The LFS sha256 (lowercase hex), else the git blob id (sha1 of `blob SIZE\0` + bytes).
    pub sha256: Option<String>,
    pub git_oid: Option<String>,
}

impl Client {
    pub fn from_env() -> Result<Client> {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty());
        let endpoint = endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim_end_matches('/').to_string();
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
            return Err(KilnError::Hub(format!("HF_ENDPOINT={endpoint:?} is not an http(s):// URL")));
        }
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .build();
        Ok(Client { agent: ureq::Agent::new_with_config(config), endpoint, token: token() })
    }

    fn host_of(url: &str) -> &str {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        rest.split(['/', '?', '#']).next().unwrap_or("")
    }

    /// GET `url` with these extra headers, following redirects; the token goes only to the
    /// endpoint's host. Returns the final response and the headers of the first one (the
    /// Hub puts a file's metadata on the redirect).
    fn get(
        &self,
        url: &str,
        headers: &[(&str, String)],
    ) -> std::result::Result<(ureq::http::Response<ureq::Body>, ureq::http::HeaderMap), Unreachable> {
        let own_host = Self::host_of(&self.endpoint).to_string();
        let mut url = url.to_string();
        let mut first: Option<ureq::http::HeaderMap> = None;
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&url);
            for (k, v) in headers {
                req = req.header(*k, v);
            }
            if let Some(t) = &self.token {
                if Self::host_of(&url) == own_host {
                    req = req.header("Authorization", format!("Bearer {t}"));
                }
            }
            let resp = req.call().map_err(|e| Unreachable(format!("{url}: {e}")))?;
            let first_headers = first.get_or_insert_with(|| resp.headers().clone()).clone();
            if !resp.status().is_redirection() {
                return Ok((resp, first_headers));
            }
            let loc = header(resp.headers(), "location")
                .ok_or_else(|| Unreachable(format!("{url}: a redirect without a Location")))?;
            url = join_url(&url, &loc);
        }
        Err(Unreachable(format!("{url}: more than {MAX_REDIRECTS} redirects")))
    }

    /// GET `url` (on the endpoint) as JSON about `repo`, with the next page's URL where the
    /// answer is paginated (`Link: <URL>; rel="next"`).
    pub fn api_json(
        &self,
        url: &str,
        repo: &str,
    ) -> std::result::Result<Result<(Value, Option<String>)>, Unreachable> {
        let (mut resp, _) = self.get(url, &[("Accept", "application/json".into())])?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Ok(Err(self.status_error(status, resp.headers(), repo, None)));
        }
        let next = header(resp.headers(), "link").and_then(|l| next_link(&l)).map(|n| join_url(url, &n));
        let body = resp.body_mut().with_config().limit(64 << 20).read_to_string();
        let body = body.map_err(|e| Unreachable(format!("{url}: {e}")))?;
        Ok(serde_json::from_str(&body)
            .map(|v| (v, next))
            .map_err(|e| KilnError::Hub(format!("{url}: not JSON ({e})"))))
    }

    /// The error for an HTTP status answering a request about `repo` (and file `path`).
    fn status_error(
        &self,
        status: u16,
        h: &ureq::http::HeaderMap,
        repo: &str,
        path: Option<&str>,
    ) -> KilnError {
        let code = header(h, "x-error-code").unwrap_or_default();
        let msg = header(h, "x-error-message").unwrap_or_default();
        let ep = &self.endpoint;
        let what = match path {
            Some(p) => format!("{repo}/{p}"),
            None => repo.to_string(),
        };
        KilnError::Hub(match (status, code.as_str()) {
            (401, "RepoNotFound") | (404, "RepoNotFound") if self.token.is_none() => {
                format!("{repo}: no such repository on {ep}, or it is private or gated ({AUTH_HINT})")
            }
            (_, "RepoNotFound") => {
                format!("{repo}: no such repository on {ep} (or your token cannot see it)")
            }
            (_, "EntryNotFound") | (404, _) if path.is_some() => format!("{what}: no such file on {ep}"),
            (404, _) => format!("{repo}: no such repository on {ep}"),
            (401 | 403, _) if self.token.is_none() => {
                format!("{what} needs authentication (HTTP {status}): {AUTH_HINT}")
            }
            (401, _) => format!("{what}: the Hugging Face token was refused (HTTP 401); check HF_TOKEN"),
            (403, "GatedRepo") | (403, _) => format!(
                "{what}: access denied (HTTP 403{}); a gated repository needs its terms accepted at \
                 {ep}/{repo} by the token's account",
                if msg.is_empty() { String::new() } else { format!(": {msg}") }
            ),
            _ => format!(
                "{what}: HTTP {status} from {ep}{}",
                if msg.is_empty() { String::new() } else { format!(": {msg}") }
            ),
        })
    }

    /// Downloads `{endpoint}/{repo}/resolve/{commit}/{path}` into `part`, resuming from
    /// what `part` already holds, checked against `want`. `progress(done, total)` is called
    /// as bytes arrive. On a hash mismatch or a write error `part` is removed; after a
    /// broken connection it is kept, so the next run resumes it.
    pub fn download(
        &self,
        repo: &str,
        commit: &str,
        path: &str,
        want: &Expect,
        part: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let url = format!("{}/{repo}/resolve/{commit}/{}", self.endpoint, encode_path(path));
        let held = std::fs::metadata(part).map_or(0, |m| m.len()).min(want.size);
        check_space(part, want.size - held)?;
        let mut file = File::options()
            .create(true)
            .read(true)
            .append(true)
            .open(part)
            .map_err(|e| KilnError::io(part, e))?;
        let mut have = file.metadata().map_err(|e| KilnError::io(part, e))?.len();
        let mut hash = Hasher::new(want);
        if have > want.size {
            truncate(&file, part)?;
            have = 0;
        }
        if have > 0 {
            hash.update_from(&mut file, have).map_err(|e| KilnError::io(part, e))?;
        }
        progress(have, want.size);
        let mut last_err = String::new();
        let mut attempt = 0;
        while have < want.size {
            if attempt == ATTEMPTS {
                return Err(KilnError::Hub(format!(
                    "{repo}/{path}: download interrupted at {have} of {} bytes ({last_err}); run the \
                     command again to resume",
                    want.size
                )));
            }
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(200 * attempt as u64));
            }
            attempt += 1;
            let range = [("Range", format!("bytes={have}-"))];
            let (mut resp, first) = match self.get(&url, if have > 0 { &range } else { &[] }) {
                Ok(r) => r,
                Err(Unreachable(e)) => {
                    last_err = e;
                    continue;
                }
            };
            check_metadata(&first, want, commit, &url)?;
            let status = resp.status().as_u16();
            match status {
                206 => {
                    let start = header(resp.headers(), "content-range")
                        .and_then(|r| r.strip_prefix("bytes ")?.split('-').next()?.parse::<u64>().ok());
                    if start != Some(have) {
                        return Err(KilnError::Hub(format!(
                            "{url}: asked for bytes from {have}, got {start:?}"
                        )));
                    }
                }
                200 if have > 0 => {
                    // The server ignored the range: start over.
                    truncate(&file, part)?;
                    have = 0;
                    hash = Hasher::new(want);
                }
                200 => {}
                416 => {
                    truncate(&file, part)?;
                    have = 0;
                    hash = Hasher::new(want);
                    continue;
                }
                500..=599 | 429 => {
                    last_err = format!("HTTP {status}");
                    continue;
                }
                _ => {
                    drop(file);
                    let _ = std::fs::remove_file(part);
                    return Err(self.status_error(status, resp.headers(), repo, Some(path)));
                }
            }
            let mut body = resp.body_mut().with_config().limit(u64::MAX).reader();
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = match body.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        last_err = e.to_string();
                        break;
                    }
                };
                let n = n.min((want.size - have) as usize);
                if let Err(e) = file.write_all(&buf[..n]) {
                    drop(file);
                    let _ = std::fs::remove_file(part);
                    return Err(write_error(part, e));
                }
                hash.update(&buf[..n]);
                have += n as u64;
                progress(have, want.size);
                if have == want.size {
                    break;
                }
            }
            if have < want.size && last_err.is_empty() {
                last_err = format!("the connection closed at byte {have}");
            }
        }
        if let Err(e) = file.flush().and_then(|_| file.sync_all()) {
            drop(file);
            let _ = std::fs::remove_file(part);
            return Err(write_error(part, e));
        }
        drop(file);
        if let Err(msg) = hash.check(want) {
            let _ = std::fs::remove_file(part);
            return Err(KilnError::Hub(format!("{repo}/{path}: {msg}; the download was discarded")));
        }
        Ok(())
    }
}

/// The metadata the Hub sends with a file (on its redirect) must agree with the listing.
fn check_metadata(h: &ureq::http::HeaderMap, want: &Expect, commit: &str, url: &str) -> Result<()> {
    let bad = |what: &str, got: &str, exp: &str| {
        Err(KilnError::Hub(format!("{url}: the Hub reports {what} {got}, the listing said {exp}")))
    };
    if let Some(c) = header(h, "x-repo-commit") {
        if c != commit {
            return bad("commit", &c, commit);
        }
    }
    if let (Some(e), Some(sha)) = (header(h, "x-linked-etag"), &want.sha256) {
        let e = clean_etag(&e);
        if !e.eq_ignore_ascii_case(sha) {
            return bad("sha256", &e, sha);
        }
    }
    if let Some(s) = header(h, "x-linked-size").and_then(|s| s.parse::<u64>().ok()) {
        if s != want.size {
            return bad("size", &s.to_string(), &want.size.to_string());
        }
    }
    Ok(())
}

/// An ETag's value: without `W/` and quotes.
pub fn clean_etag(e: &str) -> String {
    e.trim().trim_start_matches("W/").trim_matches('"').to_string()
}

fn write_error(part: &Path, e: std::io::Error) -> KilnError {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        KilnError::Hub(format!(
            "{}: no space left on device; the partial download was removed",
            part.display()
        ))
    } else {
        KilnError::io(part, e)
    }
}

fn truncate(file: &File, part: &Path) -> Result<()> {
    file.set_len(0).map_err(|e| KilnError::io(part, e))
}

/// Refuses a download the file system has no room for (with 1% to spare).
fn check_space(part: &Path, need: u64) -> Result<()> {
    let Some(free) = free_bytes(part.parent().unwrap_or(Path::new("."))) else { return Ok(()) };
    if need + need / 100 > free {
        let gb = |b: u64| b as f64 / 1e9;
        return Err(KilnError::Hub(format!(
            "not enough disk space in {}: the download needs {:.2} GB, {:.2} GB are free",
            part.parent().unwrap_or(part).display(),
            gb(need),
            gb(free)
        )));
    }
    Ok(())
}

#[cfg(unix)]
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs struct to fill.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    Some(s.f_bavail as u64 * s.f_frsize as u64)
}

#[cfg(not(unix))]
fn free_bytes(_: &Path) -> Option<u64> {
    None
}

/// The running hash a download is checked against.
enum Hasher {
    Sha256(sha2::Sha256),
    GitBlob(sha1::Sha1),
    Size,
}

impl Hasher {
    fn new(want: &Expect) -> Hasher {
        if want.sha256.is_some() {
            Hasher::Sha256(sha2::Sha256::new())
        } else if want.git_oid.is_some() {
            let mut h = sha1::Sha1::new();
            h.update(format!("blob {}\0", want.size).as_bytes());
            Hasher::GitBlob(h)
        } else {
            Hasher::Size
        }
    }

    fn update(&mut self, b: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(b),
            Hasher::GitBlob(h) => h.update(b),
            Hasher::Size => {}
        }
    }

    /// Hashes the first `n` bytes of `f` (what an earlier attempt wrote).
    fn update_from(&mut self, f: &mut File, n: u64) -> std::io::Result<()> {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0))?;
        let mut buf = vec![0u8; 1 << 20];
        let mut left = n;
        while left > 0 {
            let k = f.read(&mut buf[..left.min(1 << 20) as usize])?;
            if k == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the partial file shrank",
                ));
            }
            self.update(&buf[..k]);
            left -= k as u64;
        }
        Ok(())
    }

    fn check(self, want: &Expect) -> std::result::Result<(), String> {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let (got, exp, what) = match self {
            Hasher::Sha256(h) => (hex(&h.finalize()), want.sha256.clone().unwrap_or_default(), "sha256"),
            Hasher::GitBlob(h) => {
                (hex(&h.finalize()), want.git_oid.clone().unwrap_or_default(), "git blob id")
            }
            Hasher::Size => return Ok(()),
        };
        if got.eq_ignore_ascii_case(&exp) {
            Ok(())
        } else {
            Err(format!("{what} {got} does not match the listed {exp}"))
        }
    }
}

/// A header's value as text.
pub fn header(h: &ureq::http::HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The `rel="next"` target of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .contains("rel=\"next\"")
            .then(|| url.trim().trim_start_matches('<').trim_end_matches('>').to_string())
    })
}

/// `loc` (absolute, host-relative or relative) against the URL it answered.
fn join_url(base: &str, loc: &str) -> String {
    if loc.contains("://") {
        return loc.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    if let Some(abs) = loc.strip_prefix('/') {
        return format!("{scheme}://{host}/{abs}");
    }
    let path = rest.split(['?', '#']).next().unwrap_or(rest);
    let dir = &path[..path.rfind('/').map_or(path.len(), |i| i + 1)];
    format!("{scheme}://{dir}{loc}")
}

/// Percent-encodes a repository path for a URL (keeping `/`).
pub fn encode_path(p: &str) -> String {
    let mut out = String::new();
    for b in p.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `HF_TOKEN`, else the file huggingface_hub's login writes (`HF_TOKEN_PATH`, else
/// `HF_HOME/token`).
fn token() -> Option<String> {
    let t = std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty());
    let t = t.or_else(|| {
        let path = std::env::var_os("HF_TOKEN_PATH")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| super::cache::hf_home().join("token"));
        std::fs::read_to_string(path).ok()
    });
    t.map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(join_url("http://h:1/a/b?x", "/c/d"), "http://h:1/c/d");
        assert_eq!(join_url("http://h:1/a/b", "c"), "http://h:1/a/c");
        assert_eq!(join_url("http://h/a", "https://cdn/x"), "https://cdn/x");
        assert_eq!(Client::host_of("https://huggingface.co/api/x"), "huggingface.co");
        assert_eq!(encode_path("dir/a b+c.gguf"), "dir/a%20b%2Bc.gguf");
        assert_eq!(clean_etag("W/\"abc\""), "abc");
        let link = "<https://h/api/x?cursor=2>; rel=\"next\", <https://h/api/x>; rel=\"first\"";
        assert_eq!(next_link(link).as_deref(), Some("https://h/api/x?cursor=2"));
    }
}
