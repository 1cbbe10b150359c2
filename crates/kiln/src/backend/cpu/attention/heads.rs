//! The attention kernels specialized to a head size of 16·N values (N a multiple of 4:
//! 64, 128, 256), AVX-512 F: the query and each row's accumulator stay in registers, the
//! dot products of 16 keys are reduced together, and two rows' walks interleave their
//! independent dependency chains. Lane for lane the arithmetic of the generic primitives
//! in `mod.rs`, so the same bits (`reference_tests` there).

use std::arch::x86_64::*;

use super::simd::wide::round16;
use half::f16;

use super::{Elem, Kernel, Rows, Weights, K_BLOCK};
use crate::backend::cpu::expf::simd::expf16;

/// The kernels for heads of `16 * N` values, `N` a multiple of 4 (whole blocks of
/// 64 in ggml's dot, so no f64 tail): the query and the accumulators in registers. Rows
/// are read as `E`: f32 widened into scratch once per block, or the cache's f16 in place,
/// widened as loaded (the same bits: widening is exact); the scores of up to
/// [`Kernel::SCORE_ROWS`] query rows of one KV head take each key row's load together. In
/// place saves the block's copy but widens each key once per such load, so it pays where
/// few rows read a KV head (`mod.rs` run_heads).
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

    #[inline(always)]
    fn scores(q: &[f32], kb: Rows<E>, scale: f32, wt: &mut Weights) -> f32 {
        let mut m = f32::NEG_INFINITY;
        Self::scores_rows(q, kb, scale, std::slice::from_mut(wt), std::slice::from_mut(&mut m));
        m
    }

    /// Three query rows of 64 values with a key row beside them fill the registers.
    const SCORE_ROWS: usize = if N <= 4 {
        3
    } else if N <= 8 {
        2
    } else {
        1
    };

    #[inline(always)]
    fn scores_rows(q: &[f32], kb: Rows<E>, scale: f32, wt: &mut [Weights], max: &mut [f32]) {
        let r = wt.len();
        assert!(
            q.len() == r * 16 * N && max.len() == r && kb.data.len() >= (K_BLOCK - 1) * kb.stride + 16 * N
        );
        // SAFETY: only instantiated behind the AVX-512 F check; sizes checked.
        unsafe {
            match r {
                1 => scores_rows::<N, 1, E>(q, kb, scale, wt, max),
                2 if N <= 8 => scores_rows::<N, 2, E>(q, kb, scale, wt, max),
                3 if N <= 4 => scores_rows::<N, 3, E>(q, kb, scale, wt, max),
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
    fn walk<const F16: bool>(acc: &mut [f32], vb: Rows<E>, wt: &Weights, sum: &mut f32) {
        Self::walk_rows::<F16>(acc, vb, std::slice::from_ref(wt), std::slice::from_mut(sum))
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
    fn walk_rows<const F16: bool>(acc: &mut [f32], vb: Rows<E>, wt: &[Weights], sum: &mut [f32]) {
        let r = wt.len();
        assert!(
            acc.len() == r * 16 * N && sum.len() == r && vb.data.len() >= (K_BLOCK - 1) * vb.stride + 16 * N
        );
        // SAFETY: only instantiated behind the AVX-512 F check, with the sizes checked.
        unsafe {
            match r {
                1 => walk::<N, 1, F16, E>(acc, vb, wt, sum),
                2 if N <= 8 => walk::<N, 2, F16, E>(acc, vb, wt, sum),
                3 if N <= 4 => walk::<N, 3, F16, E>(acc, vb, wt, sum),
                4 if N <= 4 => walk::<N, 4, F16, E>(acc, vb, wt, sum),
                _ => unreachable!("at most WALK_ROWS rows"),
            }
        }
    }
}

/// The scaled scores of `R` rows over the same keys (each key row loaded and widened
/// once for all) into their `w`, and the maximum of each row's keys `a..b`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores_rows<const N: usize, const R: usize, E: Load16>(
    q: &[f32],
    kb: Rows<E>,
    scale: f32,
    wt: &mut [Weights],
    max: &mut [f32],
) {
    let d = dots::<N, R, E>(q, kb);
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

/// `dot_f16(q, K row i)` for all K_BLOCK rows and `R` query rows (one after another in
/// `q`), each key row loaded once for all: ggml's four accumulators per row, then
/// `_mm512_reduce_add_ps`'s tree (halves, quarters, pairs) for 16 rows at once by
/// transposing adds, the halves and quarters taken as their keys are done (fewer live
/// registers); each lane's additions are those of `reduce16`, in its order.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // g, p, e and r index several arrays at once
unsafe fn dots<const N: usize, const R: usize, E: Load16>(q: &[f32], kb: Rows<E>) -> [__m512; R] {
    // Plain loops, not `array::from_fn`: a closure there is compiled without this
    // function's target features, so it is called, not inlined (measured: 1.5x slower).
    let mut qv = [[_mm512_setzero_ps(); N]; R];
    for (r, qr) in qv.iter_mut().enumerate() {
        for (j, v) in qr.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(q.as_ptr().add(16 * (r * N + j)));
        }
    }
    // Key i's four accumulators, added: lane l holds a partial sum of row i.
    let dot = |qr: &[__m512; N], k: &[__m512; N]| {
        let mut acc = [_mm512_setzero_ps(); 4];
        for c in 0..N / 4 {
            for (j, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(qr[4 * c + j], k[4 * c + j], *a);
            }
        }
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]))
    };
    let load = |i: usize| {
        let k = kb.data.as_ptr().add(i * kb.stride);
        let mut v = [_mm512_setzero_ps(); N];
        for (j, v) in v.iter_mut().enumerate() {
            *v = E::load16(k.add(16 * j));
        }
        v
    };
    // Halves: [x_a lanes 0-7 | x_b lanes 0-7] + [x_a 8-15 | x_b 8-15].
    let h = |a, b| _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xee>(a, b));
    // Quarters: each 128-bit block then holds one key's four partial sums.
    let qt = |a, b| _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xdd>(a, b));
    let mut z = [[_mm512_setzero_ps(); 4]; R];
    for g in 0..4 {
        let mut y = [[_mm512_setzero_ps(); 2]; R];
        for p in 0..2 {
            // One key row at a time (a head of 256 values fills 16 registers).
            let mut x = [[_mm512_setzero_ps(); 2]; R];
            for e in 0..2 {
                let k = load(4 * g + 2 * p + e);
                for r in 0..R {
                    x[r][e] = dot(&qv[r], &k);
                }
            }
            for r in 0..R {
                y[r][p] = h(x[r][0], x[r][1]);
            }
        }
        for r in 0..R {
            z[r][g] = qt(y[r][0], y[r][1]);
        }
    }
    // Pairs: `(s0 + s2) + (s1 + s3)` within each block.
    let p = |a, b| _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xee>(a, b));
    // Lane 4c + d of `f` holds key 4d + c.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let mut out = [_mm512_setzero_ps(); R];
    for (o, z) in out.iter_mut().zip(&z) {
        let (w0, w1) = (p(z[0], z[1]), p(z[2], z[3]));
        let f = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(w0, w1), _mm512_shuffle_ps::<0xdd>(w0, w1));
        *o = _mm512_permutexvar_ps(order, f);
    }
    out
}

/// The walk of `R` rows over their keys `wt[0].a..wt[0].b` (the same for all), with
/// each row's accumulator (`16 · N` values at `acc[r · 16N..]`) in registers:
/// `scale_f16` and `mad_f16` lane for lane where `F16`, else the f32 multiply-adds alone.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn walk<const N: usize, const R: usize, const F16: bool, E: Load16>(
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
        let v = vb.data.as_ptr().add(i * vb.stride);
        for r in 0..R {
            let e = wt[r].w[i];
            let (ms, vs) = if wt[r].raised >> i & 1 == 1 {
                let m = _mm512_set1_ps(e);
                for a in a[r].iter_mut() {
                    *a = round16(_mm512_mul_ps(*a, m));
                }
                (e, 1.0)
            } else {
                (1.0, e)
            };
            let w = _mm512_set1_ps(vs);
            for (j, a) in a[r].iter_mut().enumerate() {
                let x = _mm512_fmadd_ps(E::load16(v.add(16 * j)), w, *a);
                *a = if F16 { round16(x) } else { x };
            }
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
