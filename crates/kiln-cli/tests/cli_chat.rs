//! `kiln chat` with piped stdin: one message per line, replies streamed, history reused,
//! /save and --load across processes, another model's session refused (exit 1), Ctrl-C
//! cancels the reply and not the program.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod support;
use support::model;

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1";

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("chat")
        .args(["-t", "2", "--temp", "0"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn chat(args: &[&str], input: &str) -> Output {
    let mut child = spawn(args);
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn tmp(name: &str) -> String {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name).to_str().unwrap().to_string()
}

#[test]
fn piped_lines_are_turns_and_a_saved_session_continues_identically() {
    let Some(m) = model(SMOL) else { return };
    let m = m.to_str().unwrap();
    let file = tmp("cli_chat_session.json");
    // One process: two turns, save, a third turn.
    let o = chat(&["-m", m, "-n", "12"], &format!("Hi!\nName a fruit.\n/save {file}\nAnd a vegetable?\n"));
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8(o.stdout).unwrap();
    let replies: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert!(replies.len() >= 3, "{out:?}");
    let third = out.split('\n').rfind(|l| !l.is_empty()).unwrap().to_string();
    // A new process restores the session and gives the same third reply.
    let o = chat(&["-m", m, "-n", "12", "--load", &file], "And a vegetable?\n");
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let again = String::from_utf8(o.stdout).unwrap();
    assert_eq!(again.trim_end_matches('\n').split('\n').next_back().unwrap(), third);
    // /reset forgets; /load inside the chat works too.
    let o = chat(&["-m", m, "-n", "4"], &format!("/reset\n/load {file}\n/bogus\n"));
    assert_eq!(o.status.code(), Some(0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("conversation cleared") && err.contains("loaded") && err.contains("unknown command"),
        "{err}"
    );
    // A history longer than the context: exit 1 with one error line.
    let o = chat(&["-m", m, "-c", "32", "--load", &file], "Hi\n");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("error:").count(), 1, "{err}");
    assert!(err.contains("more than the context (32)"), "{err}");
}

#[test]
fn loading_another_models_session_exits_1() {
    let (Some(m), Some(other)) = (model(SMOL), model("qwen2.5-coder-0.5b-instruct-q4_k_m")) else { return };
    let file = tmp("cli_chat_other.json");
    let o = chat(&["-m", m.to_str().unwrap(), "-n", "2"], &format!("Hi\n/save {file}\n"));
    assert_eq!(o.status.code(), Some(0));
    let o = chat(&["-m", other.to_str().unwrap(), "--load", &file], "Hi\n");
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("error:") && err.contains("sha256"), "{err}");
}

#[test]
fn ctrl_c_cancels_the_reply_not_the_program() {
    let Some(m) = model(SMOL) else { return };
    let mut child = spawn(&["-m", m.to_str().unwrap(), "-c", "2048"]);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"Write a very long story about a dragon, with many chapters.\n").unwrap();
    stdin.flush().unwrap();
    std::thread::sleep(Duration::from_millis(4000));
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    // SAFETY: signals our own child.
    assert_eq!(unsafe { kill(child.id() as i32, 2) }, 0);
    std::thread::sleep(Duration::from_millis(500));
    stdin.write_all(b"/quit\n").unwrap();
    drop(stdin);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("cancelled"), "{err}");
    assert!(!o.stdout.is_empty());
}
