//! One error type for the whole crate. Every variant says what was wrong and where.

use std::path::PathBuf;

/// Everything that can go wrong in kiln. Messages name the file, key, tensor, offset,
/// line or column concerned, so the CLI can print them as one `error:` line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KilnError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A GGUF file is malformed: truncated, corrupted or hostile.
    #[error("invalid GGUF{}: {msg} (at offset {offset})", path_suffix(.path))]
    Gguf { path: Option<PathBuf>, offset: u64, msg: String },
    /// A tensor type, architecture or feature kiln does not implement.
    #[error("unsupported {what}: {name}")]
    Unsupported { what: &'static str, name: String },
    /// Metadata is missing or has the wrong type.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// A tensor is missing or has the wrong shape or type.
    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("grammar: {0}")]
    Grammar(String),
    /// A caller-supplied value is out of range (n_ctx, prompt length, sampler settings...).
    #[error("{0}")]
    Invalid(String),
    /// The model catalog or a download failed.
    #[error("model hub: {0}")]
    Hub(String),
    #[error("backend: {0}")]
    Backend(String),
}

fn path_suffix(p: &Option<PathBuf>) -> String {
    match p {
        Some(p) => format!(" {}", p.display()),
        None => String::new(),
    }
}

pub type Result<T, E = KilnError> = std::result::Result<T, E>;

impl KilnError {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        KilnError::Io { path: path.into(), source }
    }
    pub fn invalid(msg: impl Into<String>) -> Self {
        KilnError::Invalid(msg.into())
    }
    pub fn unsupported(what: &'static str, name: impl Into<String>) -> Self {
        KilnError::Unsupported { what, name: name.into() }
    }
}
