//! GGUF reader: the header, metadata and tensor table parsed with every size and offset
//! checked against the bytes actually present; tensor data is borrowed from the mmap. A
//! split model (`NAME-00001-of-0000N.gguf`, as llama.cpp's gguf-split writes it) opens as
//! one file whose tensors lie in several parts (`split.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::value::{id, Array, Value};
use crate::error::{KilnError, Result};
use crate::quant::GgmlType;

pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
pub const MAX_DIMS: usize = 4;

/// Where the file's bytes live.
enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// One entry of the tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
    /// The part of a split model the data lies in (0 for a single file).
    pub part: usize,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Elements per row (`dims[0]`) and the number of rows (product of the rest).
    pub fn rows_cols(&self) -> (usize, usize) {
        let cols = self.dims.first().copied().unwrap_or(1) as usize;
        let rows = self.dims.iter().skip(1).product::<u64>() as usize;
        (rows, cols)
    }
}

/// One file of a model: its bytes and where its data section starts.
pub(super) struct Part {
    pub(super) path: Option<PathBuf>,
    data: Storage,
    pub(super) data_offset: u64,
}

/// A parsed GGUF file (or split model). Cheap to query; tensor bytes are zero-copy slices of
/// the mmap.
pub struct GgufFile {
    pub(super) parts: Vec<Part>,
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    /// Absolute offset of the data section (of the first part, in a split model).
    pub data_offset: u64,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path())
            .field("parts", &self.parts.len())
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

/// Refuses anything but a regular file (a directory, device, FIFO or socket), naming it.
fn regular_file(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let t = meta.file_type();
    if t.is_file() {
        return Ok(());
    }
    let kind = if t.is_dir() {
        "a directory"
    } else {
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileTypeExt;
            if t.is_fifo() {
                "a FIFO"
            } else if t.is_socket() {
                "a socket"
            } else if t.is_char_device() || t.is_block_device() {
                "a device"
            } else {
                "something other than a regular file"
            }
        }
        #[cfg(not(unix))]
        "something other than a regular file"
    };
    Err(KilnError::invalid(format!("{}: is {kind}, not a GGUF model file", path.display())))
}

impl GgufFile {
    /// Memory-maps and parses `path`; the first part of a split model brings the others.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let first = Self::open_one(path.as_ref())?;
        super::split::open_rest(first)
    }

    /// Memory-maps and parses one file.
    pub(super) fn open_one(path: &Path) -> Result<Self> {
        // Checked before opening: opening a FIFO for reading waits for a writer.
        let meta = std::fs::metadata(path).map_err(|e| KilnError::io(path, e))?;
        regular_file(path, &meta)?;
        let file = std::fs::File::open(path).map_err(|e| KilnError::io(path, e))?;
        regular_file(path, &file.metadata().map_err(|e| KilnError::io(path, e))?)?;
        // SAFETY: the map is read-only; like every mmap-based loader we rely on the file
        // not being truncated while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| KilnError::io(path, e))?;
        Self::parse(Storage::Mmap(map), Some(path.to_path_buf()))
    }

    /// Parses a GGUF image held in memory (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self> {
        Self::parse(Storage::Owned(bytes), None)
    }

    /// The file (the first part of a split model).
    pub fn path(&self) -> Option<&Path> {
        self.parts[0].path.as_deref()
    }

    /// The files of the model: one, or every part of a split model in order.
    pub fn paths(&self) -> Vec<&Path> {
        self.parts.iter().filter_map(|p| p.path.as_deref()).collect()
    }

    /// Total bytes of the file (of all parts of a split model).
    pub fn file_size(&self) -> u64 {
        self.parts.iter().map(|p| p.data.len() as u64).sum()
    }

    /// The whole file (the first part of a split model; see [`Self::part_bytes`]).
    pub fn bytes(&self) -> &[u8] {
        &self.parts[0].data
    }

    /// The whole of part `part` (0 for a single file).
    pub fn part_bytes(&self, part: usize) -> &[u8] {
        &self.parts[part].data
    }

    /// Where a tensor's bytes lie: its part and the offset in that part's bytes.
    pub fn tensor_start(&self, t: &TensorInfo) -> (usize, usize) {
        (t.part, (self.parts[t.part].data_offset + t.offset) as usize)
    }

    /// Tells the OS that bytes `start..start + len` of part `part` will not be read soon, so
    /// the resident pages wholly inside them leave this process's memory (a backend that
    /// copied a tensor into its own layout calls it). Reads still work: a page is read back
    /// from the file. A no-op for images held in memory or where the OS refuses.
    pub fn release(&self, part: usize, start: usize, len: usize) {
        const PAGE: usize = 4096;
        #[cfg(unix)]
        if let Storage::Mmap(m) = &self.parts[part].data {
            let (lo, hi) = (start.next_multiple_of(PAGE), (start + len).min(m.len()) / PAGE * PAGE);
            if lo < hi {
                // Huge mappings first: a fault on a neighbouring tensor could otherwise map a
                // whole huge page of the file back, released pages included.
                let _ = m.advise_range(memmap2::Advice::NoHugePage, lo, hi - lo);
                // SAFETY: the map is read-only and backed by the file, so dropped pages come
                // back with the same bytes: no reference into it sees a change.
                let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo) };
            }
        }
        let _ = (part, start, len);
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of a tensor (bounds were checked when the file was parsed).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let (part, start) = self.tensor_start(t);
        &self.parts[part].data[start..start + t.size as usize]
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Option<&str> {
        self.get("general.architecture").and_then(Value::as_str)
    }

    fn parse(data: Storage, path: Option<PathBuf>) -> Result<Self> {
        let mut r = Cursor { buf: &data, pos: 0, path: path.as_deref() };
        let magic = r.take(4, "magic")?;
        if magic != GGUF_MAGIC {
            return Err(r.err_at(0, format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(r.err_at(4, format!("unsupported GGUF version {version} (need 2 or 3)")));
        }
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        // Each kv needs at least 12 bytes and each tensor info at least 28: reject absurd
        // counts before allocating anything for them.
        r.check_count(n_kv, 12, "metadata count")?;
        r.check_count(n_tensors, 28, "tensor count")?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut index = HashMap::with_capacity(n_kv as usize);
        let mut alignment_at = 0;
        for _ in 0..n_kv {
            let at = r.pos;
            let key = r.string("metadata key")?;
            let ty = r.u32(&format!("type of {key}"))?;
            let value = r.value(ty, &key, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(r.err_at(at, format!("duplicate metadata key {key}")));
            }
            if key == "general.alignment" {
                alignment_at = at;
            }
            metadata.push((key, value));
        }

        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(r.err_at(
                        alignment_at,
                        format!("general.alignment {v:?} is not a power of two up to 1 MiB"),
                    ))
                }
            },
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let at = r.pos;
            let t = r.tensor_info(alignment)?;
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(r.err_at(at, format!("duplicate tensor {}", t.name)));
            }
            tensors.push(t);
        }

        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        let file_len = data.len() as u64;
        for t in &tensors {
            let end = data_offset.checked_add(t.offset).and_then(|s| s.checked_add(t.size));
            if end.is_none_or(|e| e > file_len) {
                return Err(KilnError::Gguf {
                    path: path.clone(),
                    offset: data_offset.saturating_add(t.offset),
                    msg: format!(
                        "tensor {} data ({} bytes at data offset {}) lies outside the file ({file_len} bytes)",
                        t.name, t.size, t.offset
                    ),
                });
            }
        }

        let parts = vec![Part { path, data, data_offset }];
        Ok(GgufFile { parts, version, metadata, index, tensors, tensor_index, alignment, data_offset })
    }
}

/// A bounds-checked reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: Option<&'a Path>,
}

impl<'a> Cursor<'a> {
    fn err_at(&self, offset: usize, msg: String) -> KilnError {
        KilnError::Gguf { path: self.path.map(Path::to_path_buf), offset: offset as u64, msg }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        match end {
            Some(end) => {
                let s = &self.buf[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err_at(
                self.pos,
                format!("truncated: {what} needs {n} bytes, {} left", self.buf.len() - self.pos),
            )),
        }
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Rejects a count whose elements (each at least `min_size` bytes) cannot fit in the
    /// rest of the file.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<()> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(self.err_at(
                self.pos,
                format!("{what} {count} is impossible: only {} bytes remain", self.remaining()),
            ));
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("take returns N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        self.string_named(|| what.to_string())
    }

    /// A length-prefixed UTF-8 string; `what` names it in errors (built only on error, as
    /// a vocabulary has ~10^5 of them).
    fn string_named(&mut self, what: impl Fn() -> String) -> Result<String> {
        let at = self.pos;
        if self.remaining() < 8 {
            return Err(
                self.err_at(at, format!("truncated: {} needs 8 bytes, {} left", what(), self.remaining()))
            );
        }
        let len = self.u64("string length")?;
        if len > self.remaining() {
            return Err(self.err_at(
                at,
                format!("truncated: {} of length {len}, {} bytes left", what(), self.remaining()),
            ));
        }
        let bytes = &self.buf[self.pos..self.pos + len as usize];
        self.pos += len as usize;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(self.err_at(at + 8 + e.valid_up_to(), format!("{} is not valid UTF-8", what()))),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            id::U8 => Value::U8(self.array::<1>(key)?[0]),
            id::I8 => Value::I8(self.array::<1>(key)?[0] as i8),
            id::U16 => Value::U16(u16::from_le_bytes(self.array(key)?)),
            id::I16 => Value::I16(i16::from_le_bytes(self.array(key)?)),
            id::U32 => Value::U32(u32::from_le_bytes(self.array(key)?)),
            id::I32 => Value::I32(i32::from_le_bytes(self.array(key)?)),
            id::F32 => Value::F32(f32::from_le_bytes(self.array(key)?)),
            id::BOOL => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err_at(self.pos - 1, format!("{key}: bool byte {b} is not 0 or 1"))),
            },
            id::STRING => Value::String(self.string(key)?),
            id::ARRAY => Value::Array(self.array_value(key, depth)?),
            id::U64 => Value::U64(u64::from_le_bytes(self.array(key)?)),
            id::I64 => Value::I64(i64::from_le_bytes(self.array(key)?)),
            id::F64 => Value::F64(f64::from_le_bytes(self.array(key)?)),
            _ => return Err(self.err_at(self.pos - 4, format!("{key}: unknown metadata value type {ty}"))),
        })
    }

    fn array_value(&mut self, key: &str, depth: u32) -> Result<Array> {
        if depth > 4 {
            return Err(self.err_at(self.pos, format!("{key}: arrays nested too deeply")));
        }
        let elem = self.u32(key)?;
        let n = self.u64(key)?;
        let min_size = match elem {
            id::U8 | id::I8 | id::BOOL => 1,
            id::U16 | id::I16 => 2,
            id::U32 | id::I32 | id::F32 => 4,
            id::U64 | id::I64 | id::F64 | id::STRING => 8,
            id::ARRAY => 12,
            _ => return Err(self.err_at(self.pos - 12, format!("{key}: unknown array element type {elem}"))),
        };
        self.check_count(n, min_size, &format!("{key}: array length"))?;
        let n = n as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty, $w:literal) => {{
                let bytes = self.take(n * $w, key)?;
                Array::$variant(
                    bytes.chunks_exact($w).map(|c| <$t>::from_le_bytes(c.try_into().unwrap())).collect(),
                )
            }};
        }
        Ok(match elem {
            id::U8 => Array::U8(self.take(n, key)?.to_vec()),
            id::I8 => Array::I8(self.take(n, key)?.iter().map(|&b| b as i8).collect()),
            id::U16 => fixed!(U16, u16, 2),
            id::I16 => fixed!(I16, i16, 2),
            id::U32 => fixed!(U32, u32, 4),
            id::I32 => fixed!(I32, i32, 4),
            id::F32 => fixed!(F32, f32, 4),
            id::U64 => fixed!(U64, u64, 8),
            id::I64 => fixed!(I64, i64, 8),
            id::F64 => fixed!(F64, f64, 8),
            id::BOOL => {
                let at = self.pos;
                let bytes = self.take(n, key)?;
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(self.err_at(at + i, format!("{key}: bool byte {} is not 0 or 1", bytes[i])));
                }
                Array::Bool(bytes.iter().map(|&b| b == 1).collect())
            }
            id::STRING => {
                let mut v = Vec::with_capacity(n);
                for i in 0..n {
                    v.push(self.string_named(|| format!("{key}[{i}]"))?);
                }
                Array::String(v)
            }
            _ => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, alignment: u64) -> Result<TensorInfo> {
        let at = self.pos;
        let name = self.string("tensor name")?;
        let n_dims = self.u32(&format!("tensor {name}: n_dims"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(
                self.err_at(at, format!("tensor {name}: {n_dims} dimensions (1..={MAX_DIMS} allowed)"))
            );
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(self.u64(&format!("tensor {name}: dims"))?);
        }
        let ty_at = self.pos;
        let ty_id = self.u32(&format!("tensor {name}: type"))?;
        let ty = GgmlType::from_id(ty_id)
            .ok_or_else(|| self.err_at(ty_at, format!("tensor {name}: unknown tensor type id {ty_id}")))?;
        let offset = self.u64(&format!("tensor {name}: offset"))?;
        if offset % alignment != 0 {
            return Err(self.err_at(
                at,
                format!("tensor {name}: offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        let n_elem = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= 1 << 50)
            .ok_or_else(|| self.err_at(at, format!("tensor {name}: dims {dims:?} overflow")))?;
        if dims[0] % ty.block_size() as u64 != 0 {
            return Err(self.err_at(
                at,
                format!(
                    "tensor {name}: row of {} elements is not a whole number of {ty} blocks ({})",
                    dims[0],
                    ty.block_size()
                ),
            ));
        }
        let size = n_elem / ty.block_size() as u64 * ty.type_size() as u64;
        Ok(TensorInfo { name, dims, ty, offset, size, part: 0 })
    }
}
