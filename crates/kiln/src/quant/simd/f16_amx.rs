//! Encoders' F16 matmuls on AMX-BF16 tiles (`tdpbf16ps`: a 16×32 bf16 tile times a 32×16
//! bf16 tile into 16×16 f32 per instruction). Four of them make one F16 product (below),
//! still about twice the rate of the 512-bit FMA tiles (`examples/tile_bench`).
//!
//! An F16 value (and an activation rounded to F16, as ggml rounds them) has 11 significant
//! bits; bf16 has 8. Each value is split exactly into `hi + lo`: `hi` the value rounded to
//! bf16, `lo` the remainder, at most 3 significant bits, so also a bf16. A product is then
//! `wh·xh + wh·xl + wl·xh + wl·xl`, each term exact in f32, four tile products per step.
//! Dropping `wl·xl` (at most 2⁻¹⁶ of a product) would save a quarter of them, but the
//! synthetic encoders' fixtures, which amplify any change of rounding, move past their
//! tolerance with it. The sums are f32 in the tile unit's order, not tinyBLAS's lane order
//! that the FMA tiles (`f16_gemm.rs`) reproduce, so results differ from those (and from
//! llama.cpp's) by float rounding: about 5·10⁻⁸ of the sum of |products|.
//!
//! Every (row, token) pair is the same sequence of instructions whatever the tile, batch or
//! blocking: per 32-value step, the four products of the halves into the pair's
//! accumulator in one order, steps in order. So a pair's bits do not depend on the other rows or tokens (batch invariance).
//!
//! Layouts: the activations of 16 tokens are `[step][hi | lo][token][32 bf16]` (a token's
//! values in order: the A operand reads them as is); a panel of 16 weight rows is
//! `[step][hi | lo][pair][row][2 bf16]` (the B operand's pairs of values), laid out once per
//! matmul and read by every token tile. The sums come out `[token][row]`, a token's 16 rows
//! side by side as the output holds them. Tokens and rows past the end are zero.

use std::arch::asm;
use std::arch::x86_64::*;

use super::amx::{tile_config, Aligned, TILE_BYTES};

/// Values per step (a tile's depth).
const STEP: usize = 32;
/// Bytes of one step of a panel or of a token tile: hi and lo tiles.
const STEP_BYTES: usize = 2 * TILE_BYTES;
/// Token tiles multiplied together (one accumulator tile each).
const GROUP: usize = 4;

/// The F16 AMX kernel (only handed out where the CPU has AMX-BF16 and the tile state).
#[derive(Clone, Copy)]
pub struct F16Amx(());

pub(super) fn kernel(tier: super::CpuTier) -> Option<F16Amx> {
    (tier >= super::CpuTier::Amx && super::amx::has_bf16()).then_some(F16Amx(()))
}

impl F16Amx {
    /// Weight rows of a panel.
    pub const ROWS: usize = 16;
    /// Tokens of a token tile.
    pub const TOKENS: usize = 16;

    /// Whether rows of `k` values are whole steps.
    pub fn fits(k: usize) -> bool {
        k > 0 && k.is_multiple_of(STEP)
    }

    /// Bytes of a panel of 16 rows, or of one token tile, of `k` values.
    pub fn tile_len(k: usize) -> usize {
        k / STEP * STEP_BYTES
    }

    /// Lays out up to 16 weight rows (`w`: `rows` rows of `k` F16 values, `ws` bytes apart)
    /// as a panel (`dst`: [`Self::tile_len`] bytes). Returns false, writing nothing, if a
    /// size is off.
    pub fn panel(&self, w: &[u8], ws: usize, rows: usize, k: usize, dst: &mut [u8]) -> bool {
        let ok = Self::fits(k)
            && rows <= Self::ROWS
            && ws >= 2 * k
            && (rows == 0 || w.len() >= (rows - 1) * ws + 2 * k)
            && dst.len() >= Self::tile_len(k);
        if ok {
            dst[..Self::tile_len(k)].fill(0);
            // SAFETY: the kernel is handed out only where AVX-512 BW is present; every
            // read lies in `w` and every write in `dst` (checked above).
            unsafe { panel(w.as_ptr(), ws, rows, k, dst.as_mut_ptr()) };
        }
        ok
    }

    /// Lays out up to 16 activation rows (`x`: whole rows of `k` f32) as a token tile
    /// (`dst`: [`Self::tile_len`] bytes), each value rounded to F16 first. Returns false,
    /// writing nothing, if a size is off.
    pub fn token_tile(&self, x: &[f32], k: usize, dst: &mut [u8]) -> bool {
        let n = x.len().checked_div(k).unwrap_or(0);
        let ok = Self::fits(k) && x.len() == n * k && n <= Self::TOKENS && dst.len() >= Self::tile_len(k);
        if ok {
            // SAFETY: as in `panel`; the CPU has F16C with AVX-512.
            unsafe { token_tile(x.as_ptr(), n, k, dst.as_mut_ptr()) };
        }
        ok
    }

    /// `out[t · ldo + r] = dot(row r, token t)` for the first `rows` rows of `panel` and the
    /// tokens `0..n_tok` of `acts` (consecutive token tiles). Returns false, writing
    /// nothing, if a size is off.
    #[allow(clippy::too_many_arguments)]
    pub fn dots(
        &self,
        panel: &[u8],
        acts: &[u8],
        k: usize,
        n_tok: usize,
        rows: usize,
        out: &mut [f32],
        ldo: usize,
    ) -> bool {
        let tl = Self::tile_len(k);
        let tiles = n_tok.div_ceil(Self::TOKENS);
        let ok = Self::fits(k)
            && panel.len() >= tl
            && acts.len() >= tiles * tl
            && rows <= Self::ROWS
            && ldo >= rows
            && (n_tok == 0 || out.len() >= (n_tok - 1) * ldo + rows);
        if !ok {
            return false;
        }
        let mut c = Aligned::<{ GROUP * TILE_BYTES }>([0; GROUP * TILE_BYTES]);
        for g0 in (0..tiles).step_by(GROUP) {
            let nt = GROUP.min(tiles - g0);
            // SAFETY: AMX-BF16 and the tile state were checked before the kernel was handed
            // out; the panel holds k / 32 steps, `acts` `nt` tiles of them from `g0`, `c`
            // `nt` tiles.
            unsafe {
                multiply(acts.as_ptr().add(g0 * tl), panel.as_ptr(), k / STEP, tl, nt, c.0.as_mut_ptr())
            };
            let c = bytemuck::cast_slice::<u8, f32>(&c.0);
            let t0 = g0 * Self::TOKENS;
            for t in t0..(t0 + nt * Self::TOKENS).min(n_tok) {
                out[t * ldo..][..rows].copy_from_slice(&c[(t - t0) * 16..][..rows]);
            }
        }
        true
    }
}

/// The hi and lo bf16 halves of 16 f32 values of at most 11 significant bits: `hi` each
/// rounded to bf16 (to nearest, ties to even), `lo` the exact remainder; as f32 bits.
#[inline(always)]
unsafe fn split(v: __m512) -> (__m512i, __m512i) {
    let bits = _mm512_castps_si512(v);
    let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    let up = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd));
    let hi = _mm512_and_si512(up, _mm512_set1_epi32(0xffff_0000u32 as i32));
    let lo = _mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(hi)));
    (hi, lo)
}

/// The upper 16 bits of each lane of `a` then of `b`: 32 bf16 in order.
#[inline(always)]
unsafe fn pack(a: __m512i, b: __m512i) -> __m512i {
    let idx = _mm512_set_epi16(
        63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15,
        13, 11, 9, 7, 5, 3, 1,
    );
    _mm512_permutex2var_epi16(a, idx, b)
}

/// 32 values of a step (f32, F16-valued) as (hi, lo): 32 bf16 each, in order.
#[inline(always)]
unsafe fn step_halves(v0: __m512, v1: __m512) -> (__m512i, __m512i) {
    let ((h0, l0), (h1, l1)) = (split(v0), split(v1));
    (pack(h0, h1), pack(l0, l1))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn panel(w: *const u8, ws: usize, rows: usize, k: usize, dst: *mut u8) {
    // Row r's pair i of a step goes to dword i * 16 + r of its tile.
    let pairs = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(16),
    );
    for s in 0..k / STEP {
        let at = dst.add(s * STEP_BYTES);
        for r in 0..rows {
            let p = w.add(r * ws + 2 * STEP * s);
            let v0 = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
            let v1 = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(32) as *const __m256i));
            let (hi, lo) = step_halves(v0, v1);
            let idx = _mm512_add_epi32(pairs, _mm512_set1_epi32(r as i32));
            _mm512_i32scatter_epi32::<4>(at as *mut i32, idx, hi);
            _mm512_i32scatter_epi32::<4>(at.add(TILE_BYTES) as *mut i32, idx, lo);
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn token_tile(x: *const f32, n: usize, k: usize, dst: *mut u8) {
    let round =
        |p: *const f32| _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(p)));
    for s in 0..k / STEP {
        let at = dst.add(s * STEP_BYTES);
        for t in 0..F16Amx::TOKENS {
            let (hi, lo) = if t < n {
                let p = x.add(t * k + STEP * s);
                step_halves(round(p), round(p.add(16)))
            } else {
                (_mm512_setzero_si512(), _mm512_setzero_si512())
            };
            _mm512_storeu_si512(at.add(64 * t) as *mut __m512i, hi);
            _mm512_storeu_si512(at.add(TILE_BYTES + 64 * t) as *mut __m512i, lo);
        }
    }
}

/// One accumulator tile per token tile (`nt` ≤ 4) at `a`: per step, each token tile's hi
/// and lo tiles against the panel's, `hh`, `hl`, `lh`, `ll` in that order (token half
/// first); the sums stored to `c` (`[tile][token][row]` f32).
#[target_feature(enable = "avx512f")]
unsafe fn multiply(a: *const u8, b: *const u8, steps: usize, tl: usize, nt: usize, c: *mut u8) {
    let cfg = tile_config();
    asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack));
    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack));
    macro_rules! token_tile {
        ($j:literal, $s:ident) => {
            if $j < nt {
                asm!(
                    "tileloadd tmm6, [{ah} + {st}]",
                    "tileloadd tmm7, [{al} + {st}]",
                    concat!("tdpbf16ps tmm", $j, ", tmm6, tmm4"),
                    concat!("tdpbf16ps tmm", $j, ", tmm6, tmm5"),
                    concat!("tdpbf16ps tmm", $j, ", tmm7, tmm4"),
                    concat!("tdpbf16ps tmm", $j, ", tmm7, tmm5"),
                    ah = in(reg) a.add($j * tl + $s * STEP_BYTES),
                    al = in(reg) a.add($j * tl + $s * STEP_BYTES + TILE_BYTES),
                    st = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
        };
    }
    for s in 0..steps {
        asm!(
            "tileloadd tmm4, [{bh} + {st}]",
            "tileloadd tmm5, [{bl} + {st}]",
            bh = in(reg) b.add(s * STEP_BYTES),
            bl = in(reg) b.add(s * STEP_BYTES + TILE_BYTES),
            st = in(reg) 64usize,
            options(nostack, readonly),
        );
        token_tile!(0, s);
        token_tile!(1, s);
        token_tile!(2, s);
        token_tile!(3, s);
    }
    asm!(
        "tilestored [{c} + {st}], tmm0",
        "tilestored [{c} + {st} + 1024], tmm1",
        "tilestored [{c} + {st} + 2048], tmm2",
        "tilestored [{c} + {st} + 3072], tmm3",
        c = in(reg) c,
        st = in(reg) 64usize,
        options(nostack),
    );
    asm!("tilerelease", options(nostack));
}
