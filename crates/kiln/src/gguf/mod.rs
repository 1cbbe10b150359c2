//! GGUF: read (mmap, zero-copy, every offset checked), write, typed metadata access.

mod reader;
mod split;
mod value;
mod writer;

pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
pub use value::{Array, Value};
pub use writer::GgufWriter;

use crate::error::{KilnError, Result};

/// Typed metadata getters. A present key of the wrong type is an error naming the key;
/// an absent key is `Ok(None)`.
impl GgufFile {
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "an unsigned integer", Value::as_u64)
    }

    pub fn get_usize(&self, key: &str) -> Result<Option<usize>> {
        Ok(self.get_u64(key)?.map(|v| v as usize))
    }

    pub fn get_f32(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a number", |v| v.as_f64().map(|x| x as f32))
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(wrong_type(key, "a string", v)),
        }
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(wrong_type(key, "an array", v)),
        }
    }

    fn typed<T>(&self, key: &str, want: &str, f: impl Fn(&Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| wrong_type(key, want, v)),
        }
    }
}

fn wrong_type(key: &str, want: &str, v: &Value) -> KilnError {
    KilnError::Metadata(format!("{key} should be {want}, found {}", v.type_name()))
}
