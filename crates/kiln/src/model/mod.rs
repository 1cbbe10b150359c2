//! Model definitions: config from GGUF metadata, weights, one forward per family.

/// Architectures kiln can run.
pub const ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "granite"];

pub fn is_supported_architecture(arch: &str) -> bool {
    ARCHITECTURES.contains(&arch)
}
