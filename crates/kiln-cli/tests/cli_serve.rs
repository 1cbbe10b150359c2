//! `kiln serve` as a process: clients that leave in the middle of a stream do not end it
//! (a vectored write to their closed socket raises SIGPIPE, which the server ignores), and
//! under a low descriptor limit the default connection cap keeps the server answering.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `kiln serve` of tiny.gguf on a free port, started through `sh -c "PREFIX kiln serve ..."`
/// (PREFIX: shell commands run first, such as a `ulimit`), and its address; None (saying
/// the test skips) where tiny.gguf is absent.
fn serve_tiny(prefix: &str) -> Option<(Child, String)> {
    let tiny = kiln::hub::kiln_home().join("models").join("tiny.gguf");
    if !tiny.exists() {
        eprintln!("skipping: {} is absent (kiln pull tiny-random-llama)", tiny.display());
        return None;
    }
    let script = format!("{prefix} exec \"$0\" serve --port 0 --device cpu -t 1 -c 256 --alias m -m \"$1\"");
    let mut child = Command::new("sh")
        .args(["-c", &script, env!("CARGO_BIN_EXE_kiln")])
        .arg(&tiny)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines.next().expect("the server exited").unwrap();
        if let Some(url) = line.strip_prefix("kiln: listening on http://") {
            break url.to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Some((child, addr))
}

/// The status line of `GET /health` on a new connection, or None if the connection is
/// refused or closed without an answer.
fn health(addr: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines().next().map(str::to_string)
}

fn stop(mut child: Child) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

#[test]
fn clients_leaving_mid_stream_do_not_end_the_server() {
    let Some((mut child, addr)) = serve_tiny("") else { return };
    let body = r#"{"model":"m","prompt":"hello","max_tokens":200,"ignore_eos":true,"stream":true}"#;
    for _ in 0..8 {
        let mut s = TcpStream::connect(&addr).unwrap();
        let req = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut first = [0u8; 64];
        let _ = s.read(&mut first).unwrap();
        drop(s);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "the server died: {:?}", child.try_wait());
    assert_eq!(health(&addr).as_deref(), Some("HTTP/1.1 200 OK"));
    stop(child);
}

/// With 256 descriptors (soft and hard) and no `--max-connections`, more idle clients than
/// descriptors neither end the server nor keep `/health` from answering: the default cap
/// leaves room for the model, the runtime and the probes' reserved share.
#[test]
fn more_clients_than_descriptors_leave_health_answering() {
    let Some((mut child, addr)) = serve_tiny("ulimit -n 256 &&") else { return };
    let idle: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    assert!(idle.len() >= 192, "only {} connections were accepted", idle.len());
    // Reserved places a probe's idle connection took free within its timeout (5 s).
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = None;
    while Instant::now() < deadline {
        last = health(&addr);
        if last.as_deref() == Some("HTTP/1.1 200 OK") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(last.as_deref(), Some("HTTP/1.1 200 OK"), "/health with 300 idle clients");
    assert!(child.try_wait().unwrap().is_none(), "the server died: {:?}", child.try_wait());
    drop(idle);
    stop(child);
}
