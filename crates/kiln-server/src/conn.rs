//! Connections: each accepted socket is served by hyper's HTTP/1 connection under a
//! watchdog that closes it when a request is slow to arrive, when it sits idle between
//! requests, or when its client stops reading; and the number of open connections is
//! capped, with a reserved share that answers only the probes (`/health`, `/metrics`) so a
//! full server can still be checked. Past the whole cap a new connection is closed at once.
//!
//! hyper's own `header_read_timeout` starts when a connection goes idle, so it cannot give
//! kept-alive connections longer than a request's head gets; the watchdog times the two
//! separately, as nginx's `client_header_timeout` and `keepalive_timeout` do.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures_util::FutureExt;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::error::ApiError;

/// The longest a connection of the reserved share may stay open.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The default cap never exceeds this, however high the descriptor limit.
const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// The routes the reserved share answers.
const PROBES: [&str; 2] = ["/health", "/metrics"];

/// `kiln serve`'s connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most time a request may take to arrive, head and body, from its first byte (on a
    /// new connection, from the accept). Past it the connection closes without a response.
    pub header_timeout: Duration,
    /// Most time a kept-alive connection waits for its next request, and a reply waits for
    /// the client to read it.
    pub idle_timeout: Duration,
    /// Most open connections, the reserved share included.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    /// 30 s to send a request, 60 s idle, the cap [`default_max_connections`] gives.
    fn default() -> Self {
        Self::new(default_max_connections())
    }
}

impl ConnLimits {
    /// The default timeouts with a cap of `max_connections`.
    pub fn new(max_connections: usize) -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections,
        }
    }

    /// How many of the connections are held back for the probes: a sixteenth, at least one.
    pub fn reserved(&self) -> usize {
        (self.max_connections / 16).clamp(1, 64)
    }

    fn probe(self) -> Self {
        ConnLimits {
            header_timeout: self.header_timeout.min(PROBE_TIMEOUT),
            idle_timeout: self.idle_timeout.min(PROBE_TIMEOUT),
            ..self
        }
    }
}

/// The descriptors the process may open (the soft `RLIMIT_NOFILE`), or `None` where the
/// platform does not say.
fn fd_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
            #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
            return Some((r.rlim_cur as u64, r.rlim_max as u64));
        }
    }
    None
}

/// Connections `soft` descriptors leave after the model file, logs, the runtime and GPU
/// drivers (a quarter of the limit, at most 64).
fn fit(soft: u64) -> usize {
    let headroom = (soft / 4).min(64);
    usize::try_from(soft - headroom).unwrap_or(usize::MAX).max(2)
}

/// The cap when `--max-connections` is not given: what the descriptor limit leaves, at
/// most 4096.
pub fn default_max_connections() -> usize {
    fd_limit().map_or(DEFAULT_MAX_CONNECTIONS, |(soft, _)| fit(soft).min(DEFAULT_MAX_CONNECTIONS))
}

/// Makes room for `max` connections: raises the soft descriptor limit toward the hard one
/// where it is too low. Returns the cap that fits, and a note when that is less than `max`.
pub fn fit_max_connections(max: usize) -> (usize, Option<String>) {
    let Some((soft, hard)) = fd_limit() else { return (max, None) };
    if fit(soft) >= max {
        return (max, None);
    }
    #[cfg(unix)]
    {
        let want = (max as u64).saturating_add(64).min(hard);
        let r = libc::rlimit { rlim_cur: want as libc::rlim_t, rlim_max: hard as libc::rlim_t };
        // SAFETY: setrlimit reads the struct it is given; raising the soft limit up to the
        // hard one needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
    let soft = fd_limit().map_or(soft, |(s, _)| s);
    let fits = fit(soft);
    if fits >= max {
        (max, None)
    } else {
        (fits, Some(format!("--max-connections {max} needs more file descriptors than the limit {soft} (ulimit -n) allows; using {fits}")))
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then tells every open
/// connection to close after its current reply and waits for them.
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let max = limits.max_connections.max(2);
    let reserved = limits.reserved().min(max - 1);
    let general = Arc::new(Semaphore::new(max - reserved));
    let probes = Arc::new(Semaphore::new(reserved));
    let (stop_tx, stop) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            // Out of descriptors, or a connection reset while queued: let some close first.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Streamed tokens are small writes: send each at once.
        let _ = stream.set_nodelay(true);
        let (permit, probe_only) = if let Ok(p) = general.clone().try_acquire_owned() {
            (p, false)
        } else if let Ok(p) = probes.clone().try_acquire_owned() {
            (p, true)
        } else {
            continue; // dropped: closed at once
        };
        let limits = if probe_only { limits.probe() } else { limits };
        tokio::spawn(serve_one(stream, router.clone(), limits, probe_only, stop.clone(), permit));
    }
    drop(listener);
    let _ = stop_tx.send(());
    let _ = general.acquire_many((max - reserved) as u32).await;
    let _ = probes.acquire_many(reserved as u32).await;
}

/// One connection under its watchdog; dropping the hyper connection closes the socket.
async fn serve_one(
    stream: TcpStream,
    router: Router,
    limits: ConnLimits,
    probe_only: bool,
    mut stop: watch::Receiver<()>,
    _permit: OwnedSemaphorePermit,
) {
    let watch = Watch::new();
    let io = TokioIo::new(Watched { inner: stream, watch: watch.clone() });
    let w = watch.clone();
    let service = hyper::service::service_fn(move |req| handle(req, router.clone(), w.clone(), probe_only));
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog times requests (see the module's doc).
    builder.header_read_timeout(None).keep_alive(!probe_only).half_close(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        let now = Instant::now();
        let deadline = watch.deadline(&limits);
        if deadline.is_some_and(|d| d <= now) {
            return;
        }
        // While a reply is being made there is no deadline: look again a while later.
        let wake = deadline.unwrap_or(now + limits.header_timeout.min(limits.idle_timeout));
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = tokio::time::sleep_until(wake) => {}
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Routes one request; its body and reply report their progress to the watchdog. A
/// connection of the reserved share answers only the probes.
async fn handle(
    req: hyper::Request<Incoming>,
    router: Router,
    watch: Watch,
    probe_only: bool,
) -> Result<Response, Infallible> {
    watch.request_started();
    let req = req.map(|inner| Body::new(RequestBody::new(inner, watch.clone())));
    let resp = if probe_only && !PROBES.contains(&req.uri().path()) {
        ApiError::too_many_connections().into_response()
    } else {
        match AssertUnwindSafe(router.oneshot(req)).catch_unwind().await {
            Ok(Ok(r)) => r,
            Err(_) => ApiError::internal("internal error: the request handler panicked").into_response(),
        }
    };
    let guard = ReplyGuard(watch);
    Ok(resp.map(|inner| Body::new(ReplyBody { inner, _guard: guard })))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first byte of the next request.
    Idle,
    /// A request is arriving (a new connection counts from its accept).
    Arriving,
    /// The request is in; its reply is being made or sent.
    Busy,
}

struct State {
    phase: Phase,
    since: Instant,
    /// When a write to the client last found its buffer full (cleared by the next write).
    write_blocked: Option<Instant>,
}

/// What the watchdog knows of one connection.
#[derive(Clone)]
struct Watch(Arc<Mutex<State>>);

impl Watch {
    fn new() -> Self {
        Watch(Arc::new(Mutex::new(State {
            phase: Phase::Arriving,
            since: Instant::now(),
            write_blocked: None,
        })))
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }

    fn to(&self, from: &[Phase], to: Phase) {
        self.update(|s| {
            if from.contains(&s.phase) {
                s.phase = to;
                s.since = Instant::now();
            }
        });
    }

    fn bytes_read(&self) {
        self.to(&[Phase::Idle], Phase::Arriving);
    }

    /// The head has parsed (a pipelined one may not have been seen arriving).
    fn request_started(&self) {
        self.to(&[Phase::Idle], Phase::Arriving);
    }

    /// The body has ended, or the handler dropped it.
    fn request_in(&self) {
        self.to(&[Phase::Idle, Phase::Arriving], Phase::Busy);
    }

    fn reply_sent(&self) {
        self.to(&[Phase::Idle, Phase::Arriving, Phase::Busy], Phase::Idle);
    }

    fn write_blocked(&self, blocked: bool) {
        self.update(|s| match (blocked, s.write_blocked) {
            (true, None) => s.write_blocked = Some(Instant::now()),
            (false, Some(_)) => s.write_blocked = None,
            _ => {}
        });
    }

    /// When the connection is to be closed, as things stand.
    fn deadline(&self, l: &ConnLimits) -> Option<Instant> {
        let s = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let blocked = s.write_blocked.map(|t| t + l.idle_timeout);
        let phase = match s.phase {
            Phase::Idle => Some(s.since + l.idle_timeout),
            Phase::Arriving => Some(s.since + l.header_timeout),
            Phase::Busy => None,
        };
        match (phase, blocked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The socket, reporting reads and stalled writes to the watchdog.
struct Watched {
    inner: TcpStream,
    watch: Watch,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.watch.bytes_read();
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch.write_blocked(r.is_pending());
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch.write_blocked(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request's body, telling the watchdog when it has all arrived.
struct RequestBody {
    inner: Incoming,
    watch: Option<Watch>,
}

impl RequestBody {
    fn new(inner: Incoming, watch: Watch) -> Self {
        let mut b = RequestBody { inner, watch: Some(watch) };
        if hyper::body::Body::is_end_stream(&b.inner) {
            b.arrived();
        }
        b
    }

    fn arrived(&mut self) {
        if let Some(w) = self.watch.take() {
            w.request_in();
        }
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        self.arrived();
    }
}

impl hyper::body::Body for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) || self.inner.is_end_stream() {
            self.arrived();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Tells the watchdog the reply has gone when hyper drops its body.
struct ReplyGuard(Watch);

impl Drop for ReplyGuard {
    fn drop(&mut self) {
        self.0.reply_sent();
    }
}

struct ReplyBody {
    inner: Body,
    _guard: ReplyGuard,
}

impl hyper::body::Body for ReplyBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_headroom() {
        assert_eq!(fit(256), 192);
        assert_eq!(fit(1024), 960);
        assert_eq!(fit(40), 30);
        assert_eq!(fit(0), 2);
        assert_eq!(ConnLimits::new(8).reserved(), 1);
        assert_eq!(ConnLimits::new(192).reserved(), 12);
        assert_eq!(ConnLimits::new(100_000).reserved(), 64);
    }
}
