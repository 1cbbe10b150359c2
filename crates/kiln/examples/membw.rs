//! This machine's memory read bandwidth, as decode sees it: `threads` threads each stream
//! their share of a buffer (default 1 GiB, written first, so it is resident), best of 8
//! runs, printed in GB/s. The bandwidth limit of `scripts/bench-vs-llamacpp` comes from it.
//!
//! `cargo run --release --example membw -- [THREADS] [MIB]`

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
    let mib: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024).max(1);
    let words = mib << 17;
    // An anonymous map advised as huge pages, as the CPU backend's repacked weights are
    // (4 KiB pages cost a third of the bandwidth here in TLB misses).
    let mut map = memmap2::MmapMut::map_anon((words + (1 << 18)) * 8).expect("map");
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    let skip = map.as_ptr().align_offset(2 << 20);
    let buf: &mut [u64] = bytemuck::cast_slice_mut(&mut map[skip..skip + words * 8]);
    buf.iter_mut().enumerate().for_each(|(i, w)| *w = i as u64);
    let buf: &[u64] = buf;
    let mut best = 0f64;
    for _ in 0..8 {
        let t = Instant::now();
        let sum = std::thread::scope(|s| {
            let parts: Vec<_> =
                buf.chunks(words.div_ceil(threads)).map(|c| s.spawn(move || sum(c))).collect();
            parts.into_iter().map(|h| h.join().expect("reader")).fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    println!("{best:.1}");
}

/// The wrapping sum of `c`, with the widest vector loads the CPU has (a portable build's
/// 16-byte loads do not keep enough bytes in flight to reach the bandwidth).
fn sum(c: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the feature was detected above.
            return unsafe { sum_avx512(c) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the feature was detected above.
            return unsafe { sum_avx2(c) };
        }
    }
    sum_lanes(c)
}

/// Four 8-lane accumulators, explicitly (a plain loop can compile to scalar adds with
/// spills, which measure the core, not the memory).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let chunks = c.chunks_exact(32);
    let tail = sum_lanes(chunks.remainder());
    for ch in chunks {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_add_epi64(*a, _mm512_loadu_si512(ch.as_ptr().add(8 * j).cast()));
        }
    }
    let s = _mm512_add_epi64(_mm512_add_epi64(acc[0], acc[1]), _mm512_add_epi64(acc[2], acc[3]));
    let lanes: [u64; 8] = std::mem::transmute(s);
    lanes.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

/// The same with eight 4-lane accumulators.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_avx2(c: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 8];
    let chunks = c.chunks_exact(32);
    let tail = sum_lanes(chunks.remainder());
    for ch in chunks {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm256_add_epi64(*a, _mm256_loadu_si256(ch.as_ptr().add(4 * j).cast()));
        }
    }
    let lanes: [[u64; 4]; 8] = std::mem::transmute(acc);
    lanes.iter().flatten().fold(tail, |a, &x| a.wrapping_add(x))
}

/// Thirty-two independent lanes: the compiler keeps them in vector registers.
#[inline(always)]
fn sum_lanes(c: &[u64]) -> u64 {
    let mut acc = [0u64; 32];
    let mut chunks = c.chunks_exact(32);
    for ch in &mut chunks {
        for (a, &x) in acc.iter_mut().zip(ch) {
            *a = a.wrapping_add(x);
        }
    }
    let tail = chunks.remainder().iter().fold(0u64, |a, &x| a.wrapping_add(x));
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}
