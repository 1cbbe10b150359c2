//! CPU weights: read in place from the mapped GGUF file until first multiplied; then a
//! matrix is copied into its file's [`Arena`] (huge pages), Q4_K, Q5_0 and Q4_1 with rows
//! interleaved where the SIMD tiers have kernels for it (`quant::interleave`: eight Q4_K
//! rows, sixteen Q5_0 or Q4_1 rows; the layout their prefill and decode kernels both read), the others
//! as they are. A table only looked up (an untied `token_embd`) stays in the file, read a
//! row at a time. The file's pages of a copied tensor are then released: a weight is never
//! held twice.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use super::arena::Arena;
use super::ops::SyncPtr;
use super::pool::ThreadPool;
use crate::error::Result;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{self, GgmlType, Interleave};

/// Where a matrix's copy lies: its layout (`None`: plain), its arena and the offset there.
struct ArenaCopy {
    layout: Option<Interleave>,
    arena: Arc<Arena>,
    off: usize,
}

/// A weight matrix (or vector).
pub struct CpuWeight {
    file: Arc<GgufFile>,
    /// The part of the model's files (0 unless split), the offset there and the length (of
    /// a [`Self::requantized`] weight: its copy's length, its file's bytes never read).
    part: usize,
    start: usize,
    len: usize,
    /// Where repacked copies of the file's tensors go (if it could be reserved).
    arena: Option<Arc<Arena>>,
    /// The matrix's copy in the arena (its layout where interleaved, the arena and the
    /// offset there), made at its first matmul; the file's pages are then released. Plain
    /// copies too: decode then streams every matrix from huge pages (qwen2.5-coder-0.5b tg
    /// +4-9% on a Zen 4, its 136 MB Q8_0 output matrix).
    copy: OnceLock<Option<ArenaCopy>>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// Bytes per row.
    pub row_size: usize,
    /// An encoder's weight (`Backend::encoder_weight`), on a backend that runs those on
    /// AMX-BF16 tiles where the CPU has them: it only ever multiplies whole inputs.
    pub encoder: bool,
}

impl CpuWeight {
    pub(super) fn load(gguf: &Arc<GgufFile>, arena: Option<Arc<Arena>>, t: &TensorInfo) -> Result<CpuWeight> {
        let (rows, cols) = t.rows_cols();
        let row_size = t.ty.row_size(cols)?;
        let (part, start) = gguf.tensor_start(t);
        Ok(CpuWeight {
            file: gguf.clone(),
            part,
            start,
            len: t.size as usize,
            arena,
            copy: OnceLock::new(),
            ty: t.ty,
            rows,
            cols,
            row_size,
            encoder: false,
        })
    }

    /// The matrix requantized to `ty` (each row dequantized and quantized again, groups of
    /// rows spread over `pool`), copied now into an arena of its own, interleaved where this
    /// CPU has a layout for `ty`. `None` where `ty` cannot hold rows of this width or memory
    /// is short.
    pub(super) fn requantized(&self, pool: &ThreadPool, ty: GgmlType) -> Option<CpuWeight> {
        let layout = interleave_for(ty).filter(|l| self.rows.is_multiple_of(l.rows()));
        let group = layout.map_or(1, |l| l.rows());
        let row_size = ty.row_size(self.cols).ok()?;
        let len = row_size * self.rows;
        let arena = Arc::new(Arena::new(len).ok()?);
        let (off, dst) = arena.alloc(len)?;
        let (src, src_row) = (self.file_bytes(), self.row_size);
        let per_task = (self.rows / group).div_ceil(8 * pool.n_threads()).max(1) * group;
        let (out, failed) = (SyncPtr(dst.as_mut_ptr()), std::sync::atomic::AtomicBool::new(false));
        pool.run(self.rows.div_ceil(per_task), &|task| {
            let rows = task * per_task..((task + 1) * per_task).min(self.rows);
            // SAFETY: each task writes the bytes of its own rows, inside the arena's `len`.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.get().add(rows.start * row_size), rows.len() * row_size)
            };
            let (mut f, mut plain) = (vec![0f32; self.cols], vec![0u8; group * row_size]);
            for (g, d) in rows.step_by(group).zip(dst.chunks_exact_mut(group * row_size)) {
                let ok = (0..group).all(|i| {
                    let r = g + i;
                    quant::dequantize_row(self.ty, &src[r * src_row..(r + 1) * src_row], &mut f).is_ok()
                        && quant::quantize_row(ty, &f, &mut plain[i * row_size..(i + 1) * row_size]).is_ok()
                });
                let ok = ok
                    && match layout {
                        Some(l) => l.pack(&plain, self.cols, d).is_ok(),
                        None => {
                            d.copy_from_slice(&plain);
                            true
                        }
                    };
                if !ok {
                    failed.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        if failed.into_inner() {
            return None;
        }
        Some(CpuWeight {
            file: self.file.clone(),
            part: self.part,
            start: self.start,
            len,
            arena: None,
            copy: OnceLock::from(Some(ArenaCopy { layout, arena, off })),
            ty,
            rows: self.rows,
            cols: self.cols,
            row_size,
            encoder: false,
        })
    }

    /// A copy of the matrix, interleaved as `layout` or plain (in the file's arena, else in
    /// one of its own), its file pages released afterwards; `None` where memory is short.
    fn repack(&self, layout: Option<Interleave>) -> Option<(Arc<Arena>, usize)> {
        let shared = self.arena.as_ref().filter(|a| a.room() >= self.len).cloned();
        let arena = match shared {
            Some(a) => a,
            None => Arc::new(Arena::new(self.len).ok()?),
        };
        let (off, dst) = arena.alloc(self.len)?;
        match layout {
            Some(layout) => layout.pack(self.file_bytes(), self.cols, dst).ok()?,
            None => {
                // A piece at a time, each piece's file pages released after it (pieces end
                // at whole pages of the file): peak RSS grows by a piece, not the matrix.
                const PIECE: usize = 1 << 20;
                let src = self.file_bytes();
                let mut a = 0;
                while a < self.len {
                    let b = ((self.start + a + 1).next_multiple_of(PIECE) - self.start).min(self.len);
                    dst[a..b].copy_from_slice(&src[a..b]);
                    self.file.release(self.part, self.start + a, b - a);
                    a = b;
                }
            }
        }
        self.file.release(self.part, self.start, self.len);
        Some((arena, off))
    }

    fn file_bytes(&self) -> &[u8] {
        &self.file.part_bytes(self.part)[self.start..self.start + self.len]
    }

    /// The plain bytes: the arena's plain copy where one was made, else the file's.
    fn plain(&self) -> &[u8] {
        match self.copy.get() {
            Some(Some(ArenaCopy { layout: None, arena, off })) => arena.get(*off, self.len),
            _ => self.file_bytes(),
        }
    }

    /// The interleaved layout and bytes where it was repacked (so far).
    fn packed(&self) -> Option<(Interleave, &[u8])> {
        match self.copy.get()? {
            Some(ArenaCopy { layout: Some(layout), arena, off }) => {
                Some((*layout, arena.get(*off, self.len)))
            }
            _ => None,
        }
    }

    /// The arena copy, made on the first call: interleaved where this CPU has kernels for
    /// a layout of the type, else plain. No room for it: the file's bytes are multiplied
    /// in place instead.
    fn copy(&self) {
        self.copy.get_or_init(|| {
            let layout = interleave_for(self.ty).filter(|l| self.rows.is_multiple_of(l.rows()));
            self.repack(layout).map(|(arena, off)| ArenaCopy { layout, arena, off })
        });
    }

    /// For a matmul: the weight's bytes in plain GGUF layout, or `None` where it was
    /// repacked (multiply [`Self::interleaved`]).
    pub fn bytes(&self) -> Option<&[u8]> {
        self.copy();
        self.packed().is_none().then(|| self.plain())
    }

    /// For a matmul: the interleaved layout and bytes where this CPU has kernels for one,
    /// else `None` (multiply [`Self::bytes`]).
    pub fn interleaved(&self) -> Option<(Interleave, &[u8])> {
        self.copy();
        self.packed()
    }

    /// Row `r` in plain GGUF layout (copied out of a repacked weight).
    pub fn row(&self, r: usize) -> Result<Cow<'_, [u8]>> {
        if let Some((layout, packed)) = self.packed() {
            let mut row = vec![0u8; self.row_size];
            layout.unpack_row(packed, self.cols, r, &mut row)?;
            return Ok(Cow::Owned(row));
        }
        Ok(Cow::Borrowed(&self.plain()[r * self.row_size..(r + 1) * self.row_size]))
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

/// The interleaved layout weights of `ty` are repacked into on this CPU, if any.
/// Whether this CPU has kernels for an interleaved layout of `ty`.
pub(super) fn interleaves(ty: GgmlType) -> bool {
    interleave_for(ty).is_some()
}

#[cfg(target_arch = "x86_64")]
fn interleave_for(ty: GgmlType) -> Option<Interleave> {
    match ty {
        GgmlType::Q4_K => quant::q4_k_x8_kernels().map(|_| Interleave::Q4kX8),
        GgmlType::Q5_0 => quant::x16_kernels(ty).map(|_| Interleave::Q5_0X16),
        GgmlType::Q4_1 => quant::x16_kernels(ty).map(|_| Interleave::Q4_1X16),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn interleave_for(_: GgmlType) -> Option<Interleave> {
    None
}
