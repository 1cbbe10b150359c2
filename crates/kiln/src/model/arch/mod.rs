//! One file per architecture: what its GGUF metadata means and which shared blocks
//! (`model::block`) its layers are made of. Each file has one function reading a file's
//! metadata into a [`ModelConfig`]; the tensors follow from the blocks, and the one forward
//! (`model::forward`) runs every architecture.
//!
//! Adding an architecture: a file here with its `config`, one line in [`ARCHS`], a
//! synthetic preset (`model::synth`) and its test against llama.cpp (DESIGN.md's checklist).

mod bert;
mod gemma2;
mod gemma3;
mod granite;
mod jina_bert_v2;
mod lfm2;
mod lfm2moe;
mod llama;
mod mistral3;
mod nomic_bert;
mod olmo2;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod smollm3;

use super::block::{Attention, Ffn, Layer, Norms};
use super::config::{Embeddings, Hparams, Meta, ModelConfig, NormKind};
use crate::backend::RopeParams;
use crate::error::{KilnError, Result};

/// Reads a file's metadata into the model's configuration.
pub type Config = fn(&Meta) -> Result<ModelConfig>;

/// Every architecture kiln runs, by its `general.architecture` name.
const ARCHS: &[(&str, Config)] = &[
    ("llama", llama::config),
    ("qwen2", qwen2::config),
    ("qwen3", qwen3::config),
    ("gemma3", gemma3::config),
    ("granite", granite::config),
    ("granitemoe", granite::config),
    ("qwen3moe", qwen3moe::config),
    ("qwen2moe", qwen2moe::config),
    ("olmoe", olmoe::config),
    ("phi3", phi3::config),
    ("gemma2", gemma2::config),
    ("mistral3", mistral3::config),
    ("smollm3", smollm3::config),
    ("olmo2", olmo2::config),
    ("lfm2", lfm2::config),
    ("lfm2moe", lfm2moe::config),
    ("bert", bert::config),
    ("nomic-bert", nomic_bert::config),
    ("jina-bert-v2", jina_bert_v2::config),
];

/// The architecture named `name`: its name (static) and how to read its config.
pub fn find(name: &str) -> Option<(&'static str, Config)> {
    ARCHS.iter().find(|(n, _)| *n == name).copied()
}

/// The names of the architectures kiln runs.
pub fn names() -> impl Iterator<Item = &'static str> {
    ARCHS.iter().map(|(n, _)| *n)
}

/// The BERT family's encoder: LayerNorms (`attention.layer_norm_epsilon`) after each
/// block's residual add, the embeddings LayerNormed (token type 0's row added where the
/// file has `token_types`), no final norm, attention as the file says
/// (`attention.causal`), rotated by `rope` or biased by ALiBi (`alibi`: its maximum
/// bias), `ffn(n_ff)` as each feed-forward block.
fn encoder(
    m: &Meta,
    rope: Option<RopeParams>,
    alibi: Option<f32>,
    ffn: impl Fn(usize) -> Ffn,
) -> Result<ModelConfig> {
    let h = Hparams::read(m)?;
    let attn = Attention { norms: Norms::AFTER, rope, alibi, ..Attention::new(h.rope.clone(), h.attn_scale) };
    let mut c = h.config(m, |_| Layer { mixer: attn.clone().into(), ffn: ffn(h.n_ff) });
    c.norm = NormKind::Layer;
    c.norm_eps = m.f32("attention.layer_norm_epsilon")?.ok_or_else(|| {
        KilnError::Metadata(format!("{} is missing", m.key("attention.layer_norm_epsilon")))
    })?;
    c.embd =
        Embeddings { positions: false, token_types: m.g.tensor("token_types.weight").is_some(), norm: true };
    c.output_norm = None;
    Ok(c)
}
