//! Resampling as Pillow (and so llama.cpp's mtmd) does it: separable passes, horizontal
//! then vertical, each output pixel a weighted sum of the input pixels under the filter,
//! weights normalized per pixel and held in fixed point with 22 fractional bits, sums in
//! 32-bit integers rounded by adding one half before the shift. The same integers give the
//! same bytes as llama.cpp's resize.

use super::config::ResizeFilter;
use super::image::RgbImage;

const PRECISION_BITS: u32 = 32 - 8 - 2;

impl ResizeFilter {
    fn support(self) -> f64 {
        match self {
            ResizeFilter::Bilinear => 1.0,
            ResizeFilter::Bicubic => 2.0,
            ResizeFilter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        match self {
            ResizeFilter::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
            ResizeFilter::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            ResizeFilter::Bicubic => {
                // Pillow's a = -0.5.
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

fn sinc(v: f64) -> f64 {
    if v == 0.0 {
        return 1.0;
    }
    let pv = v * std::f64::consts::PI;
    pv.sin() / pv
}

/// Each output pixel's first input pixel, count of input pixels, and fixed-point weights
/// (`ksize` per output pixel).
struct Coeffs {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    weights: Vec<i32>,
}

fn coeffs(filter: ResizeFilter, in_size: usize, out_size: usize) -> Coeffs {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = filter.support() * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let ss = 1.0 / filterscale;
    let mut bounds = Vec::with_capacity(out_size);
    let mut weights = vec![0i32; out_size * ksize];
    let fxp = (1u64 << PRECISION_BITS) as f64;
    let mut pre = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        // C's int conversion truncates toward zero.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let n = xmax.saturating_sub(xmin).min(ksize);
        let mut ww = 0.0;
        for (x, p) in pre.iter_mut().enumerate().take(n) {
            *p = filter.weight((x as f64 + xmin as f64 - center + 0.5) * ss);
            ww += *p;
        }
        for (x, p) in pre.iter_mut().enumerate() {
            if x >= n {
                *p = 0.0;
            } else if ww != 0.0 {
                *p /= ww;
            }
        }
        for (x, &p) in pre.iter().enumerate() {
            let r = p * fxp + if p < 0.0 { -0.5 } else { 0.5 };
            weights[xx * ksize + x] = r as i32;
        }
        bounds.push((xmin, n));
    }
    Coeffs { ksize, bounds, weights }
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

fn horizontal(src: &[u8], in_w: usize, h: usize, out_w: usize, c: &Coeffs) -> Vec<u8> {
    let mut out = vec![0u8; out_w * h * 3];
    for y in 0..h {
        let row = &src[y * in_w * 3..(y + 1) * in_w * 3];
        let dst = &mut out[y * out_w * 3..(y + 1) * out_w * 3];
        for (xx, px) in dst.chunks_exact_mut(3).enumerate() {
            let (xmin, n) = c.bounds[xx];
            let k = &c.weights[xx * c.ksize..xx * c.ksize + n];
            let mut s = [HALF; 3];
            for (x, &w) in k.iter().enumerate() {
                let p = &row[(xmin + x) * 3..(xmin + x) * 3 + 3];
                for ch in 0..3 {
                    s[ch] = s[ch].wrapping_add((p[ch] as i32).wrapping_mul(w));
                }
            }
            for ch in 0..3 {
                px[ch] = clip8(s[ch]);
            }
        }
    }
    out
}

fn vertical(src: &[u8], w: usize, out_h: usize, c: &Coeffs) -> Vec<u8> {
    let row_len = w * 3;
    let mut out = vec![0u8; row_len * out_h];
    let mut acc = vec![0i32; row_len];
    for yy in 0..out_h {
        let (ymin, n) = c.bounds[yy];
        acc.fill(HALF);
        for (y, &wt) in c.weights[yy * c.ksize..yy * c.ksize + n].iter().enumerate() {
            let row = &src[(ymin + y) * row_len..(ymin + y + 1) * row_len];
            for (a, &p) in acc.iter_mut().zip(row) {
                *a = a.wrapping_add((p as i32).wrapping_mul(wt));
            }
        }
        for (d, &a) in out[yy * row_len..(yy + 1) * row_len].iter_mut().zip(&acc) {
            *d = clip8(a);
        }
    }
    out
}

/// `img` resampled to `w` × `h` (both at least 1) with `filter`.
pub fn resize(img: &RgbImage, w: usize, h: usize, filter: ResizeFilter) -> RgbImage {
    let (sw, sh) = (img.width, img.height);
    let data = match (w != sw, h != sh) {
        (false, false) => img.data.clone(),
        (true, false) => horizontal(&img.data, sw, sh, w, &coeffs(filter, sw, w)),
        (false, true) => vertical(&img.data, sw, h, &coeffs(filter, sh, h)),
        (true, true) => {
            let tmp = horizontal(&img.data, sw, sh, w, &coeffs(filter, sw, w));
            vertical(&tmp, w, h, &coeffs(filter, sh, h))
        }
    };
    RgbImage { width: w, height: h, data }
}
