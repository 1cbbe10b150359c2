//! kiln: a Rust-native LLM inference engine for GGUF models.
//!
//! Load a model once into an [`Engine`] (weights, tokenizer, chat template, KV block pool;
//! cheap to clone, shared by everything that uses it), open [`Session`]s on it, append
//! text, tokens or chat messages, and [`Session::generate`] streams the reply:
//!
//! ```
//! use std::ops::ControlFlow;
//! use kiln::{Engine, EngineOptions, GenerateOptions, Message, SessionOptions};
//! # use kiln::gguf::Value;
//! # let dir = std::env::temp_dir().join(format!("kiln-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # let path = dir.join("tiny.gguf");
//! # let mut w = kiln::model::synth::SynthSpec::default().build().unwrap();
//! # w.set("tokenizer.chat_template", Value::String(
//! #     "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>".into()));
//! # w.write_file(&path).unwrap();
//! # let path = path.to_str().unwrap();
//! // A .gguf path, or a catalog name such as "smollm2-135m" (fetched on first use).
//! let engine = Engine::load(path, EngineOptions::default().with_n_ctx(256))?;
//! let mut chat = engine.session(SessionOptions::default())?;
//! chat.append_chat(&[Message::system("Be brief."), Message::user("Hello!")])?;
//! let n_prompt = chat.tokens().len();
//! let opts = GenerateOptions::default().with_max_tokens(8).with_logprobs(2);
//! let summary = chat.generate(&opts, |ev| {
//!     print!("{}", ev.text); // valid UTF-8 pieces, as they come
//!     ControlFlow::Continue(())
//! })?;
//! println!("\n[{}: {} tokens]", summary.finish_reason.as_str(), summary.ids.len());
//!
//! // The next turn re-renders the history; only tokens the KV lacks are evaluated
//! // (the first prompt is reused; the reply is too, when its text re-tokenizes alike).
//! let before = chat.n_evaluated();
//! chat.append_chat(&[Message::user("And again?")])?;
//! assert!(chat.n_evaluated() - before <= chat.tokens().len() - n_prompt);
//!
//! // Embeddings: hidden states after the final norm, mean-pooled.
//! let v = engine.embed("some text", kiln::Pooling::Mean)?;
//! assert_eq!(v[0].len(), engine.config().n_embd);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok::<(), kiln::KilnError>(())
//! ```
//!
//! Sessions are `Send` and hold only `Arc`s; cancel one from another thread with
//! [`Session::cancel_handle`]. The engine's prefix cache lets a new session reuse whole KV
//! blocks another computed ([`EngineOptions::prefix_cache_tokens`]); sessions save to and
//! restore from files bound to the model's sha256 ([`Session::save`], [`Session::restore`]).

pub mod backend;
pub mod chat;
pub mod embed;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod grammar;
pub mod hub;
pub mod kv;
pub mod model;
pub mod progress;
pub mod quant;
pub mod sample;
pub mod session;
pub mod spec;
pub mod tokenizer;
pub mod vision;

pub use backend::cpu::AttnArith;
pub use chat::Message;
pub use embed::Pooling;
pub use engine::{Device, Engine, EngineOptions};
pub use error::{KilnError, Result};
pub use grammar::{Grammar, GrammarSpec, Trigger};
pub use session::{CancelHandle, Event, FinishReason, GenerateOptions, Session, SessionOptions, Summary};
