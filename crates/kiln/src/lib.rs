//! kiln: a Rust-native LLM inference engine for GGUF models.

pub mod chat;
pub mod error;
pub mod gguf;
pub mod hub;
pub mod model;
pub mod quant;
pub mod sample;
pub mod tokenizer;

pub use error::{KilnError, Result};
