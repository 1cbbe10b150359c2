//! Model definitions: config from GGUF metadata, weights, one forward for every family.

mod config;
mod forward;
mod runner;
pub mod synth;
mod weights;

pub use config::{Arch, ModelConfig, RopeScaling};
pub use forward::{Model, OutputKind, Scratch, UBatch};
pub use runner::{Entry, ModelRunner, Runner, SeqId};
pub use weights::{LayerWeights, Weights};

/// Architectures kiln can run.
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "granite"];

pub fn is_supported_architecture(arch: &str) -> bool {
    Arch::from_name(arch).is_some()
}
