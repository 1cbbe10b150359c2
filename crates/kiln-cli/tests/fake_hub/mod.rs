//! A loopback stand-in for the Hugging Face Hub, as much of it as kiln uses:
//! `/api/models/ORG/REPO` (commit, siblings), `/api/models/ORG/REPO/tree/COMMIT` (sizes,
//! LFS sha256; two entries a page, `Link: rel="next"`), and `/ORG/REPO/resolve/COMMIT/PATH`,
//! which answers as the Hub does for LFS files: a 302 to a storage host (here 127.0.0.2,
//! another host than the API's 127.0.0.1) with `ETag`, `X-Repo-Commit`, `X-Linked-Etag` and
//! `X-Linked-Size`; the storage host honours `Range`. Gated repositories answer 401 without
//! their token. Faults on demand: a connection dropped midway, a corrupted body.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub struct HubFile {
    pub path: String,
    pub data: Vec<u8>,
    /// The size the listing reports, where it should lie about it (a file too big for the disk).
    pub listed_size: Option<u64>,
}

pub struct Repo {
    pub commit: String,
    pub files: Vec<HubFile>,
    /// The token a gated repository's downloads need.
    pub token: Option<String>,
}

/// One request the hub answered.
#[derive(Clone, Debug)]
pub struct Seen {
    pub host: &'static str,
    pub path: String,
    pub range: Option<String>,
    pub auth: bool,
}

#[derive(Default)]
pub struct State {
    pub repos: HashMap<String, Repo>,
    pub log: Vec<Seen>,
    /// sha256 -> (requests still to drop, bytes of the body sent before dropping).
    pub drops: HashMap<String, (usize, usize)>,
    /// sha256s whose bodies come back with a byte flipped.
    pub corrupt: Vec<String>,
}

pub struct Hub {
    pub endpoint: String,
    cdn: String,
    pub state: Arc<Mutex<State>>,
}

pub fn sha256(b: &[u8]) -> String {
    Sha256::digest(b).iter().map(|x| format!("{x:02x}")).collect()
}

impl Hub {
    pub fn start() -> Hub {
        let api = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn = TcpListener::bind("127.0.0.2:0").unwrap();
        let hub = Hub {
            endpoint: format!("http://{}", api.local_addr().unwrap()),
            cdn: format!("http://{}", cdn.local_addr().unwrap()),
            state: Arc::default(),
        };
        for (listener, host) in [(api, "api"), (cdn, "cdn")] {
            let state = hub.state.clone();
            let cdn_url = hub.cdn.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming().flatten() {
                    let (state, cdn_url) = (state.clone(), cdn_url.clone());
                    std::thread::spawn(move || serve(conn, host, &state, &cdn_url));
                }
            });
        }
        hub
    }

    pub fn add(&self, repo: &str, files: Vec<HubFile>, token: Option<&str>) -> String {
        let commit = sha256(repo.as_bytes())[..40].to_string();
        let r = Repo { commit: commit.clone(), files, token: token.map(str::to_string) };
        self.state.lock().unwrap().repos.insert(repo.to_string(), r);
        commit
    }

    pub fn log(&self) -> Vec<Seen> {
        self.state.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.state.lock().unwrap().log.clear();
    }
}

pub fn file(path: &str, data: Vec<u8>) -> HubFile {
    HubFile { path: path.into(), data, listed_size: None }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Send only this many bytes of the body, then close.
    cut: Option<usize>,
}

fn reply(status: u16, body: impl Into<Vec<u8>>) -> Reply {
    Reply { status, headers: Vec::new(), body: body.into(), cut: None }
}

fn serve(conn: TcpStream, host: &'static str, state: &Mutex<State>, cdn: &str) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let r = {
        let mut st = state.lock().unwrap();
        st.log.push(Seen {
            host,
            path: target.clone(),
            range: headers.get("range").cloned(),
            auth: headers.contains_key("authorization"),
        });
        route(&mut st, host, &target, &headers, cdn)
    };
    write_reply(conn, r);
}

fn write_reply(mut conn: TcpStream, r: Reply) {
    let mut head =
        format!("HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n", r.status, r.body.len());
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let body = &r.body[..r.cut.unwrap_or(r.body.len()).min(r.body.len())];
    let _ = conn.write_all(head.as_bytes()).and_then(|_| conn.write_all(body)).and_then(|_| conn.flush());
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

fn json(v: serde_json::Value) -> Reply {
    let mut r = reply(200, v.to_string());
    r.headers.push(("Content-Type".into(), "application/json".into()));
    r
}

fn not_found(code: &str) -> Reply {
    let mut r = reply(404, format!("{{\"error\":\"{code}\"}}"));
    r.headers.push(("X-Error-Code".into(), code.into()));
    r
}

fn route(st: &mut State, host: &str, target: &str, h: &HashMap<String, String>, cdn: &str) -> Reply {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if host == "cdn" {
        return blob(st, path.trim_start_matches("/cdn/"), h);
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        let repo = parts[..2.min(parts.len())].join("/");
        let Some(r) = st.repos.get(&repo) else { return not_found("RepoNotFound") };
        if parts.len() == 2 {
            let siblings: Vec<_> = r.files.iter().map(|f| serde_json::json!({"rfilename": f.path})).collect();
            return json(serde_json::json!({"id": repo, "sha": r.commit, "siblings": siblings,
                                           "gated": if r.token.is_some() { "manual" } else { "false" }}));
        }
        if parts.len() == 4 && parts[2] == "tree" && parts[3] == r.commit {
            let entries: Vec<_> = r
                .files
                .iter()
                .map(|f| {
                    let size = f.listed_size.unwrap_or(f.data.len() as u64);
                    serde_json::json!({"type": "file", "path": f.path, "size": size, "oid": &sha256(&f.data)[..40],
                                       "lfs": {"oid": sha256(&f.data), "size": size, "pointerSize": 134}})
                })
                .collect();
            let page: usize =
                query.strip_prefix("recursive=true&cursor=").and_then(|c| c.parse().ok()).unwrap_or(0);
            let end = (page + 2).min(entries.len());
            let mut r = json(serde_json::Value::Array(entries[page.min(end)..end].to_vec()));
            if end < entries.len() {
                let next = format!("<{path}?recursive=true&cursor={end}>; rel=\"next\"");
                r.headers.push(("Link".into(), next));
            }
            return r;
        }
        return not_found("EntryNotFound");
    }
    // /ORG/REPO/resolve/COMMIT/PATH
    let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
    if parts.len() < 5 || parts[2] != "resolve" {
        return not_found("EntryNotFound");
    }
    let repo = format!("{}/{}", parts[0], parts[1]);
    let Some(r) = st.repos.get(&repo) else { return not_found("RepoNotFound") };
    if let Some(t) = &r.token {
        if h.get("authorization") != Some(&format!("Bearer {t}")) {
            let mut rep = reply(401, "{\"error\":\"Access to this repository is restricted\"}");
            rep.headers.push(("X-Error-Code".into(), "GatedRepo".into()));
            return rep;
        }
    }
    if parts[3] != r.commit {
        return not_found("RevisionNotFound");
    }
    let Some(f) = r.files.iter().find(|f| f.path == parts[4]) else { return not_found("EntryNotFound") };
    let sha = sha256(&f.data);
    let mut rep = reply(302, "");
    rep.headers.extend([
        ("Location".to_string(), format!("{cdn}/cdn/{sha}")),
        ("ETag".into(), format!("\"{}\"", &sha[..40])),
        ("X-Repo-Commit".into(), r.commit.clone()),
        ("X-Linked-Etag".into(), format!("\"{sha}\"")),
        ("X-Linked-Size".into(), f.listed_size.unwrap_or(f.data.len() as u64).to_string()),
    ]);
    rep
}

/// The storage host: a blob by sha256, with `Range`.
fn blob(st: &mut State, sha: &str, h: &HashMap<String, String>) -> Reply {
    let data =
        st.repos.values().flat_map(|r| &r.files).find(|f| sha256(&f.data) == sha).map(|f| f.data.clone());
    let Some(mut data) = data else { return reply(404, "no such blob") };
    if st.corrupt.iter().any(|c| c == sha) {
        let mid = data.len() / 2;
        data[mid] ^= 0x40;
    }
    let start = h
        .get("range")
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok());
    let mut r = match start {
        Some(s) if s >= data.len() => reply(416, ""),
        Some(s) => {
            let mut r = reply(206, data[s..].to_vec());
            r.headers.push(("Content-Range".into(), format!("bytes {s}-{}/{}", data.len() - 1, data.len())));
            r
        }
        None => reply(200, data),
    };
    r.headers.push(("Accept-Ranges".into(), "bytes".into()));
    if let Some((left, after)) = st.drops.get_mut(sha) {
        if *left > 0 {
            *left -= 1;
            r.cut = Some(*after);
        }
    }
    r
}
