//! Decoding images (JPEG, PNG, WebP, GIF) into 8-bit RGB, with the size checked against a
//! pixel limit before any pixel is decoded: a small file that claims 20,000 × 20,000
//! pixels is refused, not expanded.

use std::io::Cursor;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{KilnError, Result};

/// The most pixels an image may have (64 megapixels: 8K × 8K).
pub const MAX_PIXELS: u64 = 64 << 20;

/// The most bytes of an image file read.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// An 8-bit RGB image, rows top to bottom, pixels interleaved (`[y][x][r, g, b]`).
#[derive(Clone, PartialEq, Eq)]
pub struct RgbImage {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

impl std::fmt::Debug for RgbImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RgbImage({}x{})", self.width, self.height)
    }
}

impl RgbImage {
    /// An image from raw pixels; `data` must hold `width * height * 3` bytes.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Self> {
        if width == 0 || height == 0 || (width * height) as u64 > MAX_PIXELS {
            return Err(KilnError::invalid(format!("image size {width}x{height} is empty or too large")));
        }
        if data.len() != width * height * 3 {
            return Err(KilnError::invalid(format!(
                "{} bytes of pixels for a {width}x{height} RGB image ({} expected)",
                data.len(),
                width * height * 3
            )));
        }
        Ok(RgbImage { width, height, data })
    }

    /// Decodes an image file's bytes (JPEG, PNG, WebP or GIF: the first frame); alpha is
    /// dropped, gray and palette images are expanded, 16-bit samples narrowed, as
    /// llama.cpp's loader (stb_image asked for three channels) does.
    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let bad = |e: String| KilnError::invalid(format!("not a readable image: {e}"));
        let reader = image::ImageReader::new(Cursor::new(bytes))
            .with_guessed_format()
            .map_err(|e| bad(e.to_string()))?;
        let Some(format) = reader.format() else {
            return Err(bad("unknown format (JPEG, PNG, WebP and GIF are read)".into()));
        };
        if format == image::ImageFormat::Jpeg && !jpeg_is_complete(bytes) {
            return Err(bad("truncated JPEG (no end-of-image marker after the image data)".into()));
        }
        let (w, h) = reader.into_dimensions().map_err(|e| bad(e.to_string()))?;
        if w == 0 || h == 0 {
            return Err(bad(format!("the header says {w}x{h} pixels (an empty image)")));
        }
        if w as u64 * h as u64 > MAX_PIXELS {
            return Err(KilnError::invalid(format!(
                "image is {w}x{h} pixels: more than the limit of {MAX_PIXELS} pixels (64 megapixels)"
            )));
        }
        let mut reader = image::ImageReader::with_format(Cursor::new(bytes), format);
        let mut limits = image::Limits::default();
        limits.max_image_width = Some(w);
        limits.max_image_height = Some(h);
        limits.max_alloc = Some(MAX_PIXELS * 8 + (16 << 20));
        reader.limits(limits);
        let img = reader.decode().map_err(|e| bad(e.to_string()))?;
        let rgb = img.into_rgb8();
        let (width, height) = (rgb.width() as usize, rgb.height() as usize);
        Ok(RgbImage { width, height, data: rgb.into_raw() })
    }

    /// Reads and decodes an image file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| KilnError::io(path, e))?;
        if !meta.is_file() {
            // A FIFO or device would block or never end; a directory cannot be read.
            return Err(KilnError::invalid(format!("{}: not a regular file", path.display())));
        }
        if meta.len() > MAX_FILE_BYTES {
            return Err(KilnError::invalid(format!(
                "{}: {} bytes, over the image file limit of {MAX_FILE_BYTES}",
                path.display(),
                meta.len()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| KilnError::io(path, e))?;
        Self::decode(&bytes).map_err(|e| KilnError::invalid(format!("{}: {e}", path.display())))
    }

    /// The sha256 of the size and pixels: the identity of the image in the prefix cache.
    pub fn hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update((self.width as u64).to_le_bytes());
        h.update((self.height as u64).to_le_bytes());
        h.update(&self.data);
        h.finalize().into()
    }

    pub fn pixel(&self, x: usize, y: usize) -> [u8; 3] {
        let i = (y * self.width + x) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    /// The `w` × `h` rectangle at (`x`, `y`) (inside the image).
    pub fn crop(&self, x: usize, y: usize, w: usize, h: usize) -> RgbImage {
        let mut data = Vec::with_capacity(w * h * 3);
        for row in y..y + h {
            let s = (row * self.width + x) * 3;
            data.extend_from_slice(&self.data[s..s + w * 3]);
        }
        RgbImage { width: w, height: h, data }
    }
}

/// Whether a JPEG's last start-of-scan marker (FF DA) is followed by an end-of-image marker
/// (FF D9): the decoder fills a truncated scan with gray rather than failing. Entropy-coded
/// data escapes every FF byte, so a marker found there is a real one; an embedded thumbnail's
/// markers all lie before the main image's scan.
fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let last = |m: u8| bytes.windows(2).rposition(|w| w == [0xFF, m]);
    matches!((last(0xDA), last(0xD9)), (Some(sos), Some(eoi)) if eoi > sos)
}
