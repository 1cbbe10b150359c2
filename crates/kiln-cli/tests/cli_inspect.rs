//! `kiln inspect` per docs/cli.md: the JSON shape on real models, and malformed files exiting 1
//! with one `error:` line and nothing on stdout.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kiln::gguf::{Array, GgufWriter, Value};
use kiln::quant::GgmlType;
use serde_json::Value as Json;
use support::kiln;

fn tmp(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
}

fn model() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()))
        .set("llama.block_count", Value::U32(1))
        .set(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String((0..100).map(|i| format!("t{i}")).collect())),
        )
        .set("tokenizer.ggml.scores", Value::Array(Array::F32(vec![0.5, -1.0])))
        .set("test.dup1", Value::U8(1))
        .set("test.dup2", Value::U8(2));
    w.add_f32("token_embd.weight", &[4, 2], &[1.0; 8]).unwrap();
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::Q4_K, &[256, 2], vec![0; 288]).unwrap();
    w
}

/// Exit 1, nothing on stdout, one stderr line `error: ...` naming the file and `want`.
#[track_caller]
fn fails_cleanly(out: &Output, path: &Path, want: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(out.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.ends_with('\n'), "{err}");
    assert!(err.contains(path.file_name().unwrap().to_str().unwrap()), "names the file: {err}");
    for w in want {
        assert!(err.contains(w), "mentions {w:?}: {err}");
    }
    assert!(!err.contains("panicked") && !err.contains("internal error"), "{err}");
}

#[test]
fn malformed_files_exit_1() {
    let good = model().to_bytes();
    let find = |s: &str| good.windows(s.len()).position(|w| w == s.as_bytes()).unwrap();
    let mut cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("empty.gguf", vec![], vec!["magic", "truncated"]),
        ("magic.gguf", [b"GGML".as_slice(), &good[4..]].concat(), vec!["bad magic"]),
        ("header.gguf", good[..20].to_vec(), vec!["metadata count", "truncated"]),
        ("kv.gguf", good[..find("llama.block_count") + 20].to_vec(), vec!["llama.block_count"]),
        ("array.gguf", good[..find("t90")].to_vec(), vec!["tokenizer.ggml.tokens[90]"]),
        ("tinfo.gguf", good[..find("blk.0.ffn_up.weight") + 22].to_vec(), vec!["tensor blk.0.ffn_up.weight"]),
        (
            "data.gguf",
            good[..good.len() - 100].to_vec(),
            vec!["tensor blk.0.ffn_up.weight", "outside the file"],
        ),
    ];
    let mut patch = |name, at: usize, bytes: &[u8], want| {
        let mut b = good.clone();
        b[at..at + bytes.len()].copy_from_slice(bytes);
        cases.push((name, b, want));
    };
    patch("version.gguf", 4, &7u32.to_le_bytes(), vec!["version 7"]);
    patch("count.gguf", 16, &u64::MAX.to_le_bytes(), vec!["metadata count"]);
    patch(
        "strlen.gguf",
        find("tokenizer.ggml.tokens") + 21 + 4 + 4,
        &u64::MAX.to_le_bytes(),
        vec!["array length"],
    );
    patch("utf8.gguf", find("block_count"), &[0xc3, 0x28], vec!["UTF-8"]);
    let ty_at = find("token_embd.weight") + 17 + 4 + 16;
    patch(
        "ttype.gguf",
        ty_at,
        &1000u32.to_le_bytes(),
        vec!["token_embd.weight", "unknown tensor type id 1000"],
    );
    patch(
        "vtype.gguf",
        find("llama.block_count") + 17,
        &99u32.to_le_bytes(),
        vec!["unknown metadata value type"],
    );
    patch("align.gguf", ty_at + 4, &u64::MAX.to_le_bytes(), vec!["token_embd.weight", "alignment"]);
    patch("dup.gguf", find("test.dup2") + 8, b"1", vec!["duplicate metadata key test.dup1"]);
    for (name, bytes, want) in &cases {
        let path = tmp(&format!("malformed-{name}"));
        std::fs::write(&path, bytes).unwrap();
        let p = path.to_str().unwrap();
        fails_cleanly(&kiln(&["inspect", p]), &path, want);
        fails_cleanly(&kiln(&["inspect", "--json", "-m", p]), &path, want);
    }
}

#[test]
fn missing_model_exits_1() {
    let out = kiln(&["inspect", "/no/such/dir/model.gguf"]);
    fails_cleanly(&out, Path::new("model.gguf"), &["not a catalog model", "smollm2-135m"]);
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(kiln(&["inspect", "--bogus"]).status.code(), Some(2));
    assert_eq!(kiln(&["inspect", "a.gguf", "-m", "b.gguf"]).status.code(), Some(2));
}

#[test]
fn json_shape_on_a_written_model() {
    let path = tmp("inspect-shape.gguf");
    model().write_file(&path).unwrap();
    let out = kiln(&["inspect", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j = one_json_line(&out);
    assert_eq!(j["file"], path.to_str().unwrap());
    assert_eq!(j["size"], std::fs::metadata(&path).unwrap().len());
    assert_eq!(j["metadata"]["llama.block_count"], 1);
    assert_eq!(j["metadata"]["tokenizer.ggml.scores"], serde_json::json!([0.5, -1.0]));
    // Long arrays (the vocabulary) are abbreviated to their length.
    let tokens = j["metadata"]["tokenizer.ggml.tokens"].as_str().unwrap();
    assert!(tokens.contains("100"), "{tokens}");
    let t = &j["tensors"][1];
    assert_eq!((t["name"].as_str(), t["type"].as_str()), (Some("blk.0.ffn_up.weight"), Some("Q4_K")));
    assert_eq!(t["shape"], serde_json::json!([256, 2]));
    // Absolute offsets: the second tensor starts one aligned F32 tensor after the first.
    assert_eq!(t["offset"].as_u64().unwrap(), j["tensors"][0]["offset"].as_u64().unwrap() + 32);
}

/// A mixture of experts: its experts, and the parameters a token uses counted from the
/// tensors' shapes (a 3-D expert tensor `[cols, rows, n_expert]` contributes `k` experts).
#[test]
fn experts_and_active_parameters() {
    for (preset, count, used, shared) in [
        ("olmoe-tiny", 16, 4, Json::Null),
        ("qwen2moe-tiny", 8, 2, serde_json::json!({"n_ff": 64, "gated": true})),
        ("granitemoe-tiny", 8, 2, serde_json::json!({"n_ff": 64, "gated": false})),
    ] {
        let path = tmp(&format!("inspect-{preset}.gguf"));
        kiln::model::synth::preset(preset).unwrap().build().unwrap().write_file(&path).unwrap();
        let out = kiln(&["inspect", "--json", path.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j = one_json_line(&out);
        assert_eq!(j["experts"], serde_json::json!({"count": count, "used": used, "shared": shared}));
        let (mut total, mut active) = (0, 0);
        for t in j["tensors"].as_array().unwrap() {
            let dims: Vec<u64> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
            let n: u64 = dims.iter().product();
            total += n;
            active +=
                if t["name"].as_str().unwrap().ends_with("_exps.weight") { n / count * used } else { n };
        }
        assert_eq!(j["parameters"], total, "{preset}");
        assert_eq!(j["active_parameters"], active, "{preset}");
        assert!(active < total);
        let text = String::from_utf8(kiln(&["inspect", path.to_str().unwrap()]).stdout).unwrap();
        let want = format!("experts:      {count} per layer, {used} used per token");
        assert!(text.contains(&want), "{preset}: {text}");
    }
    let path = tmp("inspect-dense.gguf");
    kiln::model::synth::preset("qwen3-tiny").unwrap().build().unwrap().write_file(&path).unwrap();
    let j = one_json_line(&kiln(&["inspect", "--json", path.to_str().unwrap()]));
    assert_eq!((&j["experts"], &j["parameters"]), (&Json::Null, &j["active_parameters"]));
}

fn one_json_line(out: &Output) -> Json {
    let s = std::str::from_utf8(&out.stdout).unwrap();
    assert!(s.ends_with('\n') && s.lines().count() == 1, "one line of JSON: {s}");
    serde_json::from_str(s).unwrap()
}

/// docs/cli.md's shape, on catalog models (fetched into the cache on first use).
#[test]
fn json_shape_on_catalog_models() {
    for (spec, arch, n_tensors) in [("tiny-random-llama", "llama", 21), ("smollm2-135m", "llama", 272)] {
        let out = kiln(&["inspect", "--json", "-m", spec]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let j = one_json_line(&out);
        let mut keys: Vec<_> = j.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort(); // whether serde_json keeps insertion order depends on its features
        let mut want = [
            "file",
            "size",
            "gguf_version",
            "architecture",
            "supported",
            "parameters",
            "active_parameters",
            "experts",
            "metadata",
            "tensors",
            "kv_bytes_per_token",
        ];
        want.sort();
        assert_eq!(keys, want);
        let file = Path::new(j["file"].as_str().unwrap());
        assert!(file.is_absolute() && file.is_file(), "{file:?}");
        assert_eq!(j["size"].as_u64(), Some(std::fs::metadata(file).unwrap().len()));
        assert_eq!((j["gguf_version"].as_u64(), j["architecture"].as_str()), (Some(3), Some(arch)));
        assert_eq!(j["supported"], true, "{spec}");
        assert_eq!(j["metadata"]["general.architecture"], arch);
        assert!(j["metadata"]["tokenizer.ggml.tokens"].is_string(), "the vocabulary is abbreviated");
        // A token's K and V in every layer: 2 · layers · KV heads · head size values, in
        // each type's blocks of 32 (ggml's sizes); quantized types only where a head is
        // whole blocks (tiny-random-llama's heads of 4 are not).
        let md = |k: &str| j["metadata"][format!("llama.{k}")].as_u64().unwrap();
        let head = md("embedding_length") / md("attention.head_count");
        let values = 2 * md("block_count") * md("attention.head_count_kv") * head;
        let kv = j["kv_bytes_per_token"].as_object().unwrap();
        let mut want = vec![("f16", 64)];
        if head % 32 == 0 {
            want.extend([
                ("q8_0", 34),
                ("q5_1", 24),
                ("q5_0", 22),
                ("q4_1", 20),
                ("q4_0", 18),
                ("iq4_nl", 18),
            ]);
        }
        assert_eq!(kv.len(), want.len(), "{spec}: {kv:?}");
        for (ty, bytes) in want {
            assert_eq!(kv[ty].as_u64(), Some(values * bytes / 32), "{spec} {ty}");
        }
        let tensors = j["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), n_tensors);
        for t in tensors {
            let o = t.as_object().unwrap();
            assert_eq!(o.len(), 5);
            assert!(t["name"].is_string() && t["type"].is_string() && t["supported"].is_boolean());
            assert!(t["offset"].as_u64().unwrap() < j["size"].as_u64().unwrap());
            let shape = t["shape"].as_array().unwrap();
            assert!(!shape.is_empty() && shape.iter().all(Json::is_u64));
        }
    }
    // Text mode, positional spec.
    let out = kiln(&["inspect", "tiny-random-llama"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("architecture: llama") && text.contains("token_embd.weight"), "{text}");
}

/// `kiln inspect x | head -1`: a closed stdout ends kiln quietly, not with a panic.
#[test]
fn closed_stdout_is_quiet() {
    let mut w = GgufWriter::new();
    for i in 0..3000 {
        w.add_f32(format!("blk.{i}.a_rather_long_tensor_name.weight"), &[1], &[0.0]).unwrap();
    }
    let path = tmp("many-tensors.gguf");
    w.write_file(&path).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["inspect", path.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 64];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.is_empty(), "nothing on stderr: {err}");
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert!(out.status.success() || out.status.signal() == Some(13), "{:?}", out.status);
    }
}
