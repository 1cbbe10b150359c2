//! `image_url` content parts through the server (SmolLM2-135M with SmolVLM's image tokens,
//! the tiny synthetic idefics3 encoder): a data URL gives llama.cpp's greedy continuation
//! (tests/fixtures/vision/run/), while other requests share the steps; remote URLs without
//! `--allow-image-urls`, `file:` URLs and bytes that are no image are 400s; fetching,
//! decoding and encoding an image leaves the async runtime free.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use kiln::engine::{Engine, EngineOptions};
use kiln::vision::synth;
use kiln_server::{router, start, App};
use serde_json::{json, Value};

fn serve(app: Arc<App>, workers: usize) -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt =
            tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build().unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, router(app)).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn post(addr: SocketAddr, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap())
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// SmolLM2-135M with SmolVLM's image tokens and the tiny idefics3 encoder, written to a
/// fresh directory (returned for removal); `None` when the model is not cached.
fn vision_engine(name: &str) -> Option<(Engine, PathBuf)> {
    let Some(src) = kiln::hub::find("smollm2-135m").map(kiln::hub::cached_path).filter(|p| p.exists()) else {
        eprintln!("skipping: smollm2-135m is not in the cache (kiln pull smollm2-135m)");
        return None;
    };
    let dir = std::env::temp_dir().join(format!("kiln-server-images-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (lm, mmproj) = (dir.join("lm.gguf"), dir.join("mmproj.gguf"));
    let g = kiln::gguf::GgufFile::open(&src).unwrap();
    synth::with_added_tokens(&g, &synth::smolvlm_image_tokens()).unwrap().write_file(&lm).unwrap();
    synth::preset("idefics3-tiny-mmproj").unwrap().build().unwrap().write_file(&mmproj).unwrap();
    // The encoder in tinyBLAS's order (llama.cpp's bits): the first greedy step is one of
    // llama.cpp's near-ties (top-2 margin 0.12), which the AMX tiles' rounding can flip.
    let opts = EngineOptions::default().with_n_ctx(512).with_n_seq(2).with_threads(2).with_mmproj(&mmproj);
    let opts = opts.with_encoder_amx(false);
    Some((Engine::load(lm.to_str().unwrap(), opts).unwrap(), dir))
}

fn ask(url: &str) -> Value {
    json!({"model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "Describe this image."}]}]})
}

#[test]
fn image_url_data_urls_match_llama_cpp() {
    let Some((engine, dir)) = vision_engine("data-urls") else { return };
    let tok = engine.tokenizer().clone();
    let app = Arc::new(App::new("m".into(), None));
    // A small step budget: prompts go in chunks, image runs between them.
    start(&app, engine, 2, 8, 512, 24).unwrap();
    let addr = serve(app, 2);

    let fx: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("vision/run/test-1.stb.idefics3-tiny-mmproj.json")).unwrap(),
    )
    .unwrap();
    let greedy: Vec<u32> =
        fx["greedy"].as_array().unwrap()[..4].iter().map(|x| x.as_u64().unwrap() as u32).collect();
    let png = std::fs::read(fixture("vision/test-1.stb.png")).unwrap();
    let url = format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&png));
    let other = std::fs::read(fixture("vision/alpha.png")).unwrap();
    let other_url =
        format!("data:image/png;base64,{}", base64::engine::general_purpose::STANDARD.encode(&other));
    // Two requests at once, each with its image.
    let (a, b) = (ask(&url), ask(&other_url));
    let ha = std::thread::spawn(move || post(addr, &a));
    let (sb, vb) = post(addr, &b);
    let (sa, va) = ha.join().unwrap();
    assert_eq!((sa, sb), (200, 200), "{va} {vb}");
    let text = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert_eq!(text(&va), tok.decode(&greedy, false), "llama.cpp's first greedy tokens");
    assert_ne!(text(&va), text(&vb), "the image must matter");
    assert_eq!(text(&post(addr, &ask(&url)).1), text(&va), "again, from the prefix cache");

    for (url, want) in [
        ("http://127.0.0.1:9/x.png", "--allow-image-urls"),
        ("file:///etc/passwd", "data: URL"),
        ("data:image/png;base64,aGVsbG8=", "not a readable image"),
        ("data:image/png,plain", "base64"),
    ] {
        let (s, v) = post(addr, &ask(url));
        assert_eq!(s, 400, "{url}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{url}: {msg}");
        assert_eq!(v["error"]["param"], "messages[0].content[0].image_url");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The status line of `GET path`, or the error that kept it from coming within `wait`.
fn get_status(addr: SocketAddr, path: &str, wait: Duration) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(wait))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut line = [0u8; 12];
    s.read_exact(&mut line)?;
    Ok(String::from_utf8_lossy(&line).into_owned())
}

#[test]
fn image_work_runs_off_the_async_runtime() {
    let Some((engine, dir)) = vision_engine("runtime") else { return };
    let mut app = App::new("m".into(), None);
    app.allow_image_urls = true;
    let app = Arc::new(app);
    start(&app, engine, 2, 8, 512, 24).unwrap();
    // One worker thread: a request blocking it would stall every other request.
    let addr = serve(app, 1);

    // An image host that takes the request and answers only when told to.
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/test-1.png", host.local_addr().unwrap());
    let (asked_tx, asked) = std::sync::mpsc::channel();
    let (answer, answer_rx) = std::sync::mpsc::channel::<()>();
    let png = std::fs::read(fixture("vision/test-1.stb.png")).unwrap();
    std::thread::spawn(move || {
        let (mut c, _) = host.accept().unwrap();
        let mut req = Vec::new();
        let mut b = [0u8; 1];
        while !req.ends_with(b"\r\n\r\n") && c.read(&mut b).unwrap() == 1 {
            req.push(b[0]);
        }
        asked_tx.send(()).unwrap();
        answer_rx.recv().unwrap();
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            png.len()
        );
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&png).unwrap();
    });
    let a = ask(&url);
    let pending = std::thread::spawn(move || post(addr, &a));
    asked.recv_timeout(Duration::from_secs(60)).expect("the server fetches the image");
    // The fetch is in flight: the server still answers.
    let health = get_status(addr, "/health", Duration::from_secs(20));
    answer.send(()).unwrap();
    let (status, v) = pending.join().unwrap();
    assert_eq!(health.expect("/health while an image request waits for its image"), "HTTP/1.1 200");
    assert_eq!(status, 200, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}
