//! Image files: decoding any bytes must return an image or an error, never panic, and never
//! allocate past the pixel limit; a decoded image must preprocess for both projector
//! families (small tiles, so the resize paths run on every input).
#![no_main]

use std::sync::OnceLock;

use kiln::gguf::GgufFile;
use kiln::vision::{preprocess, synth, ClipConfig, RgbImage};
use libfuzzer_sys::fuzz_target;

fn configs() -> &'static [ClipConfig] {
    static CFGS: OnceLock<Vec<ClipConfig>> = OnceLock::new();
    CFGS.get_or_init(|| {
        ["idefics3-tiny-mmproj", "gemma3-tiny-mmproj"]
            .iter()
            .map(|p| {
                let bytes = synth::preset(p).unwrap().build().unwrap().to_bytes();
                ClipConfig::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(img) = RgbImage::decode(data) else { return };
    assert_eq!(img.data.len(), img.width * img.height * 3);
    if img.width * img.height > 1 << 16 {
        return;
    }
    for cfg in configs() {
        if let Ok(p) = preprocess(&img, cfg) {
            assert!(p.tiles.iter().all(|t| t.data.len() == t.width * t.height * 3));
        }
    }
});
