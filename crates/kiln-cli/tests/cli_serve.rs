//! `kiln serve` as a process: clients that leave in the middle of a stream do not end it
//! (a vectored write to their closed socket raises SIGPIPE, which the server ignores).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn clients_leaving_mid_stream_do_not_end_the_server() {
    let tiny = kiln::hub::kiln_home().join("models").join("tiny.gguf");
    if !tiny.exists() {
        eprintln!("skipping: {} is absent (kiln pull tiny-random-llama)", tiny.display());
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["serve", "--port", "0", "--device", "cpu", "-t", "1", "-c", "256", "--alias", "m", "-m"])
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
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert_eq!(child.wait().unwrap().code(), Some(0));
}
