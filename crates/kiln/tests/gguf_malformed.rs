//! Malformed GGUF input: files built with `GgufWriter`, then truncated or corrupted. Each
//! must give a `KilnError::Gguf` naming what is wrong (key, tensor, offset), never a panic.

use kiln::gguf::{Array, GgufFile, GgufWriter, Value};
use kiln::quant::GgmlType;
use kiln::KilnError;

const KEYS: [&str; 7] =
    ["general.architecture", "test.u32", "test.f32", "test.bool", "test.strings", "test.ints", "test.nested"];
const TENSORS: [(&str, usize); 2] = [("tok_embd.weight", 2), ("blk.0.attn_q.weight", 2)];

/// A small valid file exercising every section: scalar, string, array and nested-array
/// values, an F32 and a Q8_0 tensor.
fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.set(KEYS[0], Value::String("llama".into()));
    w.set(KEYS[1], Value::U32(7));
    w.set(KEYS[2], Value::F32(1.5));
    w.set(KEYS[3], Value::Bool(true));
    w.set(KEYS[4], Value::Array(Array::String(vec!["a".into(), "bc".into(), "déf".into()])));
    w.set(KEYS[5], Value::Array(Array::I32(vec![1, -2, 3])));
    w.set(KEYS[6], Value::Array(Array::Array(vec![Array::U8(vec![1, 2]), Array::U8(vec![3])])));
    w.add_f32(TENSORS[0].0, &[4, 2], &[0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]).unwrap();
    let q8: Vec<u8> = (0..68u32).map(|i| (i * 7) as u8).collect();
    w.add_tensor(TENSORS[1].0, GgmlType::Q8_0, &[32, 2], q8).unwrap();
    w
}

fn find(hay: &[u8], needle: &str) -> usize {
    let n = needle.as_bytes();
    let hits: Vec<_> = hay.windows(n.len()).enumerate().filter(|(_, w)| *w == n).map(|(i, _)| i).collect();
    assert_eq!(hits.len(), 1, "{needle} should occur once");
    hits[0]
}

/// Little-endian patches (methods, so `b.put_u32(find(&b, ..), v)` borrows cleanly).
trait Patch {
    fn put_u32(&mut self, at: usize, v: u32);
    fn put_u64(&mut self, at: usize, v: u64);
}

impl Patch for Vec<u8> {
    fn put_u32(&mut self, at: usize, v: u32) {
        self[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, at: usize, v: u64) {
        self[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Parses `bytes`, which must fail with a GGUF error whose message contains every one of
/// `want`; returns (message, offset).
#[track_caller]
fn fails(bytes: Vec<u8>, want: &[&str]) -> (String, u64) {
    let len = bytes.len() as u64;
    match GgufFile::from_bytes(bytes) {
        Ok(_) => panic!("parsed, expected an error mentioning {want:?}"),
        Err(KilnError::Gguf { msg, offset, .. }) => {
            for w in want {
                assert!(msg.contains(w), "error {msg:?} should mention {w:?}");
            }
            // Data outside the file is reported at the offset where it would start.
            if !msg.contains("outside the file") {
                assert!(offset <= len, "error offset {offset} beyond the {len}-byte file: {msg}");
            }
            (msg, offset)
        }
        Err(e) => panic!("expected a GGUF error, got {e}"),
    }
}

/// Offset of the value of metadata `key` (after its name and type id).
fn value_at(b: &[u8], key: &str) -> usize {
    find(b, key) + key.len() + 4
}

/// Offset of the type id of tensor `name` (after its name, n_dims and dims).
fn tensor_type_at(b: &[u8], name: &str, n_dims: usize) -> usize {
    find(b, name) + name.len() + 4 + 8 * n_dims
}

#[test]
fn sample_is_valid() {
    let w = sample();
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(g.metadata.len(), KEYS.len());
    assert_eq!(g.tensors.len(), 2);
    let q = g.tensor(TENSORS[1].0).unwrap();
    assert_eq!(g.tensor_data(q), (0..68u32).map(|i| (i * 7) as u8).collect::<Vec<_>>());
}

/// Truncation at every byte: the error names the section the file ends in.
#[test]
fn truncation_inside_every_section() {
    let full = sample().to_bytes();
    let g = GgufFile::from_bytes(full.clone()).unwrap();
    let kv_start: Vec<usize> = KEYS.iter().map(|k| find(&full, k) - 8).collect();
    let ti_start: Vec<usize> = TENSORS.iter().map(|(n, _)| find(&full, n) - 8).collect();
    let ti_end: Vec<usize> =
        TENSORS.iter().zip(&ti_start).map(|((n, d), s)| s + 8 + n.len() + 4 + 8 * d + 4 + 8).collect();
    let data_end = g.tensors.iter().map(|t| g.data_offset + t.offset + t.size).max().unwrap() as usize;
    let (n_kv, n_t) = (KEYS.len(), TENSORS.len());
    let mut checked = 0;
    for len in 0..full.len() {
        let bytes = full[..len].to_vec();
        if len >= data_end {
            assert!(GgufFile::from_bytes(bytes).is_ok(), "only padding is missing at {len}");
            continue;
        }
        let rest = len.saturating_sub(24);
        let want: Vec<String> = if len < 4 {
            vec!["magic".into()]
        } else if len < 8 {
            vec!["version".into()]
        } else if len < 16 {
            vec!["tensor count".into()]
        } else if len < 24 || rest < n_kv * 12 {
            vec!["metadata count".into()]
        } else if rest < n_t * 28 {
            vec!["tensor count".into()]
        } else if len < ti_start[0] {
            let i = kv_start.iter().rposition(|&s| s <= len).unwrap();
            if len < kv_start[i] + 8 + KEYS[i].len() {
                vec!["metadata key".into()]
            } else {
                vec![KEYS[i].into()]
            }
        } else if len < ti_end[n_t - 1] {
            let i = ti_start.iter().rposition(|&s| s <= len).unwrap();
            if len < ti_start[i] + 8 + TENSORS[i].0.len() {
                vec!["tensor name".into()]
            } else {
                vec![format!("tensor {}", TENSORS[i].0)]
            }
        } else {
            // Header complete: the first tensor whose data the file does not hold is named.
            let t = g.tensors.iter().find(|t| (g.data_offset + t.offset + t.size) as usize > len).unwrap();
            vec![format!("tensor {}", t.name), "outside the file".into()]
        };
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        fails(bytes, &want);
        checked += 1;
    }
    assert!(checked > 300, "{checked} truncations checked");
}

#[test]
fn wrong_magic() {
    let mut b = sample().to_bytes();
    b[..4].copy_from_slice(b"GGML");
    fails(b, &["bad magic"]);
    fails(b"\x7fELF\x02\x01\x01\x00".to_vec(), &["bad magic"]);
    fails(Vec::new(), &["magic", "truncated"]);
}

#[test]
fn versions() {
    for v in [0, 1, 4, u32::MAX] {
        let mut b = sample().to_bytes();
        b.put_u32(4, v);
        fails(b, &["version", &v.to_string()]);
    }
    // v2 has v3's layout (64-bit counts and lengths): accepted.
    let mut b = sample().to_bytes();
    b.put_u32(4, 2);
    assert_eq!(GgufFile::from_bytes(b).unwrap().version, 2);
}

#[test]
fn absurd_counts() {
    for n in [1_000, 1 << 40, u64::MAX] {
        let mut b = sample().to_bytes();
        b.put_u64(8, n);
        fails(b, &["tensor count", &n.to_string()]);
        let mut b = sample().to_bytes();
        b.put_u64(16, n);
        fails(b, &["metadata count", &n.to_string()]);
    }
}

#[test]
fn absurd_lengths() {
    for n in [1 << 20, 1 << 62, u64::MAX] {
        // The length of a key.
        let mut b = sample().to_bytes();
        b.put_u64(find(&b, "test.u32") - 8, n);
        fails(b, &["metadata key", &n.to_string()]);
        // The length of a string value.
        let mut b = sample().to_bytes();
        b.put_u64(value_at(&b, "general.architecture"), n);
        fails(b, &["general.architecture", &n.to_string()]);
        // The length of an array (after its element type).
        let mut b = sample().to_bytes();
        b.put_u64(value_at(&b, "test.ints") + 4, n);
        fails(b, &["test.ints", "array length"]);
        // The length of a string inside an array.
        let mut b = sample().to_bytes();
        b.put_u64(find(&b, "bc") - 8, n);
        fails(b, &["test.strings[1]"]);
        // The length of an inner array.
        let mut b = sample().to_bytes();
        b.put_u64(value_at(&b, "test.nested") + 12 + 4, n);
        fails(b, &["test.nested", "array length"]);
        // The length of a tensor name.
        let mut b = sample().to_bytes();
        b.put_u64(find(&b, "tok_embd.weight") - 8, n);
        fails(b, &["tensor name"]);
    }
}

#[test]
fn unknown_value_types() {
    for ty in [13, 255, u32::MAX] {
        let mut b = sample().to_bytes();
        b.put_u32(value_at(&b, "test.u32") - 4, ty);
        fails(b, &["test.u32", "unknown metadata value type"]);
        let mut b = sample().to_bytes();
        b.put_u32(value_at(&b, "test.ints"), ty);
        fails(b, &["test.ints", "unknown array element type"]);
    }
    let mut b = sample().to_bytes();
    let at = value_at(&b, "test.bool");
    b[at] = 2;
    fails(b, &["test.bool", "bool byte 2"]);
}

#[test]
fn arrays_nested_too_deeply() {
    let mut a = Array::U8(vec![1]);
    for _ in 0..8 {
        a = Array::Array(vec![a]);
    }
    let mut w = GgufWriter::new();
    w.set("test.deep", Value::Array(a));
    fails(w.to_bytes(), &["test.deep", "nested too deeply"]);
}

#[test]
fn unknown_tensor_types() {
    // 4 and 5 were Q4_2/Q4_3, removed from ggml; 31 is unassigned.
    for ty in [4, 5, 31, 99, u32::MAX] {
        let mut b = sample().to_bytes();
        b.put_u32(tensor_type_at(&b, "blk.0.attn_q.weight", 2), ty);
        fails(b, &["tensor blk.0.attn_q.weight", "unknown tensor type id", &ty.to_string()]);
    }
}

#[test]
fn bad_dims() {
    let dims_at = |b: &[u8], name: &str| find(b, name) + name.len();
    for n in [0, 5, u32::MAX] {
        let mut b = sample().to_bytes();
        b.put_u32(dims_at(&b, "tok_embd.weight"), n);
        fails(b, &["tensor tok_embd.weight", "dimensions"]);
    }
    let mut b = sample().to_bytes();
    let at = dims_at(&b, "tok_embd.weight") + 4;
    b.put_u64(at, u64::MAX);
    fails(b, &["tensor tok_embd.weight", "overflow"]);
    // Within limits, but far more data than the file holds.
    let mut b = sample().to_bytes();
    b.put_u64(at + 8, 1 << 40);
    fails(b, &["tensor tok_embd.weight", "outside the file"]);
    // A Q8_0 row must be whole 32-element blocks.
    let mut b = sample().to_bytes();
    b.put_u64(dims_at(&b, "blk.0.attn_q.weight") + 4, 33);
    fails(b, &["tensor blk.0.attn_q.weight", "Q8_0 blocks"]);
}

#[test]
fn bad_offsets() {
    let offset_at = |b: &[u8]| tensor_type_at(b, "blk.0.attn_q.weight", 2) + 4;
    let mut b = sample().to_bytes();
    let at = offset_at(&b);
    let good = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    b.put_u64(at, good + 1);
    fails(b, &["tensor blk.0.attn_q.weight", "alignment"]);
    for off in [good + 32 * 1000, 1 << 60, u64::MAX - 31] {
        let mut b = sample().to_bytes();
        b.put_u64(at, off);
        let (_, offset) = fails(b, &["tensor blk.0.attn_q.weight", "outside the file"]);
        assert!(offset > 0);
    }
}

#[test]
fn bad_alignment() {
    for v in [Value::U32(0), Value::U32(3), Value::U32(48), Value::U64(1 << 40), Value::String("32".into())] {
        let mut w = sample();
        w.set("general.alignment", v);
        fails(w.to_bytes(), &["general.alignment"]);
    }
    // A valid non-default alignment is honoured by writer and reader alike.
    let mut w = sample();
    w.set("general.alignment", Value::U32(64));
    let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!((g.alignment, g.data_offset % 64), (64, 0));
    assert!(g.tensors.iter().all(|t| t.offset % 64 == 0));
}

#[test]
fn non_utf8_strings() {
    let cases: [(&str, &[&str]); 4] = [
        ("test.u32", &["metadata key", "UTF-8"]),
        ("llama", &["general.architecture", "UTF-8"]),
        ("déf", &["test.strings[2]", "UTF-8"]),
        ("tok_embd.weight", &["tensor name", "UTF-8"]),
    ];
    for (needle, want) in cases {
        let mut b = sample().to_bytes();
        let at = find(&b, needle) + 1;
        b[at] = 0xff;
        let (_, offset) = fails(b, want);
        assert_eq!(offset as usize, at, "{needle}: the offset points at the bad byte");
    }
}

#[test]
fn duplicates() {
    let mut w = sample();
    w.set("test.dup1", Value::U8(1)).set("test.dup2", Value::U8(2));
    let mut b = w.to_bytes();
    let at = find(&b, "test.dup2");
    b[at + 8] = b'1';
    fails(b, &["duplicate metadata key test.dup1"]);

    let mut w = sample();
    w.add_f32("x.a", &[1], &[1.0]).unwrap().add_f32("x.b", &[1], &[2.0]).unwrap();
    let mut b = w.to_bytes();
    let at = find(&b, "x.b");
    b[at + 2] = b'a';
    fails(b, &["duplicate tensor x.a"]);
}

#[test]
fn writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    assert!(w.add_tensor("none", GgmlType::F32, &[], vec![]).is_err());
    assert!(w.add_tensor("five", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0; 4]).is_err());
    assert!(w.add_tensor("huge", GgmlType::F32, &[u64::MAX, 2], vec![]).is_err());
    assert!(w.add_tensor("short", GgmlType::F32, &[4], vec![0; 15]).is_err());
    assert!(w.add_tensor("partial", GgmlType::Q8_0, &[16], vec![0; 17]).is_err());
}

/// Every single-byte corruption of the header and tables parses or fails cleanly.
#[test]
fn every_byte_flipped() {
    let full = sample().to_bytes();
    let g = GgufFile::from_bytes(full.clone()).unwrap();
    for at in 0..g.data_offset as usize {
        for x in [0x01, 0x80, 0xff] {
            let mut b = full.clone();
            b[at] ^= x;
            match GgufFile::from_bytes(b) {
                Ok(g) => {
                    for t in &g.tensors {
                        assert_eq!(g.tensor_data(t).len() as u64, t.size);
                    }
                }
                Err(KilnError::Gguf { .. }) => {}
                Err(e) => panic!("byte {at} ^ {x:#x}: expected a GGUF error, got {e}"),
            }
        }
    }
}
