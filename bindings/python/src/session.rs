//! `kiln.Session`: one conversation on an engine, kept between calls (its KV cache too).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use kiln::CancelHandle;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::convert::from_json;
use crate::errors::OrRaise;
use crate::generate::{generate, Job, Target};
use crate::sampling;
use crate::worker;

/// A conversation: its tokens, chat history and KV cache. Appends evaluate only what the
/// cache lacks. Calls on one session take turns (a call waits for the running one);
/// `cancel()` works from any thread. While a stream from the session is unfinished, other
/// calls raise `RuntimeError` (waiting for it could deadlock the thread reading it).
#[pyclass(module = "kiln", frozen)]
pub struct Session {
    inner: Arc<Mutex<kiln::Session>>,
    cancel: CancelHandle,
    /// Set while a stream from this session can still be read.
    stream_open: Arc<AtomicBool>,
    n_vocab: usize,
}

impl Session {
    pub fn new(s: kiln::Session) -> PyResult<Self> {
        Ok(Session {
            cancel: s.cancel_handle(),
            n_vocab: s.engine().config().n_vocab,
            inner: Arc::new(Mutex::new(s)),
            stream_open: Arc::default(),
        })
    }

    fn no_open_stream(&self) -> PyResult<()> {
        if self.stream_open.load(Ordering::SeqCst) {
            return Err(PyRuntimeError::new_err(
                "a stream from this session is unfinished: read it to the end, cancel it or drop it first",
            ));
        }
        Ok(())
    }

    /// Runs `f` on the session in a worker, once any running call has ended.
    fn with<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut kiln::Session) -> kiln::Result<T> + Send + 'static,
    ) -> PyResult<T> {
        self.no_open_stream()?;
        let inner = self.inner.clone();
        worker::run(py, Some(self.cancel.clone()), move |c| {
            let mut session = lock(&inner);
            c.start();
            let out = f(&mut session);
            c.finish();
            out
        })?
        .or_raise()
    }

    /// Reads the session, once any running call has ended.
    fn read<T: Send + 'static>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&kiln::Session) -> T + Send + 'static,
    ) -> PyResult<T> {
        self.no_open_stream()?;
        let inner = self.inner.clone();
        worker::run(py, None, move |_| f(&lock(&inner)))
    }
}

fn lock(m: &Mutex<kiln::Session>) -> MutexGuard<'_, kiln::Session> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[pymethods]
impl Session {
    /// Tokenizes `text` (BOS first when the session is empty and the model wants one;
    /// special tokens parsed), appends and evaluates it. Returns the new token ids.
    fn append_text(&self, py: Python<'_>, text: String) -> PyResult<Vec<u32>> {
        self.with(py, move |s| s.append_text(&text))
    }

    /// Appends token ids and evaluates them.
    fn append_tokens(&self, py: Python<'_>, ids: Vec<u32>) -> PyResult<()> {
        self.with(py, move |s| s.append_tokens(&ids))
    }

    /// Adds messages to the chat history, renders it with the model's chat template and
    /// evaluates what the cache lacks. Returns the whole rendered conversation's ids.
    /// `tools`, `tool_choice` and `parallel_tool_calls` (as Engine.chat) hold from here on;
    /// when none of them is given, the tools of the previous append_chat stay.
    #[pyo3(signature = (messages, tools=None, *, tool_choice=None, parallel_tool_calls=None))]
    fn append_chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        tools: Option<&Bound<'_, PyAny>>,
        tool_choice: Option<&Bound<'_, PyAny>>,
        parallel_tool_calls: Option<bool>,
    ) -> PyResult<Vec<u32>> {
        let msgs = crate::convert::messages(messages)?;
        if tools.is_none() && tool_choice.is_none() && parallel_tool_calls.is_none() {
            return self.with(py, move |s| s.append_chat(&msgs));
        }
        let tools = crate::convert::chat_tools(tools, tool_choice, parallel_tool_calls)?;
        self.with(py, move |s| s.append_chat_with(&msgs, &tools))
    }

    /// Generates from where the conversation stands (after an append_chat, the reply joins
    /// the history). Takes the sampling keywords of Engine.complete; returns a Completion,
    /// or with stream=True a Stream of Pieces.
    #[pyo3(signature = (**sampling))]
    fn generate(&self, py: Python<'_>, sampling: Option<&Bound<'_, PyDict>>) -> PyResult<Py<PyAny>> {
        let s = sampling::parse(sampling, self.n_vocab)?;
        self.no_open_stream()?;
        let open = s.stream.then(|| self.stream_open.clone());
        if let Some(o) = &open {
            if o.swap(true, Ordering::SeqCst) {
                return Err(PyRuntimeError::new_err("a stream from this session is unfinished"));
            }
        }
        let job = Job {
            target: Target::Shared(self.inner.clone()),
            prepare: Box::new(|s| Ok(s.tokens())),
            opts: s.opts,
            cancel: self.cancel.clone(),
            stream_open: open,
        };
        generate(py, job, s.stream)
    }

    /// Stops this session's running append or generate (from any thread) at its next
    /// forward: a generation ends with finish_reason "cancelled". A request made while
    /// nothing runs applies to the next call.
    fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Forgets the conversation.
    fn reset(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |s| {
            s.reset();
            Ok(())
        })
    }

    /// Writes the conversation (tokens and chat history) to `path`, bound to the model file.
    fn save(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.with(py, move |s| s.save(&path))
    }

    /// Replaces the conversation with one saved by `save` (same model) and evaluates it.
    fn restore(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.with(py, move |s| s.restore(&path))
    }

    /// Every token of the conversation so far.
    #[getter]
    fn tokens(&self, py: Python<'_>) -> PyResult<Vec<u32>> {
        self.read(py, |s| s.tokens())
    }

    /// The chat history: append_chat's messages and the replies generated after them.
    #[getter]
    fn history<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let json = self.read(py, |s| serde_json::to_value(s.history()))?;
        let json = json.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        from_json(py, &json)?.cast_into::<PyList>().map_err(Into::into)
    }

    /// Tokens run through the model so far (those reused from a cache are not counted).
    #[getter]
    fn n_evaluated(&self, py: Python<'_>) -> PyResult<usize> {
        self.read(py, |s| s.n_evaluated())
    }
}
