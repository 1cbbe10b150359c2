//! Matmuls on F16 weights: register tiles of up to [`MR`] weight rows × [`NR`] tokens over
//! the whole row, the rows widened from f16 as loaded (`vcvtph2ps`, exact) and the
//! activations read as f32 rows of F16 values (`quant::round_f16_rows`, once per matmul).
//!
//! Every (row, token) pair takes the arithmetic of `quant::dot_f16_lanes` (llamafile's
//! tinyBLAS on AVX-512, which llama.cpp's CPU runs F16 matmuls through): value `i` is fused
//! into lane `i % 16` in ascending order, then the 16 lanes are summed as
//! `_mm512_reduce_add_ps` does. That order belongs to the pair, not to the tile, so a pair
//! gives the same bits in every tile shape and position, alone or in a batch, prompt or
//! decode (batch invariance, DESIGN.md), and on both tiers here.
//!
//! AVX-512 F: a 16-lane accumulator per pair, so a 4 × 6 tile keeps its 24 accumulators,
//! 4 weight vectors and the activation vector in the 32 registers (llamafile's tile too).
//! AVX2: the 16 lanes as two 8-lane halves, a 2 × 3 tile in the 16 registers.

#![allow(clippy::needless_range_loop)] // r, t index several tile arrays at once

use std::arch::x86_64::*;

use super::avx2::hsum_ps;
use super::{prefetch, CpuTier};

/// `out[r * T + t] = dot(w row r, a row t)` for `R` weight rows of `ws` bytes starting at
/// `w` and `T` activation rows of `as_` bytes starting at `a`, `ng` groups of 16 each.
type Core = unsafe fn(w: *const u8, ws: usize, a: *const u8, as_: usize, ng: usize, out: *mut f32);

/// Most weight rows of a tile (AVX-512).
pub const MR: usize = 4;
/// Most tokens of a tile (AVX-512).
pub const NR: usize = 6;

/// Below this many tokens a call takes one weight row (all the tokens): decode then reads
/// the weights from DRAM as one stream (rows side by side would be several streams a core,
/// each its own DRAM pages, which is markedly slower).
const STREAM_BELOW: usize = 4;

/// Bytes of weight rows that the token tiles walk over before the next rows: a quarter of
/// a core's L2 (1 MiB on Zen 4), so the rows stay there beside the activations.
const WEIGHT_BLOCK_BYTES: usize = 256 << 10;

/// `$body` for `$i` = 0, 1, .., 5 below `$n`, each with `$i` a constant: the tile arrays
/// are then indexed by constants only, so they live in registers (a loop over them, even
/// one unrolled later, leaves some in memory, loaded and stored every step).
macro_rules! unroll {
    ($n:expr, $i:ident, $body:block) => {{
        { const $i: usize = 0; if $i < $n $body }
        { const $i: usize = 1; if $i < $n $body }
        { const $i: usize = 2; if $i < $n $body }
        { const $i: usize = 3; if $i < $n $body }
        { const $i: usize = 4; if $i < $n $body }
        { const $i: usize = 5; if $i < $n $body }
    }};
}

/// The 16-lane tile: `acc[r][t]` lane `j` holds the chain of values `j mod 16`.
#[inline(always)]
unsafe fn core512<const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    ng: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    let mut wv = [_mm512_setzero_ps(); R];
    let ahead = prefetch::tile_distance(R * ws);
    for i in 0..ng {
        unroll!(R, RI, {
            let p = w.add(RI * ws + 32 * i);
            if i % 2 == 0 {
                prefetch::block(p, ahead, 64);
            }
            wv[RI] = _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i));
        });
        unroll!(T, TI, {
            let v = _mm512_loadu_ps(a.add(TI * as_ + 64 * i) as *const f32);
            unroll!(R, RI, {
                acc[RI][TI] = _mm512_fmadd_ps(wv[RI], v, acc[RI][TI]);
            });
        });
    }
    for r in 0..R {
        for t in 0..T {
            let v = acc[r][t];
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            *out.add(r * T + t) = hsum_ps(_mm256_add_ps(_mm512_castps512_ps256(v), hi));
        }
    }
}

/// The 8-lane tile: `lo[r][t]` lane `j` holds the chain of values `j mod 16`, `hi[r][t]`
/// that of values `8 + j mod 16`.
#[inline(always)]
unsafe fn core256<const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    ng: usize,
    out: *mut f32,
) {
    let (mut lo, mut hi) = ([[_mm256_setzero_ps(); T]; R], [[_mm256_setzero_ps(); T]; R]);
    let mut wv = [_mm256_setzero_ps(); R];
    let ahead = prefetch::tile_distance(R * ws);
    macro_rules! half {
        ($acc:ident, $i:ident, $h:literal) => {
            unroll!(R, RI, {
                let p = w.add(RI * ws + 32 * $i + 16 * $h);
                if $h == 0 && $i % 2 == 0 {
                    prefetch::block(p, ahead, 64);
                }
                wv[RI] = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
            });
            unroll!(T, TI, {
                let v = _mm256_loadu_ps(a.add(TI * as_ + 64 * $i + 32 * $h) as *const f32);
                unroll!(R, RI, {
                    $acc[RI][TI] = _mm256_fmadd_ps(wv[RI], v, $acc[RI][TI]);
                });
            });
        };
    }
    for i in 0..ng {
        half!(lo, i, 0);
        half!(hi, i, 1);
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(r * T + t) = hsum_ps(_mm256_add_ps(lo[r][t], hi[r][t]));
        }
    }
}

#[target_feature(enable = "avx512f,avx512vl,avx2,fma,f16c")]
unsafe fn avx512<const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    ng: usize,
    out: *mut f32,
) {
    core512::<R, T>(w, ws, a, as_, ng, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<const R: usize, const T: usize>(
    w: *const u8,
    ws: usize,
    a: *const u8,
    as_: usize,
    ng: usize,
    out: *mut f32,
) {
    core256::<R, T>(w, ws, a, as_, ng, out)
}

/// F16 matmul tiles for one CPU tier: the cores of every shape up to `mr` × `nr`.
#[derive(Clone, Copy)]
pub struct F16Gemm {
    /// `cores[r - 1][t - 1]`: `r` rows × `t` tokens (shapes past `mr` × `nr` unused).
    cores: &'static [[Core; NR]; MR],
    mr: usize,
    nr: usize,
}

impl F16Gemm {
    /// Values per group of lanes: rows must be whole groups.
    pub const GROUP: usize = 16;

    /// Whether rows of `n` values are whole groups.
    pub fn fits(n: usize) -> bool {
        n.is_multiple_of(Self::GROUP)
    }

    /// The largest tile, rows × tokens.
    pub fn tile(&self) -> (usize, usize) {
        (self.mr, self.nr)
    }

    /// `put(t, r, dot(w row r, a row t))` for `rows` weight rows of `n` F16 values (`ws`
    /// bytes apart, from the start of `w`) and `n_tok` activation rows of `n` f32 (`4 n`
    /// bytes each: `quant::round_f16_rows`). Tile by tile: in blocks of rows, tokens `nr`
    /// at a time over the block, so the block's weights and a tile's activations stay in
    /// cache; under [`STREAM_BELOW`] tokens, a row at a time. Returns false, calling
    /// nothing, if `n` is not whole groups or a slice is too short.
    #[allow(clippy::too_many_arguments)]
    pub fn dots(
        &self,
        w: &[u8],
        ws: usize,
        rows: usize,
        a: &[u8],
        n_tok: usize,
        n: usize,
        mut put: impl FnMut(usize, usize, f32),
    ) -> bool {
        let ok = Self::fits(n)
            && ws >= 2 * n
            && (rows == 0 || w.len() >= (rows - 1) * ws + 2 * n)
            && a.len() >= n_tok * 4 * n;
        if !ok {
            return false;
        }
        let (mr, tn) = if n_tok < STREAM_BELOW { (1, n_tok) } else { (self.mr, self.nr) };
        let block = (WEIGHT_BLOCK_BYTES / ws).max(1).next_multiple_of(mr);
        let mut out = [0f32; MR * NR];
        for b0 in (0..rows).step_by(block) {
            let b1 = (b0 + block).min(rows);
            for t0 in (0..n_tok).step_by(tn.max(1)) {
                let nt = tn.min(n_tok - t0);
                for r0 in (b0..b1).step_by(mr) {
                    let nr = mr.min(b1 - r0);
                    // SAFETY: the tier was detected before these cores were handed out; rows
                    // r0..r0 + nr of `w` and tokens t0..t0 + nt of `a` lie inside the
                    // slices (checked above), and `out` holds nr × nt values.
                    unsafe {
                        (self.cores[nr - 1][nt - 1])(
                            w.as_ptr().add(r0 * ws),
                            ws,
                            a.as_ptr().add(t0 * 4 * n),
                            4 * n,
                            n / Self::GROUP,
                            out.as_mut_ptr(),
                        )
                    };
                    for r in 0..nr {
                        for t in 0..nt {
                            put(t0 + t, r0 + r, out[r * nt + t]);
                        }
                    }
                }
            }
        }
        true
    }
}

/// The F16 matmul tiles at `tier` (AVX-512 F: 4 × 6 of 16 lanes; AVX2: 2 × 3 of 2 × 8).
pub(super) fn f16_gemm(tier: CpuTier) -> Option<F16Gemm> {
    macro_rules! row {
        ($f:ident, $r:literal) => {
            [$f::<$r, 1>, $f::<$r, 2>, $f::<$r, 3>, $f::<$r, 4>, $f::<$r, 5>, $f::<$r, 6>]
        };
    }
    macro_rules! cores {
        ($f:ident) => {
            [row!($f, 1), row!($f, 2), row!($f, 3), row!($f, 4)]
        };
    }
    static AVX2: [[Core; NR]; MR] = cores!(avx2);
    static AVX512: [[Core; NR]; MR] = cores!(avx512);
    match tier {
        CpuTier::Scalar => None,
        CpuTier::Avx2 => Some(F16Gemm { cores: &AVX2, mr: 2, nr: 3 }),
        CpuTier::Avx512 | CpuTier::Avx512Vnni | CpuTier::Amx => {
            Some(F16Gemm { cores: &AVX512, mr: MR, nr: NR })
        }
    }
}
