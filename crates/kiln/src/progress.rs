//! Progress of the steps that can take a while — downloads, loading weights, uploading
//! them to a GPU, evaluating a long prompt — reported to a callback the caller supplies
//! (the `kiln` command draws bars on a terminal from it). The library itself draws nothing.

use std::sync::Arc;

/// Which step an update is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// A file coming from the network (bytes).
    Download,
    /// Weights read into the backend's layout (bytes).
    Load,
    /// Weights uploaded to the GPU (bytes).
    Upload,
    /// A prompt being evaluated (tokens).
    Prompt,
}

/// One update: `done` of `total` units of `stage`; `label` names the file or model.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub stage: Stage,
    pub label: &'a str,
    pub done: u64,
    pub total: u64,
}

/// The callback progress goes to. It is called often (per MiB, per tensor, per batch), so it
/// should be quick.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Reports `done` of `total` to `f`, if there is one.
pub(crate) fn report(f: Option<&ProgressFn>, stage: Stage, label: &str, done: u64, total: u64) {
    if let Some(f) = f {
        f(&Progress { stage, label, done, total });
    }
}
