//! `ModelConfig`: everything the forward needs to know about a model, read from GGUF
//! metadata. Architecture variants are fields here, not copies of the forward.

use crate::backend::Activation;
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, Value};

/// The architecture families kiln implements (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Gemma3,
    Granite,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        Some(match name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3" => Arch::Gemma3,
            "granite" => Arch::Granite,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Granite => "granite",
        }
    }
}

/// How RoPE frequencies are scaled for contexts beyond training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear,
    Yarn,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    pub n_rot: usize,
    /// NEOX (halves) rotation; NORM (adjacent pairs) otherwise.
    pub rope_neox: bool,
    pub rope_freq_base: f32,
    /// Base of sliding-window layers (gemma3: 10000 unless the file says otherwise).
    pub rope_freq_base_swa: f32,
    pub rope_scaling: RopeScaling,
    pub rope_freq_scale: f32,
    pub rope_n_ctx_orig: usize,
    pub yarn_ext_factor: f32,
    pub yarn_attn_factor: f32,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    /// Sliding-window size; `swa_layers[il]` says which layers use it.
    pub sliding_window: Option<u32>,
    pub swa_layers: Vec<bool>,
    pub activation: Activation,
    /// Multiplies the token embeddings (gemma: sqrt(n_embd); granite: embedding_scale).
    pub embd_scale: f32,
    /// Multiplies each block's attention and FFN output before the residual add (granite).
    pub residual_scale: f32,
    /// Scale of q·k (1/sqrt(head_dim) unless the file says otherwise).
    pub attn_scale: f32,
    /// Logits are divided by this (granite).
    pub logit_scale: f32,
    /// gemma3's extra norms after attention and after the FFN.
    pub post_norms: bool,
}

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch_name =
            g.architecture().ok_or_else(|| KilnError::Metadata("general.architecture is missing".into()))?;
        let arch =
            Arch::from_name(arch_name).ok_or_else(|| KilnError::unsupported("architecture", arch_name))?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize> {
            g.get_usize(&key(k))?.ok_or_else(|| KilnError::Metadata(format!("{} is missing", key(k))))
        };
        let opt_f32 = |k: &str| g.get_f32(&key(k));

        let n_embd = req("embedding_length")?;
        let n_layer = req("block_count")?;
        let n_head = per_layer_uniform(g, &key("attention.head_count"))?
            .ok_or_else(|| KilnError::Metadata(format!("{} is missing", key("attention.head_count"))))?;
        let n_head_kv = per_layer_uniform(g, &key("attention.head_count_kv"))?.unwrap_or(n_head);
        let n_ff = per_layer_uniform(g, &key("feed_forward_length"))?.unwrap_or(0);
        if n_embd == 0 || n_layer == 0 || n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(KilnError::Metadata(format!(
                "impossible shape: n_embd {n_embd}, n_layer {n_layer}, n_head {n_head}, n_head_kv {n_head_kv}"
            )));
        }
        if n_layer > 4096 || n_embd > 1 << 20 || n_head > 4096 {
            return Err(KilnError::Metadata(format!(
                "implausible shape: n_embd {n_embd}, n_layer {n_layer}"
            )));
        }
        let head_dim = g.get_usize(&key("attention.key_length"))?.unwrap_or(n_embd / n_head);
        let head_dim_v = g.get_usize(&key("attention.value_length"))?.unwrap_or(head_dim);
        if head_dim == 0 || head_dim_v != head_dim || head_dim % 2 != 0 {
            return Err(KilnError::unsupported("head dims", format!("key {head_dim}, value {head_dim_v}")));
        }
        let n_rot = g.get_usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(KilnError::Metadata(format!(
                "rope.dimension_count {n_rot} exceeds head_dim {head_dim}"
            )));
        }
        let n_ctx_train = g.get_usize(&key("context_length"))?.unwrap_or(2048);
        let norm_eps = opt_f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);

        let n_vocab = match g.get_array("tokenizer.ggml.tokens")? {
            Some(a) => a.len(),
            None => {
                g.get_usize(&key("vocab_size"))?.ok_or_else(|| KilnError::Metadata("no vocabulary".into()))?
            }
        };

        let rope_freq_base = opt_f32("rope.freq_base")?.unwrap_or(10000.0);
        let rope_scaling = match g.get_str(&key("rope.scaling.type"))?.unwrap_or("linear") {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear,
            "yarn" => RopeScaling::Yarn,
            other => return Err(KilnError::unsupported("rope scaling", other)),
        };
        let factor = match opt_f32("rope.scaling.factor")? {
            Some(f) => f,
            None => opt_f32("rope.scale_linear")?.unwrap_or(0.0),
        };
        let rope_freq_scale =
            if rope_scaling == RopeScaling::None || factor == 0.0 { 1.0 } else { 1.0 / factor };
        let rope_n_ctx_orig =
            g.get_usize(&key("rope.scaling.original_context_length"))?.unwrap_or(n_ctx_train);
        // llama.cpp's defaults for YaRN (llama-context.cpp).
        let yarn_ext_factor = opt_f32("rope.scaling.yarn_ext_factor")?
            .filter(|&x| x >= 0.0)
            .unwrap_or(if rope_scaling == RopeScaling::Yarn { 1.0 } else { 0.0 });
        let mut yarn_attn_factor = opt_f32("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0);
        if yarn_ext_factor != 0.0 {
            let f = 1.0 / rope_freq_scale;
            let mscale = if f <= 1.0 { 1.0 } else { 0.1 * f.ln() + 1.0 };
            // ggml multiplies by 1 + 0.1 ln(f) again inside rope; cancel it as llama.cpp does.
            yarn_attn_factor = mscale / (1.0 + 0.1 * f.ln());
        }
        yarn_attn_factor *= opt_f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let yarn_beta_fast = opt_f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0);
        let yarn_beta_slow = opt_f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0);

        let sliding_window =
            g.get_usize(&key("attention.sliding_window"))?.filter(|&w| w > 0).map(|w| w as u32);
        let swa_layers = match (arch, sliding_window) {
            (Arch::Gemma3, Some(_)) => {
                let pattern = g.get_usize(&key("attention.sliding_window_pattern"))?.unwrap_or(6);
                (0..n_layer).map(|il| pattern == 0 || il % pattern < pattern - 1).collect()
            }
            _ => vec![false; n_layer],
        };
        let sliding_window = if swa_layers.iter().any(|&s| s) { sliding_window } else { None };
        let rope_freq_base_swa = opt_f32("rope.freq_base_swa")?.unwrap_or(10000.0);

        let gemma = arch == Arch::Gemma3;
        let granite = arch == Arch::Granite;
        let embd_scale = if gemma {
            (n_embd as f32).sqrt()
        } else if granite {
            opt_f32("embedding_scale")?.unwrap_or(1.0)
        } else {
            1.0
        };
        let residual_scale = if granite { opt_f32("residual_scale")?.unwrap_or(1.0) } else { 1.0 };
        let attn_scale = match opt_f32("attention.scale")? {
            Some(s) if s != 0.0 => s,
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let logit_scale = if granite { opt_f32("logit_scale")?.unwrap_or(1.0) } else { 1.0 };

        Ok(ModelConfig {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train,
            norm_eps,
            n_rot,
            rope_neox: matches!(arch, Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma3),
            rope_freq_base,
            rope_freq_base_swa,
            rope_scaling,
            rope_freq_scale,
            rope_n_ctx_orig,
            yarn_ext_factor,
            yarn_attn_factor,
            yarn_beta_fast,
            yarn_beta_slow,
            sliding_window,
            swa_layers,
            activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
            embd_scale,
            residual_scale,
            attn_scale,
            logit_scale,
            post_norms: gemma,
        })
    }

    /// Width of one token's K (or V) across KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }
}

/// A per-layer count that kiln requires to be the same for every layer (a scalar, or an
/// array of equal values).
fn per_layer_uniform(g: &GgufFile, key: &str) -> Result<Option<usize>> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => {
            let v = a
                .to_i64_vec()
                .ok_or_else(|| KilnError::Metadata(format!("{key} is not an integer array")))?;
            match v.first() {
                Some(&first) if v.iter().all(|&x| x == first) && first >= 0 => Ok(Some(first as usize)),
                _ => Err(KilnError::unsupported("per-layer shape", format!("{key} = {v:?}"))),
            }
        }
        Some(_) => g.get_usize(key),
    }
}
