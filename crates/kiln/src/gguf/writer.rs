//! GGUF writer (v3): builds small models for tests and, later, `kiln quantize`.

use std::io::Write;
use std::path::Path;

use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC, MAX_DIMS};
use super::value::{id, Array, Value};
use crate::error::{KilnError, Result};
use crate::quant::GgmlType;

struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<u64>,
    data: Vec<u8>,
}

/// Collects metadata and tensors, then writes a GGUF v3 file.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets a metadata key (replacing an earlier value of the same key).
    pub fn set(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Adds a tensor; `dims` in ggml order (`dims[0]` contiguous), `data` already encoded
    /// as `ty`.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> Result<&mut Self> {
        let name = name.into();
        if dims.is_empty() || dims.len() > MAX_DIMS {
            return Err(KilnError::Tensor {
                name,
                msg: format!("{} dimensions (1..={MAX_DIMS} allowed)", dims.len()),
            });
        }
        let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).and_then(|n| usize::try_from(n).ok());
        let Some(n) = n else {
            return Err(KilnError::Tensor { name, msg: format!("dims {dims:?} overflow") });
        };
        let want = ty.row_size(n)?;
        if data.len() != want || !dims[0].is_multiple_of(ty.block_size() as u64) {
            return Err(KilnError::Tensor {
                name,
                msg: format!("{ty} {dims:?} needs {want} bytes, got {}", data.len()),
            });
        }
        self.tensors.push(PendingTensor { name, ty, dims: dims.to_vec(), data });
        Ok(self)
    }

    /// Removes the tensor `name`; whether there was one.
    pub fn remove_tensor(&mut self, name: &str) -> bool {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        self.tensors.len() != before
    }

    /// Adds an F32 tensor from values.
    pub fn add_f32(&mut self, name: impl Into<String>, dims: &[u64], values: &[f32]) -> Result<&mut Self> {
        self.add_tensor(name, GgmlType::F32, dims, bytemuck::cast_slice(values).to_vec())
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            // An invalid value is written as given (readers reject it) but not used for padding.
            .filter(|a| a.is_power_of_two() && *a <= 1 << 20)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serializes the whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let align = self.alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend_from_slice(&value_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&(t.ty as u32).to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(align) * align;
        }
        pad_to(&mut out, align);
        let data_start = out.len() as u64;
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize((data_start + off) as usize, 0);
            out.extend_from_slice(&t.data);
        }
        pad_to(&mut out, align);
        out
    }

    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let mut f = std::fs::File::create(path).map_err(|e| KilnError::io(path, e))?;
        f.write_all(&self.to_bytes()).map_err(|e| KilnError::io(path, e))
    }
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = (out.len() as u64).div_ceil(align) * align;
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => id::U8,
        Value::I8(_) => id::I8,
        Value::U16(_) => id::U16,
        Value::I16(_) => id::I16,
        Value::U32(_) => id::U32,
        Value::I32(_) => id::I32,
        Value::F32(_) => id::F32,
        Value::Bool(_) => id::BOOL,
        Value::String(_) => id::STRING,
        Value::Array(_) => id::ARRAY,
        Value::U64(_) => id::U64,
        Value::I64(_) => id::I64,
        Value::F64(_) => id::F64,
    }
}

fn array_elem_id(a: &Array) -> u32 {
    match a {
        Array::U8(_) => id::U8,
        Array::I8(_) => id::I8,
        Array::U16(_) => id::U16,
        Array::I16(_) => id::I16,
        Array::U32(_) => id::U32,
        Array::I32(_) => id::I32,
        Array::F32(_) => id::F32,
        Array::Bool(_) => id::BOOL,
        Array::String(_) => id::STRING,
        Array::Array(_) => id::ARRAY,
        Array::U64(_) => id::U64,
        Array::I64(_) => id::I64,
        Array::F64(_) => id::F64,
    }
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&array_elem_id(a).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
        Array::String(v) => v.iter().for_each(|s| put_str(out, s)),
        Array::Array(v) => v.iter().for_each(|a| put_array(out, a)),
    }
}
