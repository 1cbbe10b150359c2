//! GgufWriter -> GgufFile: every value type, nested arrays, tensors of several types and
//! alignments, read back exactly; v2 and files on disk through the mmap path.

use kiln::gguf::{Array, GgufFile, GgufWriter, Value};
use kiln::quant::GgmlType;

fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("v.u8", Value::U8(200)),
        ("v.i8", Value::I8(-100)),
        ("v.u16", Value::U16(60_000)),
        ("v.i16", Value::I16(-30_000)),
        ("v.u32", Value::U32(4_000_000_000)),
        ("v.i32", Value::I32(-2_000_000_000)),
        ("v.f32", Value::F32(-0.125)),
        ("v.bool", Value::Bool(false)),
        ("v.string", Value::String("héllo\n\u{0}wörld".into())),
        ("v.empty", Value::String(String::new())),
        ("v.u64", Value::U64(u64::MAX)),
        ("v.i64", Value::I64(i64::MIN)),
        ("v.f64", Value::F64(std::f64::consts::PI)),
        ("a.u8", Value::Array(Array::U8(vec![0, 255]))),
        ("a.i8", Value::Array(Array::I8(vec![-128, 127]))),
        ("a.u16", Value::Array(Array::U16(vec![1, 65535]))),
        ("a.i16", Value::Array(Array::I16(vec![-1, 2]))),
        ("a.u32", Value::Array(Array::U32(vec![3, 4, 5]))),
        ("a.i32", Value::Array(Array::I32(vec![-3]))),
        ("a.f32", Value::Array(Array::F32(vec![1.5, f32::INFINITY]))),
        ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
        ("a.string", Value::Array(Array::String(vec!["x".into(), String::new(), "日本".into()]))),
        ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
        ("a.i64", Value::Array(Array::I64(vec![i64::MIN, 0]))),
        ("a.f64", Value::Array(Array::F64(vec![-2.5]))),
        ("a.empty", Value::Array(Array::I32(vec![]))),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::String(vec!["a".into()]),
                Array::Array(vec![Array::F32(vec![1.0]), Array::U8(vec![])]),
            ])),
        ),
    ]
}

fn sample(align: Option<u32>) -> GgufWriter {
    let mut w = GgufWriter::new();
    if let Some(a) = align {
        w.set("general.alignment", Value::U32(a));
    }
    for (k, v) in all_values() {
        w.set(k, v);
    }
    w.add_f32("f32.3d", &[2, 3, 4], &(0..24).map(|i| i as f32).collect::<Vec<_>>()).unwrap();
    w.add_tensor("f16.1d", GgmlType::F16, &[3], vec![1, 2, 3, 4, 5, 6]).unwrap();
    w.add_tensor("q4k.2d", GgmlType::Q4_K, &[256, 2], (0..288).map(|i| i as u8).collect()).unwrap();
    w.add_tensor("q8_0.4d", GgmlType::Q8_0, &[32, 1, 1, 2], vec![9; 68]).unwrap();
    w
}

fn check(g: &GgufFile) {
    for (k, v) in all_values() {
        assert_eq!(g.get(k), Some(&v), "{k}");
    }
    let t = g.tensor("f32.3d").unwrap();
    assert_eq!(
        (t.dims.as_slice(), t.ty, t.size, t.rows_cols()),
        (&[2, 3, 4][..], GgmlType::F32, 96, (12, 2))
    );
    let last = &g.tensor_data(t)[92..96]; // unaligned when general.alignment is 1
    assert_eq!(f32::from_le_bytes(last.try_into().unwrap()), 23.0);
    assert_eq!(g.tensor_data(g.tensor("f16.1d").unwrap()), &[1, 2, 3, 4, 5, 6]);
    let q = g.tensor("q4k.2d").unwrap();
    assert_eq!(q.size, 288);
    assert_eq!(g.tensor_data(q)[287], 31);
    assert_eq!(g.tensor_data(g.tensor("q8_0.4d").unwrap()), &[9; 68][..]);
    for t in &g.tensors {
        assert_eq!((g.data_offset + t.offset) % g.alignment, 0, "{} aligned", t.name);
    }
}

#[test]
fn every_value_type_round_trips() {
    for align in [None, Some(1), Some(8), Some(64), Some(4096)] {
        let g = GgufFile::from_bytes(sample(align).to_bytes()).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.alignment, align.unwrap_or(32) as u64);
        check(&g);
    }
}

#[test]
fn typed_getters() {
    let g = GgufFile::from_bytes(sample(None).to_bytes()).unwrap();
    assert_eq!(g.get_u64("v.u32").unwrap(), Some(4_000_000_000));
    assert_eq!(g.get_u64("v.u8").unwrap(), Some(200));
    assert_eq!(g.get_f32("v.f64").unwrap(), Some(std::f32::consts::PI));
    assert_eq!(g.get_bool("v.bool").unwrap(), Some(false));
    assert_eq!(g.get_str("v.string").unwrap(), Some("héllo\n\u{0}wörld"));
    assert_eq!(g.get_array("a.string").unwrap().unwrap().as_strings().unwrap()[2], "日本");
    assert_eq!(g.get_u64("absent").unwrap(), None);
    let err = g.get_u64("v.string").unwrap_err().to_string();
    assert!(err.contains("v.string") && err.contains("string"), "{err}");
    assert!(g.get_u64("v.i64").is_err(), "negative values are not unsigned");
    assert!(g.get_str("v.u8").is_err());
}

#[test]
fn metadata_and_tensors_keep_file_order() {
    let g = GgufFile::from_bytes(sample(None).to_bytes()).unwrap();
    let keys: Vec<_> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    let want: Vec<_> = all_values().into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, want);
    let names: Vec<_> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["f32.3d", "f16.1d", "q4k.2d", "q8_0.4d"]);
}

#[test]
fn file_on_disk_via_mmap() {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("roundtrip.gguf");
    sample(None).write_file(&path).unwrap();
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.path(), Some(path.as_path()));
    assert_eq!(g.file_size(), std::fs::metadata(&path).unwrap().len());
    check(&g);
    // Errors from a file name it.
    let bad = path.with_file_name("truncated.gguf");
    std::fs::write(&bad, &std::fs::read(&path).unwrap()[..100]).unwrap();
    let err = GgufFile::open(&bad).unwrap_err().to_string();
    assert!(err.contains("truncated.gguf"), "{err}");
    let err = GgufFile::open(path.with_file_name("absent.gguf")).unwrap_err().to_string();
    assert!(err.contains("absent.gguf"), "{err}");
}

#[test]
fn version_2_reads_like_3() {
    let mut b = sample(None).to_bytes();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = GgufFile::from_bytes(b).unwrap();
    assert_eq!(g.version, 2);
    check(&g);
}

#[test]
fn empty_file_is_valid() {
    let g = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(g.metadata.is_empty() && g.tensors.is_empty());
    assert_eq!(g.architecture(), None);
}

/// The committed fixtures (also the fuzzer's seeds) are exactly what the writer makes
/// today: a change to the byte layout shows up here. `KILN_BLESS=1` rewrites them.
#[test]
fn fixtures_match_writer() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gguf");
    let mut tokenizer = GgufWriter::new();
    tokenizer
        .set("general.architecture", Value::String("llama".into()))
        .set("llama.block_count", Value::U32(1))
        .set("tokenizer.ggml.model", Value::String("gpt2".into()))
        .set("tokenizer.ggml.tokens", Value::Array(Array::String(vec!["<s>".into(), "a".into(), "b".into()])))
        .set("tokenizer.ggml.token_type", Value::Array(Array::I32(vec![3, 1, 1])))
        .set("tokenizer.ggml.merges", Value::Array(Array::String(vec!["a b".into()])));
    tokenizer.add_f32("token_embd.weight", &[4, 3], &[0.25; 12]).unwrap();
    let fixtures = [
        ("empty.gguf", GgufWriter::new()),
        ("all_types.gguf", sample(None)),
        ("align64.gguf", sample(Some(64))),
    ];
    let fixtures = fixtures.into_iter().chain([("tokenizer.gguf", tokenizer)]);
    for (name, w) in fixtures {
        let path = dir.join(name);
        let bytes = w.to_bytes();
        if std::env::var_os("KILN_BLESS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(on_disk == bytes, "{name} differs from the writer's output (KILN_BLESS=1 to rewrite)");
        GgufFile::open(&path).unwrap();
    }
}
