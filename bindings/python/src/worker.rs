//! Running kiln's compute off the Python thread.
//!
//! Every call that computes (loading, prompts, generation, embeddings) runs on a worker
//! thread of its own while the calling thread waits with the GIL released, waking every
//! [`TICK`] to let Python handle signals. So other Python threads run meanwhile, and Ctrl-C
//! raises `KeyboardInterrupt` at once: the worker is asked to cancel (it stops at its next
//! forward, one micro-batch of prompt or one token) and finishes on its own.

use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln::CancelHandle;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How often a waiting thread checks for signals (Ctrl-C is seen within this).
const TICK: Duration = Duration::from_millis(50);

#[derive(Default)]
struct State {
    started: bool,
    done: bool,
    cancelled: bool,
}

/// Cancels the work of one call on a session, and only that work. The session's cancel
/// flag is raised only while the work holds the session ([`Canceller::start`] to
/// [`Canceller::finish`], both called by the work with the session locked): a request made
/// before the work has the session waits for it, and the flag is lowered again before the
/// session is unlocked. So a cancelled call never cancels the call that runs next, even one
/// that locks the session before the cancelled worker has begun.
#[derive(Clone)]
pub struct Canceller {
    state: Arc<Mutex<State>>,
    handle: Option<CancelHandle>,
}

impl Canceller {
    pub fn new(handle: Option<CancelHandle>) -> Self {
        Canceller { state: Arc::default(), handle }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the work to stop, unless it is done already.
    pub fn cancel(&self) {
        let mut s = self.state();
        if !s.done {
            s.cancelled = true;
            if s.started {
                self.raise();
            }
        }
    }

    /// The work has the session: a cancel asked for earlier takes effect now.
    pub fn start(&self) {
        let mut s = self.state();
        s.started = true;
        if s.cancelled && !s.done {
            self.raise();
        }
    }

    /// The work has ended (call it before unlocking the session); a cancel asked for it is
    /// withdrawn. Calls after the first do nothing.
    pub fn finish(&self) {
        let mut s = self.state();
        if s.done {
            return;
        }
        s.done = true;
        if s.cancelled && s.started {
            if let Some(h) = &self.handle {
                h.reset();
            }
        }
    }

    fn raise(&self) {
        if let Some(h) = &self.handle {
            h.cancel();
        }
    }
}

/// Starts `work` on a new thread; what it sends on the channel (capacity `bound`) arrives
/// at the returned receiver, which the thread's end disconnects.
pub fn spawn<M: Send + 'static>(
    bound: usize,
    canceller: &Canceller,
    work: impl FnOnce(&SyncSender<M>) + Send + 'static,
) -> PyResult<Receiver<M>> {
    let (tx, rx) = sync_channel(bound);
    let c = canceller.clone();
    std::thread::Builder::new()
        .name("kiln-worker".into())
        .spawn(move || {
            work(&tx);
            c.finish();
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start a worker thread: {e}")))?;
    Ok(rx)
}

/// The next message from a worker, waiting with the GIL released. `None`: the worker ended
/// without sending more. A pending signal handler's exception (`KeyboardInterrupt`) calls
/// `on_interrupt` (which asks the worker to stop) and is raised.
pub fn recv<M: Send>(
    py: Python<'_>,
    rx: &mut Option<Receiver<M>>,
    on_interrupt: impl FnOnce(),
) -> PyResult<Option<M>> {
    loop {
        let Some(r) = rx.take() else { return Ok(None) };
        // The receiver is not Sync, so it moves into the GIL-free closure and back.
        let (r, got) = py.detach(move || {
            let got = r.recv_timeout(TICK);
            (r, got)
        });
        match got {
            Ok(m) => {
                *rx = Some(r);
                return Ok(Some(m));
            }
            Err(RecvTimeoutError::Disconnected) => return Ok(None),
            Err(RecvTimeoutError::Timeout) => {
                *rx = Some(r);
                if let Err(e) = py.check_signals() {
                    on_interrupt();
                    return Err(e);
                }
            }
        }
    }
}

/// Runs `work` on a worker thread and returns its result (see the module docs); `cancel`
/// is the session it computes on, if any (`work` gets the canceller to finish while it
/// holds that session).
pub fn run<T: Send + 'static>(
    py: Python<'_>,
    cancel: Option<CancelHandle>,
    work: impl FnOnce(&Canceller) -> T + Send + 'static,
) -> PyResult<T> {
    let canceller = Canceller::new(cancel);
    let c = canceller.clone();
    let mut rx = Some(spawn(1, &canceller, move |tx| {
        let _ = tx.send(work(&c));
    })?);
    recv(py, &mut rx, || canceller.cancel())?.ok_or_else(worker_died)
}

/// The error when a worker ended without its result (a panic: a bug in kiln).
pub fn worker_died() -> PyErr {
    PyRuntimeError::new_err("kiln: the worker thread stopped unexpectedly (a bug; please report it)")
}
