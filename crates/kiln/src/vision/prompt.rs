//! Images in the prompt, as llama.cpp's mtmd places them: the text holds a marker where
//! each image goes; an image becomes its family's marker tokens around the encoded rows of
//! each tile. Positions holding image rows carry ids past any vocabulary, derived from the
//! pixels' hash, so a session's prefix reuse and the prefix cache see the same image as the
//! same positions; they tell image rows apart by id and the rows' values
//! ([`prefix::row_key`]), so two images whose ids coincide never share keys and values.

use std::collections::HashMap;
use std::sync::Arc;

use super::config::Projector;
use super::encoder::VisionEncoder;
use super::image::RgbImage;
use super::preprocess::preprocess;
use crate::error::{KilnError, Result};
use crate::kv::prefix;
use crate::tokenizer::Tokenizer;

/// Where an image goes in a prompt's text (llama.cpp's default media marker).
pub const MEDIA_MARKER: &str = "<__media__>";

/// Ids at or above this name image rows, not tokens.
pub const IMAGE_ID_BASE: u32 = 0x8000_0000;

/// An image ready for the language model: the ids of its span (marker tokens and image-row
/// ids) and the encoded rows of the image ids, in order.
#[derive(Clone, Debug)]
pub struct EncodedImage {
    pub ids: Vec<u32>,
    /// `n_embd` values per image id of `ids`, in their order.
    pub embd: Vec<f32>,
}

impl EncodedImage {
    pub fn is_image_id(id: u32) -> bool {
        id >= IMAGE_ID_BASE
    }
}

/// The images of a conversation or request, by their pixels' hash, and for each image-row
/// id where its row is: what a prompt's image ids stand for. Ids are distinct per image here:
/// an image whose ids would coincide with an earlier one's takes the next free ids.
#[derive(Clone, Debug, Default)]
pub struct ImageRows {
    images: Vec<Arc<EncodedImage>>,
    by_hash: HashMap<[u8; 32], usize>,
    rows: HashMap<u32, Row>,
}

/// Where an image-row id's row is, and its prefix-cache key.
#[derive(Clone, Copy, Debug)]
struct Row {
    image: usize,
    row: usize,
    key: u64,
}

impl ImageRows {
    /// The image of these pixels, encoded once.
    pub fn encode(
        &mut self,
        enc: &VisionEncoder,
        tok: &Tokenizer,
        img: &RgbImage,
    ) -> Result<Arc<EncodedImage>> {
        let hash = img.hash();
        if let Some(&i) = self.by_hash.get(&hash) {
            return Ok(self.images[i].clone());
        }
        let mut e = encode_image(enc, tok, img)?;
        let n = e.ids.iter().filter(|&&id| EncodedImage::is_image_id(id)).count() as u32;
        let mut base = image_base(&hash);
        while (0..n).any(|k| self.rows.contains_key(&image_id(base, k))) {
            base = base.wrapping_add(n);
        }
        let i = self.images.len();
        let rows = Arc::make_mut(&mut e);
        let d = rows.embd.len() / n.max(1) as usize;
        let ids = rows.ids.iter_mut().filter(|id| EncodedImage::is_image_id(**id));
        for (k, id) in ids.enumerate() {
            *id = image_id(base, k as u32);
            let key = prefix::row_key(*id, &rows.embd[k * d..(k + 1) * d]);
            self.rows.insert(*id, Row { image: i, row: k, key });
        }
        self.by_hash.insert(hash, i);
        self.images.push(e.clone());
        Ok(e)
    }

    /// The prefix-cache keys of the positions `tokens`: image rows of these images by their
    /// ids and values, anything else as a token.
    pub fn keys(&self, tokens: &[u32]) -> Vec<u64> {
        tokens.iter().map(|&t| self.rows.get(&t).map_or(prefix::token_key(t), |r| r.key)).collect()
    }

    /// Images held.
    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// Whether `id` names an image row here.
    pub fn contains(&self, id: u32) -> bool {
        self.rows.contains_key(&id)
    }

    /// The rows (`n_embd` wide) of image-row ids `ids`, concatenated.
    pub fn gather(&self, ids: &[u32], n_embd: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(ids.len() * n_embd);
        for id in ids {
            let r = self.rows.get(id).ok_or_else(|| KilnError::invalid(format!("no image row {id:#x}")))?;
            out.extend_from_slice(&self.images[r.image].embd[r.row * n_embd..(r.row + 1) * n_embd]);
        }
        Ok(out)
    }

    pub fn clear(&mut self) {
        *self = ImageRows::default();
    }
}

/// Where an image's ids start, from its pixels' hash.
fn image_base(hash: &[u8; 32]) -> u32 {
    u32::from_le_bytes([hash[0], hash[1], hash[2], hash[3]])
}

/// The id of row `k` of the image whose ids start at `base` (31 bits above `IMAGE_ID_BASE`).
fn image_id(base: u32, k: u32) -> u32 {
    IMAGE_ID_BASE | (base.wrapping_add(k) & !IMAGE_ID_BASE)
}

/// The end of the run starting at `at` of `tokens` that is all image rows of `images` or all
/// not, at most `max` long.
pub fn run_end(tokens: &[u32], at: usize, max: usize, images: Option<&ImageRows>) -> usize {
    let limit = at.saturating_add(max).min(tokens.len());
    let Some(images) = images else { return limit };
    let img = images.contains(tokens[at]);
    (at..limit).find(|&i| images.contains(tokens[i]) != img).unwrap_or(limit)
}

/// Preprocesses and encodes `img`, and lays it out as `enc`'s family does in llama.cpp
/// (idefics3: per tile `<fake_token_around_image><row_R_col_C>` and the tile, a `\n` after
/// each row of tiles but the last, then `\n\n<fake_token_around_image><global-img>`, the
/// global image and `<fake_token_around_image>`; gemma3: `<start_of_image>`, the image's
/// rows, `<end_of_image>`).
pub fn encode_image(enc: &VisionEncoder, tok: &Tokenizer, img: &RgbImage) -> Result<Arc<EncodedImage>> {
    let cfg = enc.config();
    let pre = preprocess(img, cfg)?;
    let base = image_base(&img.hash());
    let mut next = 0u32;
    let mut out = EncodedImage { ids: Vec::new(), embd: Vec::new() };
    let text = |out: &mut EncodedImage, s: &str| -> Result<()> {
        out.ids.extend(tok.encode(s, false, true)?);
        Ok(())
    };
    let mut tile = |out: &mut EncodedImage, i: usize| -> Result<()> {
        let rows = enc.encode(&pre.tiles[i])?;
        for _ in 0..cfg.n_tokens_per_image() {
            out.ids.push(image_id(base, next));
            next += 1;
        }
        out.embd.extend(rows);
        Ok(())
    };
    match cfg.projector {
        Projector::Idefics3 => {
            for t in ["<fake_token_around_image>", "<global-img>", "<row_1_col_1>"] {
                if tok.encode(t, false, true)?.len() != 1 {
                    return Err(KilnError::invalid(format!(
                        "the language model has no {t} token: it does not take SmolVLM's (idefics3) images"
                    )));
                }
            }
            let (gx, gy) = pre.grid;
            for y in 0..gy {
                for x in 0..gx {
                    text(&mut out, &format!("<fake_token_around_image><row_{}_col_{}>", y + 1, x + 1))?;
                    tile(&mut out, 1 + y * gx + x)?;
                }
                if y + 1 != gy {
                    text(&mut out, "\n")?;
                }
            }
            text(&mut out, "\n\n<fake_token_around_image><global-img>")?;
            tile(&mut out, 0)?;
            text(&mut out, "<fake_token_around_image>")?;
        }
        Projector::Gemma3 => {
            for t in ["<start_of_image>", "<end_of_image>"] {
                if tok.encode(t, false, true)?.len() != 1 {
                    return Err(KilnError::invalid(format!(
                        "the language model has no {t} token: it does not take Gemma 3's images"
                    )));
                }
            }
            text(&mut out, "<start_of_image>")?;
            tile(&mut out, 0)?;
            text(&mut out, "<end_of_image>")?;
        }
    }
    Ok(Arc::new(out))
}
