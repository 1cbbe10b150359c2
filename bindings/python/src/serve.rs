//! `kiln.serve`: the OpenAI-compatible server (crate kiln-server) in this process.

use std::net::SocketAddr;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kiln::KilnError;
use kiln_server::{serve_until, ServerOptions};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::sync::Notify;

use crate::engine::{engine_options, spec_options};
use crate::errors::{invalid, OrRaise};
use crate::worker::{recv, worker_died};

/// How long `stop` waits for the server to drain (it finishes within 5 s).
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// A running server (from `serve(..., block=False)`). `stop()` (or leaving a `with` block,
/// or dropping the handle) drains it and shuts it down.
#[pyclass(module = "kiln", frozen)]
pub struct Server {
    /// The bound address.
    addr: SocketAddr,
    stop: Arc<Notify>,
    done: Mutex<Option<Receiver<kiln::Result<()>>>>,
}

#[pymethods]
impl Server {
    /// The base URL, such as "http://127.0.0.1:8080" (the OpenAI routes are under /v1).
    #[getter]
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    #[getter]
    fn host(&self) -> String {
        self.addr.ip().to_string()
    }
    /// The bound port (the OS's choice when serve was given port=0).
    #[getter]
    fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Drains the server (requests in flight finish or are cancelled within 5 s) and
    /// stops it. Calling it again does nothing.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        self.stop.notify_one();
        let Some(rx) = self.done.lock().unwrap_or_else(|e| e.into_inner()).take() else { return Ok(()) };
        match py.detach(move || rx.recv_timeout(DRAIN_WAIT)) {
            Ok(r) => r.or_raise(),
            Err(_) => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(&self, py: Python<'_>, _ty: Py<PyAny>, _value: Py<PyAny>, _tb: Py<PyAny>) -> PyResult<()> {
        self.stop(py)
    }

    fn __repr__(&self) -> String {
        format!("Server(url={:?})", self.url())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.notify_one();
    }
}

/// Runs kiln's OpenAI-compatible HTTP server (the routes and options of `kiln serve`) on
/// `model` in this process. With block=True (the default) it serves until Ctrl-C, then
/// drains and returns None; with block=False it returns a Server handle once the model is
/// loaded and requests are answered.
#[pyfunction]
#[pyo3(signature = (model=None, *, host="127.0.0.1", port=8080, n_ctx=None, device="auto",
                    threads=None, n_batch=None, parallel=8, queue=64, alias=None, api_key=None, block=true,
                    draft_model=None, lookup_ngram=None, draft_max=16, draft_min=0, draft_p_min=0.75))]
#[allow(clippy::too_many_arguments)]
pub fn serve(
    py: Python<'_>,
    model: Option<std::path::PathBuf>,
    host: &str,
    port: u16,
    n_ctx: Option<usize>,
    device: &str,
    threads: Option<usize>,
    n_batch: Option<usize>,
    parallel: usize,
    queue: usize,
    alias: Option<String>,
    api_key: Option<String>,
    block: bool,
    draft_model: Option<std::path::PathBuf>,
    lookup_ngram: Option<usize>,
    draft_max: usize,
    draft_min: usize,
    draft_p_min: f32,
) -> PyResult<Option<Server>> {
    if parallel == 0 || queue == 0 {
        return Err(invalid("parallel and queue must be at least 1"));
    }
    let spec = spec_options(draft_model, lookup_ngram, draft_max, draft_min, draft_p_min);
    let engine = engine_options(device, n_ctx, threads, n_batch, spec)?;
    let opts = ServerOptions {
        model: model
            .map_or_else(|| kiln::hub::DEFAULT_MODEL.to_string(), |m| m.to_string_lossy().into_owned()),
        engine,
        host: host.to_string(),
        port,
        alias,
        parallel,
        queue,
        api_key: api_key.filter(|k| !k.is_empty()),
        limits: kiln_server::ConnLimits::default(),
        max_request_tokens: None,
        allow_image_urls: false,
    };
    let stop = Arc::new(Notify::new());
    let (ready_tx, ready_rx) = sync_channel(1);
    let (done_tx, done_rx) = sync_channel(1);
    let stop2 = stop.clone();
    std::thread::Builder::new()
        .name("kiln-server".into())
        .spawn(move || {
            let ready = move |addr| {
                let _ = ready_tx.send(addr);
            };
            let r = serve_until(opts, ready, async move { stop2.notified().await });
            let _ = done_tx.send(r);
        })
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the server thread: {e}")))?;

    // Until the model is loaded, Ctrl-C abandons the start.
    let mut ready = Some(ready_rx);
    let addr = match recv(py, &mut ready, || stop.notify_one())? {
        Some(addr) => addr,
        None => {
            // The server ended before it was ready: its error says why.
            let r = py.detach(move || done_rx.recv());
            return match r {
                Ok(Err(e)) => Err(crate::errors::to_py(e)),
                Ok(Ok(())) => {
                    Err(crate::errors::to_py(KilnError::invalid("the server stopped while starting")))
                }
                Err(_) => Err(worker_died()),
            };
        }
    };
    let server = Server { addr, stop, done: Mutex::new(Some(done_rx)) };
    if !block {
        return Ok(Some(server));
    }
    // Serve until Ctrl-C (or until the server fails), then drain.
    let mut done = server.done.lock().unwrap_or_else(|e| e.into_inner()).take();
    match recv(py, &mut done, || server.stop.notify_one()) {
        Ok(Some(r)) => r.or_raise().map(|()| None),
        Ok(None) => Err(worker_died()),
        Err(_interrupt) => {
            if let Some(rx) = done {
                let r = py.detach(move || rx.recv_timeout(DRAIN_WAIT));
                if let Ok(r) = r {
                    r.or_raise()?;
                }
            }
            Ok(None)
        }
    }
}
