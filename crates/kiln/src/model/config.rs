//! `ModelConfig`: everything the forward needs to know about a model, read from GGUF
//! metadata. What every architecture's metadata says the same way (shape, heads, RoPE) is
//! read here into [`Hparams`]; each architecture's file (`arch/`) then says what its layers
//! are made of.

use super::arch;
use super::block::Layer;
use crate::backend::{Gating, RopeParams, Routing};
use crate::error::{KilnError, Result};
use crate::gguf::{GgufFile, Value};

/// How RoPE frequencies are scaled for contexts beyond training.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    Linear,
    Yarn,
}

/// The kind of every norm of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    Rms,
    /// LayerNorm, with a bias where the file has one (BERT).
    Layer,
}

/// What an encoder adds to its token embeddings before the first layer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Embeddings {
    /// Learned absolute positions (`position_embd`, BERT).
    pub positions: bool,
    /// Token type 0's row (`token_types`).
    pub token_types: bool,
    /// A norm of the sum (`token_embd_norm`).
    pub norm: bool,
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    /// `general.architecture`.
    pub arch: &'static str,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Width of the widest feed-forward hidden layer (scratch sizing).
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    /// Multiplies the token embeddings (gemma: sqrt(n_embd); granite: embedding_scale).
    pub embd_scale: f32,
    /// Multiplies each block's output before the residual add (granite).
    pub residual_scale: f32,
    /// Logits are divided by this (granite).
    pub logit_scale: f32,
    /// Soft-capping of the logits, `cap · tanh(logit / cap)` (gemma2).
    pub final_softcap: Option<f32>,
    /// What each layer is made of.
    pub layers: Vec<Layer>,
    pub norm: NormKind,
    /// Each position sees only the ones before it (decoders); else its whole sequence
    /// (encoders: `attention.causal` = false).
    pub causal: bool,
    pub embd: Embeddings,
    /// The final norm's tensor name (without `.weight`), `None` where the last layer
    /// ends with one (BERT).
    pub output_norm: Option<&'static str>,
    /// How the file says its embeddings are pooled (`pooling_type`); `None`: not said.
    pub pooling: Option<crate::embed::Pooling>,
}

impl ModelConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let name =
            g.architecture().ok_or_else(|| KilnError::Metadata("general.architecture is missing".into()))?;
        let (name, config) = arch::find(name).ok_or_else(|| KilnError::unsupported("architecture", name))?;
        let m = Meta { g, arch: name };
        let c = config(&m)?;
        c.check(&m)?;
        Ok(c)
    }

    /// What the forward needs of any architecture's config, whatever its file computed from
    /// the metadata: sizes of at least 1, rotations within the head, finite multipliers.
    fn check(&self, m: &Meta) -> Result<()> {
        let positive = |x: f32| x.is_finite() && x > 0.0;
        let bad = |what: &str, v: &dyn std::fmt::Display| {
            Err(KilnError::Metadata(format!("{}: {what} = {v}, which the forward cannot run", m.arch)))
        };
        for (what, v) in [
            ("the norm epsilon", self.norm_eps),
            ("the embedding scale", self.embd_scale),
            ("the residual scale", self.residual_scale),
            ("the logit scale", self.logit_scale),
        ] {
            if !positive(v) {
                return bad(what, &v);
            }
        }
        for (il, l) in self.layers.iter().enumerate() {
            // Each dense unit's hidden width, by the key that sets it.
            let widths = match l.ffn.moe() {
                None => vec![("feed_forward_length", l.ffn.n_ff())],
                Some(moe) => {
                    let shared = moe.shared.map(|s| ("expert_shared_feed_forward_length", s.n_ff));
                    [("expert_feed_forward_length", moe.n_ff)].into_iter().chain(shared).collect()
                }
            };
            // The biased route (`backend::route`) scores experts by sigmoid only.
            if l.ffn.moe().is_some_and(|moe| moe.selection_bias && moe.routing.gating != Gating::Sigmoid) {
                return Err(m.bad(
                    "expert_gating_func",
                    1,
                    "an expert-selection bias needs sigmoid scores (2)",
                ));
            }
            for (key, n_ff) in widths {
                if n_ff == 0 {
                    return match m.g.get(&m.key(key)) {
                        Some(_) => Err(m.bad(key, 0, "a feed-forward block needs at least 1")),
                        None => Err(KilnError::Metadata(format!("{} is missing", m.key(key)))),
                    };
                }
            }
            // The rest checks attention (a short convolution has nothing to check here).
            let Some(attn) = l.mixer.attention() else { continue };
            if !positive(attn.scale) {
                return bad(&format!("layer {il}'s attention scale"), &attn.scale);
            }
            if attn.window == Some(0) {
                return bad(&format!("layer {il}'s sliding window"), &0);
            }
            if let Some(r) = &attn.rope {
                if r.n_rot > self.head_dim || r.n_rot % 2 != 0 {
                    return bad(
                        &format!("layer {il}'s rotated dimensions (head size {})", self.head_dim),
                        &r.n_rot,
                    );
                }
                for (what, v) in [
                    ("base", r.freq_base),
                    ("frequency scale", r.freq_scale),
                    ("attention factor", r.attn_factor),
                ] {
                    if !positive(v) {
                        return bad(&format!("layer {il}'s RoPE {what}"), &v);
                    }
                }
                if !(r.ext_factor.is_finite() && r.beta_fast.is_finite() && r.beta_slow.is_finite()) {
                    return bad(
                        &format!("layer {il}'s YaRN parameters"),
                        &format!("{} {} {}", r.ext_factor, r.beta_fast, r.beta_slow),
                    );
                }
            }
        }
        Ok(())
    }

    /// Width of one token's K (or V) across KV heads.
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// The sliding window of layer `il`'s attention (`None`: it sees the whole context).
    pub fn window(&self, il: usize) -> Option<u32> {
        self.layers.get(il).and_then(|l| l.mixer.attention()?.window)
    }

    /// Whether some layer keeps a recurrent state per sequence (LFM2's short convolutions).
    pub fn is_recurrent(&self) -> bool {
        self.layers.iter().any(|l| matches!(l.mixer, super::block::Mixer::ShortConv(_)))
    }

    /// The share of tensor `name` one token reads: `k / n_expert` for a layer's routed
    /// experts (`blk.N.ffn_*_exps.*`), else all of it (1).
    pub fn active_share(&self, name: &str) -> f64 {
        let moe = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .filter(|(_, t)| t.starts_with("ffn_") && t.contains("_exps."))
            .and_then(|(il, _)| self.layers.get(il.parse::<usize>().ok()?))
            .and_then(|l| l.ffn.moe());
        moe.map_or(1.0, |m| m.routing.k as f64 / m.routing.n_expert as f64)
    }
}

/// A model's GGUF metadata, read under its architecture's prefix (`{arch}.{key}`).
pub struct Meta<'a> {
    pub g: &'a GgufFile,
    pub arch: &'static str,
}

impl Meta<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An integer; a count (`block_count`, head sizes, ...: [`COUNTS`]) must be at least 1.
    pub fn usize(&self, k: &str) -> Result<Option<usize>> {
        self.count_checked(k, self.g.get_usize(&self.key(k))?)
    }

    /// A number, checked against what its key can mean ([`FloatDomain::of`]): so every
    /// architecture's reads refuse a NaN base or a negative epsilon alike.
    pub fn f32(&self, k: &str) -> Result<Option<f32>> {
        let x = self.g.get_f32(&self.key(k))?;
        match x {
            Some(v) if !FloatDomain::of(k).holds(v) => Err(self.bad(k, v, FloatDomain::of(k).needs())),
            _ => Ok(x),
        }
    }

    pub fn str(&self, k: &str) -> Result<Option<&str>> {
        self.g.get_str(&self.key(k))
    }

    /// A count the architecture cannot do without.
    pub fn req(&self, k: &str) -> Result<usize> {
        self.usize(k)?.ok_or_else(|| KilnError::Metadata(format!("{} is missing", self.key(k))))
    }

    /// The error for `k` holding `value`, which the forward cannot run.
    pub fn bad(&self, k: &str, value: impl std::fmt::Display, why: &str) -> KilnError {
        KilnError::Metadata(format!("{} = {value}: {why}", self.key(k)))
    }

    fn count_checked(&self, k: &str, n: Option<usize>) -> Result<Option<usize>> {
        match n {
            Some(0) if COUNTS.contains(&k) => Err(self.bad(k, 0, "must be at least 1")),
            n => Ok(n),
        }
    }

    /// A per-layer count that kiln requires to be the same for every layer (a scalar, or an
    /// array of equal values).
    pub fn uniform(&self, k: &str) -> Result<Option<usize>> {
        let array = |key: &str, v: Option<Vec<i64>>| {
            let v = v.ok_or_else(|| KilnError::Metadata(format!("{key} is not an integer array")))?;
            match v.first() {
                Some(&first) if v.iter().all(|&x| x == first) && first >= 0 => {
                    self.count_checked(k, Some(first as usize))
                }
                _ => Err(KilnError::unsupported("per-layer shape", format!("{key} = {v:?}"))),
            }
        };
        self.scalar_or_array(k, || self.usize(k), array)
    }

    /// A per-layer key: `None` where absent, else read by `scalar` where it holds one value,
    /// by `array` (given the full key and the elements as integers, `None` where they are not)
    /// where it holds an array.
    fn scalar_or_array<T>(
        &self,
        k: &str,
        scalar: impl FnOnce() -> Result<Option<T>>,
        array: impl FnOnce(&str, Option<Vec<i64>>) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let key = self.key(k);
        match self.g.get(&key) {
            None => Ok(None),
            Some(Value::Array(a)) => array(&key, a.to_i64_vec()),
            Some(_) => scalar(),
        }
    }

    /// The experts' routing (`expert_count`, `expert_used_count`), `None` where the model
    /// has no experts. llama.cpp's limits: at most 512 experts, 1 to all of them used.
    pub fn routing(&self, gating: Gating, norm: bool) -> Result<Option<Routing>> {
        let n_expert = self.usize("expert_count")?.unwrap_or(0);
        if n_expert == 0 {
            return Ok(None);
        }
        let k = self.uniform("expert_used_count")?.unwrap_or(0);
        if n_expert > 512 || k == 0 || k > n_expert {
            return Err(KilnError::Metadata(format!(
                "{} = {n_expert} with {} = {k}: 1 to 512 experts, at least one used, at most all",
                self.key("expert_count"),
                self.key("expert_used_count")
            )));
        }
        Ok(Some(Routing { n_expert, k, gating, norm, scale: 1.0 }))
    }

    /// How the router scores experts (`expert_gating_func`, llama.cpp's enum: 1 softmax,
    /// 2 sigmoid); `None` where the file does not say.
    pub fn gating(&self) -> Result<Option<Gating>> {
        Ok(match self.g.get_usize(&self.key("expert_gating_func"))? {
            None => None,
            Some(1) => Some(Gating::Softmax),
            Some(2) => Some(Gating::Sigmoid),
            Some(other) => return Err(self.bad("expert_gating_func", other, "1 (softmax) or 2 (sigmoid)")),
        })
    }

    /// The file's `pooling_type` (llama.cpp's enum: 0 none, 1 mean, 2 cls, 3 last, 4 rank).
    pub fn pooling(&self) -> Result<Option<crate::embed::Pooling>> {
        use crate::embed::Pooling;
        Ok(match self.usize("pooling_type")? {
            None => None,
            Some(0) => Some(Pooling::None),
            Some(1) => Some(Pooling::Mean),
            Some(2) => Some(Pooling::Cls),
            Some(3) => Some(Pooling::Last),
            Some(4) => Some(Pooling::Rank),
            Some(other) => return Err(KilnError::unsupported("pooling_type", other.to_string())),
        })
    }

    /// A per-layer count as one value per layer (a scalar repeated, or an array of
    /// `n_layer`).
    pub fn per_layer(&self, k: &str, n_layer: usize) -> Result<Option<Vec<usize>>> {
        let scalar = || Ok(self.g.get_usize(&self.key(k))?.map(|x| vec![x; n_layer]));
        self.scalar_or_array(k, scalar, |key, v| {
            let v = v
                .filter(|v| v.len() == n_layer && v.iter().all(|&x| (0..1 << 20).contains(&x)))
                .ok_or_else(|| KilnError::Metadata(format!("{key} should hold {n_layer} counts")))?;
            Ok(Some(v.iter().map(|&x| x as usize).collect()))
        })
    }

    /// Which of `n_layer` layers use the sliding window: `attention.sliding_window_pattern`
    /// as an array of flags, or a period `p` (every layer but each `p`-th is local; 0: all),
    /// `default_period` when absent.
    pub fn swa_layers(&self, n_layer: usize, default_period: usize) -> Result<Vec<bool>> {
        let key = self.key("attention.sliding_window_pattern");
        if let Some(Value::Array(a)) = self.g.get(&key) {
            let v = a.to_i64_vec().filter(|v| v.len() == n_layer).ok_or_else(|| {
                KilnError::Metadata(format!("{key} should hold one flag per layer ({n_layer})"))
            })?;
            return Ok(v.iter().map(|&x| x != 0).collect());
        }
        let p = self.g.get_usize(&key)?.unwrap_or(default_period);
        Ok((0..n_layer).map(|il| p == 0 || il % p < p - 1).collect())
    }
}

/// Integer keys that are counts or sizes: 0 is refused wherever one is read.
/// (`feed_forward_length` is not among them: layers without a feed-forward block write 0;
/// [`ModelConfig::check`] refuses an empty one.)
const COUNTS: &[&str] = &[
    "block_count",
    "embedding_length",
    "context_length",
    "vocab_size",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "rope.scaling.original_context_length",
];

/// What a number in the metadata can hold, by its key's name (llama.cpp's names), so an
/// architecture file that reads a key gets it checked without saying so.
#[derive(Clone, Copy)]
enum FloatDomain {
    /// A norm epsilon, a RoPE base, a multiplier or a YaRN parameter: finite and above 0.
    Positive,
    /// Where 0 means "unset" or "off" (`rope.scaling.factor`, `attention.scale`, soft caps).
    NonNegative,
    /// Any finite value (`rope.scaling.yarn_ext_factor`: negative means "unset").
    Finite,
    /// A key with no known meaning here: anything but NaN.
    NotNan,
}

impl FloatDomain {
    fn of(k: &str) -> FloatDomain {
        match k {
            "rope.scaling.factor" | "rope.scale_linear" | "attention.scale" => FloatDomain::NonNegative,
            "rope.scaling.yarn_ext_factor" | "rope.scaling.yarn_log_multiplier" => FloatDomain::Finite,
            "embedding_scale" | "residual_scale" | "logit_scale" => FloatDomain::Positive,
            _ if k.ends_with("epsilon")
                || k.starts_with("rope.freq_base")
                || k.ends_with("attn_factor")
                || k.starts_with("rope.scaling.yarn_beta") =>
            {
                FloatDomain::Positive
            }
            _ if k.ends_with("softcapping") => FloatDomain::NonNegative,
            _ if k.starts_with("rope.") => FloatDomain::Finite,
            _ => FloatDomain::NotNan,
        }
    }

    fn holds(self, x: f32) -> bool {
        match self {
            FloatDomain::Positive => x.is_finite() && x > 0.0,
            FloatDomain::NonNegative => x.is_finite() && x >= 0.0,
            FloatDomain::Finite => x.is_finite(),
            FloatDomain::NotNan => !x.is_nan(),
        }
    }

    fn needs(self) -> &'static str {
        match self {
            FloatDomain::Positive => "must be a finite number above 0",
            FloatDomain::NonNegative => "must be a finite number, 0 or more",
            FloatDomain::Finite => "must be a finite number",
            FloatDomain::NotNan => "must be a number",
        }
    }
}

/// What every architecture's metadata says the same way (llama.cpp's generic hparams):
/// the shape, the norm epsilon and the trained RoPE.
#[derive(Clone, Debug)]
pub struct Hparams {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub norm_eps: f32,
    /// Scale of q·k (`attention.scale`, else 1/sqrt(head_dim)).
    pub attn_scale: f32,
    /// The trained rotation (NORM pairs; an architecture sets `neox`), no frequency factors
    /// (those are tensors: the loader adds them).
    pub rope: RopeParams,
    pub rope_scaling: RopeScaling,
    /// `attention.causal` (default true).
    pub causal: bool,
    pub pooling: Option<crate::embed::Pooling>,
}

impl Hparams {
    pub fn read(m: &Meta) -> Result<Hparams> {
        let n_embd = m.req("embedding_length")?;
        let n_layer = m.req("block_count")?;
        let n_head = m
            .uniform("attention.head_count")?
            .ok_or_else(|| KilnError::Metadata(format!("{} is missing", m.key("attention.head_count"))))?;
        // Layers without attention (LFM2's convolutions) have no KV heads: the others'
        // count, which must agree.
        let n_head_kv = match m.per_layer("attention.head_count_kv", n_layer.min(4096))? {
            None => n_head,
            Some(v) => {
                let mut heads = v.iter().copied().filter(|&h| h > 0);
                // Every layer without KV heads: no attention anywhere, which is no model kiln runs.
                let first = heads
                    .next()
                    .ok_or_else(|| m.bad("attention.head_count_kv", 0, "must be positive in some layer"))?;
                if heads.any(|h| h != first) {
                    return Err(KilnError::unsupported(
                        "per-layer shape",
                        format!("{} = {v:?}", m.key("attention.head_count_kv")),
                    ));
                }
                first
            }
        };
        let n_ff = m.uniform("feed_forward_length")?.unwrap_or(0);
        if n_head % n_head_kv != 0 {
            return Err(m.bad(
                "attention.head_count_kv",
                n_head_kv,
                &format!("must divide {} ({n_head})", m.key("attention.head_count")),
            ));
        }
        if n_layer > 4096 || n_embd > 1 << 20 || n_head > 4096 {
            return Err(KilnError::Metadata(format!(
                "implausible shape: n_embd {n_embd}, n_layer {n_layer}"
            )));
        }
        let head_dim = m.usize("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = m.usize("attention.value_length")?.unwrap_or(head_dim);
        if head_dim == 0 || head_dim_v != head_dim || head_dim % 2 != 0 {
            return Err(KilnError::unsupported("head dims", format!("key {head_dim}, value {head_dim_v}")));
        }
        let n_rot = m.usize("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            let why = format!("must be even and at most the head size ({head_dim})");
            return Err(m.bad("rope.dimension_count", n_rot, &why));
        }
        let n_ctx_train = m.usize("context_length")?.unwrap_or(2048);
        let norm_eps = m.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5);

        let n_vocab = match m.g.get_array("tokenizer.ggml.tokens")? {
            Some(a) => a.len(),
            None => m.usize("vocab_size")?.ok_or_else(|| KilnError::Metadata("no vocabulary".into()))?,
        };
        if n_vocab == 0 {
            return Err(KilnError::Metadata("the vocabulary is empty".into()));
        }

        let rope_scaling = match m.str("rope.scaling.type")?.unwrap_or("linear") {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear,
            "yarn" => RopeScaling::Yarn,
            other => return Err(KilnError::unsupported("rope scaling", other)),
        };
        let (factor_key, factor) = match m.f32("rope.scaling.factor")? {
            Some(f) => ("rope.scaling.factor", f),
            None => ("rope.scale_linear", m.f32("rope.scale_linear")?.unwrap_or(0.0)),
        };
        let freq_scale = if rope_scaling == RopeScaling::None || factor == 0.0 { 1.0 } else { 1.0 / factor };
        if !freq_scale.is_finite() {
            return Err(m.bad(factor_key, factor, "is too small to scale by"));
        }
        // llama.cpp's defaults for YaRN (llama-context.cpp).
        let ext_factor = match m.f32("rope.scaling.yarn_ext_factor")? {
            // Negative: llama.cpp's "unset".
            Some(x) if x >= 0.0 => x,
            _ if rope_scaling == RopeScaling::Yarn => 1.0,
            _ => 0.0,
        };
        let mut attn_factor = m.f32("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0);
        if ext_factor != 0.0 {
            let f = 1.0 / freq_scale;
            let mscale = |m: f32| if f <= 1.0 { 1.0 } else { 0.1 * m * f.ln() + 1.0 };
            // `yarn_log_multiplier` (mistral3: mscale_all_dim) divides it out.
            let mscale = match m.f32("rope.scaling.yarn_log_multiplier")? {
                Some(all) if all != 0.0 => mscale(1.0) / mscale(all),
                _ => mscale(1.0),
            };
            // ggml multiplies by 1 + 0.1 ln(f) again inside rope; cancel it as llama.cpp does.
            attn_factor = mscale / (1.0 + 0.1 * f.ln());
        }
        attn_factor *= m.f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let rope = RopeParams {
            n_rot,
            neox: false,
            freq_base: m.f32("rope.freq_base")?.unwrap_or(10000.0),
            freq_scale,
            ext_factor,
            attn_factor,
            beta_fast: m.f32("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
            beta_slow: m.f32("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
            n_ctx_orig: m.usize("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train),
            freq_factors: None,
        };
        let attn_scale = match m.f32("attention.scale")? {
            Some(s) if s != 0.0 => s,
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        Ok(Hparams {
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train,
            norm_eps,
            attn_scale,
            rope,
            rope_scaling,
            causal: m.g.get_bool(&m.key("attention.causal"))?.unwrap_or(true),
            pooling: m.pooling()?,
        })
    }

    /// The trained rotation with NEOX (halves) pairs instead of NORM (adjacent) ones.
    pub fn rope_neox(&self) -> RopeParams {
        RopeParams { neox: true, ..self.rope.clone() }
    }

    /// A config of these hparams with `layer(il)` as each layer: every multiplier 1,
    /// RMSNorms, `output_norm`.
    pub fn config(&self, m: &Meta, layer: impl Fn(usize) -> Layer) -> ModelConfig {
        let layers: Vec<Layer> = (0..self.n_layer).map(layer).collect();
        ModelConfig {
            arch: m.arch,
            n_vocab: self.n_vocab,
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim: self.head_dim,
            n_ff: layers.iter().map(|l| l.ffn.n_ff()).max().unwrap_or(0),
            n_ctx_train: self.n_ctx_train,
            norm_eps: self.norm_eps,
            embd_scale: 1.0,
            residual_scale: 1.0,
            logit_scale: 1.0,
            final_softcap: None,
            layers,
            norm: NormKind::Rms,
            causal: self.causal,
            embd: Embeddings::default(),
            output_norm: Some("output_norm"),
            pooling: self.pooling,
        }
    }
}
