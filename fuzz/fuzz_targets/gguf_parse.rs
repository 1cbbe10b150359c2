//! `GgufFile::from_bytes` on arbitrary bytes: it must return Ok or Err, never panic, read
//! out of bounds or allocate without bound; on Ok, every accessor must hold up too.

#![no_main]

use kiln::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = GgufFile::from_bytes(data.to_vec()) {
        let _ = g.architecture();
        for (k, v) in &g.metadata {
            assert!(g.get(k).is_some());
            let _ = (v.type_name(), v.as_u64(), v.as_f64(), g.get_u64(k), g.get_f32(k), g.get_str(k));
            if let Some(a) = v.as_array() {
                let _ = (a.to_i64_vec(), a.to_f32_vec(), a.len());
            }
        }
        for t in &g.tensors {
            assert_eq!(g.tensor_data(t).len() as u64, t.size);
            let _ = (t.n_elements(), t.rows_cols());
        }
    }
});
