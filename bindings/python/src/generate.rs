//! One generation: a session (the call's own, or a Python `Session`'s), what to append
//! first, the options; run to the end (`Completion`) or streamed (`Stream`, an iterator of
//! `Piece`s fed by the worker through a bounded channel).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use kiln::{CancelHandle, Event, GenerateOptions, Session};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::errors::OrRaise;
use crate::results::{Completion, Logprobs, Outcome, Piece};
use crate::worker::{recv, spawn, worker_died, Canceller};

/// Pieces a stream's worker may run ahead of the reader.
const STREAM_AHEAD: usize = 16;

/// The session a generation runs on.
pub enum Target {
    /// Made for this call (`Engine.complete`, `Engine.chat`).
    Owned(Box<Session>),
    /// A Python `Session`'s; locked for the whole generation.
    Shared(Arc<Mutex<Session>>),
}

/// Appends the prompt, returning the prompt's token ids.
pub type Prepare = Box<dyn FnOnce(&mut Session) -> kiln::Result<Vec<u32>> + Send>;

pub struct Job {
    pub target: Target,
    pub prepare: Prepare,
    pub opts: GenerateOptions,
    pub cancel: CancelHandle,
    /// A Python `Session`'s flag, set while a stream from it can be read: the stream
    /// clears it when it ends, is cancelled or dropped.
    pub stream_open: Option<Arc<AtomicBool>>,
}

impl Job {
    /// Prepares and generates, handing each event to `on_event`; finishes `canceller`
    /// before a shared session is unlocked.
    fn execute(
        self,
        canceller: &Canceller,
        mut on_event: impl FnMut(&Event) -> ControlFlow<()>,
    ) -> kiln::Result<Outcome> {
        let Job { target, prepare, opts, .. } = self;
        let run = |session: &mut Session| {
            // A grammar that does not compile is an error before anything changes.
            if let Some(g) = &opts.grammar {
                session.engine().compile_grammar(g)?;
            }
            let prompt_ids = prepare(session)?;
            let mut logprobs = opts.logprobs.map(|_| Logprobs::default());
            let summary = session.generate(&opts, |ev| {
                if let Some(l) = &mut logprobs {
                    l.push(ev);
                }
                on_event(ev)
            })?;
            Ok(Outcome { prompt_ids, summary, logprobs })
        };
        match target {
            Target::Owned(mut s) => {
                canceller.start();
                run(&mut s)
            }
            Target::Shared(m) => {
                let mut session = m.lock().unwrap_or_else(|e| e.into_inner());
                canceller.start();
                let out = run(&mut session);
                canceller.finish();
                out
            }
        }
    }
}

/// Runs `job` to the end on a worker thread.
pub fn complete(py: Python<'_>, job: Job) -> PyResult<Completion> {
    let canceller = Canceller::new(Some(job.cancel.clone()));
    let c = canceller.clone();
    let mut rx = Some(spawn(1, &canceller, move |tx: &SyncSender<kiln::Result<Outcome>>| {
        let _ = tx.send(job.execute(&c, |_| ControlFlow::Continue(())));
    })?);
    let out = recv(py, &mut rx, || canceller.cancel())?.ok_or_else(worker_died)?;
    out.or_raise()?.into_completion(py)
}

enum Msg {
    Piece(Piece),
    Done(kiln::Result<Outcome>),
}

/// Starts `job` streaming.
pub fn stream(mut job: Job) -> PyResult<Stream> {
    let canceller = Canceller::new(Some(job.cancel.clone()));
    let open = job.stream_open.take();
    let c = canceller.clone();
    let rx = spawn(STREAM_AHEAD, &canceller, move |tx: &SyncSender<Msg>| {
        let out = job.execute(&c, |ev| match tx.send(Msg::Piece(Piece::from_event(ev))) {
            Ok(()) => ControlFlow::Continue(()),
            // The reader is gone: stop generating.
            Err(_) => ControlFlow::Break(()),
        });
        let _ = tx.send(Msg::Done(out));
    })?;
    Ok(Stream { rx: Mutex::new(Some(rx)), canceller, result: Mutex::new(None), open })
}

/// Runs `job` to the end, or streams it.
pub fn generate(py: Python<'_>, job: Job, streaming: bool) -> PyResult<Py<PyAny>> {
    if streaming {
        Ok(Py::new(py, stream(job)?)?.into_any())
    } else {
        Ok(Py::new(py, complete(py, job)?)?.into_any())
    }
}

/// An iterator of `Piece`s as they are generated. When it is exhausted, `result` holds the
/// `Completion`. Dropping it (or `cancel()`) stops the generation.
#[pyclass(module = "kiln", frozen)]
pub struct Stream {
    rx: Mutex<Option<Receiver<Msg>>>,
    canceller: Canceller,
    result: Mutex<Option<Py<Completion>>>,
    open: Option<Arc<AtomicBool>>,
}

impl Stream {
    /// The stream will be read no more: its session takes other calls (they wait for the
    /// worker to wind down).
    fn close(&self) {
        if let Some(o) = &self.open {
            o.store(false, Ordering::SeqCst);
        }
    }
}

#[pymethods]
impl Stream {
    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Piece>> {
        let mut rx = self
            .rx
            .try_lock()
            .map_err(|_| PyRuntimeError::new_err("this stream is being read by another thread"))?;
        let msg = recv(py, &mut rx, || self.canceller.cancel());
        if !matches!(msg, Ok(Some(Msg::Piece(_)))) {
            self.close();
        }
        match msg? {
            Some(Msg::Piece(p)) => Ok(Some(p)),
            Some(Msg::Done(out)) => {
                *rx = None;
                let c = Py::new(py, out.or_raise()?.into_completion(py)?)?;
                *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
                Ok(None)
            }
            None if self.result.lock().unwrap_or_else(|e| e.into_inner()).is_some() => Ok(None),
            None => Err(worker_died()),
        }
    }

    /// The `Completion`, once the stream is exhausted (None before).
    #[getter]
    fn result(&self, py: Python<'_>) -> Option<Py<Completion>> {
        self.result.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.clone_ref(py))
    }

    /// Stops the generation at the next token; the stream then ends with finish_reason
    /// "cancelled".
    fn cancel(&self) {
        self.canceller.cancel();
        self.close();
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, _ty: Py<PyAny>, _value: Py<PyAny>, _tb: Py<PyAny>) {
        self.cancel();
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.canceller.cancel();
        self.close();
    }
}
