//! Image preprocessing per family, as llama.cpp's mtmd does it, so the encoder sees the same
//! pixels: Idefics3 resizes to a longest edge, then to whole tiles, cuts the tiles and adds a
//! global image (the whole, resized to one tile); Gemma 3 letterboxes into one fixed square.
//! Pixels become `v / 255`, then `(v - mean) / std` per channel, in f32.

use super::config::{ClipConfig, Projector};
use super::image::RgbImage;
use super::resize::resize;
use crate::error::{KilnError, Result};

/// One encoder input: `size` × `size` pixels, normalized, interleaved (`[y][x][c]`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tile {
    pub width: usize,
    pub height: usize,
    pub data: Vec<f32>,
}

/// A preprocessed image: the encoder inputs in the order their embeddings enter the prompt
/// (Idefics3: the global image first, then the tiles row by row) and the tile grid.
#[derive(Clone, Debug)]
pub struct Preprocessed {
    pub tiles: Vec<Tile>,
    /// Tiles per row and rows of tiles (0 × 0: a single image, no grid).
    pub grid: (usize, usize),
    /// Whether `tiles[0]` is the global image of a grid.
    pub overview: bool,
}

fn normalize(img: &RgbImage, cfg: &ClipConfig) -> Tile {
    let data = img
        .data
        .chunks_exact(3)
        .flat_map(|p| (0..3).map(move |c| (p[c] as f32 / 255.0 - cfg.image_mean[c]) / cfg.image_std[c]))
        .collect();
    Tile { width: img.width, height: img.height, data }
}

/// llama.cpp's resize with letterbox padding (PAD_CEIL): the image scaled to fit, centred on
/// black.
fn letterbox(img: &RgbImage, w: usize, h: usize, cfg: &ClipConfig) -> RgbImage {
    if img.width == w && img.height == h {
        return img.clone();
    }
    let scale = (w as f32 / img.width as f32).min(h as f32 / img.height as f32);
    let nw = ((img.width as f32 * scale).ceil() as usize).clamp(1, w);
    let nh = ((img.height as f32 * scale).ceil() as usize).clamp(1, h);
    let small = resize(img, nw, nh, cfg.resize);
    let mut out = RgbImage { width: w, height: h, data: vec![0; w * h * 3] };
    let (ox, oy) = ((w - nw) / 2, (h - nh) / 2);
    for y in 0..nh {
        let d = ((y + oy) * w + ox) * 3;
        out.data[d..d + nw * 3].copy_from_slice(&small.data[y * nw * 3..(y + 1) * nw * 3]);
    }
    out
}

/// Preprocesses `img` for the encoder of `cfg`.
pub fn preprocess(img: &RgbImage, cfg: &ClipConfig) -> Result<Preprocessed> {
    let size = cfg.image_size;
    match cfg.projector {
        Projector::Gemma3 => {
            let t = normalize(&letterbox(img, size, size, cfg), cfg);
            Ok(Preprocessed { tiles: vec![t], grid: (0, 0), overview: false })
        }
        Projector::Idefics3 => {
            let edge = cfg.longest_edge;
            if edge == 0 {
                return Err(KilnError::unsupported(
                    "idefics3 mmproj",
                    "without clip.vision.preproc_image_size (an old conversion)",
                ));
            }
            let aspect = img.width as f64 / img.height as f64;
            let (rw, rh) = if img.width >= img.height {
                let h = (edge as f64 / aspect) as usize;
                (edge, h + h % 2)
            } else {
                let w = (edge as f64 * aspect) as usize;
                (w + w % 2, edge)
            };
            if rw == 0 || rh == 0 {
                return Err(KilnError::invalid(format!(
                    "a {}x{} image is too narrow to resize to a longest edge of {edge}",
                    img.width, img.height
                )));
            }
            let (gx, gy) = (rw.div_ceil(size), rh.div_ceil(size));
            let resized = resize(img, rw, rh, cfg.resize);
            let refined = resize(&resized, gx * size, gy * size, cfg.resize);
            let mut tiles = vec![normalize(&resize(&refined, size, size, cfg.resize), cfg)];
            for y in 0..gy {
                for x in 0..gx {
                    tiles.push(normalize(&refined.crop(x * size, y * size, size, size), cfg));
                }
            }
            Ok(Preprocessed { tiles, grid: (gx, gy), overview: true })
        }
    }
}
