//! The attention kernels specialized to a head size of 16·N values (N a multiple of 4:
//! 64, 128, 256), AVX-512 F: the scores of 16 keys come from their K tile with a key in
//! each lane, several query rows per load of the tile; each row's accumulator stays in
//! registers, and rows' walks interleave their independent dependency chains. Lane for
//! lane the arithmetic of the generic primitives in `mod.rs`, so the same bits
//! (`reference_tests` there).

use std::arch::x86_64::*;

use super::simd::wide::round16;
use half::f16;

use super::{Elem, Kernel, Rows, Weights, K_BLOCK};
use crate::backend::cpu::expf::simd::expf16;

/// The kernels for heads of `16 * N` values, `N` a multiple of 4 (whole blocks of
/// 64 in ggml's dot, so no f64 tail): the accumulators in registers. K tiles are read
/// in place as f16, widened as loaded (exact), once per [`Kernel::SCORE_ROWS`] query rows
/// of their KV head; value rows as `E`: f32 widened into scratch once per block, or the
/// cache's f16 in place, widened as loaded. In place saves the block's copy but widens
/// each value once per [`Kernel::WALK_ROWS`] rows, so it pays where few rows read a KV
/// head (`mod.rs` run_heads).
pub struct Heads<const N: usize, E>(std::marker::PhantomData<E>);

/// Loads 16 values of a row, widened.
pub trait Load16: Elem {
    /// # Safety
    /// AVX-512 F; 16 values readable at `p`.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Load16 for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Load16 for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
}

impl<const N: usize, E: Load16> Kernel for Heads<N, E> {
    type E = E;
    type KE = f16;

    #[inline(always)]
    fn scores(q: &[f32], kt: &[f16], scale: f32, wt: &mut Weights) -> f32 {
        let mut m = f32::NEG_INFINITY;
        Self::scores_rows(q, kt, scale, std::slice::from_mut(wt), std::slice::from_mut(&mut m));
        m
    }

    /// Rows per load of a tile: at head size 64 up to 8 (so a group of 7 query heads, as
    /// qwen2.5-0.5b's, takes one pass over its keys), else 4 (each row's four accumulators
    /// fill the registers).
    const SCORE_ROWS: usize = if N <= 4 { 8 } else { 4 };

    #[inline(always)]
    fn scores_rows(q: &[f32], kt: &[f16], scale: f32, wt: &mut [Weights], max: &mut [f32]) {
        let r = wt.len();
        assert!(q.len() == r * 16 * N && max.len() == r && kt.len() >= 16 * N * K_BLOCK);
        // SAFETY: only instantiated behind the AVX-512 F check; sizes checked.
        unsafe {
            match r {
                1 => scores_rows::<N, 1>(q, kt, scale, wt, max),
                2 => scores_rows::<N, 2>(q, kt, scale, wt, max),
                3 => scores_rows::<N, 3>(q, kt, scale, wt, max),
                4 => scores_rows::<N, 4>(q, kt, scale, wt, max),
                5 if N <= 4 => scores_rows::<N, 5>(q, kt, scale, wt, max),
                6 if N <= 4 => scores_rows::<N, 6>(q, kt, scale, wt, max),
                7 if N <= 4 => scores_rows::<N, 7>(q, kt, scale, wt, max),
                8 if N <= 4 => scores_rows::<N, 8>(q, kt, scale, wt, max),
                _ => unreachable!("at most SCORE_ROWS rows"),
            }
        }
    }

    #[inline(always)]
    fn raises(w: &mut [f32; K_BLOCK], a: usize, b: usize, m: &mut f32, mb: f32) -> u32 {
        // SAFETY: only instantiated behind the AVX-512 F check.
        let raised = unsafe { raises(w, a, b, *m) };
        *m = if mb > *m { mb } else { *m };
        raised
    }

    #[inline(always)]
    fn exp(w: &mut [f32; K_BLOCK], _a: usize, _b: usize) {
        // SAFETY: as above; lanes outside `a..b` are computed and ignored.
        unsafe { _mm512_storeu_ps(w.as_mut_ptr(), expf16(_mm512_loadu_ps(w.as_ptr()))) }
    }

    #[inline(always)]
    fn walk<const ROUND: bool>(acc: &mut [f32], vb: Rows<E>, wt: &Weights, sum: &mut f32) {
        Self::walk_rows::<ROUND>(acc, vb, std::slice::from_ref(wt), std::slice::from_mut(sum))
    }

    /// As many rows' accumulators as fit in the 32 registers beside the value being added.
    const WALK_ROWS: usize = if N <= 4 {
        4
    } else if N <= 8 {
        2
    } else {
        1
    };

    #[inline(always)]
    fn walk_rows<const ROUND: bool>(acc: &mut [f32], vb: Rows<E>, wt: &[Weights], sum: &mut [f32]) {
        let r = wt.len();
        assert!(
            acc.len() == r * 16 * N && sum.len() == r && vb.data.len() >= (K_BLOCK - 1) * vb.stride + 16 * N
        );
        // SAFETY: only instantiated behind the AVX-512 F check, with the sizes checked.
        unsafe {
            match r {
                1 => walk::<N, 1, ROUND, E>(acc, vb, wt, sum),
                2 if N <= 8 => walk::<N, 2, ROUND, E>(acc, vb, wt, sum),
                3 if N <= 4 => walk::<N, 3, ROUND, E>(acc, vb, wt, sum),
                4 if N <= 4 => walk::<N, 4, ROUND, E>(acc, vb, wt, sum),
                _ => unreachable!("at most WALK_ROWS rows"),
            }
        }
    }
}

/// The scaled scores of `R` rows over the same keys (each tile vector loaded and widened
/// once for all) into their `w`, and the maximum of each row's keys `a..b`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores_rows<const N: usize, const R: usize>(
    q: &[f32],
    kt: &[f16],
    scale: f32,
    wt: &mut [Weights],
    max: &mut [f32],
) {
    let d = dots::<N, R>(q.as_ptr(), kt.as_ptr());
    for (r, (wt, m)) in wt.iter_mut().zip(max).enumerate() {
        let s = _mm512_mul_ps(d[r], _mm512_set1_ps(scale));
        _mm512_storeu_ps(wt.w.as_mut_ptr(), s);
        let live = ((1u32 << wt.b) - (1u32 << wt.a)) as u16;
        *m = _mm512_reduce_max_ps(_mm512_mask_blend_ps(live, _mm512_set1_ps(f32::NEG_INFINITY), s));
    }
}

/// The scalar walk's running maximum for all keys at once: the maximum before key `i` is
/// `m` or a prefix maximum of the scores (four shift-and-max steps), so each key's
/// `expf` argument and whether it raised the maximum follow lane by lane. (Ties between
/// zeros of either sign may pick the other zero; the `expf` arguments then differ only
/// in the sign of a zero, which `expf` maps to the same 1.)
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn raises(w: &mut [f32; K_BLOCK], a: usize, b: usize, m: f32) -> u32 {
    let live = ((1u32 << b) - (1u32 << a)) as u16;
    let ninf = _mm512_castps_si512(_mm512_set1_ps(f32::NEG_INFINITY));
    let s = _mm512_mask_blend_ps(live, _mm512_castsi512_ps(ninf), _mm512_loadu_ps(w.as_ptr()));
    // Lane i <- lane i - K, the first K lanes -inf.
    macro_rules! up {
        ($p:expr, $k:literal) => {
            _mm512_castsi512_ps(_mm512_alignr_epi32::<{ 16 - $k }>(_mm512_castps_si512($p), ninf))
        };
    }
    let mut p = s;
    p = _mm512_max_ps(p, up!(p, 1));
    p = _mm512_max_ps(p, up!(p, 2));
    p = _mm512_max_ps(p, up!(p, 4));
    p = _mm512_max_ps(p, up!(p, 8));
    // The running maximum before each key.
    let prev = _mm512_max_ps(_mm512_set1_ps(m), up!(p, 1));
    let raised = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(live, s, prev);
    let args = _mm512_mask_blend_ps(raised, _mm512_sub_ps(s, prev), _mm512_sub_ps(prev, s));
    _mm512_storeu_ps(w.as_mut_ptr(), args);
    raised as u32
}

/// `dot_f16(q, key i)` for the K_BLOCK keys of a tile (`[16 N][K_BLOCK]` f16 at `kt`) and
/// `R` query rows (one after another at `q`), key `i` in lane `i`: ggml's four accumulators
/// per row, then `reduce16`'s tree (`t1[l] = x[l + 8] + x[l]`, `t2[l] = t1[l + 4] + t1[l]`,
/// `(t2[0] + t2[2]) + (t2[1] + t2[3])`), each vector of the tile widened once for all rows.
///
/// # Safety
/// AVX-512 F; `16 N` values per row at `q`, the whole tile at `kt`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dots<const N: usize, const R: usize>(q: *const f32, kt: *const f16) -> [__m512; R] {
    // t2[g] = (x[g + 12] + x[g + 4]) + (x[g + 8] + x[g]) (a macro: a closure is compiled
    // without the target features, so it is called).
    macro_rules! t2 {
        ($g:expr) => {{
            let hi = add::<R>(x::<N, R>(q, kt, $g + 12), x::<N, R>(q, kt, $g + 4));
            add::<R>(hi, add::<R>(x::<N, R>(q, kt, $g + 8), x::<N, R>(q, kt, $g)))
        }};
    }
    // Each pair of groups summed as it is done (fewer live registers).
    let s02 = add::<R>(t2!(0), t2!(2));
    add::<R>(s02, add::<R>(t2!(1), t2!(3)))
}

/// `a + b` lane by lane, for each row.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn add<const R: usize>(a: [__m512; R], b: [__m512; R]) -> [__m512; R] {
    let mut o = a;
    for (o, b) in o.iter_mut().zip(b) {
        *o = _mm512_add_ps(*o, b);
    }
    o
}

/// Lane `l` of ggml's `(acc0 + acc2) + (acc1 + acc3)` for each of `R` rows, over the 16
/// keys. With one block of 64 (`N` = 4) each accumulator is a single product, exact for f16
/// values, so `acc0 + acc2` is one multiply-add onto `acc2` (ggml's own first multiply-add
/// adds to +0, so `acc2` is never -0 and the sum is the same).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // r and j index several arrays at once
unsafe fn x<const N: usize, const R: usize>(q: *const f32, kt: *const f16, l: usize) -> [__m512; R] {
    let z = _mm512_setzero_ps();
    let load = |d: usize| _mm512_cvtph_ps(_mm256_loadu_si256(kt.add(d * K_BLOCK).cast()));
    let qd = |r: usize, d: usize| _mm512_set1_ps(*q.add(r * 16 * N + d));
    let mut out = [z; R];
    if N == 4 {
        let k = [load(l), load(16 + l), load(32 + l), load(48 + l)];
        for r in 0..R {
            let a2 = _mm512_fmadd_ps(qd(r, 32 + l), k[2], z);
            let a3 = _mm512_fmadd_ps(qd(r, 48 + l), k[3], z);
            let s02 = _mm512_fmadd_ps(qd(r, l), k[0], a2);
            out[r] = _mm512_add_ps(s02, _mm512_fmadd_ps(qd(r, 16 + l), k[1], a3));
        }
        return out;
    }
    let mut acc = [[z; 4]; R];
    for i in 0..N / 4 {
        for j in 0..4 {
            let k = load(64 * i + 16 * j + l);
            for r in 0..R {
                acc[r][j] = _mm512_fmadd_ps(qd(r, 64 * i + 16 * j + l), k, acc[r][j]);
            }
        }
    }
    for r in 0..R {
        out[r] = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][2]), _mm512_add_ps(acc[r][1], acc[r][3]));
    }
    out
}

/// The walk of `R` rows over their keys `wt[0].a..wt[0].b` (the same for all), with
/// each row's accumulator (`16 · N` values at `acc[r · 16N..]`) in registers: a key that
/// raised its row's maximum rescales the row first; `scale_f16` and `mad_f16` lane for lane
/// where `ROUND`, else f32 multiplies and multiply-adds.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn walk<const N: usize, const R: usize, const ROUND: bool, E: Load16>(
    acc: &mut [f32],
    vb: Rows<E>,
    wt: &[Weights],
    sum: &mut [f32],
) {
    let hd = 16 * N;
    let mut a = [[_mm512_setzero_ps(); N]; R];
    let mut s = [0f32; R];
    for (r, ar) in a.iter_mut().enumerate() {
        for (j, v) in ar.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(acc.as_ptr().add(r * hd + 16 * j));
        }
    }
    s.copy_from_slice(&sum[..R]);
    for i in wt[0].a..wt[0].b {
        // The value row, widened once for all rows.
        let p = vb.data.as_ptr().add(i * vb.stride);
        let mut v = [_mm512_setzero_ps(); N];
        for (j, v) in v.iter_mut().enumerate() {
            *v = E::load16(p.add(16 * j));
        }
        for r in 0..R {
            let e = wt[r].w[i];
            // The block arithmetic rescales once per block, before the walk (`raised` empty).
            let (ms, vs) = if wt[r].raised >> i & 1 == 1 {
                let m = _mm512_set1_ps(e);
                for a in a[r].iter_mut() {
                    let x = _mm512_mul_ps(*a, m);
                    *a = if ROUND { round16(x) } else { x };
                }
                (e, 1.0)
            } else {
                (1.0, e)
            };
            let w = _mm512_set1_ps(vs);
            for (a, &v) in a[r].iter_mut().zip(&v) {
                let x = _mm512_fmadd_ps(v, w, *a);
                *a = if ROUND { round16(x) } else { x };
            }
            // With `ms` 1 this is `s + vs` exactly.
            s[r] = s[r].mul_add(ms, vs);
        }
    }
    for (r, ar) in a.iter().enumerate() {
        for (j, v) in ar.iter().enumerate() {
            _mm512_storeu_ps(acc.as_mut_ptr().add(r * hd + 16 * j), *v);
        }
    }
    sum[..R].copy_from_slice(&s);
}
