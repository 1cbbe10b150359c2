//! `ClipConfig`: an mmproj file's vision encoder and projector, read from its `clip.*`
//! metadata as llama.cpp's `tools/mtmd` reads it (the keys, their defaults per projector).

use crate::error::{KilnError, Result};
use crate::gguf::GgufFile;

/// The projector from the ViT's output into the language model's embedding space, with the
/// image layout (preprocessing, markers, attention in the language model) of its family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Projector {
    /// SmolVLM / Idefics3: pixel shuffle (`n_merge`² patches side by side) then one linear
    /// map; the image is tiled into `image_size` sub-images plus a global one.
    Idefics3,
    /// Gemma 3: SigLIP, `n_merge` × `n_merge` average pooling, the soft-embedding RMS norm,
    /// one linear map; one fixed-size image; the language model attends to it
    /// bidirectionally.
    Gemma3,
}

impl Projector {
    pub fn name(self) -> &'static str {
        match self {
            Projector::Idefics3 => "idefics3",
            Projector::Gemma3 => "gemma3",
        }
    }

    /// Whether the language model reads an image's rows with bidirectional attention among
    /// them (each row sees the context before the image and every row of the image), as
    /// llama.cpp decodes the image chunk with causal attention off
    /// (`mtmd_decode_use_non_causal`); otherwise causally, like text.
    pub fn rows_attend_bidirectionally(self) -> bool {
        match self {
            Projector::Idefics3 => false,
            Projector::Gemma3 => true,
        }
    }
}

/// The resampling filter of a family's resize (Pillow's, in fixed point).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResizeFilter {
    Bilinear,
    Bicubic,
    Lanczos,
}

#[derive(Clone, Debug)]
pub struct ClipConfig {
    pub projector: Projector,
    pub n_embd: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub eps: f32,
    /// Side of the (square) image the encoder takes.
    pub image_size: usize,
    pub patch_size: usize,
    pub image_mean: [f32; 3],
    pub image_std: [f32; 3],
    /// Patches merged per side by the projector (pixel shuffle factor, pooling kernel).
    pub n_merge: usize,
    /// Idefics3: the longest edge an image is resized to before tiling (0: the generic
    /// size rule of files without it).
    pub longest_edge: usize,
    pub resize: ResizeFilter,
    /// Width of the projector's output rows (the language model's `n_embd`).
    pub n_embd_out: usize,
}

/// The most patches per side an encoder takes (a bound on input, far above real files).
const MAX_PATCHES_SIDE: usize = 256;

impl ClipConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let meta = |m: String| KilnError::Metadata(m);
        if g.architecture() != Some("clip") {
            return Err(meta(format!(
                "not an mmproj file (general.architecture is {:?}, expected \"clip\")",
                g.architecture().unwrap_or("missing")
            )));
        }
        if g.get_bool("clip.has_vision_encoder")? != Some(true) {
            return Err(meta("the mmproj file has no vision encoder (clip.has_vision_encoder)".into()));
        }
        let proj_name = match g.get_str("clip.projector_type")? {
            Some(p) => p,
            None => g.get_str("clip.vision.projector_type")?.unwrap_or(""),
        };
        let projector = match proj_name {
            "idefics3" => Projector::Idefics3,
            "gemma3" => Projector::Gemma3,
            other => return Err(KilnError::unsupported("vision projector", other)),
        };
        let req =
            |k: &str| -> Result<usize> { g.get_usize(k)?.ok_or_else(|| meta(format!("{k} is missing"))) };
        let n_embd = req("clip.vision.embedding_length")?;
        let n_head = req("clip.vision.attention.head_count")?;
        let n_ff = req("clip.vision.feed_forward_length")?;
        let n_layer = req("clip.vision.block_count")?;
        let eps = g
            .get_f32("clip.vision.attention.layer_norm_epsilon")?
            .ok_or_else(|| meta("clip.vision.attention.layer_norm_epsilon is missing".into()))?;
        let image_size = req("clip.vision.image_size")?;
        let patch_size = req("clip.vision.patch_size")?;
        if g.get_usize("clip.vision.attention.head_count_kv")?.is_some_and(|kv| kv != n_head) {
            return Err(KilnError::unsupported("vision attention", "grouped KV heads"));
        }
        let head_dim = g.get_usize("clip.vision.attention.head_dim")?.unwrap_or(n_embd / n_head.max(1));
        let arr3 = |k: &str| -> Result<[f32; 3]> {
            let v = g.get_array(k)?.and_then(|a| a.to_f32_vec()).filter(|v| v.len() >= 3);
            let v = v.ok_or_else(|| meta(format!("{k} should be an array of at least 3 numbers")))?;
            Ok([v[0], v[1], v[2]])
        };
        let image_mean = arr3("clip.vision.image_mean")?;
        let image_std = arr3("clip.vision.image_std")?;
        if g.get_bool("clip.use_silu")? == Some(true) || g.get_bool("clip.use_gelu")? != Some(true) {
            return Err(KilnError::unsupported("vision feed-forward activation", "other than GELU"));
        }
        let (n_merge, resize) = match projector {
            Projector::Idefics3 => (2, ResizeFilter::Lanczos),
            Projector::Gemma3 => (4, ResizeFilter::Bilinear),
        };
        let n_merge = g.get_usize("clip.vision.projector.scale_factor")?.unwrap_or(n_merge);
        let longest_edge = match projector {
            Projector::Idefics3 => g.get_usize("clip.vision.preproc_image_size")?.unwrap_or(0),
            Projector::Gemma3 => 0,
        };
        let n_embd_out = req("clip.vision.projection_dim")?;

        let bad = |what: &str| Err(meta(format!("vision encoder: {what}")));
        if n_embd == 0 || n_head == 0 || n_layer == 0 || n_ff == 0 || head_dim == 0 || n_embd_out == 0 {
            return bad("a zero size");
        }
        if n_head * head_dim != n_embd {
            return bad("head_count × head_dim differs from embedding_length");
        }
        if patch_size == 0 || image_size % patch_size != 0 || image_size / patch_size > MAX_PATCHES_SIDE {
            return bad("image_size is not a multiple of patch_size (or too large)");
        }
        let side = image_size / patch_size;
        if n_merge < 1 || side % n_merge != 0 {
            return bad("the projector's scale factor does not divide the patch grid");
        }
        if longest_edge > 16 * image_size {
            return bad("preproc_image_size is over 16 tiles");
        }
        if !(eps.is_finite() && eps >= 0.0) {
            return bad("layer_norm_epsilon is not a finite non-negative number");
        }
        if image_std.iter().any(|&s| s == 0.0 || !s.is_finite()) || image_mean.iter().any(|m| !m.is_finite())
        {
            return bad("image_mean/image_std are not finite (or a std is 0)");
        }
        Ok(ClipConfig {
            projector,
            n_embd,
            n_head,
            head_dim,
            n_ff,
            n_layer,
            eps,
            image_size,
            patch_size,
            image_mean,
            image_std,
            n_merge,
            longest_edge,
            resize,
            n_embd_out,
        })
    }

    /// Patches per side of an `image_size` image.
    pub fn n_patches_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Output rows (language-model positions) per encoded image.
    pub fn n_tokens_per_image(&self) -> usize {
        let s = self.n_patches_side() / self.n_merge;
        s * s
    }
}
