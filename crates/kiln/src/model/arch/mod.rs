//! One file per architecture: what its GGUF metadata means and which shared blocks
//! (`model::block`) its layers are made of. Each file has one function reading a file's
//! metadata into a [`ModelConfig`]; the tensors follow from the blocks, and the one forward
//! (`model::forward`) runs every architecture.
//!
//! Adding an architecture: a file here with its `config`, one line in [`ARCHS`], a
//! synthetic preset (`model::synth`) and its test against llama.cpp (DESIGN.md's checklist).

mod gemma2;
mod gemma3;
mod granite;
mod llama;
mod mistral3;
mod olmo2;
mod olmoe;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod smollm3;

use super::config::{Meta, ModelConfig};
use crate::error::Result;

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
];

/// The architecture named `name`: its name (static) and how to read its config.
pub fn find(name: &str) -> Option<(&'static str, Config)> {
    ARCHS.iter().find(|(n, _)| *n == name).copied()
}

/// The names of the architectures kiln runs.
pub fn names() -> impl Iterator<Item = &'static str> {
    ARCHS.iter().map(|(n, _)| *n)
}
