//! Q4_K×8 prompt matmuls on AMX tiles (`tdpbusd`: a 16×64 u8 tile times a 64×16 s8 tile
//! into 16×16 i32 per instruction, ~8× the multiply-adds of 512-bit VNNI).
//!
//! The float steps need each superblock's integer sums of a (row, token), `Σ_g s_g·q·y`
//! with one 6-bit scale `s_g` per 32-quant group, and `Σ_g m_g·Σy` for the mins. A tile
//! multiplies bytes, so a superblock's weights become two u8 tiles per 64 quants,
//! `q·(s_g >> 3)` and `q·(s_g & 7)` (both ≤ 105), and the sum is `8·hi + lo`, exact in i32;
//! the min sums take `vpdpwssd` on the Q8_K bsums (exact sums of the same quants). Then the
//! float steps are those of `q4k_x8::core`, per superblock in order, so AMX gives the bits
//! of every other tier, whatever the batch.
//!
//! A call takes 16 rows (two interleaved groups) and all the prompt's tokens: each
//! superblock's tiles are built once in L1 and multiplied by every 16-token tile of the
//! activations, two token tiles at a time (four independent accumulator tiles: each
//! `tdpbusd` waits on the previous one into the same tile). The activations are laid out
//! once per matmul in the form the instruction reads (`[k/4][token][4]`). Linux hands out
//! the tile state on request (`arch_prctl`), once per process; without it there is no AMX
//! tier.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

use super::q4k_x8::scales_mins;
use crate::quant::interleave::{Q4K_X8_BLOCK, Q4K_X8_LANES, Q4K_X8_ROWS};

use super::{Q8K_BSUMS, Q8K_BYTES, Q8K_QS};
/// Bytes of one 16×64 tile.
pub(super) const TILE_BYTES: usize = 1024;
/// One superblock of one tile set (16 rows or 16 tokens): four 64-quant steps.
const SB_TILES: usize = 4 * TILE_BYTES;
/// The activations of one 16-token tile and one superblock: the quant tiles, the 16 `d`,
/// and per step the (group 2kk, group 2kk + 1) quant sums of each token as i16 pairs.
const REC: usize = SB_TILES + 64 + 4 * 64;
const REC_D: usize = SB_TILES;
const REC_BSUMS: usize = SB_TILES + 64;

/// Whether this CPU has AMX-INT8 and the OS granted this process the tile state.
pub(super) fn available() -> bool {
    // CPUID.(7,0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
    let edx = __cpuid_count(7, 0).edx;
    edx & (3 << 24) == 3 << 24 && request_tile_state()
}

/// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: 0 where the kernel grants it.
/// Whether this CPU also has AMX-BF16 (CPUID.(7,0):EDX bit 22), beside [`available`].
pub(super) fn has_bf16() -> bool {
    __cpuid_count(7, 0).edx & (1 << 22) != 0
}

#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let ret: isize;
    // SAFETY: a plain system call that only changes this process's permissions.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The Q4_K×8 AMX prompt kernel (only handed out where [`available`]).
#[derive(Clone, Copy)]
pub struct Q4kX8Amx(());

pub(super) fn kernel(tier: super::CpuTier) -> Option<Q4kX8Amx> {
    (tier >= super::CpuTier::Amx).then_some(Q4kX8Amx(()))
}

/// Token tiles of `n_tok` tokens, rounded up to whole pairs.
fn token_tiles(n_tok: usize) -> usize {
    n_tok.div_ceil(Q4kX8Amx::TOKENS).next_multiple_of(2)
}

impl Q4kX8Amx {
    /// Rows per call: two interleaved groups.
    pub const ROWS: usize = 2 * Q4K_X8_ROWS;
    /// Tokens per tile.
    pub const TOKENS: usize = 16;

    /// Bytes of the tile-form activations of `n_tok` tokens of `k` columns.
    pub fn acts_len(k: usize, n_tok: usize) -> usize {
        token_tiles(n_tok) * (k / 256) * REC
    }

    /// Lays out `n_tok` Q8_K activation rows (`q8k`, `k` columns each) in tile form
    /// (`dst`: [`Self::acts_len`] bytes); tokens past `n_tok` are zero. Mis-sized input
    /// leaves `dst` zeroed (the dots then come out 0).
    pub fn prepare(&self, q8k: &[u8], k: usize, n_tok: usize, dst: &mut [u8]) {
        let nb = k / 256;
        let ok = k.is_multiple_of(256)
            && q8k.len() >= n_tok * nb * Q8K_BYTES
            && dst.len() >= Self::acts_len(k, n_tok);
        if !ok {
            dst.fill(0);
            return;
        }
        let full = n_tok / Self::TOKENS;
        dst[full * nb * REC..Self::acts_len(k, n_tok)].fill(0);
        for t in 0..n_tok {
            let (tile, n) = (t / Self::TOKENS, t % Self::TOKENS);
            for i in 0..nb {
                let y = &q8k[(t * nb + i) * Q8K_BYTES..][..Q8K_BYTES];
                let rec = &mut dst[(tile * nb + i) * REC..][..REC];
                // Step kk, tile row k4 holds quants 64kk + 4k4 .. +4 of tokens 0..16.
                for (w, four) in y[Q8K_QS..Q8K_QS + 256].chunks_exact(4).enumerate() {
                    let at = (w / 16) * TILE_BYTES + (w % 16) * 64 + 4 * n;
                    rec[at..at + 4].copy_from_slice(four);
                }
                rec[REC_D + 4 * n..][..4].copy_from_slice(&y[..4]);
                let bsum = |j: usize| i16::from_le_bytes([y[Q8K_BSUMS + 2 * j], y[Q8K_BSUMS + 2 * j + 1]]);
                for g in 0..8 {
                    // |sum of 32 quants| ≤ 32·127 fits i16.
                    let sum = bsum(2 * g) + bsum(2 * g + 1);
                    let at = REC_BSUMS + (g / 2) * 64 + 4 * n + 2 * (g % 2);
                    rec[at..at + 2].copy_from_slice(&sum.to_le_bytes());
                }
            }
        }
    }

    /// `out[t * 16 + r] = dot(row r, token t)` for the 16 rows of two consecutive Q4_K×8
    /// groups `w` (`k` columns) and the `n_tok` tokens of `acts` (from [`Self::prepare`]).
    /// Mis-sized input writes NaN to whatever of `out` exists.
    pub fn dots(&self, w: &[u8], acts: &[u8], k: usize, n_tok: usize, out: &mut [f32]) {
        let nb = k / 256;
        let ok = k.is_multiple_of(256)
            && n_tok > 0
            && w.len() >= 2 * nb * Q4K_X8_BLOCK
            && acts.len() >= Self::acts_len(k, n_tok)
            && out.len() >= n_tok * Self::ROWS;
        if !ok {
            out.iter_mut().for_each(|v| *v = f32::NAN);
            return;
        }
        let tiles = token_tiles(n_tok);
        // acc[tile][sum | min][row][token], reused by the thread's next call.
        thread_local!(static ACC: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) });
        ACC.with_borrow_mut(|acc| {
            acc.clear();
            acc.resize(tiles * 2 * 256, 0.0);
            // SAFETY: the AMX tier was detected (tile state granted) before this kernel
            // was handed out, and the slices hold every byte read (checked above).
            unsafe { run(w, acts, nb, tiles, acc) };
            for t in 0..n_tok {
                let a = &acc[(t / Self::TOKENS) * 512..];
                for r in 0..Self::ROWS {
                    let (s, m) = (a[16 * r + t % 16], a[256 + 16 * r + t % 16]);
                    out[t * Self::ROWS + r] = s - m;
                }
            }
        });
    }
}

/// A 64-byte-aligned buffer for tile loads and stores.
#[repr(C, align(64))]
pub(super) struct Aligned<const N: usize>(pub [u8; N]);

/// Palette 1, all eight tiles 16 rows of 64 bytes (here: 0-3 the sums (hi, lo of two token
/// tiles), 4-5 the weights (hi, lo), 6-7 the two token tiles' activations).
pub(super) fn tile_config() -> Aligned<64> {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
    }
    Aligned(c)
}

/// One superblock of 16 rows as tiles and the per-row values the float steps need.
struct WeightTiles {
    /// `[hi | lo][step][row][64]`.
    q: Aligned<{ 2 * SB_TILES }>,
    /// (min of group 2kk, of group 2kk + 1) as i16 pairs, `[row][step]`.
    min_pairs: [[u32; 4]; 16],
    d: [f32; 16],
    dmin: [f32; 16],
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run(w: &[u8], acts: &[u8], nb: usize, tiles: usize, acc: &mut [f32]) {
    let cfg = tile_config();
    asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack));
    let mut wt =
        WeightTiles { q: Aligned([0; 2 * SB_TILES]), min_pairs: [[0; 4]; 16], d: [0.0; 16], dmin: [0.0; 16] };
    // Two sum buffers: the tiles of pair p + 1 are multiplied before pair p's sums are
    // folded, so the AMX unit and the vector units work at the same time.
    let mut c = Aligned::<{ 8 * TILE_BYTES }>([0; 8 * TILE_BYTES]);
    let c = c.0.as_mut_ptr();
    let recs = |pair: usize, i: usize| [pair, pair + 1].map(|t| acts.as_ptr().add((t * nb + i) * REC));
    for i in 0..nb {
        let blocks = [w.as_ptr().add(i * Q4K_X8_BLOCK), w.as_ptr().add((nb + i) * Q4K_X8_BLOCK)];
        weight_tiles(blocks, &mut wt);
        let pairs = tiles / 2;
        multiply(wt.q.0.as_ptr(), recs(0, i), c);
        for p in 0..pairs {
            if p + 1 < pairs {
                multiply(wt.q.0.as_ptr(), recs(2 * p + 2, i), c.add((p + 1) % 2 * 4 * TILE_BYTES));
            }
            for (j, rec) in recs(2 * p, i).into_iter().enumerate() {
                let sums = c.add((p % 2 * 4 + 2 * j) * TILE_BYTES);
                fold(&wt, rec, sums, acc.as_mut_ptr().add((2 * p + j) * 512));
            }
        }
    }
    asm!("tilerelease", options(nostack));
}

/// Folds one superblock of one token tile into its accumulators (`acc`: sums then mins,
/// `[row][token]`), from the hi and lo sum tiles at `sums`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn fold(wt: &WeightTiles, rec: *const u8, sums: *const u8, acc: *mut f32) {
    let dy = _mm512_loadu_ps(rec.add(REC_D).cast());
    let bsums: [__m512i; 4] =
        std::array::from_fn(|kk| _mm512_loadu_si512(rec.add(REC_BSUMS + 64 * kk).cast()));
    let tiles = sums as *const __m512i;
    for r in 0..16 {
        let hi = _mm512_load_si512(tiles.add(r));
        let lo = _mm512_load_si512(tiles.add(16 + r));
        let sum = _mm512_add_epi32(_mm512_slli_epi32::<3>(hi), lo);
        let mut mins = _mm512_setzero_si512();
        for (b, &pair) in bsums.iter().zip(&wt.min_pairs[r]) {
            mins = _mm512_dpwssd_epi32(mins, *b, _mm512_set1_epi32(pair as i32));
        }
        // (d·dy) rounded, then one FMA: the steps of q4k_x8::core.
        let dd = _mm512_mul_ps(_mm512_set1_ps(wt.d[r]), dy);
        let dm = _mm512_mul_ps(_mm512_set1_ps(wt.dmin[r]), dy);
        let (ps, pm) = (acc.add(16 * r), acc.add(256 + 16 * r));
        _mm512_storeu_ps(ps, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), dd, _mm512_loadu_ps(ps)));
        _mm512_storeu_ps(pm, _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), dm, _mm512_loadu_ps(pm)));
    }
}

/// One superblock of 16 rows (two interleaved blocks) as [`WeightTiles`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn weight_tiles(blocks: [*const u8; 2], wt: &mut WeightTiles) {
    let mut buf = [0u8; 128];
    let base = wt.q.0.as_mut_ptr();
    let m4 = _mm256_set1_epi8(0x0f);
    let halves =
        |x: u8, y: u8| _mm512_inserti64x4::<1>(_mm512_set1_epi16(x as i16), _mm256_set1_epi16(y as i16));
    for (h, &b) in blocks.iter().enumerate() {
        scales_mins(b.add(32), &mut buf);
        for rr in 0..Q4K_X8_ROWS {
            let r = 8 * h + rr;
            let lane = Q4K_X8_LANES[rr];
            wt.d[r] = f16_at(b.add(2 * lane));
            wt.dmin[r] = f16_at(b.add(16 + 2 * lane));
            for kk in 0..4 {
                // Row rr's 32 quant bytes of step kk: columns 4kk..4kk+4, 8 bytes each.
                let col = |m: usize| (b.add(128 + 64 * (4 * kk + m) + 8 * rr) as *const i64).read_unaligned();
                let raw = _mm256_setr_epi64x(col(0), col(1), col(2), col(3));
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                let q = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                let (s0, s1) = (buf[8 * (2 * kk) + rr], buf[8 * (2 * kk + 1) + rr]);
                let (m0, m1) = (buf[64 + 8 * (2 * kk) + rr], buf[64 + 8 * (2 * kk + 1) + rr]);
                // Byte products < 256 fit their byte of a 16-bit lane's product.
                let at = |set: usize| base.add(set * SB_TILES + kk * TILE_BYTES + 64 * r) as *mut __m512i;
                _mm512_store_si512(at(0), _mm512_mullo_epi16(q, halves(s0 >> 3, s1 >> 3)));
                _mm512_store_si512(at(1), _mm512_mullo_epi16(q, halves(s0 & 7, s1 & 7)));
                wt.min_pairs[r][kk] = m0 as u32 | (m1 as u32) << 16;
            }
        }
    }
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    half::f16::from_bits((p as *const u16).read_unaligned()).to_f32()
}

/// The sum tiles of one superblock and two token tiles: `c` gets `[token tile][hi | lo]`
/// (16 rows × 16 tokens of i32 each) from the weight tiles `a` and activation records.
#[inline(always)]
unsafe fn multiply(a: *const u8, recs: [*const u8; 2], c: *mut u8) {
    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack));
    for kk in 0..4 {
        asm!(
            "tileloadd tmm4, [{hi} + {s}]",
            "tileloadd tmm6, [{y0} + {s}]",
            "tdpbusd tmm0, tmm4, tmm6",
            "tileloadd tmm5, [{lo} + {s}]",
            "tdpbusd tmm1, tmm5, tmm6",
            "tileloadd tmm7, [{y1} + {s}]",
            "tdpbusd tmm2, tmm4, tmm7",
            "tdpbusd tmm3, tmm5, tmm7",
            hi = in(reg) a.add(kk * TILE_BYTES),
            lo = in(reg) a.add(SB_TILES + kk * TILE_BYTES),
            y0 = in(reg) recs[0].add(kk * TILE_BYTES),
            y1 = in(reg) recs[1].add(kk * TILE_BYTES),
            s = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
    asm!(
        "tilestored [{c} + {s}], tmm0",
        "tilestored [{c} + {s} + 1024], tmm1",
        "tilestored [{c} + {s} + 2048], tmm2",
        "tilestored [{c} + {s} + 3072], tmm3",
        c = in(reg) c,
        s = in(reg) 64usize,
        options(nostack),
    );
}
