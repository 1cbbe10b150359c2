//! Fetching: `pip download` into a scratch directory inside `$KILN_HOME`, unpack with
//! python3's zipfile/tarfile, check sha256, then one atomic rename into the cache. A lock
//! file per target makes concurrent fetches of one model wait for each other instead of
//! racing. Everything human-readable goes to stderr: stdout belongs to the caller.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::catalog::CatalogEntry;
use crate::error::{KilnError, Result};

/// The sdist that carries llama.cpp's source, vocab test files and chat templates.
pub(crate) const LLAMA_CPP_PYTHON: &str = "llama_cpp_python-0.3.36";
const LLAMA_CPP_PYTHON_REQ: &str = "llama-cpp-python==0.3.36";
const LLAMA_CPP_PYTHON_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";

/// Python: `index`, each member of the wheels and zips in directory `src` to its open
/// `ZipFile`; the scripts below start with it.
macro_rules! member_index {
    () => {
        r#"
index = {}
for name in sorted(os.listdir(src)):
    if name.endswith((".whl", ".zip")):
        z = zipfile.ZipFile(os.path.join(src, name))
        for m in z.namelist():
            index[m] = z
"#
    };
}

/// Concatenates wheel members, in order, into one file: `python3 -c EXTRACT DIR OUT MEMBER...`.
const EXTRACT_MEMBERS: &str = concat!(
    r#"
import os, shutil, sys, zipfile
src, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]"#,
    member_index!(),
    r#"with open(out, "wb") as f:
    for m in members:
        if m not in index:
            sys.exit("member %s is in none of the downloaded packages (%s)" % (m, ", ".join(sorted(os.listdir(src)))))
        with index[m].open(m) as r:
            shutil.copyfileobj(r, f, 1 << 20)
"#
);

/// Inflates a zip member whose local header lies at OFFSET of the concatenated wheel
/// members: `python3 -c INFLATE DIR OUT OFFSET COMPRESSED SIZE CRC32 MEMBER...`. Streams
/// (nothing the size of the parts is held), checks the size and CRC-32.
const INFLATE_ENTRY: &str = concat!(
    r#"
import os, struct, sys, zipfile, zlib
src, out = sys.argv[1], sys.argv[2]
offset, csize, usize, crc = (int(x) for x in sys.argv[3:7])
members = sys.argv[7:]"#,
    member_index!(),
    r#"def chunks():
    for m in members:
        if m not in index:
            sys.exit("member %s is in none of the downloaded packages" % m)
        with index[m].open(m) as r:
            while True:
                b = r.read(1 << 20)
                if not b:
                    break
                yield b
class Stream:
    def __init__(self):
        self.it, self.buf = chunks(), b""
    def read(self, n):
        while len(self.buf) < n:
            b = next(self.it, None)
            if b is None:
                break
            self.buf += b
        r, self.buf = self.buf[:n], self.buf[n:]
        return r
    def skip(self, n):
        while n > 0:
            got = len(self.read(min(n, 1 << 20)))
            if got == 0:
                sys.exit("the packages end before offset %d" % offset)
            n -= got
s = Stream()
s.skip(offset)
h = s.read(30)
if len(h) < 30 or h[:4] != b"PK":
    sys.exit("no zip entry at offset %d" % offset)
if struct.unpack("<H", h[8:10])[0] != 8:
    sys.exit("the zip entry is not deflated")
nlen, xlen = struct.unpack("<HH", h[26:30])
s.skip(nlen + xlen)
d, left, got, c = zlib.decompressobj(-15), csize, 0, 0
with open(out, "wb") as f:
    while left > 0:
        b = s.read(min(left, 1 << 20))
        if not b:
            sys.exit("the packages end %d bytes before the entry does" % left)
        left -= len(b)
        o = d.decompress(b)
        got += len(o); c = zlib.crc32(o, c); f.write(o)
    o = d.flush()
    got += len(o); c = zlib.crc32(o, c); f.write(o)
if got != usize or c != crc:
    sys.exit("the entry inflates to %d bytes with CRC-32 %08x, expected %d and %08x" % (got, c, usize, crc))
"#
);

/// Unpacks a source archive: `python3 -c UNTAR ARCHIVE DEST`.
const UNTAR: &str = r#"
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    if hasattr(tarfile, "data_filter"):
        t.extractall(sys.argv[2], filter="data")
    else:
        t.extractall(sys.argv[2])
"#;

/// Fetches `e` into `home/models/` unless a verified copy is there; returns its absolute path.
pub(crate) fn pull_entry(home: &Path, e: &CatalogEntry) -> Result<PathBuf> {
    let dir = home.join("models");
    mkdir(&dir)?;
    let dest = dir.join(e.file);
    let _lock = super::lock(&dir.join(format!(".{}.lock", e.file)), "fetch", e.name)?;
    // Holding the lock, anything left by an interrupted pull of this model is stale.
    remove_matching(&dir, &format!(".{}.partial-", e.file));
    remove_matching(&home.join("tmp"), &format!("pull-{}-", e.name));
    if dest.exists() {
        match verify(&dest, e.size, e.sha256) {
            Ok(()) => return absolute(&dest),
            Err(err) => {
                eprintln!("kiln: cached {} is not the catalog's file ({err}); fetching it again", e.file)
            }
        }
    }
    eprintln!(
        "kiln: pulling {} ({:.1} MB, {} package{}) into {}",
        e.name,
        e.size as f64 / 1e6,
        e.parts.len(),
        if e.parts.len() == 1 { "" } else { "s" },
        dir.display()
    );
    let scratch = Scratch::new(home, &format!("pull-{}", e.name))?;
    let packages: Vec<&str> = e.parts.iter().map(|p| p.package.as_str()).collect();
    pip_download(&scratch.0, &[], &packages)?;

    let partial = Scratch(dir.join(format!(".{}.partial-{}", e.file, std::process::id())));
    let mut cmd = python();
    match e.zip_entry {
        None => cmd.arg("-c").arg(EXTRACT_MEMBERS).arg(&scratch.0).arg(&partial.0),
        Some(z) => cmd.arg("-c").arg(INFLATE_ENTRY).arg(&scratch.0).arg(&partial.0).args([
            z.offset.to_string(),
            z.compressed.to_string(),
            e.size.to_string(),
            z.crc32.to_string(),
        ]),
    };
    cmd.args(e.parts.iter().map(|p| &p.member));
    run_python(cmd, &format!("unpacking {}", e.name))?;
    drop(scratch); // the wheels are as big as the model: free the space before verifying
    verify(&partial.0, e.size, e.sha256).map_err(|err| KilnError::Hub(format!("{}: {err}", e.name)))?;
    std::fs::rename(&partial.0, &dest).map_err(|err| KilnError::io(&dest, err))?;
    std::mem::forget(partial);
    eprintln!("kiln: {} verified (sha256 {})", e.file, e.sha256);
    absolute(&dest)
}

/// The extracted llama-cpp-python sdist under `home/src/`, fetched on first use.
pub(crate) fn llama_cpp_source_in(home: &Path) -> Result<PathBuf> {
    let src = home.join("src");
    let dest = src.join(LLAMA_CPP_PYTHON);
    let complete = |d: &Path| d.join("vendor/llama.cpp/include/llama.h").is_file();
    if complete(&dest) {
        return absolute(&dest);
    }
    mkdir(&src)?;
    let _lock = super::lock(&src.join(format!(".{LLAMA_CPP_PYTHON}.lock")), "fetch", LLAMA_CPP_PYTHON)?;
    if complete(&dest) {
        return absolute(&dest);
    }
    remove_matching(&home.join("tmp"), "sdist-");
    eprintln!("kiln: fetching the {LLAMA_CPP_PYTHON} source (77 MB) into {}", src.display());
    let scratch = Scratch::new(home, "sdist")?;
    let dl = scratch.0.join("dl");
    pip_download(&dl, &["--no-binary", "llama-cpp-python"], &[LLAMA_CPP_PYTHON_REQ])?;
    let archive = dl.join(format!("{LLAMA_CPP_PYTHON}.tar.gz"));
    verify(&archive, 76_589_250, LLAMA_CPP_PYTHON_SHA256)
        .map_err(|err| KilnError::Hub(format!("{LLAMA_CPP_PYTHON}: {err}")))?;
    let x = scratch.0.join("x");
    let mut cmd = python();
    cmd.arg("-c").arg(UNTAR).arg(&archive).arg(&x);
    run_python(cmd, &format!("unpacking {}", archive.display()))?;
    let unpacked = x.join(LLAMA_CPP_PYTHON);
    if !complete(&unpacked) {
        return Err(KilnError::Hub(format!("{} lacks vendor/llama.cpp", archive.display())));
    }
    if dest.exists() {
        // A tree left incomplete by something other than us (we only ever rename whole trees).
        std::fs::remove_dir_all(&dest).map_err(|err| KilnError::io(&dest, err))?;
    }
    std::fs::rename(&unpacked, &dest).map_err(|err| KilnError::io(&dest, err))?;
    absolute(&dest)
}

/// Checks a file's size, then its sha256 (lowercase hex).
pub(crate) fn verify(path: &Path, size: u64, sha256: &str) -> std::result::Result<(), String> {
    let len = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?.len();
    if len != size {
        return Err(format!("{} has {len} bytes, expected {size}", path.display()));
    }
    let got = sha256_file(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if got != sha256 {
        return Err(format!("{} has sha256 {got}, expected {sha256}", path.display()));
    }
    Ok(())
}

pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => h.update(&buf[..n]),
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn python() -> Command {
    let mut c = Command::new("python3");
    c.stdin(Stdio::null());
    c
}

/// `python3 -m pip download --no-deps` into `dest`; pip's output goes to our stderr.
fn pip_download(dest: &Path, extra: &[&str], packages: &[&str]) -> Result<()> {
    let mut cmd = python();
    cmd.args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--dest"]);
    cmd.arg(dest).args(extra).args(packages);
    cmd.stdout(std::io::stderr());
    let status = cmd.status().map_err(|e| {
        KilnError::Hub(format!("cannot run python3 -m pip ({e}): fetching needs python3 with pip"))
    })?;
    if !status.success() {
        return Err(KilnError::Hub(format!("pip download {} failed ({status})", packages.join(" "))));
    }
    Ok(())
}

/// Runs a python3 helper script; its complaint, if any, becomes the error.
fn run_python(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd
        .stdout(Stdio::null())
        .output()
        .map_err(|e| KilnError::Hub(format!("{what}: cannot run python3 ({e})")))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stderr);
        let last = msg.trim().lines().last().unwrap_or("").to_string();
        return Err(KilnError::Hub(format!("{what} failed ({}): {last}", out.status)));
    }
    Ok(())
}

/// Best-effort removal of the entries of `dir` named `prefix` followed by a process id.
fn remove_matching(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name.to_string_lossy().strip_prefix(prefix).map(|rest| rest.parse::<u32>().is_ok());
        if pid == Some(true) {
            drop(Scratch(entry.path()));
        }
    }
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| KilnError::io(dir, e))
}

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).map_err(|e| KilnError::io(p, e))
}

/// A file or directory removed when dropped (on error paths and after use).
struct Scratch(PathBuf);

impl Scratch {
    /// A fresh directory `home/tmp/<tag>-<pid>`: inside `$KILN_HOME`, so the final rename
    /// stays on one file system.
    fn new(home: &Path, tag: &str) -> Result<Self> {
        let dir = home.join("tmp").join(format!("{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        mkdir(&dir)?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.0.is_dir() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}
