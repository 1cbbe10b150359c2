//! Attention over quantized caches (`crate::kv::types`), in the arithmetic of ggml's
//! one-chunk flash attention for such caches: the query rotated by the K cache's
//! Walsh-Hadamard transform and quantized to the K type's `vec_dot_type`, each key's score
//! the type's dot product of its blocks with it (`quant::vec_dot_fn`, ggml's x86 float
//! order; where the type has matmul tiles, two keys by four queries of a group a call, the
//! same bits), times the scale; values dequantized (`to_float`) and accumulated in f32, the
//! accumulator rescaled wherever a key raises the maximum; the output rotated back by the
//! V cache's transform. The blocks are read where they lie: only a block of keys' values
//! is dequantized at a time, into the task's scratch.

use half::f16;

use crate::kv::hadamard;
use crate::quant::{self, GgmlType, VecDotFn};

/// A cache as the attention reads it.
#[derive(Clone, Copy)]
pub enum Cache<'a> {
    /// f16 values: K in tiles of 16 slots (`kv_buf.rs`), V in rows.
    F16(&'a [f16]),
    /// Rows of blocks of `ty`, each slot's row rotated in groups of `rot` values.
    Blocks(Blocks<'a>),
}

/// A quantized cache: a row of blocks per slot.
#[derive(Clone, Copy)]
pub struct Blocks<'a> {
    pub data: &'a [u8],
    pub ty: GgmlType,
    pub rot: Option<usize>,
}

impl<'a> Cache<'a> {
    /// The f16 values (empty for a quantized cache).
    pub fn f16(&self) -> &'a [f16] {
        match self {
            Cache::F16(c) => c,
            Cache::Blocks(_) => &[],
        }
    }

    pub fn blocks(&self) -> Option<Blocks<'a>> {
        match self {
            Cache::F16(_) => None,
            Cache::Blocks(b) => Some(*b),
        }
    }

    /// The cache's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        match self {
            Cache::F16(c) => bytemuck::cast_slice(c),
            Cache::Blocks(b) => b.data,
        }
    }
}

/// A quantized cache's geometry for one attention call: bytes per slot and per head.
#[derive(Clone, Copy)]
pub struct Layout {
    pub row: usize,
    pub head: usize,
}

impl Layout {
    pub fn new(ty: GgmlType, n_head_kv: usize, head_dim: usize) -> Layout {
        let head = ty.row_size(head_dim).unwrap_or(0);
        Layout { row: head * n_head_kv, head }
    }
}

/// Query rows [`QuantKeys::scores_tile`] scores at once; the task's quantized queries have
/// room for this many rows past the last.
pub const QUERY_TILE: usize = 4;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(QUERY_TILE == quant::TILE);

/// The K side of a task over a quantized K cache: its queries, quantized.
pub struct QuantKeys<'a> {
    blocks: Blocks<'a>,
    layout: Layout,
    dot: VecDotFn,
    /// The type's matmul tiles (the same bits as `dot`), where kiln has them.
    #[cfg(target_arch = "x86_64")]
    tiles: Option<quant::TileKernels>,
    /// Bytes of a quantized query row.
    q_row: usize,
    hd: usize,
}

impl<'a> QuantKeys<'a> {
    pub fn new(blocks: Blocks<'a>, n_head_kv: usize, hd: usize) -> Self {
        let q_row = blocks.ty.vec_dot_type().row_size(hd).unwrap_or(0);
        let layout = Layout::new(blocks.ty, n_head_kv, hd);
        QuantKeys {
            blocks,
            layout,
            dot: quant::vec_dot_fn(blocks.ty),
            #[cfg(target_arch = "x86_64")]
            tiles: quant::tile_kernels(blocks.ty),
            q_row,
            hd,
        }
    }

    /// Bytes the task's quantized queries take per row.
    pub fn q_row(&self) -> usize {
        self.q_row
    }

    /// Query `q` (f32, `hd` values; rotated in place) quantized into `dst` as ggml's CPU
    /// quantizes a row for the K type's dot product.
    pub fn quantize_query(&self, q: &mut [f32], dst: &mut [u8]) {
        if let Some(n) = self.blocks.rot {
            hadamard(q, n);
        }
        let vdt = self.blocks.ty.vec_dot_type();
        quant::quantize_activation(vdt, q, dst).expect("a query row of whole blocks");
    }

    /// `w[i] = dot(key i, q) * scale` for `i` in `a..b`, key `i` at slot `slot(i)` of KV
    /// head `kvh`; returns their maximum.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub fn scores(
        &self,
        q: &[u8],
        kvh: usize,
        slot: impl Fn(usize) -> usize,
        scale: f32,
        w: &mut [f32],
        a: usize,
        b: usize,
    ) -> f32 {
        let mut max = f32::NEG_INFINITY;
        for (i, w) in w.iter_mut().enumerate().take(b).skip(a) {
            let at = slot(i) * self.layout.row + kvh * self.layout.head;
            *w = (self.dot)(&self.blocks.data[at..at + self.layout.head], q, self.hd) * scale;
            max = if *w > max { *w } else { max };
        }
        max
    }

    /// [`Self::scores`] of up to [`QUERY_TILE`] query rows that see the same keys
    /// (`wts[0].a..wts[0].b`) of KV head `kvh`, at consecutive slots from `slot0`: their
    /// quantized queries one after another in `q` (with room for [`QUERY_TILE`]), weights
    /// into `wts`, maxima into `max`. The matmul tiles load two keys' blocks once for four
    /// queries, each dot in the single dot product's operations (the same bits). False,
    /// writing nothing, where the type has no tiles.
    #[inline(always)]
    pub fn scores_tile(
        &self,
        q: &[u8],
        kvh: usize,
        slot0: usize,
        scale: f32,
        wts: &mut [super::Weights],
        max: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        if let Some(tk) = &self.tiles {
            let (a, b, rows) = (wts[0].a, wts[0].b, wts.len());
            let (row, head) = (self.layout.row, self.layout.head);
            let mut m = [f32::NEG_INFINITY; QUERY_TILE];
            let mut out = [0f32; 2 * QUERY_TILE];
            for i in (a..b).step_by(2) {
                let at = (slot0 + i) * row + kvh * head;
                if i + 1 < b {
                    tk.rows2_toks4_strided(&self.blocks.data[at..], row, q, self.hd, &mut out);
                } else {
                    let mut one = [0f32; QUERY_TILE];
                    tk.toks(&self.blocks.data[at..at + head], q, self.hd, QUERY_TILE, &mut one);
                    out[..QUERY_TILE].copy_from_slice(&one);
                }
                for (k, key) in (i..b.min(i + 2)).enumerate() {
                    for (r, (wt, m)) in wts.iter_mut().zip(&mut m).enumerate() {
                        let w = out[k * QUERY_TILE + r] * scale;
                        wt.w[key] = w;
                        *m = if w > *m { w } else { *m };
                    }
                }
            }
            max[..rows].copy_from_slice(&m[..rows]);
            return true;
        }
        let _ = (q, kvh, slot0, scale, wts, max);
        false
    }

    /// The span of slot `slot`'s row holding KV heads `kvs` (to prefetch).
    pub fn span(&self, slot: usize, kvs: &std::ops::Range<usize>) -> (usize, usize) {
        (slot * self.layout.row + kvs.start * self.layout.head, kvs.len() * self.layout.head)
    }

    pub fn row_bytes(&self) -> usize {
        self.layout.row
    }
}

/// Dequantizes a block's value rows of KV heads `kvs` into `dst`, `[KV head][K_BLOCK][hd]`:
/// for each `(i, slot)`, head `j`'s values to row `i` of its block.
pub fn gather_values<E: super::Elem>(
    blocks: Blocks,
    layout: Layout,
    kvs: std::ops::Range<usize>,
    rows: impl Iterator<Item = (usize, usize)>,
    hd: usize,
    dst: &mut [E],
) {
    let f = quant::dequantizer(blocks.ty).expect("a cache type");
    for (i, slot) in rows {
        for (j, kvh) in kvs.clone().enumerate() {
            let at = slot * layout.row + kvh * layout.head;
            let d = &mut dst[(j * super::K_BLOCK + i) * hd..][..hd];
            E::from_blocks(f, &blocks.data[at..at + layout.head], d);
        }
    }
}

/// A row's output rotated back by the V cache's transform, if it has one.
pub fn unrotate(out: &mut [f32], v: &Cache) {
    if let Some(Blocks { rot: Some(n), .. }) = v.blocks() {
        hadamard(out, n);
    }
}
