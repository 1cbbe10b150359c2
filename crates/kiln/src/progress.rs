//! Progress of the steps that can take a while — downloads, loading weights, uploading
//! them to a GPU, evaluating a long prompt — reported to a callback the caller supplies
//! ([`crate::EngineOptions::with_progress`], [`crate::SessionOptions::with_progress`]; the
//! `kiln` command draws bars on a terminal from it). The library itself draws nothing.

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

/// One update: `done` of `total` units of `stage`; `label` names the file or model. A
/// step's last update has `done == total`.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub stage: Stage,
    pub label: &'a str,
    pub done: u64,
    pub total: u64,
}

/// The callback progress goes to. It is called often (per MiB, per layer, per batch), so
/// it should be quick.
#[derive(Clone)]
pub struct ProgressFn(Arc<dyn Fn(&Progress) + Send + Sync>);

impl ProgressFn {
    pub fn new(f: impl Fn(&Progress) + Send + Sync + 'static) -> Self {
        ProgressFn(Arc::new(f))
    }

    /// Reports `done` of `total` units of `stage`.
    pub fn report(&self, stage: Stage, label: &str, done: u64, total: u64) {
        (self.0)(&Progress { stage, label, done, total });
    }
}

impl std::fmt::Debug for ProgressFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressFn")
    }
}

/// Reports to `f`, if there is one.
pub(crate) fn report(f: Option<&ProgressFn>, stage: Stage, label: &str, done: u64, total: u64) {
    if let Some(f) = f {
        f.report(stage, label, done, total);
    }
}
