//! Every value-taking flag and positional argument of every `kiln` command, given empty,
//! huge and odd values, ends with exit 0, 1 (one `error:` line, nothing on stdout) or 2
//! (usage), and never a panic. The flags come from each command's `--help`, which clap
//! renders from the command definitions, so a new flag is swept without editing this test.
//! Every other argument is a small valid one on the tiny model, so each run is quick.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const KILN: &str = env!("CARGO_BIN_EXE_kiln");

/// The most a run may take (a server: until it listens, then it must drain within 5 s).
const TIMEOUT: Duration = Duration::from_secs(30);

/// Arguments whose huge values ask for that much work: a run still working after
/// `WORK_TIMEOUT` is stopped and passes.
const WORK: [(&str, &str); 1] = [("bench", "--repetitions")];
const WORK_TIMEOUT: Duration = Duration::from_secs(3);

fn tiny() -> Option<PathBuf> {
    let p = kiln::hub::kiln_home().join("models").join("tiny.gguf");
    if !p.exists() {
        eprintln!("skipping: {} is absent (kiln pull tiny-random-llama)", p.display());
        return None;
    }
    Some(p)
}

fn help(args: &[&str]) -> String {
    let o = Command::new(KILN).args(args).arg("--help").output().unwrap();
    assert!(o.status.success(), "{args:?} --help");
    String::from_utf8(o.stdout).unwrap()
}

/// The lines of one section (`Commands:`, `Arguments:`, `Options:`) of a help text.
fn section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .filter(|l| !l.is_empty())
        .collect()
}

/// An argument as `--help` shows it: `--name` (with a value) or a positional `<NAME>`.
#[derive(Clone, Debug, PartialEq)]
enum Arg {
    Flag(String),
    Positional(String),
}

/// The value-taking flags and the positionals of `cmd`. Option lines are indented at most
/// 6 columns; long help puts descriptions on lines indented further.
fn arguments(cmd: &str) -> Vec<Arg> {
    let h = help(&[cmd]);
    let mut out = Vec::new();
    for l in section(&h, "Arguments:") {
        let name = l.split_whitespace().next().unwrap();
        out.push(Arg::Positional(name.trim_matches(|c| "[]<>.".contains(c)).to_string()));
    }
    for l in section(&h, "Options:") {
        let indent = l.len() - l.trim_start().len();
        let words: Vec<&str> = l.split_whitespace().collect();
        if indent > 6 || !words[0].starts_with('-') {
            continue;
        }
        let long = words.iter().find(|w| w.starts_with("--")).map(|w| w.trim_end_matches(','));
        let takes_value = words.iter().take(3).any(|w| w.starts_with('<'));
        if let (Some(long), true) = (long, takes_value) {
            out.push(Arg::Flag(long.to_string()));
        }
    }
    out
}

fn commands() -> Vec<String> {
    let h = help(&[]);
    section(&h, "Commands:")
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|c| c != "help")
        .collect()
}

/// Empty, huge, negative, non-numeric, non-ASCII, path-like and list-like values.
fn odd_values() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        "0",
        "-1",
        "99999999999",
        "18446744073709551616",
        "1e400",
        "nan",
        "-inf",
        "x",
        "é🦀\u{202e}",
        "/",
        "/dev/null",
        "-",
        "1,,99999999999",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(20_000));
    v
}

/// Small valid arguments for the flags a command has, so each run is quick.
fn base(cmd: &str, args: &[Arg], tiny: &str, text_file: &str) -> Vec<(Arg, String)> {
    let has = |f: &str| args.contains(&Arg::Flag(f.into()));
    let mut b = Vec::new();
    let mut set = |a: Arg, v: &str| b.push((a, v.to_string()));
    for (flag, value) in [
        ("--model", tiny),
        ("--device", "cpu"),
        ("--threads", "1"),
        ("--ctx-size", "64"),
        ("--n-predict", "4"),
        ("--n-prompt", "8"),
        ("--n-gen", "4"),
        ("--repetitions", "1"),
        ("--port", "0"),
    ] {
        if has(flag) {
            set(Arg::Flag(flag.into()), value);
        }
    }
    if has("--file") {
        set(Arg::Flag("--file".into()), text_file);
    } else if let Some(Arg::Positional(p)) = args.iter().find(|a| matches!(a, Arg::Positional(_))) {
        match p.as_str() {
            "MODEL" if cmd != "pull" => set(Arg::Positional(p.clone()), tiny),
            "TEXT" => set(Arg::Positional(p.clone()), "hello there"),
            _ => {}
        }
    }
    b
}

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

/// Runs `kiln ARGS` with "hi" on stdin, offline; a server is stopped with SIGTERM once it
/// listens.
fn run(args: &[String], serve: bool, timeout: Duration) -> Outcome {
    let mut child = Command::new(KILN)
        .args(args)
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        // Hub names never reach the network: only the cache answers.
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"hi\n");
    drop(stdin);
    let mut out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let pid = child.id();
    let stdout = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if serve && line.starts_with("kiln: listening on") {
                let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
            }
            s.push_str(&line);
            s.push('\n');
        }
        s
    });
    let t0 = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > timeout {
            timed_out = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Outcome { code: status.code(), stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap(), timed_out }
}

/// What is wrong with an outcome, if anything.
fn verdict(o: &Outcome, work: bool) -> Option<String> {
    if o.timed_out && !work {
        return Some(format!("still running after {TIMEOUT:?}"));
    }
    if o.stderr.contains("panicked") || o.stderr.contains("internal error") {
        return Some("panicked".into());
    }
    match o.code {
        Some(0) | Some(2) => None,
        Some(1) if !o.stdout.is_empty() => Some("exit 1 with output on stdout".into()),
        Some(1) if !o.stderr.lines().any(|l| l.starts_with("error: ")) => {
            Some("exit 1 without an error: line".into())
        }
        Some(1) => None,
        None if o.timed_out => None,
        c => Some(format!("exit {c:?}")),
    }
}

/// `kiln CMD` with the base's arguments but `arg`'s, then `arg` given `value`;
/// `with_text: false` leaves out the base's text (`--file`, a positional TEXT).
fn argv(cmd: &str, base: &[(Arg, String)], arg: &Arg, value: &str, with_text: bool) -> Vec<String> {
    let mut argv = vec![cmd.to_string()];
    let mut positional = Vec::new();
    for (a, v) in base.iter().filter(|(a, _)| a != arg) {
        match a {
            Arg::Flag(f) if f == "--file" && !with_text => {}
            Arg::Flag(f) => argv.extend([f.clone(), v.clone()]),
            Arg::Positional(p) if p == "TEXT" && !with_text => {}
            Arg::Positional(_) => positional.push(v.clone()),
        }
    }
    match arg {
        // `--flag=VALUE`, so that values starting with '-' are values.
        Arg::Flag(f) => argv.push(format!("{f}={value}")),
        Arg::Positional(_) => positional.push(value.to_string()),
    }
    if !positional.is_empty() {
        argv.push("--".into());
        argv.extend(positional);
    }
    argv
}

#[test]
fn every_flag_with_odd_values_exits_cleanly() {
    let Some(tiny) = tiny() else { return };
    let tiny = tiny.to_string_lossy().into_owned();
    let dir = std::env::temp_dir().join(format!("kiln-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text_file = dir.join("text.txt");
    std::fs::write(&text_file, "The quick brown fox jumps over the lazy dog. ".repeat(40)).unwrap();
    let text_file = text_file.to_string_lossy().into_owned();

    let mut cases = Vec::new();
    for cmd in commands() {
        let args = arguments(&cmd);
        let base = base(&cmd, &args, &tiny, &text_file);
        for arg in &args {
            for value in odd_values() {
                let work = WORK.iter().any(|&(c, a)| c == cmd && Arg::Flag(a.into()) == *arg);
                let argvs = (argv(&cmd, &base, arg, &value, true), argv(&cmd, &base, arg, &value, false));
                cases.push((cmd.clone(), argvs, work));
            }
        }
    }
    assert!(cases.len() > 500, "the sweep found only {} cases", cases.len());

    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((cmd, (argv, without_text), work)) = cases.get(i) else { break };
                let timeout = if *work { WORK_TIMEOUT } else { TIMEOUT };
                let mut o = run(argv, cmd == "serve", timeout);
                // A conflict with the base's own text: try the value without it.
                if o.code == Some(2) && o.stderr.contains("cannot be used with") {
                    o = run(without_text, cmd == "serve", timeout);
                }
                if let Some(why) = verdict(&o, *work) {
                    let shown: Vec<String> = argv.iter().map(|a| a.chars().take(60).collect()).collect();
                    failures.lock().unwrap().push(format!("kiln {}: {why}\n{}", shown.join(" "), o.stderr));
                }
            });
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("{} runs in {:.1?}", cases.len(), t0.elapsed());
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} runs failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

/// `-m` naming a directory, a device, a FIFO or a socket is refused at once, naming what it is
/// (a FIFO is never opened: opening it for reading would wait for a writer).
#[test]
fn a_model_path_that_is_not_a_regular_file_is_refused() {
    let dir = std::env::temp_dir().join(format!("kiln-notfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("model.gguf");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_string_lossy().into_owned();
    let socket = dir.join("socket.gguf");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let socket = socket.to_string_lossy().into_owned();
    let d = dir.to_string_lossy().into_owned();
    for (path, kind) in [
        (fifo.as_str(), "a FIFO"),
        (socket.as_str(), "a socket"),
        (d.as_str(), "a directory"),
        ("/dev/null", "a device"),
    ] {
        for cmd in
            [&["run", "-p", "hi"][..], &["inspect"], &["tokenize", "-p", "hi"], &["serve", "--port", "0"]]
        {
            let mut argv: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
            argv.extend(["-m".into(), path.into()]);
            let o = run(&argv, false, Duration::from_secs(10));
            assert!(!o.timed_out, "kiln {argv:?} hung");
            assert_eq!(o.code, Some(1), "kiln {argv:?}: {}", o.stderr);
            let want = format!("error: {path}: is {kind}, not a GGUF model file");
            assert!(o.stderr.contains(&want), "kiln {argv:?}: {}", o.stderr);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
