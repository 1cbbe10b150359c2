//! CPU weights: read in place from the mapped GGUF file, except Q4_K matrices, which the
//! SIMD tiers repack at load into eight interleaved rows (`quant::interleave`, the layout
//! their prefill and decode kernels both read); the file's pages of a repacked tensor are
//! then released, so a weight is never held twice.

use std::borrow::Cow;
use std::sync::Arc;

use crate::error::Result;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, GgmlType};

/// 64 bytes on a cache line boundary: the unit of a repacked weight's buffer (its blocks
/// are 1152 bytes, so every block and every 32-byte load stays within cache lines).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight matrix (or vector).
pub struct CpuWeight {
    file: Arc<GgufFile>,
    start: usize,
    len: usize,
    /// The Q4_K×8 copy of the tensor, where it was repacked (the file's bytes then stay
    /// unread).
    interleaved: Option<Box<[Line]>>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Bytes per row.
    pub row_size: usize,
}

impl CpuWeight {
    pub(super) fn load(gguf: &Arc<GgufFile>, t: &TensorInfo) -> Result<CpuWeight> {
        let (rows, cols) = t.rows_cols();
        let row_size = t.ty.row_size(cols)?;
        let mut w = CpuWeight {
            file: gguf.clone(),
            start: (gguf.data_offset + t.offset) as usize,
            len: t.size as usize,
            interleaved: None,
            ty: t.ty,
            rows,
            cols,
            row_size,
        };
        if w.ty == GgmlType::Q4_K && rows.is_multiple_of(quant::Q4K_X8_ROWS) && has_q4_k_x8_kernels() {
            let mut lines = vec![Line([0; 64]); w.len.div_ceil(64)].into_boxed_slice();
            // SAFETY: `Line` is 64 plain bytes, so the buffer is `64 · lines` initialized bytes.
            let dst = unsafe { std::slice::from_raw_parts_mut(lines.as_mut_ptr().cast::<u8>(), w.len) };
            quant::pack_q4_k_x8(w.file_bytes(), cols, dst)?;
            w.interleaved = Some(lines);
            gguf.release(w.start, w.len);
        }
        Ok(w)
    }

    fn file_bytes(&self) -> &[u8] {
        &self.file.bytes()[self.start..self.start + self.len]
    }

    /// The weight's bytes in plain GGUF layout, or `None` where it was repacked.
    pub fn bytes(&self) -> Option<&[u8]> {
        self.interleaved.is_none().then(|| self.file_bytes())
    }

    /// The Q4_K×8 bytes, where the weight was repacked at load.
    pub fn interleaved(&self) -> Option<&[u8]> {
        // SAFETY: as in `load`: `len` initialized bytes.
        self.interleaved
            .as_ref()
            .map(|l| unsafe { std::slice::from_raw_parts(l.as_ptr().cast::<u8>(), self.len) })
    }

    /// Row `r` in plain GGUF layout (copied out of a repacked weight).
    pub fn row(&self, r: usize) -> Result<Cow<'_, [u8]>> {
        if let Some(packed) = self.interleaved() {
            let mut row = vec![0u8; self.row_size];
            quant::unpack_q4_k_x8_row(packed, self.cols, r, &mut row)?;
            return Ok(Cow::Owned(row));
        }
        Ok(Cow::Borrowed(&self.file_bytes()[r * self.row_size..(r + 1) * self.row_size]))
    }

    /// Where the weight starts in its file (a key for caches).
    pub(super) fn key(&self) -> (usize, usize) {
        (Arc::as_ptr(&self.file) as usize, self.start)
    }

    /// The weight as f32 values (small vectors: norms, biases).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (r, dst) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            let row = self.row(r).expect("rows checked at load");
            quant::dequantize_row(self.ty, &row, dst).expect("type checked at load");
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
fn has_q4_k_x8_kernels() -> bool {
    quant::q4_k_x8_kernels().is_some()
}

#[cfg(not(target_arch = "x86_64"))]
fn has_q4_k_x8_kernels() -> bool {
    false
}
