//! Model definitions: each architecture's file (`arch/`) reads its GGUF metadata into a
//! `ModelConfig` of shared blocks (`block/`); the weights follow from the blocks, and one
//! batch-first forward runs them all.

pub mod arch;
pub mod block;
mod config;
mod forward;
mod runner;
pub mod synth;
mod weights;

pub use block::{Layer, LayerWeights, Mixer};
pub use config::{Embeddings, Hparams, Meta, ModelConfig, NormKind, RopeScaling};
pub use forward::{Model, OutputKind, Scratch, UBatch};
pub use runner::{Entry, ModelRunner, Runner, SeqId};
pub use weights::{Loader, Weights};

/// Whether kiln runs architecture `arch` (`general.architecture`).
pub fn is_supported_architecture(arch: &str) -> bool {
    arch::find(arch).is_some()
}
