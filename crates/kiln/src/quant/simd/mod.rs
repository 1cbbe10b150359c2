//! Runtime-dispatched SIMD dot products. The CPU is probed once (`is_x86_feature_detected!`,
//! no build flags needed, so portable builds stay portable);
//! `KILN_CPU=scalar|avx2|avx512|avx512vnni|amx` caps the tier, e.g. to compare against the
//! scalar reference.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod f16_amx;
#[cfg(target_arch = "x86_64")]
mod f16_gemm;
#[cfg(target_arch = "x86_64")]
mod ktiles;
#[cfg(target_arch = "x86_64")]
mod prefetch;
#[cfg(target_arch = "x86_64")]
mod q4k_x8;
#[cfg(target_arch = "x86_64")]
mod q8k;
#[cfg(target_arch = "x86_64")]
mod tiles;
#[cfg(target_arch = "x86_64")]
mod x16;

#[cfg(target_arch = "x86_64")]
pub use amx::Q4kX8Amx;
#[cfg(target_arch = "x86_64")]
pub use f16_amx::F16Amx;
#[cfg(target_arch = "x86_64")]
pub use f16_gemm::F16Gemm;
#[cfg(target_arch = "x86_64")]
pub use q4k_x8::Q4kX8Kernels;
#[cfg(target_arch = "x86_64")]
pub use tiles::{TileKernels, TILE};
#[cfg(target_arch = "x86_64")]
pub use x16::X16Kernels;

use std::sync::OnceLock;

use super::{scalar_vec_dot_fn, GgmlType, VecDotFn};

/// Q8_K activation blocks, as the k-quant kernels read them: f32 d at 0, 256 quants at
/// [`Q8K_QS`], then 16 i16 sums of 16 quants each at [`Q8K_BSUMS`].
#[cfg(target_arch = "x86_64")]
const Q8K_BYTES: usize = 292;
#[cfg(target_arch = "x86_64")]
const Q8K_QS: usize = 4;
#[cfg(target_arch = "x86_64")]
const Q8K_BSUMS: usize = 260;

/// A family of CPU instructions kiln has kernels for, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuTier {
    /// Portable Rust, the reference.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL on top of the AVX2 tier. It runs the AVX2 kernels for the Q8_0/Q4_0/
    /// F16 dots: 512-bit versions are no faster on CPUs that issue 512-bit ops as two
    /// 256-bit halves (AMD Zen 4).
    Avx512,
    /// AVX-512 VNNI (`vpdpbusd`) on top: the matmul tile kernels use it.
    Avx512Vnni,
    /// AMX-INT8 tiles on top (with the tile state granted by the OS): Q4_K prompt matmuls.
    Amx,
}

impl CpuTier {
    pub fn name(self) -> &'static str {
        match self {
            CpuTier::Scalar => "scalar",
            CpuTier::Avx2 => "avx2",
            CpuTier::Avx512 => "avx512",
            CpuTier::Avx512Vnni => "avx512vnni",
            CpuTier::Amx => "amx",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        [CpuTier::Scalar, CpuTier::Avx2, CpuTier::Avx512, CpuTier::Avx512Vnni, CpuTier::Amx]
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s))
    }
}

/// The best tier this CPU supports, ignoring `KILN_CPU`.
pub fn detected_cpu_tier() -> CpuTier {
    static DETECTED: OnceLock<CpuTier> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuTier {
    use std::arch::is_x86_feature_detected as has;
    if !(has!("avx2") && has!("fma") && has!("f16c")) {
        return CpuTier::Scalar;
    }
    if has!("avx512f") && has!("avx512bw") && has!("avx512vl") {
        if has!("avx512vnni") {
            return if amx::available() { CpuTier::Amx } else { CpuTier::Avx512Vnni };
        }
        return CpuTier::Avx512;
    }
    CpuTier::Avx2
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> CpuTier {
    CpuTier::Scalar
}

/// The tier kiln uses: the detected one, capped by `KILN_CPU` (read once; an unknown value
/// is ignored with a warning on stderr).
pub fn cpu_tier() -> CpuTier {
    static TIER: OnceLock<CpuTier> = OnceLock::new();
    *TIER.get_or_init(|| {
        let detected = detected_cpu_tier();
        match std::env::var("KILN_CPU") {
            Ok(v) => match CpuTier::from_name(v.trim()) {
                Some(cap) => cap.min(detected),
                None => {
                    eprintln!(
                        "warning: KILN_CPU={v:?} is not scalar, avx2, avx512, avx512vnni or amx; using {}",
                        detected.name()
                    );
                    detected
                }
            },
            Err(_) => detected,
        }
    })
}

/// The fastest dot product for weights of type `ty` on this CPU (see [`cpu_tier`]), with
/// the activation row quantized to `ty.vec_dot_type()` (by [`super::quantize_activation`]).
/// Choose it once per matmul and call it in the hot loop; it agrees with the scalar
/// [`super::vec_dot`] up to float rounding (summation order and FMA).
pub fn vec_dot_fn(ty: GgmlType) -> VecDotFn {
    vec_dot_fn_for(ty, cpu_tier())
}

/// [`vec_dot_fn`] for a given tier, capped at what the CPU supports (for tests/benchmarks).
pub fn vec_dot_fn_for(ty: GgmlType, tier: CpuTier) -> VecDotFn {
    let tier = tier.min(detected_cpu_tier());
    #[cfg(target_arch = "x86_64")]
    {
        use GgmlType::*;
        if tier >= CpuTier::Avx2 {
            let f: Option<VecDotFn> = match ty {
                F32 => Some(avx2::dot_f32),
                F16 => Some(avx2::dot_f16),
                Q4_0 => Some(avx2::dot_q4_0_q8_0),
                Q4_1 => Some(avx2::dot_q4_1_q8_1),
                Q5_0 => Some(avx2::dot_q5_0_q8_0),
                Q5_1 => Some(avx2::dot_q5_1_q8_1),
                Q8_0 => Some(avx2::dot_q8_0_q8_0),
                Q4_K => Some(avx2::dot_q4_k_q8_k),
                Q5_K => Some(avx2::dot_q5_k_q8_k),
                Q6_K => Some(avx2::dot_q6_k_q8_k),
                _ => None,
            };
            if let Some(f) = f {
                return f;
            }
        }
    }
    let _ = tier;
    scalar_vec_dot_fn(ty)
}

/// A fast F16 x F16 dot product of `n` elements (rows of any length), for F16 weights.
pub fn vec_dot_f16(w: &[u8], a: &[u8], n: usize) -> f32 {
    debug_assert!(w.len() >= 2 * n && a.len() >= 2 * n);
    let n = n.min(w.len() / 2).min(a.len() / 2);
    vec_dot_fn(GgmlType::F16)(&w[..2 * n], &a[..2 * n], n)
}

/// Matmul tile kernels (several rows or tokens per call, bit-identical to one pair at a
/// time) for weights of `ty` on this CPU, where kiln has them.
#[cfg(target_arch = "x86_64")]
pub fn tile_kernels(ty: GgmlType) -> Option<TileKernels> {
    tiles::tile_kernels(ty, cpu_tier())
}

/// [`tile_kernels`] for a given tier, capped at what the CPU supports (for tests).
#[cfg(target_arch = "x86_64")]
pub fn tile_kernels_for(ty: GgmlType, tier: CpuTier) -> Option<TileKernels> {
    tiles::tile_kernels(ty, tier.min(detected_cpu_tier()))
}

/// The F16 prompt-matmul tiles on this CPU (see `f16_gemm.rs`), where kiln has them.
#[cfg(target_arch = "x86_64")]
pub fn f16_gemm() -> Option<F16Gemm> {
    f16_gemm::f16_gemm(cpu_tier())
}

/// [`f16_gemm`] for a given tier, capped at what the CPU supports (for tests/benchmarks).
#[cfg(target_arch = "x86_64")]
pub fn f16_gemm_for(tier: CpuTier) -> Option<F16Gemm> {
    f16_gemm::f16_gemm(tier.min(detected_cpu_tier()))
}

/// An interleaved-rows kernel for a fixed number of tokens: weights `x` of `nb` blocks, the
/// first token's activations at `y` (`ys` bytes per token), outputs at `out`, `os` apart.
type GroupCore = unsafe fn(x: *const u8, y: *const u8, ys: usize, nb: usize, out: *mut f32, os: usize);

/// A group kernel file's entry points: `core::<T, VNNI, ..>` compiled for the AVX2 and the
/// AVX-512 VNNI tiers, and `cores::<..>(tier)`, its cores for each count of 1 to 8 tokens
/// there, so that a call of any size reads and unpacks each weight block once (`..`: the
/// file's own const parameters, if any, e.g. `group_cores!(Q41: bool)`).
macro_rules! group_cores {
    ($($p:ident: $t:ty),*) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2<const T: usize $(, const $p: $t)*>(
            x: *const u8,
            y: *const u8,
            ys: usize,
            nb: usize,
            out: *mut f32,
            os: usize,
        ) {
            core::<T, false $(, $p)*>(x, y, ys, nb, out, os)
        }

        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        unsafe fn vnni<const T: usize $(, const $p: $t)*>(
            x: *const u8,
            y: *const u8,
            ys: usize,
            nb: usize,
            out: *mut f32,
            os: usize,
        ) {
            core::<T, true $(, $p)*>(x, y, ys, nb, out, os)
        }

        fn cores<$(const $p: $t),*>(tier: super::CpuTier) -> Option<[super::GroupCore; 8]> {
            use super::CpuTier;
            match tier {
                CpuTier::Scalar => None,
                CpuTier::Avx2 | CpuTier::Avx512 => Some([
                    avx2::<1 $(, $p)*>, avx2::<2 $(, $p)*>, avx2::<3 $(, $p)*>, avx2::<4 $(, $p)*>,
                    avx2::<5 $(, $p)*>, avx2::<6 $(, $p)*>, avx2::<7 $(, $p)*>, avx2::<8 $(, $p)*>,
                ]),
                CpuTier::Avx512Vnni | CpuTier::Amx => Some([
                    vnni::<1 $(, $p)*>, vnni::<2 $(, $p)*>, vnni::<3 $(, $p)*>, vnni::<4 $(, $p)*>,
                    vnni::<5 $(, $p)*>, vnni::<6 $(, $p)*>, vnni::<7 $(, $p)*>, vnni::<8 $(, $p)*>,
                ]),
            }
        }
    };
}
use group_cores;

/// A group kernel's `dots`: `out[t * os + r] = dot(row r, token t)` for one group of
/// `rows` interleaved rows `w` (`n` columns in blocks of `bs` values, `block` bytes per
/// block of the group) and `n_tok` (1..=8) activation rows `a` (`act` bytes per block),
/// after checking that the slices hold every byte the cores read and write. Mis-sized input
/// writes NaN to whatever of `out` exists.
#[allow(clippy::too_many_arguments)]
fn group_dots(
    cores: &[GroupCore; 8],
    (rows, bs, block, act): (usize, usize, usize, usize),
    w: &[u8],
    a: &[u8],
    n: usize,
    n_tok: usize,
    out: &mut [f32],
    os: usize,
) {
    let nb = n / bs;
    let ok = n.is_multiple_of(bs)
        && (1..=8).contains(&n_tok)
        && os >= rows
        && w.len() >= nb * block
        && a.len() >= n_tok * nb * act
        && out.len() >= (n_tok - 1) * os + rows;
    if !ok {
        out.iter_mut().for_each(|v| *v = f32::NAN);
        return;
    }
    // SAFETY: the cores' tier was detected before they were handed out, and the slices hold
    // every byte read and written (checked above).
    unsafe { (cores[n_tok - 1])(w.as_ptr(), a.as_ptr(), nb * act, nb, out.as_mut_ptr(), os) }
}

/// Matmul kernels on Q4_K×8 (`quant::interleave`) on this CPU, where kiln has them.
#[cfg(target_arch = "x86_64")]
pub fn q4_k_x8_kernels() -> Option<Q4kX8Kernels> {
    q4k_x8::kernels(cpu_tier(), full_width_512())
}

/// [`q4_k_x8_kernels`] for a given tier, capped at what the CPU supports, with the VNNI
/// tier's prompt steps on token pairs or not (for tests and benchmarks).
#[cfg(target_arch = "x86_64")]
pub fn q4_k_x8_kernels_for(tier: CpuTier, pairs: bool) -> Option<Q4kX8Kernels> {
    q4k_x8::kernels(tier.min(detected_cpu_tier()), pairs)
}

/// Whether 512-bit integer steps run at full width here, so that a kernel doing two
/// tokens' work per 512-bit step beats one token per 256-bit step: not on AMD's Zen 4
/// (family 0x19), which issues them as two 256-bit halves (there one token a step is about
/// 25% faster), but on Zen 5 (family 0x1a) and Intel's AVX-512 cores.
#[cfg(target_arch = "x86_64")]
pub fn full_width_512() -> bool {
    static WIDE: OnceLock<bool> = OnceLock::new();
    *WIDE.get_or_init(|| {
        let (vendor, sig) = (std::arch::x86_64::__cpuid(0), std::arch::x86_64::__cpuid(1).eax);
        let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
        let base = (sig >> 8) & 0xf;
        let family = if base == 0xf { base + ((sig >> 20) & 0xff) } else { base };
        !(amd && family == 0x19)
    })
}

/// The AMX-BF16 F16 kernel for encoders' matmuls (`f16_amx.rs`), where this CPU (and
/// `KILN_CPU`) allows it.
#[cfg(target_arch = "x86_64")]
pub fn f16_amx() -> Option<F16Amx> {
    f16_amx::kernel(cpu_tier())
}

/// [`f16_amx`] for a given tier, capped at what the CPU supports (for tests).
#[cfg(target_arch = "x86_64")]
pub fn f16_amx_for(tier: CpuTier) -> Option<F16Amx> {
    f16_amx::kernel(tier.min(detected_cpu_tier()))
}

/// The AMX Q4_K×8 prompt kernel, where this CPU (and `KILN_CPU`) allows it.
#[cfg(target_arch = "x86_64")]
pub fn q4_k_x8_amx() -> Option<Q4kX8Amx> {
    amx::kernel(cpu_tier())
}

/// [`q4_k_x8_amx`] for a given tier, capped at what the CPU supports (for tests).
#[cfg(target_arch = "x86_64")]
pub fn q4_k_x8_amx_for(tier: CpuTier) -> Option<Q4kX8Amx> {
    amx::kernel(tier.min(detected_cpu_tier()))
}

/// Matmul kernels on sixteen interleaved rows of `ty` (Q5_0, Q4_1: `quant::interleave`)
/// on this CPU, where kiln has them.
#[cfg(target_arch = "x86_64")]
pub fn x16_kernels(ty: GgmlType) -> Option<X16Kernels> {
    x16::kernels(ty, cpu_tier())
}

/// [`x16_kernels`] for a given tier, capped at what the CPU supports (for tests).
#[cfg(target_arch = "x86_64")]
pub fn x16_kernels_for(ty: GgmlType, tier: CpuTier) -> Option<X16Kernels> {
    x16::kernels(ty, tier.min(detected_cpu_tier()))
}

// NEON (aarch64) is the seam for an ARM tier: a `neon` module with the same `VecDotFn`
// signatures and a `CpuTier::Neon`; nothing is claimed for it yet.

/// The dequantizer for `ty` on this CPU where a SIMD one exists (exact, so it always agrees
/// with the scalar reference bit for bit).
pub(super) fn simd_dequantize(ty: GgmlType) -> Option<super::DequantizeFn> {
    #[cfg(target_arch = "x86_64")]
    if cpu_tier() >= CpuTier::Avx2 {
        match ty {
            GgmlType::F16 => return Some(avx2::dequantize_f16),
            GgmlType::Q8_0 => return Some(avx2::dequantize_q8_0),
            _ => {}
        }
    }
    let _ = ty;
    None
}

/// Values in, values out (the same count).
type MapFn = fn(&[f32], &mut [f32]);

/// F32 values rounded to F16 and widened back, on this CPU where a SIMD form exists (the
/// scalar path's values).
pub(super) fn simd_round_f16() -> Option<MapFn> {
    #[cfg(target_arch = "x86_64")]
    if cpu_tier() >= CpuTier::Avx2 {
        return Some(avx2::round_f16);
    }
    None
}

type QuantizeFn = fn(&[f32], &mut [u8]);

/// The activation quantizer for `ty` on this CPU where a SIMD one exists (bit-identical to
/// the scalar one, which mirrors ggml's x86 rounding).
pub(super) fn simd_quantize_activation(ty: GgmlType) -> Option<QuantizeFn> {
    #[cfg(target_arch = "x86_64")]
    if cpu_tier() >= CpuTier::Avx2 {
        match ty {
            GgmlType::Q8_0 => return Some(avx2::quantize_q8_0_act),
            GgmlType::Q8_1 => return Some(avx2::quantize_q8_1_act),
            GgmlType::Q8_K => return Some(q8k::quantize_q8_k_act),
            _ => {}
        }
    }
    let _ = ty;
    None
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// The SIMD dequantizers give the scalar reference's bits: every quant, scales from
    /// subnormal to the largest f16, negative zero, infinity; a NaN scale gives NaNs.
    #[test]
    fn simd_dequantize_matches_the_scalar_reference() {
        let scalar: [(GgmlType, super::super::DequantizeFn); 2] = [
            (GgmlType::F16, super::super::float::dequantize_f16),
            (GgmlType::Q8_0, super::super::legacy::dequantize_q8_0),
        ];
        let scales: [u16; 8] = [0x0001, 0x03ff, 0x2e66, 0x3c00, 0x8000, 0xbc00, 0x7bff, 0x7c00];
        for (ty, reference) in scalar {
            let Some(simd) = simd_dequantize(ty) else {
                assert!(cpu_tier() < CpuTier::Avx2, "{ty}: no SIMD dequantizer");
                continue;
            };
            // F16: every bit pattern; Q8_0: every quant under each scale, a block each.
            let src: Vec<u8> = match ty {
                GgmlType::F16 => (0..=u16::MAX).flat_map(u16::to_le_bytes).collect(),
                _ => scales
                    .iter()
                    .flat_map(|&d| {
                        (0..8).flat_map(move |k| {
                            let mut b = d.to_le_bytes().to_vec();
                            b.extend((0..32).map(|i| (k * 32 + i) as u8));
                            b
                        })
                    })
                    .collect(),
            };
            let n = src.len() / ty.type_size() * ty.block_size();
            let (mut want, mut got) = (vec![0f32; n], vec![0f32; n]);
            reference(&src, &mut want);
            simd(&src, &mut got);
            for (i, (w, g)) in want.iter().zip(&got).enumerate() {
                assert!(
                    w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan()),
                    "{ty} value {i}: {w} vs {g}"
                );
            }
        }
        // A NaN scale.
        let mut block = vec![0x7e, 0x7e];
        block.extend([1u8; 32]);
        let mut got = [0f32; 32];
        if let Some(simd) = simd_dequantize(GgmlType::Q8_0) {
            simd(&block, &mut got);
            assert!(got.iter().all(|x| x.is_nan()));
        }
    }
}
