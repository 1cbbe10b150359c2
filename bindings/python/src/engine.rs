//! `kiln.Engine`: a loaded model. Tokenize, complete, chat, embed, open sessions.

use std::path::PathBuf;

use kiln::embed::{embed_tokens, normalize as unit_length, Pooling};
use kiln::spec::SpecOptions;
use kiln::{Device, EngineOptions, SessionOptions};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict, PyList, PyString};

use crate::errors::{invalid, OrRaise};
use crate::generate::{generate, Job, Target};
use crate::sampling;
use crate::session::Session;
use crate::worker;

/// A loaded model: weights on a device, tokenizer, chat template and KV cache. Loading is
/// the slow part; make one engine and share it (threads may use it at once).
#[pyclass(module = "kiln", frozen)]
pub struct Engine {
    pub inner: kiln::Engine,
}

#[pymethods]
impl Engine {
    /// Loads `model`: a .gguf path, a catalog name such as "smollm2-135m" (fetched into
    /// the cache on first use) or a Hugging Face name (hf://ORG/REPO[:QUANT]).
    #[new]
    #[pyo3(signature = (model, *, n_ctx=None, device="auto", threads=None, n_batch=None, n_seq=1,
                        draft_model=None, lookup_ngram=None, draft_max=16, draft_min=0, draft_p_min=0.75))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: PathBuf,
        n_ctx: Option<usize>,
        device: &str,
        threads: Option<usize>,
        n_batch: Option<usize>,
        n_seq: usize,
        draft_model: Option<PathBuf>,
        lookup_ngram: Option<usize>,
        draft_max: usize,
        draft_min: usize,
        draft_p_min: f32,
    ) -> PyResult<Self> {
        let spec = spec_options(draft_model, lookup_ngram, draft_max, draft_min, draft_p_min);
        let opts = engine_options(device, n_ctx, threads, n_batch, spec)?.with_n_seq(n_seq);
        let model = model.to_string_lossy().into_owned();
        let inner = worker::run(py, None, move |_| kiln::Engine::load(&model, opts))?.or_raise()?;
        Ok(Engine { inner })
    }

    /// Token ids of `text`: BOS first when the model adds one (`add_special`), special-token
    /// text read as those tokens (`parse_special`), as `kiln tokenize` does.
    #[pyo3(signature = (text, *, add_special=true, parse_special=true))]
    fn tokenize(
        &self,
        py: Python<'_>,
        text: String,
        add_special: bool,
        parse_special: bool,
    ) -> PyResult<Vec<u32>> {
        let tok = self.inner.tokenizer().clone();
        py.detach(move || tok.encode(&text, add_special, parse_special)).or_raise()
    }

    /// The text of token ids; control tokens (BOS, EOS...) are left out unless `special`.
    #[pyo3(signature = (ids, *, special=false))]
    fn detokenize(&self, ids: Vec<u32>, special: bool) -> PyResult<String> {
        let n_vocab = self.inner.config().n_vocab;
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= n_vocab) {
            return Err(invalid(format!("token id {bad} is outside the vocabulary ({n_vocab})")));
        }
        Ok(self.inner.tokenizer().decode(&ids, special))
    }

    /// Raw completion of `prompt` (a string, tokenized with BOS as the model wants and
    /// special tokens parsed, or a list of token ids), as `kiln run --raw` and
    /// /v1/completions. Returns a Completion, or with stream=True a Stream of Pieces.
    #[pyo3(signature = (prompt, **sampling))]
    fn complete(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        sampling: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let s = sampling::parse(sampling, self.inner.config().n_vocab)?;
        let ids = if let Ok(text) = prompt.cast::<PyString>() {
            let text = text.to_cow()?.into_owned();
            let tok = self.inner.tokenizer().clone();
            py.detach(move || tok.encode(&text, true, true)).or_raise()?
        } else if prompt.is_instance_of::<PyList>() {
            prompt
                .extract::<Vec<u32>>()
                .map_err(|_| PyTypeError::new_err("prompt token ids must be ints >= 0"))?
        } else {
            return Err(PyTypeError::new_err("prompt must be a string or a list of token ids"));
        };
        if ids.is_empty() {
            return Err(invalid("the prompt has no tokens"));
        }
        let session = self.inner.session(SessionOptions::default()).or_raise()?;
        let job = Job {
            cancel: session.cancel_handle(),
            target: Target::Owned(Box::new(session)),
            prepare: Box::new(move |s| s.append_tokens(&ids).map(|()| ids)),
            opts: s.opts,
            stream_open: None,
        };
        generate(py, job, s.stream)
    }

    /// A reply to `messages` (a list of {"role": ..., "content": ...} dicts) with the model's
    /// chat template applied. `tools` (OpenAI's function tools), `tool_choice` and
    /// `parallel_tool_calls` let the model call functions: its calls come back parsed, in
    /// `tool_calls`, their arguments valid against each tool's schema. Returns a Completion,
    /// or with stream=True a Stream of Pieces.
    #[pyo3(signature = (messages, tools=None, response_format=None, *, tool_choice=None, parallel_tool_calls=None, **sampling))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        response_format: Option<&Bound<'_, PyAny>>,
        tool_choice: Option<&Bound<'_, PyAny>>,
        parallel_tool_calls: Option<bool>,
        sampling: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let msgs = crate::convert::messages(messages)?;
        let kw = match sampling {
            Some(d) => d.copy()?,
            None => PyDict::new(py),
        };
        if let Some(rf) = response_format {
            kw.set_item("response_format", rf)?;
        }
        let s = sampling::parse(Some(&kw), self.inner.config().n_vocab)?;
        let tools = crate::convert::chat_tools(tools, tool_choice, parallel_tool_calls)?;
        if tools.active() && self.inner.chat_template().is_none() {
            return Err(invalid("the model has no chat template, so it cannot be given tools"));
        }
        let session = self.inner.session(SessionOptions::default()).or_raise()?;
        let job = Job {
            cancel: session.cancel_handle(),
            target: Target::Owned(Box::new(session)),
            prepare: Box::new(move |s| s.append_chat_with(&msgs, &tools)),
            opts: s.opts,
            stream_open: None,
        };
        generate(py, job, s.stream)
    }

    /// Embeddings of `texts` (a string or a list of strings): the model's hidden states after
    /// its final norm, pooled ("mean", "last", or "none": one row per token), optionally
    /// scaled to unit length. Returns one list of floats per text (a list of rows each with
    /// pooling="none"); with as_numpy=True a float32 ndarray of shape (len(texts), n_embd)
    /// (a list of (n_tokens, n_embd) arrays with pooling="none").
    #[pyo3(signature = (texts, *, pooling="mean", normalize=false, as_numpy=false))]
    fn embed(
        &self,
        py: Python<'_>,
        texts: &Bound<'_, PyAny>,
        pooling: &str,
        normalize: bool,
        as_numpy: bool,
    ) -> PyResult<Py<PyAny>> {
        let pooling: Pooling = pooling.parse().or_raise()?;
        let texts: Vec<String> = match texts.cast::<PyString>() {
            Ok(s) => vec![s.to_cow()?.into_owned()],
            Err(_) => texts
                .extract()
                .map_err(|_| PyTypeError::new_err("texts must be a string or a list of strings"))?,
        };
        let engine = self.inner.clone();
        let rows = worker::run(py, None, move |_| -> kiln::Result<Vec<Vec<Vec<f32>>>> {
            texts
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    let ids = engine.tokenizer().encode(text, true, true)?;
                    let mut rows = embed_tokens(&engine, &ids, pooling)
                        .map_err(|e| kiln::KilnError::invalid(format!("text {i}: {e}")))?;
                    if normalize {
                        rows.iter_mut().for_each(|r| unit_length(r));
                    }
                    Ok(rows)
                })
                .collect()
        })?
        .or_raise()?;
        let n_embd = self.inner.config().n_embd;
        match (as_numpy, pooling) {
            (false, Pooling::None) => Ok(rows.into_pyobject(py)?.into_any().unbind()),
            (false, _) => {
                Ok(rows.into_iter().flatten().collect::<Vec<_>>().into_pyobject(py)?.into_any().unbind())
            }
            (true, Pooling::None) => {
                let arrays = rows.iter().map(|r| ndarray(py, r, n_embd)).collect::<PyResult<Vec<_>>>()?;
                Ok(PyList::new(py, arrays)?.into_any().unbind())
            }
            (true, _) => {
                let flat: Vec<Vec<f32>> = rows.into_iter().flatten().collect();
                Ok(ndarray(py, &flat, n_embd)?.unbind())
            }
        }
    }

    /// A new conversation: append text, tokens or chat messages, then generate; the KV
    /// cache keeps what was computed. `context_shift=n_keep` shifts the context when it
    /// fills (keeping the first n_keep tokens) instead of stopping with "context_full".
    #[pyo3(signature = (*, context_shift=None))]
    fn session(&self, context_shift: Option<usize>) -> PyResult<Session> {
        let mut opts = SessionOptions::default();
        if let Some(n) = context_shift {
            opts = opts.with_context_shift(n);
        }
        Session::new(self.inner.session(opts).or_raise()?)
    }

    /// Context size of each sequence, in tokens.
    #[getter]
    fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    /// Tokens in the vocabulary.
    #[getter]
    fn n_vocab(&self) -> usize {
        self.inner.config().n_vocab
    }
    /// Width of the hidden states (and of embeddings).
    #[getter]
    fn n_embd(&self) -> usize {
        self.inner.config().n_embd
    }
    /// The model file.
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }
    /// The device the model runs on, in words.
    #[getter]
    fn backend(&self) -> String {
        self.inner.backend_name()
    }
    /// The model's chat template (Jinja source), if it has one.
    #[getter]
    fn chat_template(&self) -> Option<String> {
        self.inner.chat_template().map(|t| t.source().to_string())
    }
    /// Milliseconds the load took.
    #[getter]
    fn load_ms(&self) -> f64 {
        self.inner.load_ms()
    }

    fn __repr__(&self) -> String {
        format!(
            "Engine({:?}, n_ctx={}, backend={:?})",
            self.inner.path().display().to_string(),
            self.inner.n_ctx(),
            self.inner.backend_name()
        )
    }
}

/// `rows` (each `n_embd` wide) as a float32 NumPy array of shape (len(rows), n_embd).
fn ndarray<'py>(py: Python<'py>, rows: &[Vec<f32>], n_embd: usize) -> PyResult<Bound<'py, PyAny>> {
    let np = py.import("numpy").map_err(|_| {
        pyo3::exceptions::PyImportError::new_err("as_numpy=True needs NumPy (pip install numpy)")
    })?;
    let bytes: Vec<u8> = rows.iter().flatten().flat_map(|x| x.to_ne_bytes()).collect();
    let buf = PyByteArray::new(py, &bytes);
    let arr = np.call_method1("frombuffer", (buf, np.getattr("float32")?))?;
    arr.call_method1("reshape", (rows.len(), n_embd))
}

/// The engine options `Engine(...)` and `serve(...)` share: the device, context, threads,
/// batch and speculation (a draft model or prompt lookup).
pub fn engine_options(
    device: &str,
    n_ctx: Option<usize>,
    threads: Option<usize>,
    n_batch: Option<usize>,
    spec: SpecOptions,
) -> PyResult<EngineOptions> {
    let device: Device = device.parse().or_raise()?;
    let mut opts = EngineOptions::default().with_device(device).with_spec(spec);
    if let Some(n) = n_ctx {
        opts = opts.with_n_ctx(n);
    }
    if let Some(t) = threads {
        if t == 0 {
            return Err(invalid("threads must be at least 1"));
        }
        opts = opts.with_threads(t);
    }
    if let Some(b) = n_batch {
        opts = opts.with_batch(b);
    }
    Ok(opts)
}

/// Speculative decoding's settings from the keywords of `Engine(...)` and `serve(...)`.
pub fn spec_options(
    draft_model: Option<PathBuf>,
    lookup_ngram: Option<usize>,
    draft_max: usize,
    draft_min: usize,
    draft_p_min: f32,
) -> SpecOptions {
    let mut spec = SpecOptions::default();
    spec.draft_model = draft_model.map(|m| m.to_string_lossy().into_owned());
    spec.lookup_ngram = lookup_ngram;
    spec.draft_max = draft_max;
    spec.draft_min = draft_min;
    spec.draft_p_min = draft_p_min;
    spec
}
