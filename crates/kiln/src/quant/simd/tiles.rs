//! Matmul tiles: one kernel call computes the dots of R weight rows with T activation rows,
//! so a prefill GEMM unpacks each weight block once for T tokens. A decode GEMV takes one
//! row per call: the weights then stream from DRAM as one sequence.
//!
//! Every (row, token) pair goes through exactly the operations of the single-pair kernel in
//! `avx2.rs`, in the same order, so the result is bit-identical whatever the tile shape:
//! batch invariance (DESIGN.md) holds by construction and is tested below.
//!
//! The `vnni` instantiations replace `maddubs + madd` by `vpdpbusd`; the integer sums are
//! the same (no 16-bit saturation occurs for these quant ranges), so the results too.

#![allow(clippy::needless_range_loop)] // r, t index several tile arrays at once

use std::arch::x86_64::*;

use super::prefetch;

use super::avx2::{bits_32, dot_us8, hsum_epi32, hsum_ps, loadu, nibbles_32};
use super::ktiles::{q4_k_core, q6_k_core};

/// `out[r * T + t] = dot(w row r, a row t)` for `R` weight rows of `ws` bytes starting at
/// `w` and `T` activation rows of `as_` bytes starting at `a`, `nb` blocks each.
type Core = unsafe fn(w: *const u8, ws: usize, a: *const u8, as_: usize, nb: usize, out: *mut f32);

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8i8<const VNNI: bool>(ux: __m256i, sy: __m256i) -> __m256i {
    if VNNI {
        vnni_dot(ux, sy)
    } else {
        dot_us8(ux, sy)
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn vnni_dot(ux: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), ux, sy)
}

/// The two f16 at `p` (scale and min/sum of a block), widened.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_f16(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u32).read_unaligned() as i32))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_core<const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    if T == TILE {
        return q4_1_core_t4::<R, VNNI>(x, xs, y, ys, nb, out);
    }
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut summs = [[0f32; T]; R];
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut dmx = [_mm_setzero_ps(); R];
        for r in 0..R {
            let xb = x.add(r * xs + 20 * i);
            prefetch::block(xb, ahead, 20);
            qx[r] = nibbles_32(xb.add(4));
            dmx[r] = two_f16(xb);
        }
        for t in 0..T {
            let yb = y.add(t * ys + 36 * i);
            let qy = loadu(yb.add(4));
            let dsy = two_f16(yb);
            for r in 0..R {
                // [x.d * y.d, x.m * y.s]: the products the single-pair kernel forms.
                let p = _mm_mul_ps(dmx[r], dsy);
                summs[r][t] += _mm_cvtss_f32(_mm_movehdup_ps(p));
                let s = dot_u8i8::<VNNI>(qx[r], qy);
                acc[r][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(p), _mm256_cvtepi32_ps(s), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(r * T + t) = hsum_ps(acc[r][t]) + summs[r][t];
        }
    }
}

/// `q4_1_core` for four tokens, with the scale products of the four formed by one multiply
/// (lanes `2t, 2t + 1` = `[x.d * y_t.d, x.m * y_t.s]`) and the min sums kept in the odd
/// lanes of one vector: the same float operations per pair, in the same order, in fewer
/// instructions (so the same bits as the other shapes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_core_t4<const R: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); TILE]; R];
    let mut summs = [_mm256_setzero_ps(); R];
    let lane: [__m256i; TILE] = std::array::from_fn(|t| _mm256_set1_epi32(2 * t as i32));
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let word = |p: *const u8| (p as *const i32).read_unaligned();
        let ds = |t: usize| word(y.add(t * ys + 36 * i));
        let dsy = _mm256_cvtph_ps(_mm_setr_epi32(ds(0), ds(1), ds(2), ds(3)));
        let qy: [__m256i; TILE] = std::array::from_fn(|t| loadu(y.add(t * ys + 36 * i + 4)));
        for r in 0..R {
            let xb = x.add(r * xs + 20 * i);
            prefetch::block(xb, ahead, 20);
            let qx = nibbles_32(xb.add(4));
            let p = _mm256_mul_ps(_mm256_cvtph_ps(_mm_set1_epi32(word(xb))), dsy);
            summs[r] = _mm256_add_ps(summs[r], p);
            for t in 0..TILE {
                let s = dot_u8i8::<VNNI>(qx, qy[t]);
                let d = _mm256_permutevar8x32_ps(p, lane[t]);
                acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[r][t]);
            }
        }
    }
    for r in 0..R {
        let mut m = [0f32; 8];
        _mm256_storeu_ps(m.as_mut_ptr(), summs[r]);
        for t in 0..TILE {
            *out.add(r * TILE + t) = hsum_ps(acc[r][t]) + m[2 * t + 1];
        }
    }
}

/// The signed quants of block `xb`: Q8_0's bytes, or Q5_0's nibbles with the fifth bit
/// (`nibble | 0xf0` where the bit is clear is the nibble minus 16 as an i8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_quants<const Q5: bool>(xb: *const u8) -> __m256i {
    if Q5 {
        let high = _mm256_andnot_si256(bits_32(xb.add(2)), _mm256_set1_epi8(0xf0u8 as i8));
        _mm256_or_si256(nibbles_32(xb.add(6)), high)
    } else {
        loadu(xb.add(2))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_core<const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    q0_core::<false, R, T, VNNI>(x, xs, y, ys, nb, out)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0_core<const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    q0_core::<true, R, T, VNNI>(x, xs, y, ys, nb, out)
}

/// Q8_0 or Q5_0 (one f16 scale, signed quants) with Q8_0 activations. Q5_0 takes ggml's
/// generic float steps (`sumf += (x.d · y.d) · f32(sum)` per block, as `q5_0_x16.rs`), Q8_0
/// its AVX2 ones (eight lane chains).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_core<const Q5: bool, const R: usize, const T: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    if T == TILE {
        return q0_core_t4::<Q5, R, VNNI>(x, xs, y, ys, nb, out);
    }
    let wb = if Q5 { 22 } else { 34 };
    let mut acc = [[_mm256_setzero_ps(); T]; R];
    let mut sums = [[0f32; T]; R];
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let mut qx = [_mm256_setzero_si256(); R];
        let mut absx = [_mm256_setzero_si256(); R];
        let mut dx = [_mm_setzero_ps(); R];
        for r in 0..R {
            let xb = x.add(r * xs + wb * i);
            prefetch::block(xb, ahead, wb);
            qx[r] = signed_quants::<Q5>(xb);
            absx[r] = _mm256_sign_epi8(qx[r], qx[r]);
            dx[r] = two_f16(xb);
        }
        for t in 0..T {
            let yb = y.add(t * ys + 34 * i);
            let qy = loadu(yb.add(2));
            let dy = two_f16(yb);
            for r in 0..R {
                let d = _mm_mul_ps(dx[r], dy);
                // The sign moves onto y so one operand is unsigned (as `dot_s8`).
                let s = dot_u8i8::<VNNI>(absx[r], _mm256_sign_epi8(qy, qx[r]));
                if Q5 {
                    sums[r][t] += _mm_cvtss_f32(d) * hsum_epi32(s) as f32;
                } else {
                    acc[r][t] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), _mm256_cvtepi32_ps(s), acc[r][t]);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..T {
            *out.add(r * T + t) = if Q5 { sums[r][t] } else { hsum_ps(acc[r][t]) };
        }
    }
}

/// `q0_core` for four tokens: the four scale products `x.d * y_t.d` formed by one
/// multiply (lane t), each then broadcast; the same float operations per pair.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q0_core_t4<const Q5: bool, const R: usize, const VNNI: bool>(
    x: *const u8,
    xs: usize,
    y: *const u8,
    ys: usize,
    nb: usize,
    out: *mut f32,
) {
    let wb = if Q5 { 22 } else { 34 };
    let mut acc = [[_mm256_setzero_ps(); TILE]; R];
    let mut sums = [[0f32; TILE]; R];
    let lane: [__m256i; TILE] = std::array::from_fn(|t| _mm256_set1_epi32(t as i32));
    let ahead = prefetch::tile_distance(R * xs);
    for i in 0..nb {
        let half = |p: *const u8| (p as *const i16).read_unaligned();
        let d = |t: usize| half(y.add(t * ys + 34 * i));
        let dy = _mm_cvtph_ps(_mm_setr_epi16(d(0), d(1), d(2), d(3), 0, 0, 0, 0));
        let qy: [__m256i; TILE] = std::array::from_fn(|t| loadu(y.add(t * ys + 34 * i + 2)));
        for r in 0..R {
            let xb = x.add(r * xs + wb * i);
            prefetch::block(xb, ahead, wb);
            let qx = signed_quants::<Q5>(xb);
            let absx = _mm256_sign_epi8(qx, qx);
            let p = _mm256_castps128_ps256(_mm_mul_ps(_mm_cvtph_ps(_mm_set1_epi16(half(xb))), dy));
            for t in 0..TILE {
                // The sign moves onto y so one operand is unsigned (as `dot_s8`).
                let s = dot_u8i8::<VNNI>(absx, _mm256_sign_epi8(qy[t], qx));
                let d = _mm256_permutevar8x32_ps(p, lane[t]);
                if Q5 {
                    sums[r][t] += _mm256_cvtss_f32(d) * hsum_epi32(s) as f32;
                } else {
                    acc[r][t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[r][t]);
                }
            }
        }
    }
    for r in 0..R {
        for t in 0..TILE {
            *out.add(r * TILE + t) = if Q5 { sums[r][t] } else { hsum_ps(acc[r][t]) };
        }
    }
}

macro_rules! instances {
    ($core:ident, $avx2:ident, $vnni:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $avx2<const R: usize, const T: usize>(
            x: *const u8,
            xs: usize,
            y: *const u8,
            ys: usize,
            nb: usize,
            out: *mut f32,
        ) {
            $core::<R, T, false>(x, xs, y, ys, nb, out)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn $vnni<const R: usize, const T: usize>(
            x: *const u8,
            xs: usize,
            y: *const u8,
            ys: usize,
            nb: usize,
            out: *mut f32,
        ) {
            $core::<R, T, true>(x, xs, y, ys, nb, out)
        }
    };
}
instances!(q4_1_core, q4_1_avx2, q4_1_vnni);
instances!(q8_0_core, q8_0_avx2, q8_0_vnni);
instances!(q5_0_core, q5_0_avx2, q5_0_vnni);
instances!(q4_k_core, q4_k_avx2, q4_k_vnni);
instances!(q6_k_core, q6_k_avx2, q6_k_vnni);

/// Tile kernels of one weight type: 1 row × 1 to 4 tokens (GEMV, and the tokens a GEMM has
/// past its last whole tile: a row unpacked once for all of them) and 2 rows × 4 tokens
/// (GEMM; the pair shares each activation block's loads).
#[derive(Clone, Copy)]
pub struct TileKernels {
    /// For 1, 2, 3 and 4 tokens.
    toks: [Core; TILE],
    rows2_toks4: Core,
    /// Bytes per weight block and per activation block (the weight's `vec_dot_type`), and
    /// elements per block.
    wb: usize,
    ab: usize,
    bs: usize,
}

/// Rows (or tokens) a wide tile covers.
pub const TILE: usize = 4;

impl TileKernels {
    /// Whether rows of `n` elements are whole blocks of these kernels.
    pub fn fits(&self, n: usize) -> bool {
        n.is_multiple_of(self.bs)
    }

    fn check(&self, w: &[u8], w_rows: usize, a: &[u8], a_rows: usize, n: usize) -> Option<usize> {
        let nb = n / self.bs;
        let ok =
            n.is_multiple_of(self.bs) && w.len() >= w_rows * nb * self.wb && a.len() >= a_rows * nb * self.ab;
        ok.then_some(nb)
    }

    /// The dot of one weight row and one activation row of `n` elements (NaN if mis-sized).
    pub fn one(&self, w: &[u8], a: &[u8], n: usize) -> f32 {
        let mut out = f32::NAN;
        if let Some(nb) = self.check(w, 1, a, 1, n) {
            // SAFETY: the tier was detected before these kernels were handed out and the
            // slices hold the blocks read (checked above).
            unsafe { (self.toks[0])(w.as_ptr(), 0, a.as_ptr(), 0, nb, &mut out) };
        }
        out
    }

    /// `out[r * 4 + t] = dot(w row r, a row t)` for 2 consecutive weight rows and 4
    /// consecutive activation rows.
    pub fn rows2_toks4(&self, w: &[u8], a: &[u8], n: usize, out: &mut [f32; 2 * TILE]) {
        *out = [f32::NAN; 2 * TILE];
        if let Some(nb) = self.check(w, 2, a, TILE, n) {
            // SAFETY: as in `one`.
            unsafe {
                (self.rows2_toks4)(w.as_ptr(), nb * self.wb, a.as_ptr(), nb * self.ab, nb, out.as_mut_ptr())
            };
        }
    }

    /// [`Self::rows2_toks4`] with the two weight rows `ws` bytes apart (e.g. two slots'
    /// keys in a cache whose rows hold several heads).
    pub fn rows2_toks4_strided(&self, w: &[u8], ws: usize, a: &[u8], n: usize, out: &mut [f32; 2 * TILE]) {
        *out = [f32::NAN; 2 * TILE];
        let nb = n / self.bs;
        let fits = ws >= nb * self.wb && w.len() >= ws + nb * self.wb;
        if let Some(nb) = self.check(w, 1, a, TILE, n).filter(|_| fits) {
            // SAFETY: as in `one`; the second row lies inside `w` (checked above).
            unsafe { (self.rows2_toks4)(w.as_ptr(), ws, a.as_ptr(), nb * self.ab, nb, out.as_mut_ptr()) };
        }
    }

    /// `out[t] = dot(w, a row t)` for `nt` (1 to 4) consecutive activation rows (the rest of
    /// `out` NaN).
    pub fn toks(&self, w: &[u8], a: &[u8], n: usize, nt: usize, out: &mut [f32; TILE]) {
        *out = [f32::NAN; TILE];
        if let Some(nb) = self.check(w, 1, a, nt, n).filter(|_| (1..=TILE).contains(&nt)) {
            // SAFETY: as in `one`.
            unsafe { (self.toks[nt - 1])(w.as_ptr(), 0, a.as_ptr(), nb * self.ab, nb, out.as_mut_ptr()) };
        }
    }
}

/// The tile kernels for weights of `ty` at `tier`, where kiln has them.
pub(super) fn tile_kernels(ty: super::GgmlType, tier: super::CpuTier) -> Option<TileKernels> {
    use super::{CpuTier, GgmlType};
    if tier < CpuTier::Avx2 {
        return None;
    }
    let vnni = tier >= CpuTier::Avx512Vnni;
    macro_rules! set {
        ($avx2:ident, $vnni:ident, $wb:expr, $ab:expr, $bs:expr) => {
            if vnni {
                TileKernels {
                    toks: [$vnni::<1, 1>, $vnni::<1, 2>, $vnni::<1, 3>, $vnni::<1, TILE>],
                    rows2_toks4: $vnni::<2, TILE>,
                    wb: $wb,
                    ab: $ab,
                    bs: $bs,
                }
            } else {
                TileKernels {
                    toks: [$avx2::<1, 1>, $avx2::<1, 2>, $avx2::<1, 3>, $avx2::<1, TILE>],
                    rows2_toks4: $avx2::<2, TILE>,
                    wb: $wb,
                    ab: $ab,
                    bs: $bs,
                }
            }
        };
    }
    match ty {
        GgmlType::Q4_1 => Some(set!(q4_1_avx2, q4_1_vnni, 20, 36, 32)),
        GgmlType::Q8_0 => Some(set!(q8_0_avx2, q8_0_vnni, 34, 34, 32)),
        GgmlType::Q5_0 => Some(set!(q5_0_avx2, q5_0_vnni, 22, 34, 32)),
        GgmlType::Q4_K => Some(set!(q4_k_avx2, q4_k_vnni, 144, 292, 256)),
        GgmlType::Q6_K => Some(set!(q6_k_avx2, q6_k_vnni, 210, 292, 256)),
        _ => None,
    }
}
