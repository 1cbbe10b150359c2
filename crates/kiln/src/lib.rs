//! kiln: a Rust-native LLM inference engine for GGUF models.

pub mod backend;
pub mod chat;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod hub;
pub mod kv;
pub mod model;
pub mod quant;
pub mod sample;
pub mod session;
pub mod tokenizer;

pub use error::{KilnError, Result};
