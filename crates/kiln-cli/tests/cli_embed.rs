//! `kiln embed` per docs/cli.md: JSON shape, pooling, normalization, errors.

use std::path::PathBuf;
use std::process::{Command, Output};

mod support;

fn model() -> Option<PathBuf> {
    support::model("SmolLM2-135M-Instruct.Q4_1")
}

fn embed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln")).arg("embed").args(["-t", "2"]).args(args).output().unwrap()
}

fn json(o: &Output) -> serde_json::Value {
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8(o.stdout.clone()).unwrap();
    assert_eq!(s.matches('\n').count(), 1);
    serde_json::from_str(&s).unwrap()
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn pooling_shapes_and_identities() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let mean = json(&embed(&["-m", m, "Hello world", "Second text", "--json"]));
    assert_eq!(mean["pooling"], "mean");
    let n = mean["n_embd"].as_u64().unwrap() as usize;
    assert_eq!(n, 576);
    let data = mean["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[1]["index"], 1);
    let m0 = floats(&data[0]["embedding"]);
    assert_eq!(m0.len(), n);

    let none = json(&embed(&["-m", m, "Hello world", "--pooling", "none", "--json"]));
    let rows: Vec<Vec<f64>> = none["data"][0]["embedding"].as_array().unwrap().iter().map(floats).collect();
    assert!(rows.len() >= 2);
    for j in 0..n {
        let avg = rows.iter().map(|r| r[j]).sum::<f64>() / rows.len() as f64;
        assert!((avg - m0[j]).abs() < 1e-4, "dim {j}: mean {} vs rows {avg}", m0[j]);
    }
    let last = json(&embed(&["-m", m, "Hello world", "--pooling", "last", "--json"]));
    assert_eq!(floats(&last["data"][0]["embedding"]), *rows.last().unwrap());

    let norm = json(&embed(&["-m", m, "Hello world", "--normalize", "--json"]));
    let v = floats(&norm["data"][0]["embedding"]);
    assert!((v.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);
}

#[test]
fn bad_pooling_exits_1_and_no_text_is_usage() {
    let Some(m) = model() else { return };
    let o = embed(&["-m", m.to_str().unwrap(), "x", "--pooling", "max"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("error:"));
    assert!(o.stdout.is_empty());
    assert_eq!(embed(&["-m", m.to_str().unwrap()]).status.code(), Some(2));
}
