//! The server's connections, held against hostile clients: at most `--max-connections` are
//! served at once (a few more, the reserve, answer `/health` and `/metrics` only), each
//! request head must arrive within `--header-timeout`, each pause in a body may last at most
//! `--body-timeout` and the whole request must be read within `--request-timeout`; the
//! bodies being read hold at most `--max-buffered-body-bytes` between them.
//!
//! So a server's memory for reading requests is bounded by about
//! `(max_connections + RESERVE) × MAX_HEAD_BYTES + max_buffered_body_bytes`, whatever its
//! clients send or fail to send, and a flood of connections cannot hide `/health`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::Router;
use http_body::Body as _;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinSet};

use super::api::ApiError;
use super::metrics::Metrics;

/// Connections past `--max-connections` that are still taken, for `/health` and `/metrics`
/// only (anything else is answered 503 and closed). When the reserve is full too, a new
/// connection takes the place of its oldest: a probe is answered within milliseconds of
/// connecting, so a flood cannot keep it out unless it opens this many connections in
/// those milliseconds.
pub const RESERVE: usize = 64;

/// How long a reserve connection may take to send its one request head.
pub const RESERVE_HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// The most a request head (request line and headers) may take: hyper's read buffer of a
/// connection grows to at most this, and a longer head is answered 431.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// File descriptors kept for everything but connections (model files, the listener, logs).
pub const OTHER_FILES: u64 = 64;

/// How the server reads its clients.
#[derive(Clone, Debug)]
pub struct ReadLimits {
    /// Connections served at once; more go to the reserve.
    pub max_connections: usize,
    /// A request head must arrive within this of the server starting to wait for it (a new
    /// connection, or the end of the previous answer on a kept-alive one); idle kept-alive
    /// connections are closed after it too.
    pub header_timeout: Duration,
    /// The longest pause in a request body.
    pub body_timeout: Duration,
    /// A whole request, head and body, must be read within this of the server starting to
    /// wait for it.
    pub request_timeout: Duration,
    /// The largest body one request may have.
    pub max_body_bytes: usize,
    /// The most bytes of bodies held at once across all requests being read.
    pub max_buffered_body_bytes: usize,
}

impl ReadLimits {
    /// Says what is wrong with these limits, naming the flag.
    pub fn check(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.max_connections >= 1,
            "serve: --max-connections must be at least 1"
        );
        for (flag, d) in [
            ("--header-timeout", self.header_timeout),
            ("--body-timeout", self.body_timeout),
            ("--request-timeout", self.request_timeout),
        ] {
            anyhow::ensure!(!d.is_zero(), "serve: {flag} must be more than 0 seconds");
        }
        anyhow::ensure!(
            self.request_timeout >= self.header_timeout,
            "serve: --request-timeout ({:?}) is shorter than --header-timeout ({:?}); the \
             whole request cannot take less time than its head",
            self.request_timeout,
            self.header_timeout
        );
        anyhow::ensure!(
            self.max_body_bytes >= 1 && self.max_body_bytes <= u32::MAX as usize,
            "serve: --max-body-bytes must be 1 to {}",
            u32::MAX
        );
        anyhow::ensure!(
            self.max_buffered_body_bytes >= self.max_body_bytes,
            "serve: --max-buffered-body-bytes ({}) is below --max-body-bytes ({}): a body of \
             the largest size could never be read",
            self.max_buffered_body_bytes,
            self.max_body_bytes
        );
        anyhow::ensure!(
            self.max_buffered_body_bytes <= Semaphore::MAX_PERMITS,
            "serve: --max-buffered-body-bytes must be at most {}",
            Semaphore::MAX_PERMITS
        );
        Ok(())
    }
}

/// Makes room for `connections` open connections (and the reserve and a margin) in this
/// process's open-file limit, raising its soft limit up to the hard one if need be. With
/// `explicit` false (the default was not changed) a limit too low lowers the cap, with a
/// warning; otherwise it is an error that says what to do.
// rlim_t is u64 on Linux, not everywhere.
#[allow(clippy::unnecessary_cast)]
pub fn fit_open_files(connections: usize, explicit: bool) -> anyhow::Result<usize> {
    let need = |c: usize| c as u64 + RESERVE as u64 + OTHER_FILES;
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            return Ok(connections);
        }
        if (lim.rlim_cur as u64) < need(connections) {
            let raised = libc::rlimit {
                rlim_cur: (need(connections) as libc::rlim_t).min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            // SAFETY: a valid rlimit, within the hard limit.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
        let may = lim.rlim_cur as u64;
        if may < need(connections) {
            let fits = may.saturating_sub(RESERVE as u64 + OTHER_FILES) as usize;
            if explicit || fits == 0 {
                anyhow::bail!(
                    "serve: --max-connections {connections} needs about {} open files \
                     (the connections, {RESERVE} reserved for /health and {OTHER_FILES} more); \
                     this process may open {may} (ulimit -n): lower --max-connections to {fits} \
                     or raise the limit",
                    need(connections)
                );
            }
            tracing::warn!(
                "this process may open {may} files (ulimit -n): serving at most {fits} \
                 connections instead of {connections}"
            );
            return Ok(fits);
        }
    }
    let _ = (explicit, need);
    Ok(connections)
}

/// When the server began waiting for a request: the deadline of its reading.
#[derive(Clone, Copy, Debug)]
pub struct ReadDeadline(pub Instant);

/// The accept loop's shared parts.
pub struct Listener {
    pub limits: ReadLimits,
    pub metrics: Arc<Metrics>,
    /// Bytes of bodies that may still be buffered.
    pub budget: Arc<Semaphore>,
}

/// Serves `app` on `listener` until `stop` completes; then takes no more connections and
/// asks each open one to close after its current request. Returns the connections' tasks,
/// for the caller to wait on (or abort) within its shutdown timeout.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    reserve_app: Router,
    shared: Arc<Listener>,
    stop: impl std::future::Future<Output = ()>,
    closing: watch::Receiver<bool>,
) -> JoinSet<()> {
    let slots = Arc::new(Semaphore::new(shared.limits.max_connections));
    let mut tasks = JoinSet::new();
    let mut reserve: VecDeque<AbortHandle> = VecDeque::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            biased;
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors (or memory), or a connection that failed as
                        // it was accepted: wait a little rather than spin.
                        if !matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionAborted
                                | std::io::ErrorKind::ConnectionReset
                        ) {
                            tracing::warn!("accepting a connection: {e}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let (app, shared, closing) =
                            (app.clone(), shared.clone(), closing.clone());
                        tasks.spawn(connection(stream, app, shared, closing, slot));
                    }
                    Err(_) => {
                        shared.metrics.over_cap.fetch_add(1, Ordering::Relaxed);
                        reserve.retain(|h| !h.is_finished());
                        if reserve.len() >= RESERVE {
                            if let Some(oldest) = reserve.pop_front() {
                                oldest.abort();
                            }
                        }
                        reserve.push_back(tasks.spawn(reserved(stream, reserve_app.clone())));
                    }
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    for r in reserve {
        r.abort();
    }
    tasks
}

/// One connection within the cap: HTTP/1 with keep-alive, under the read limits.
async fn connection(
    stream: TcpStream,
    app: Router,
    shared: Arc<Listener>,
    mut closing: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let metrics = shared.metrics.clone();
    metrics.open.fetch_add(1, Ordering::Relaxed);
    let _open = Defer(|| {
        metrics.open.fetch_sub(1, Ordering::Relaxed);
    });
    // When the server began waiting for this connection's next request head.
    let waiting = Arc::new(Mutex::new(Instant::now()));
    let request_timeout = shared.limits.request_timeout;
    let service = TowerToHyperService::new(app);
    let tracked = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
        let since = *waiting.lock().unwrap();
        request
            .extensions_mut()
            .insert(ReadDeadline(since + request_timeout));
        let answer = hyper::service::Service::call(&service, request);
        let waiting = waiting.clone();
        async move {
            let response: axum::response::Response = answer.await?;
            // The next head is waited for once this answer has been sent whole.
            Ok::<_, Infallible>(response.map(|body| {
                Body::new(Tracked {
                    body,
                    waiting: Some(waiting),
                })
            }))
        }
    });
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(shared.limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let served = http.serve_connection(TokioIo::new(stream), tracked);
    tokio::pin!(served);
    let result = tokio::select! {
        r = served.as_mut() => r,
        _ = closed(&mut closing) => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            shared.metrics.head_timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Once the server is closing (or gone).
async fn closed(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|c| *c).await;
}

/// A connection over the cap: one request, `/health` or `/metrics`; anything else is
/// answered 503 by `app`'s fallback.
async fn reserved(stream: TcpStream, app: Router) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .keep_alive(false)
        .header_read_timeout(RESERVE_HEAD_TIMEOUT)
        .max_buf_size(8192);
    let _ = http
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(app))
        .await;
}

/// An answer's body that notes when it has been sent (or dropped): the connection then
/// waits for its next request.
struct Tracked {
    body: Body,
    waiting: Option<Arc<Mutex<Instant>>>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        if let Some(w) = self.waiting.take() {
            *w.lock().unwrap() = Instant::now();
        }
    }
}

struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}

/// A request body read whole, and its share of the buffered-body budget (given back when it
/// is dropped).
pub struct ReadBody {
    pub bytes: Bytes,
    _budget: Option<OwnedSemaphorePermit>,
}

/// Reads `request`'s body within the read limits: 413 for one over `--max-body-bytes`, 503
/// for one that does not fit what is left of `--max-buffered-body-bytes`, 408 for one that
/// stalls for `--body-timeout` or is not whole by the request's deadline.
pub async fn read_body(request: Request, listener: &Listener) -> Result<ReadBody, ApiError> {
    let limits = &listener.limits;
    let deadline = request
        .extensions()
        .get::<ReadDeadline>()
        .map(|d| d.0)
        .unwrap_or_else(|| Instant::now() + limits.request_timeout);
    let mut body = request.into_body();
    let hint = body.size_hint();
    let too_large = || ApiError {
        status: 413,
        kind: "request_too_large",
        message: format!(
            "the request body is over this server's limit of {} bytes (serve --max-body-bytes)",
            limits.max_body_bytes
        ),
    };
    let over_budget = || {
        listener
            .metrics
            .budget_refusals
            .fetch_add(1, Ordering::Relaxed);
        ApiError {
            status: 503,
            kind: "server_busy",
            message: format!(
                "the server is reading too many request bodies at once (at most {} bytes \
                 between them, serve --max-buffered-body-bytes); retry later",
                limits.max_buffered_body_bytes
            ),
        }
    };
    if hint.lower() > limits.max_body_bytes as u64 {
        return Err(too_large());
    }
    // A declared length that cannot fit what is left is refused now; otherwise the budget
    // is taken as the bytes come, so a client that declares much and sends little holds
    // little.
    if hint.lower() > listener.budget.available_permits() as u64 {
        return Err(over_budget());
    }
    let mut bytes: Vec<u8> = Vec::with_capacity(hint.exact().unwrap_or(0) as usize);
    let mut held: Option<OwnedSemaphorePermit> = None;
    loop {
        let stall = Instant::now() + limits.body_timeout;
        let until = stall.min(deadline);
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx));
        let frame = match tokio::time::timeout_at(until.into(), frame).await {
            Ok(frame) => frame,
            Err(_) if until == deadline => {
                listener
                    .metrics
                    .request_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return Err(ApiError {
                    status: 408,
                    kind: "request_timeout",
                    message: format!(
                        "the request was not read whole within {} s (serve --request-timeout)",
                        limits.request_timeout.as_secs_f64()
                    ),
                });
            }
            Err(_) => {
                listener
                    .metrics
                    .body_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return Err(ApiError {
                    status: 408,
                    kind: "request_timeout",
                    message: format!(
                        "the request body stalled: nothing came for {} s (serve --body-timeout)",
                        limits.body_timeout.as_secs_f64()
                    ),
                });
            }
        };
        let Some(frame) = frame else { break };
        let frame =
            frame.map_err(|e| ApiError::invalid(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if bytes.len() + data.len() > limits.max_body_bytes {
            return Err(too_large());
        }
        if !data.is_empty() {
            let more = listener
                .budget
                .clone()
                .try_acquire_many_owned(data.len() as u32)
                .map_err(|_| over_budget())?;
            match &mut held {
                Some(h) => h.merge(more),
                None => held = Some(more),
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(ReadBody {
        bytes: Bytes::from(bytes),
        _budget: held,
    })
}
