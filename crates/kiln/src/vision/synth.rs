//! Synthetic mmproj files: a vision encoder and projector of a real family and shape with
//! deterministic pseudo-random weights, written as llama.cpp's converters write them
//! (`clip.*` metadata; patch and position embeddings F32, matrices F16, norms and biases
//! F32). Tests compare kiln with llama.cpp on them, paired with a real language model.

use crate::error::Result;
use crate::gguf::{Array, GgufWriter, Value};
use crate::model::synth::Rng;
use crate::quant::{self, GgmlType};

/// What to write.
#[derive(Clone, Debug)]
pub struct MmprojSpec {
    /// `clip.projector_type`: "idefics3" or "gemma3".
    pub projector: String,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub image_size: usize,
    pub patch_size: usize,
    /// Pixel-shuffle factor (idefics3) or pooling kernel (gemma3).
    pub n_merge: usize,
    /// idefics3: `clip.vision.preproc_image_size` (the longest edge before tiling).
    pub longest_edge: usize,
    pub eps: f32,
    /// The language model's embedding width.
    pub n_embd_text: usize,
    /// Gain of the projection: how strongly images move the language model.
    pub proj_gain: f32,
    pub seed: u64,
}

/// Named specs. `smolvlm-256m-mmproj`: SmolVLM-256M's SigLIP (768 wide, 12 layers, 512
/// pixel tiles of 16-pixel patches) and its 4× pixel shuffle into SmolLM2-135M's 576, with
/// tiles up to 512 pixels (the real file's 2048 makes 17 tiles of every image: slow tests).
/// `idefics3-tiny-mmproj`: the same family at 64-pixel tiles, several per image.
/// `gemma3-tiny-mmproj`: a small SigLIP with Gemma 3's projector into gemma3-270m's 640.
pub fn preset(name: &str) -> Option<MmprojSpec> {
    let smolvlm = MmprojSpec {
        projector: "idefics3".into(),
        n_embd: 768,
        n_head: 12,
        n_ff: 3072,
        n_layer: 12,
        image_size: 512,
        patch_size: 16,
        n_merge: 4,
        longest_edge: 512,
        eps: 1e-6,
        n_embd_text: 576,
        proj_gain: 0.5,
        seed: 7,
    };
    Some(match name {
        "smolvlm-256m-mmproj" => smolvlm,
        "idefics3-tiny-mmproj" => MmprojSpec {
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_layer: 2,
            image_size: 64,
            patch_size: 16,
            n_merge: 2,
            longest_edge: 192,
            seed: 8,
            ..smolvlm
        },
        "gemma3-tiny-mmproj" => MmprojSpec {
            projector: "gemma3".into(),
            n_embd: 64,
            n_head: 4,
            n_ff: 128,
            n_layer: 2,
            image_size: 128,
            patch_size: 16,
            n_merge: 2,
            longest_edge: 0,
            n_embd_text: 640,
            seed: 9,
            ..smolvlm
        },
        _ => return None,
    })
}

/// The preset names, for tools' usage messages.
pub const PRESETS: &[&str] = &["smolvlm-256m-mmproj", "idefics3-tiny-mmproj", "gemma3-tiny-mmproj"];

impl MmprojSpec {
    pub fn build(&self) -> Result<GgufWriter> {
        let mut w = GgufWriter::new();
        let (d, ff, ps) = (self.n_embd, self.n_ff, self.patch_size);
        let u = |v: usize| Value::U32(v as u32);
        w.set("general.architecture", Value::String("clip".into()));
        w.set("general.name", Value::String(format!("synthetic {} mmproj", self.projector)));
        w.set("clip.has_vision_encoder", Value::Bool(true));
        w.set("clip.projector_type", Value::String(self.projector.clone()));
        w.set("clip.use_gelu", Value::Bool(true));
        w.set("clip.vision.embedding_length", u(d));
        w.set("clip.vision.feed_forward_length", u(ff));
        w.set("clip.vision.block_count", u(self.n_layer));
        w.set("clip.vision.projection_dim", u(self.n_embd_text));
        w.set("clip.vision.attention.head_count", u(self.n_head));
        w.set("clip.vision.attention.layer_norm_epsilon", Value::F32(self.eps));
        w.set("clip.vision.image_size", u(self.image_size));
        w.set("clip.vision.patch_size", u(ps));
        w.set("clip.vision.image_mean", Value::Array(Array::F32(vec![0.5, 0.5, 0.5])));
        w.set("clip.vision.image_std", Value::Array(Array::F32(vec![0.5, 0.5, 0.5])));
        w.set("clip.vision.projector.scale_factor", u(self.n_merge));
        if self.projector == "idefics3" {
            w.set("clip.vision.preproc_image_size", u(self.longest_edge));
        }

        let mut rng = Rng(self.seed);
        let n_pos = (self.image_size / ps).pow(2);
        let cols = 3 * ps * ps;
        let patch: Vec<f32> = (0..cols * d).map(|_| rng.next_f32() * (3.0 / cols as f32).sqrt()).collect();
        let (ps64, d64) = (ps as u64, d as u64);
        w.add_f32("v.patch_embd.weight", &[ps64, ps64, 3, d64], &patch)?;
        vector(&mut w, &mut rng, "v.patch_embd.bias", d, 0.0, 0.1)?;
        let pos: Vec<f32> = (0..n_pos * d).map(|_| 0.5 * rng.next_f32()).collect();
        w.add_f32("v.position_embd.weight", &[d64, n_pos as u64], &pos)?;
        for il in 0..self.n_layer {
            let n = |s: &str| format!("v.blk.{il}.{s}");
            vector(&mut w, &mut rng, &n("ln1.weight"), d, 1.0, 0.1)?;
            vector(&mut w, &mut rng, &n("ln1.bias"), d, 0.0, 0.1)?;
            for t in ["attn_q", "attn_k", "attn_v", "attn_out"] {
                matrix(&mut w, &mut rng, &n(&format!("{t}.weight")), d, d, 1.0)?;
                vector(&mut w, &mut rng, &n(&format!("{t}.bias")), d, 0.0, 0.1)?;
            }
            vector(&mut w, &mut rng, &n("ln2.weight"), d, 1.0, 0.1)?;
            vector(&mut w, &mut rng, &n("ln2.bias"), d, 0.0, 0.1)?;
            matrix(&mut w, &mut rng, &n("ffn_up.weight"), d, ff, 1.0)?;
            vector(&mut w, &mut rng, &n("ffn_up.bias"), ff, 0.0, 0.1)?;
            matrix(&mut w, &mut rng, &n("ffn_down.weight"), ff, d, 1.0)?;
            vector(&mut w, &mut rng, &n("ffn_down.bias"), d, 0.0, 0.1)?;
        }
        vector(&mut w, &mut rng, "v.post_ln.weight", d, 1.0, 0.1)?;
        vector(&mut w, &mut rng, "v.post_ln.bias", d, 0.0, 0.1)?;
        let m2 = self.n_merge * self.n_merge;
        match self.projector.as_str() {
            "idefics3" => {
                matrix(&mut w, &mut rng, "mm.model.fc.weight", d * m2, self.n_embd_text, self.proj_gain)?
            }
            _ => {
                vector(&mut w, &mut rng, "mm.soft_emb_norm.weight", d, 1.0, 0.1)?;
                // Stored as [n_embd_text, n_embd] (ggml order) and multiplied transposed: the
                // values' scale follows the input width n_embd.
                let amp = self.proj_gain * (3.0 / d as f32).sqrt();
                f16_matrix(&mut w, &mut rng, "mm.input_projection.weight", self.n_embd_text, d, amp)?;
            }
        }
        Ok(w)
    }
}

/// A `[cols, rows]` F16 matrix with values uniform in ±gain·sqrt(3/cols).
fn matrix(w: &mut GgufWriter, rng: &mut Rng, name: &str, cols: usize, rows: usize, gain: f32) -> Result<()> {
    f16_matrix(w, rng, name, cols, rows, gain * (3.0 / cols as f32).sqrt())
}

fn f16_matrix(
    w: &mut GgufWriter,
    rng: &mut Rng,
    name: &str,
    cols: usize,
    rows: usize,
    amp: f32,
) -> Result<()> {
    let vals: Vec<f32> = (0..cols * rows).map(|_| rng.next_f32() * amp).collect();
    let mut data = vec![0u8; 2 * vals.len()];
    quant::quantize_row(GgmlType::F16, &vals, &mut data)?;
    w.add_tensor(name, GgmlType::F16, &[cols as u64, rows as u64], data)?;
    Ok(())
}

fn vector(w: &mut GgufWriter, rng: &mut Rng, name: &str, n: usize, center: f32, spread: f32) -> Result<()> {
    let v: Vec<f32> = (0..n).map(|_| center + spread * rng.next_f32()).collect();
    w.add_f32(name, &[n as u64], &v)?;
    Ok(())
}

/// The tokens SmolVLM's language model adds to SmolLM2's vocabulary for images (the global
/// image, tile positions up to 6 × 6, and the marker around each image).
pub fn smolvlm_image_tokens() -> Vec<String> {
    let mut t =
        vec!["<fake_token_around_image>".to_string(), "<global-img>".to_string(), "<image>".to_string()];
    for r in 1..=6 {
        for c in 1..=6 {
            t.push(format!("<row_{r}_col_{c}>"));
        }
    }
    t
}

/// A copy of language model `src` with `tokens` appended to its vocabulary as control
/// tokens, each with an embedding row copied from an existing token's (deterministically):
/// SmolLM2-135M becomes a language model whose vocabulary holds SmolVLM's image tokens, as
/// SmolVLM-256M's own does, so llama.cpp's idefics3 prompt layout can be formed on it.
pub fn with_added_tokens(src: &crate::gguf::GgufFile, tokens: &[String]) -> Result<GgufWriter> {
    use crate::error::KilnError;
    let n_vocab = src
        .get_array("tokenizer.ggml.tokens")?
        .map(|a| a.len())
        .ok_or_else(|| KilnError::Metadata("tokenizer.ggml.tokens is missing".into()))?;
    let mut w = GgufWriter::new();
    for (k, v) in &src.metadata {
        let v = match (k.as_str(), v) {
            ("tokenizer.ggml.tokens", Value::Array(Array::String(t))) => {
                Value::Array(Array::String(t.iter().chain(tokens).cloned().collect()))
            }
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(t))) => {
                Value::Array(Array::I32(t.iter().copied().chain(tokens.iter().map(|_| 3)).collect()))
            }
            ("tokenizer.ggml.scores", Value::Array(Array::F32(t))) => {
                Value::Array(Array::F32(t.iter().copied().chain(tokens.iter().map(|_| 0.0)).collect()))
            }
            _ => v.clone(),
        };
        w.set(k.clone(), v);
    }
    for t in &src.tensors {
        let mut data = src.tensor_data(t).to_vec();
        let mut dims = t.dims.clone();
        if matches!(t.name.as_str(), "token_embd.weight" | "output.weight")
            && dims.get(1) == Some(&(n_vocab as u64))
        {
            let row = t.ty.row_size(dims[0] as usize)?;
            for i in 0..tokens.len() {
                let from = (i * 997 + 301) % n_vocab;
                data.extend_from_within(from * row..(from + 1) * row);
            }
            dims[1] += tokens.len() as u64;
        }
        w.add_tensor(t.name.clone(), t.ty, &dims, data)?;
    }
    Ok(w)
}
