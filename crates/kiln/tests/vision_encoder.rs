//! The vision encoder against llama.cpp's (`clip_image_encode` on the same synthetic mmproj
//! files and the same preprocessed tiles; `scripts/gen-vision-fixtures`): every projected
//! embedding within tolerance, for both projector families. The SmolVLM-256M-shape encoder
//! (1,024 patches a tile, 12 layers) runs under `KILN_FULL=1`.

mod support;

use std::sync::Arc;

use kiln::backend::cpu::CpuBackend;
use kiln::gguf::GgufFile;
use kiln::vision::{preprocess, synth, RgbImage, VisionEncoder};
use support::*;

/// `amx`: the encoder's F16 matmuls on AMX-BF16 tiles where the CPU has them (the
/// default), else in tinyBLAS's order (llama.cpp's bits).
fn encoder(preset: &str, amx: bool) -> VisionEncoder {
    let bytes = synth::preset(preset).unwrap().build().unwrap().to_bytes();
    let g = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    VisionEncoder::load(g, Arc::new(CpuBackend::new(2).with_encoder_amx(amx))).unwrap()
}

/// Encodes every tile of `image` and compares with llama.cpp's embeddings: returns the
/// normalized squared error and the largest absolute difference.
fn compare(image: &str, preset: &str) -> (f64, f32) {
    compare_on(image, preset, true)
}

fn compare_on(image: &str, preset: &str, amx: bool) -> (f64, f32) {
    let enc = encoder(preset, amx);
    let img = RgbImage::open(fixtures().join("vision").join(image)).unwrap();
    let pre = preprocess(&img, enc.config()).unwrap();
    let mut got = Vec::new();
    for t in &pre.tiles {
        got.extend(enc.encode(t).unwrap());
    }
    let stem = image.strip_suffix(".png").unwrap();
    let raw = std::fs::read(fixtures().join(format!("vision/embd/{stem}.{preset}.f32"))).unwrap();
    let want: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
    assert_eq!(got.len(), want.len(), "{image} {preset}: embedding count");
    let (mut err, mut norm, mut max) = (0f64, 0f64, 0f32);
    for (a, b) in got.iter().zip(&want) {
        err += ((a - b) as f64).powi(2);
        norm += (*b as f64).powi(2);
        max = max.max((a - b).abs());
    }
    let nmse = err / norm;
    eprintln!("{image} {preset}: nmse {nmse:.3e}, max abs diff {max:.3e} over {} values", got.len());
    (nmse, max)
}

/// 16 patches a tile: with the F16 matmuls in tinyBLAS's order every step is llama.cpp's
/// arithmetic (the F16 patch embedding and matmuls, ggml's LayerNorm and GELU, the
/// one-chunk flash attention), so the rows are llama.cpp's to a few last bits (alpha.png:
/// every bit); on AMX tiles (sums in another order) within the gemma3 family's tolerance.
#[test]
fn idefics3_encoder_matches_llama_cpp() {
    for img in ["test-1.stb.png", "alpha.png"] {
        let (nmse, max) = compare_on(img, "idefics3-tiny-mmproj", false);
        assert!(nmse < 1e-9 && max < 1e-4, "{img}: nmse {nmse:e}, max {max}");
        let (nmse, max) = compare(img, "idefics3-tiny-mmproj");
        assert!(nmse < 1e-5 && max < 1e-2, "{img} on AMX where present: nmse {nmse:e}, max {max}");
    }
}

#[test]
fn gemma3_encoder_matches_llama_cpp() {
    for img in ["test-1.stb.png", "alpha.png"] {
        let (nmse, max) = compare(img, "gemma3-tiny-mmproj");
        assert!(nmse < 1e-5 && max < 1e-2, "{img}: nmse {nmse:e}, max {max}");
    }
}

#[test]
fn smolvlm_shape_encoder_matches_llama_cpp() {
    if std::env::var("KILN_FULL").is_err() {
        eprintln!("skipped: KILN_FULL=1 runs the SmolVLM-256M-shape encoder");
        return;
    }
    let (nmse, max) = compare("test-1.stb.png", "smolvlm-256m-mmproj");
    assert!(nmse < 1e-5 && max < 1e-2, "nmse {nmse:e}, max {max}");
}
