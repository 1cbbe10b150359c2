//! Causal attention over the f16 KV cache with an online softmax per query, in the
//! arithmetic of ggml's one-chunk flash-attention path (llama.cpp's CPU default): queries
//! rounded to f16, the K dot summed in ggml's order, keys taken one at a time in ascending
//! position, and the output accumulated in f16 (rounded after every rescale and every
//! fused multiply-add), the sum of weights with an FMA. On short prompts this makes kiln's
//! hidden states bit-identical to llama.cpp's (tests/embed_oracle.rs); kiln uses it for
//! every batch size, so results do not depend on batching (batch invariance).
//!
//! Flash-style tiling: one task takes a head and a tile of consecutive queries of the same
//! sequence, and widens each K/V row to f32 once for the whole tile. Every query still
//! sees its keys in ascending position with the same arithmetic, so its result does not
//! depend on the tile. Scratch lives on the task's stack: no allocation.
//!
//! The f16 primitives (dot, rescale, multiply-add with rounding) run 16 lanes wide where
//! the CPU has AVX-512 F, each lane with the arithmetic of the 8-lane AVX2 forms, so every
//! tier gives the same bits (~1.3x on gemma3-270m's pp512 attention).

use half::f16;

use super::ops::SyncPtr;
use super::pool::ThreadPool;
use crate::backend::AttnPlan;
use crate::quant::{self, GgmlType};

/// Queries per task; their accumulators and one K/V row stay in L1.
const Q_TILE: usize = 8;
/// Widest head the stack scratch holds; wider heads use heap scratch per task.
const MAX_HEAD_DIM: usize = 256;

pub fn attention(pool: &ThreadPool, q: &[f32], kc: &[f16], vc: &[f16], plan: &AttnPlan, out: &mut [f32]) {
    let n_head = plan.n_head;
    let n_tok = plan.pos.len();
    let n_tiles = n_tok.div_ceil(Q_TILE);
    let op = SyncPtr(out.as_mut_ptr());
    pool.run(n_tiles * n_head, &|task| {
        // Heads vary fastest: a decode step's heads spread over the threads.
        let (tile, h) = (task / n_head, task % n_head);
        let t0 = tile * Q_TILE;
        let t1 = (t0 + Q_TILE).min(n_tok);
        // Split the tile into runs of one sequence.
        let mut a = t0;
        while a < t1 {
            let mut b = a + 1;
            while b < t1 && plan.seq[b] == plan.seq[a] {
                b += 1;
            }
            let tile = Tile { q, kc, vc, plan, h, ts: a..b, out: op };
            if plan.head_dim <= MAX_HEAD_DIM {
                let mut scratch = Scratch::<[f32; MAX_HEAD_DIM * Q_TILE], [f32; MAX_HEAD_DIM]> {
                    q: [0.0; MAX_HEAD_DIM * Q_TILE],
                    acc: [0.0; MAX_HEAD_DIM * Q_TILE],
                    k: [0.0; MAX_HEAD_DIM],
                    v: [0.0; MAX_HEAD_DIM],
                };
                run_tile(&tile, &mut scratch);
            } else {
                let hd = plan.head_dim;
                let mut scratch = Scratch {
                    q: vec![0.0; hd * Q_TILE],
                    acc: vec![0.0; hd * Q_TILE],
                    k: vec![0.0; hd],
                    v: vec![0.0; hd],
                };
                run_tile(&tile, &mut scratch);
            }
            a = b;
        }
    });
}

struct Scratch<T, R> {
    /// f16-rounded queries of the tile, `[tile, head_dim]`.
    q: T,
    /// Unnormalized outputs, `[tile, head_dim]`.
    acc: T,
    /// The current K and V rows, widened.
    k: R,
    v: R,
}

/// One task: head `h` for queries `ts` (all of one sequence).
struct Tile<'a> {
    q: &'a [f32],
    kc: &'a [f16],
    vc: &'a [f16],
    plan: &'a AttnPlan<'a>,
    h: usize,
    ts: std::ops::Range<usize>,
    out: SyncPtr<f32>,
}

fn run_tile<T: AsMut<[f32]>, R: AsMut<[f32]>>(t: &Tile, s: &mut Scratch<T, R>) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { run_tile_fma(t, s) };
    }
    run_tile_body(t, s)
}

/// The same body compiled with FMA, so `mul_add` is one instruction rather than a call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_tile_fma<T: AsMut<[f32]>, R: AsMut<[f32]>>(t: &Tile, s: &mut Scratch<T, R>) {
    run_tile_body(t, s)
}

#[inline(always)]
fn run_tile_body<T: AsMut<[f32]>, R: AsMut<[f32]>>(tile: &Tile, s: &mut Scratch<T, R>) {
    let Tile { q, kc, vc, plan, h, ref ts, out: op } = *tile;
    let ts = ts.clone();
    let (n_head, hd) = (plan.n_head, plan.head_dim);
    let kv_dim = plan.n_head_kv * hd;
    let kvh = h / (n_head / plan.n_head_kv);
    let nq = ts.len();
    let (qs, acc) = (&mut s.q.as_mut()[..nq * hd], &mut s.acc.as_mut()[..nq * hd]);
    let (kr, vr) = (&mut s.k.as_mut()[..hd], &mut s.v.as_mut()[..hd]);
    for (j, t) in ts.clone().enumerate() {
        let src = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
        let dst = &mut qs[j * hd..(j + 1) * hd];
        dst.copy_from_slice(src);
        round_f16(dst);
    }
    acc.fill(0.0);
    let mut m = [f32::NEG_INFINITY; Q_TILE];
    let mut sum = [0.0f32; Q_TILE];
    let seq = plan.seq[ts.start];
    let lo = ts.clone().map(|t| plan.first_pos(t)).min().unwrap_or(0);
    let hi = ts.clone().map(|t| plan.pos[t]).max().unwrap_or(0);
    for p in lo..=hi {
        let base = plan.slot(seq, p) * kv_dim + kvh * hd;
        widen(&kc[base..base + hd], kr);
        widen(&vc[base..base + hd], vr);
        for (j, t) in ts.clone().enumerate() {
            if p < plan.first_pos(t) || p > plan.pos[t] {
                continue;
            }
            let qj = &qs[j * hd..(j + 1) * hd];
            let score = dot_f16(qj, kr) * plan.scale;
            let a = &mut acc[j * hd..(j + 1) * hd];
            let (ms, vs);
            if score > m[j] {
                ms = (m[j] - score).exp();
                vs = 1.0;
                m[j] = score;
                scale_f16(a, ms);
            } else {
                ms = 1.0;
                vs = (score - m[j]).exp();
            }
            mad_f16(a, vr, vs);
            sum[j] = sum[j].mul_add(ms, vs); // GCC contracts ggml's `S*ms + vs`
        }
    }
    for (j, t) in ts.enumerate() {
        let inv = if sum[j] == 0.0 { 0.0 } else { 1.0 / sum[j] };
        // SAFETY: each task writes its own (token, head) slices of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(op.get().add((t * n_head + h) * hd), hd) };
        o.iter_mut().zip(&acc[j * hd..(j + 1) * hd]).for_each(|(o, &a)| *o = a * inv);
    }
}

/// f16 -> f32 (exact), with F16C where the CPU has it.
fn widen(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F; `dst` is as long as `src`.
        return unsafe { simd::wide::widen(src, dst) };
    }
    quant::dequantize_row(GgmlType::F16, bytemuck::cast_slice(src), dst).expect("sizes match");
}

/// Rounds every value to the nearest f16 (ties to even), as storing to f16 does.
fn round_f16(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::round_f16(x) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::round_f16(x) };
    }
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
}

/// The dot product of f16 values (held as f32) summed in the order of ggml's
/// `ggml_vec_dot_f16` on AVX-512: four 16-lane accumulators over blocks of 64, a fixed
/// reduction tree, the tail added in f64. Products of f16 values are exact in f32.
fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::dot_f16(q, k) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { simd::dot_f16(q, k) };
    }
    let np = q.len() / 64 * 64;
    let mut acc = [[0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, a) in a.iter_mut().enumerate() {
                *a += q[i + j * 16 + l] * k[i + j * 16 + l];
            }
        }
    }
    let x: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    reduce16(x, &q[np..], &k[np..])
}

/// `_mm512_reduce_add_ps` (halves, then quarters, then pairs), then the f64 tail.
fn reduce16(x: [f32; 16], qt: &[f32], kt: &[f32]) -> f32 {
    let t1: [f32; 8] = std::array::from_fn(|l| x[l + 8] + x[l]);
    let t2: [f32; 4] = std::array::from_fn(|l| t1[l + 4] + t1[l]);
    let mut sum = ((t2[0] + t2[2]) + (t2[1] + t2[3])) as f64;
    for (&a, &b) in qt.iter().zip(kt) {
        sum += (a * b) as f64;
    }
    sum as f32
}

/// `acc = f16(acc * s)`: the f16 accumulator's rescale.
fn scale_f16(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::scale_f16(acc, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::scale_f16(acc, s) };
    }
    acc.iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
}

/// `acc = f16(fma(v, s, acc))`: one key's contribution to the f16 accumulator.
fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx512 {
        // SAFETY: the CPU has AVX-512 F (and AVX2, FMA, F16C).
        return unsafe { simd::wide::mad_f16(acc, v, s) };
    }
    #[cfg(target_arch = "x86_64")]
    if quant::cpu_tier() >= quant::CpuTier::Avx2 {
        // SAFETY: the CPU has AVX2, FMA and F16C.
        return unsafe { simd::mad_f16(acc, v, s) };
    }
    acc.iter_mut().zip(v).for_each(|(a, &x)| *a = f16::from_f32(x.mul_add(s, *a)).to_f32());
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use half::f16;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn round8(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn round_f16(x: &mut [f32]) {
        let mut c = x.chunks_exact_mut(8);
        for c in &mut c {
            _mm256_storeu_ps(c.as_mut_ptr(), round8(_mm256_loadu_ps(c.as_ptr())));
        }
        c.into_remainder().iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
        let np = q.len() / 64 * 64;
        // Lanes 0-7 and 8-15 of ggml's four 16-lane accumulators.
        let mut lo = [_mm256_setzero_ps(); 4];
        let mut hi = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(64) {
            for j in 0..4 {
                let (qp, kp) = (q.as_ptr().add(i + j * 16), k.as_ptr().add(i + j * 16));
                lo[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp), _mm256_loadu_ps(kp), lo[j]);
                hi[j] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(8)), _mm256_loadu_ps(kp.add(8)), hi[j]);
            }
        }
        let xl = _mm256_add_ps(_mm256_add_ps(lo[0], lo[2]), _mm256_add_ps(lo[1], lo[3]));
        let xh = _mm256_add_ps(_mm256_add_ps(hi[0], hi[2]), _mm256_add_ps(hi[1], hi[3]));
        let mut x = [0f32; 16];
        _mm256_storeu_ps(x.as_mut_ptr(), xl);
        _mm256_storeu_ps(x.as_mut_ptr().add(8), xh);
        super::reduce16(x, &q[np..], &k[np..])
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn scale_f16(acc: &mut [f32], s: f32) {
        let vs = _mm256_set1_ps(s);
        let mut c = acc.chunks_exact_mut(8);
        for c in &mut c {
            let a = _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), vs);
            _mm256_storeu_ps(c.as_mut_ptr(), round8(a));
        }
        c.into_remainder().iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
        let vs = _mm256_set1_ps(s);
        let mut c = acc.chunks_exact_mut(8);
        let mut x = v.chunks_exact(8);
        for (c, x) in (&mut c).zip(&mut x) {
            let a = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr()), vs, _mm256_loadu_ps(c.as_ptr()));
            _mm256_storeu_ps(c.as_mut_ptr(), round8(a));
        }
        for (a, &x) in c.into_remainder().iter_mut().zip(x.remainder()) {
            *a = f16::from_f32(x.mul_add(s, *a)).to_f32();
        }
    }
    /// The same operations on 16 lanes at a time (AVX-512 F): per lane the arithmetic of
    /// the 8-lane forms above, so the same bits, in half the instructions.
    pub mod wide {
        use std::arch::x86_64::*;

        use half::f16;

        #[inline]
        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        unsafe fn round16(v: __m512) -> __m512 {
            _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn widen(src: &[f16], dst: &mut [f32]) {
            let n = src.len().min(dst.len());
            let body = n / 16 * 16;
            for i in (0..body).step_by(16) {
                let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
                _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            }
            dst[body..n].iter_mut().zip(&src[body..n]).for_each(|(d, s)| *d = s.to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn round_f16(x: &mut [f32]) {
            let body = x.len() / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = x.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, round16(_mm512_loadu_ps(p)));
            }
            x[body..].iter_mut().for_each(|v| *v = f16::from_f32(*v).to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
            let np = q.len() / 64 * 64;
            // ggml's four 16-lane accumulators.
            let mut acc = [_mm512_setzero_ps(); 4];
            for i in (0..np).step_by(64) {
                for (j, a) in acc.iter_mut().enumerate() {
                    let (qp, kp) = (q.as_ptr().add(i + j * 16), k.as_ptr().add(i + j * 16));
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(qp), _mm512_loadu_ps(kp), *a);
                }
            }
            let x = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), x);
            super::super::reduce16(lanes, &q[np..], &k[np..])
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn scale_f16(acc: &mut [f32], s: f32) {
            let vs = _mm512_set1_ps(s);
            let body = acc.len() / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = acc.as_mut_ptr().add(i);
                _mm512_storeu_ps(p, round16(_mm512_mul_ps(_mm512_loadu_ps(p), vs)));
            }
            acc[body..].iter_mut().for_each(|a| *a = f16::from_f32(*a * s).to_f32());
        }

        #[target_feature(enable = "avx512f,avx2,fma,f16c")]
        pub unsafe fn mad_f16(acc: &mut [f32], v: &[f32], s: f32) {
            let vs = _mm512_set1_ps(s);
            let n = acc.len().min(v.len());
            let body = n / 16 * 16;
            for i in (0..body).step_by(16) {
                let p = acc.as_mut_ptr().add(i);
                let a = _mm512_fmadd_ps(_mm512_loadu_ps(v.as_ptr().add(i)), vs, _mm512_loadu_ps(p));
                _mm512_storeu_ps(p, round16(a));
            }
            for (a, &x) in acc[body..n].iter_mut().zip(&v[body..n]) {
                *a = f16::from_f32(x.mul_add(s, *a)).to_f32();
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::simd;
    use half::f16;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                f16::from_f32((s >> 8) as f32 / (1 << 24) as f32 * 8.0 - 4.0).to_f32()
            })
            .collect()
    }

    /// The 16-lane primitives give the bits of the 8-lane ones (and of the per-value
    /// rounding), for head sizes with and without tails.
    #[test]
    fn wide_primitives_match_the_avx2_ones() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx2")) {
            eprintln!("skipped: no AVX-512 F on this CPU");
            return;
        }
        for n in [8, 64, 72, 80, 128, 200, 256] {
            let (q, k) = (values(n, 1), values(n, 2));
            // SAFETY (all calls): the CPU has AVX-512 F, AVX2, FMA and F16C (checked).
            let (a, b) = unsafe { (simd::dot_f16(&q, &k), simd::wide::dot_f16(&q, &k)) };
            assert_eq!(a.to_bits(), b.to_bits(), "dot, n = {n}");
            let mut raw = values(n, 3);
            raw.iter_mut().for_each(|x| *x *= 1.001);
            let (mut r8, mut r16) = (raw.clone(), raw.clone());
            unsafe { (simd::round_f16(&mut r8), simd::wide::round_f16(&mut r16)) };
            let per_value: Vec<f32> = raw.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
            assert_eq!(r8, per_value, "round, n = {n}");
            assert_eq!(r16, per_value, "round, n = {n}");
            let (mut s8, mut s16) = (q.clone(), q.clone());
            unsafe { (simd::scale_f16(&mut s8, 0.37), simd::wide::scale_f16(&mut s16, 0.37)) };
            assert_eq!(s8, s16, "scale, n = {n}");
            let (mut m8, mut m16) = (q.clone(), q.clone());
            unsafe { (simd::mad_f16(&mut m8, &k, 0.61), simd::wide::mad_f16(&mut m16, &k, 0.61)) };
            assert_eq!(m8, m16, "mad, n = {n}");
            let h: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
            let mut w = vec![0f32; n];
            unsafe { simd::wide::widen(&h, &mut w) };
            assert_eq!(w, k, "widen, n = {n}");
        }
    }
}
