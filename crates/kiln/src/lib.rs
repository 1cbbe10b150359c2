//! kiln: a Rust-native LLM inference engine for GGUF models.

pub mod backend;
pub mod chat;
pub mod embed;
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

pub use chat::Message;
pub use embed::Pooling;
pub use engine::{Device, Engine, EngineOptions};
pub use error::{KilnError, Result};
pub use session::{CancelHandle, Event, FinishReason, GenerateOptions, Session, SessionOptions, Summary};
