//! Image decoding and preprocessing against llama.cpp's (libmtmd on the same files,
//! `scripts/gen-vision-fixtures`): the decoded RGB bytes and every preprocessed tile's f32
//! bytes equal, on llama.cpp's test image and a few of our own (alpha, tiny, very wide).
//! Bad input: truncated and non-image files, a decompression bomb, are clear errors.

mod support;

use kiln::vision::{preprocess, synth, ClipConfig, RgbImage};
use sha2::{Digest, Sha256};
use support::*;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn config(preset: &str) -> ClipConfig {
    let bytes = synth::preset(preset).unwrap().build().unwrap().to_bytes();
    ClipConfig::from_gguf(&kiln::gguf::GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

#[test]
fn preprocessing_matches_llama_cpp_byte_for_byte() {
    let fx = fixture_json("vision/preprocess.json");
    let presets = ["smolvlm-256m-mmproj", "idefics3-tiny-mmproj", "gemma3-tiny-mmproj"];
    let cfgs: Vec<ClipConfig> = presets.iter().map(|p| config(p)).collect();
    let mut checked = 0;
    for (key, want) in fx.as_object().unwrap() {
        let (file, preset) = key.split_once(' ').unwrap();
        let img = if let Some(stem) = file.strip_suffix(".jpeg") {
            // JPEG decoders differ in their IDCT and chroma upsampling: llama.cpp's decode
            // (stb_image, kept losslessly) is the input here; ours is checked close to it.
            let ours = RgbImage::open(fixtures().join("vision").join(file)).unwrap();
            let stb = RgbImage::open(fixtures().join("vision").join(format!("{stem}.stb.png"))).unwrap();
            assert_eq!((ours.width, ours.height), (stb.width, stb.height));
            let diffs: Vec<u32> =
                ours.data.iter().zip(&stb.data).map(|(a, b)| a.abs_diff(*b) as u32).collect();
            let mean = diffs.iter().sum::<u32>() as f64 / diffs.len() as f64;
            let max = *diffs.iter().max().unwrap();
            assert!(
                mean < 1.0 && max <= 24,
                "{file}: decoded pixels vs stb_image: mean {mean:.3}, max {max}"
            );
            stb
        } else {
            RgbImage::open(fixtures().join("vision").join(file)).unwrap()
        };
        assert_eq!(hex(&Sha256::digest(&img.data)), want["rgb_sha256"], "{file}: decoded pixels");
        let cfg = &cfgs[presets.iter().position(|p| *p == preset).unwrap()];
        let got = preprocess(&img, cfg).unwrap();
        let tiles = want["tiles"].as_array().unwrap();
        assert_eq!(got.tiles.len(), tiles.len(), "{key}: tiles");
        let grid = [want["grid"][0].as_u64().unwrap() as usize, want["grid"][1].as_u64().unwrap() as usize];
        assert_eq!([got.grid.0, got.grid.1], grid, "{key}: grid");
        assert_eq!(got.overview, want["overview"].as_bool().unwrap(), "{key}: overview");
        for (i, (t, w)) in got.tiles.iter().zip(tiles).enumerate() {
            let size = (w["width"].as_u64().unwrap() as usize, w["height"].as_u64().unwrap() as usize);
            assert_eq!((t.width, t.height), size, "{key}: tile {i} size");
            let bytes: &[u8] = bytemuck::cast_slice(&t.data);
            assert_eq!(
                hex(&Sha256::digest(bytes)),
                w["sha256"],
                "{key}: tile {i} (first values {:?})",
                &t.data[..6]
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 12);
}

#[test]
fn bad_images_are_clear_errors() {
    let jpeg = std::fs::read(fixtures().join("vision/test-1.jpeg")).unwrap();
    let e = RgbImage::decode(&jpeg[..jpeg.len() / 3]).unwrap_err().to_string();
    assert!(e.contains("truncated"), "{e}");
    let png = std::fs::read(fixtures().join("vision/alpha.png")).unwrap();
    let e = RgbImage::decode(&png[..png.len() / 2]).unwrap_err().to_string();
    assert!(e.contains("not a readable image"), "{e}");
    let e = RgbImage::decode(b"hello, this is text").unwrap_err().to_string();
    assert!(e.contains("unknown format"), "{e}");
    let e = RgbImage::decode(&[]).unwrap_err().to_string();
    assert!(e.contains("not a readable image") || e.contains("unknown format"), "{e}");
    // Not files: refused at once (reading a FIFO would wait for a writer forever).
    let dir = std::env::temp_dir().join(format!("kiln-vision-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("image.png");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    for p in [fifo.as_path(), dir.as_path(), std::path::Path::new("/dev/zero")] {
        let e = RgbImage::open(p).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
    }
    std::fs::remove_dir_all(&dir).ok();
    // A 20,000 x 20,000 PNG: the header alone says so; refused before decoding.
    let e = RgbImage::decode(&bomb_png(20_000, 20_000)).unwrap_err().to_string();
    assert!(e.contains("more than the limit"), "{e}");
}

/// A PNG that claims `w` x `h` pixels (its data a short zlib stream of zero rows).
fn bomb_png(w: u32, h: u32) -> Vec<u8> {
    fn chunk(out: &mut Vec<u8>, t: &[u8], d: &[u8]) {
        out.extend_from_slice(&(d.len() as u32).to_be_bytes());
        let start = out.len();
        out.extend_from_slice(t);
        out.extend_from_slice(d);
        let crc = crc32(&out[start..]);
        out.extend_from_slice(&crc.to_be_bytes());
    }
    fn crc32(b: &[u8]) -> u32 {
        let mut c = !0u32;
        for &x in b {
            c ^= x as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            }
        }
        !c
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    chunk(&mut out, b"IHDR", &ihdr);
    // zlib: a stored empty block is enough for the header check to matter.
    chunk(&mut out, b"IDAT", &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01]);
    chunk(&mut out, b"IEND", &[]);
    out
}
