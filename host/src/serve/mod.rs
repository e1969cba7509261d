//! `maporl serve`: a trained team over HTTP. OpenAI-compatible chat completions (each agent a
//! `model`, its adapter over the shared base), whole debates through the run's plugins, the
//! learned verifier as a remote reward model, health, models and Prometheus metrics.
//!
//! The HTTP side runs on tokio (axum over hyper) and only parses, checks, queues and answers;
//! the model work runs on a fixed pool of worker threads behind a bounded queue
//! ([`workers`]), so a full server refuses with 429 rather than piling up work, and a long
//! generation never blocks the runtime that accepts connections. Every refusal is a JSON
//! error; a client that goes away (or whose connection the server cuts at shutdown) cancels
//! its generation at the next token. Connections are
//! capped, read under timeouts, and their bodies under one byte budget ([`conn`]), so slow
//! or unfinished requests cannot take the server's memory, file descriptors or `/health`.

mod api;
mod conn;
mod metrics;
mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use api::ApiError;
pub use api::Limits;
pub use conn::{fit_open_files, ReadLimits, MAX_HEAD_BYTES, RESERVE};
use metrics::Metrics;
use workers::{ChatEvent, Job, Queue, Shared};

use crate::config::Config;

/// How a server listens and what it takes.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The one address it listens on.
    pub addr: SocketAddr,
    /// Model worker threads (requests served at once).
    pub workers: usize,
    /// Requests that may wait for a worker; more get 429.
    pub queue: usize,
    /// How connections and requests are read: the connection cap, the read timeouts, the
    /// largest body and the budget of all bodies being read.
    pub read: ReadLimits,
    pub limits: Limits,
    /// After the shutdown signal, how long requests in flight may take to finish; then the
    /// server closes their connections, which cancels them, and stops anyway (a client that
    /// stopped reading cannot hold it up). Queued requests are answered 503 at the signal.
    pub shutdown_timeout: Duration,
}

/// After the shutdown timeout, how long the workers get to notice that their requests'
/// clients have gone before the server exits without them.
const WORKER_GRACE: Duration = Duration::from_secs(2);

/// A started server: models loaded, workers running, the address bound.
pub struct Server {
    listener: std::net::TcpListener,
    state: AppState,
    workers: Vec<std::thread::JoinHandle<()>>,
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    queue: Arc<Queue>,
    reading: Arc<conn::Listener>,
    shutdown_timeout: Duration,
}

impl Server {
    /// Loads the config's team (with the adapters it names), its learned verifier if it has
    /// one, and each worker's plugins; binds `opts.addr`. Nothing is served until
    /// [`run`](Self::run).
    pub fn start(config: Config, opts: ServeOptions) -> anyhow::Result<Server> {
        anyhow::ensure!(opts.workers >= 1, "serve: --workers must be at least 1");
        anyhow::ensure!(opts.queue >= 1, "serve: --queue must be at least 1");
        opts.read.check()?;
        let team = crate::session::load_team(&config)?;
        let judge = crate::verifier::LearnedVerifier::from_config(&config)?.map(Arc::new);
        let metrics = Arc::new(Metrics::default());
        let budget = Arc::new(tokio::sync::Semaphore::new(
            opts.read.max_buffered_body_bytes,
        ));
        let _ = metrics
            .body_budget
            .set((budget.clone(), opts.read.max_buffered_body_bytes));
        let shared = Arc::new(Shared {
            config,
            team,
            judge,
            metrics: metrics.clone(),
            limits: opts.limits,
        });
        let (queue, workers) = workers::start(shared.clone(), opts.workers, opts.queue)?;
        let listener = std::net::TcpListener::bind(opts.addr)
            .with_context(|| format!("serve: listening on {}", opts.addr))?;
        listener.set_nonblocking(true)?;
        Ok(Server {
            listener,
            state: AppState {
                shared,
                queue,
                reading: Arc::new(conn::Listener {
                    limits: opts.read,
                    metrics,
                    budget,
                }),
                shutdown_timeout: opts.shutdown_timeout,
            },
            workers,
        })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` completes; then takes no new connections, answers the queued
    /// requests 503, and gives the requests in flight (streams included) the shutdown
    /// timeout to finish. Those still running then have their connections closed, which
    /// cancels them as a client that goes away does: a generation stops at its next piece
    /// of text, a debate before its next turn. The workers get [`WORKER_GRACE`] more to
    /// stop, and it returns without those that did not: within about the shutdown timeout
    /// and 3 s of the signal.
    pub fn run(self, shutdown: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("maporl-http")
            .enable_all()
            .build()?;
        let Server {
            listener,
            state,
            workers,
        } = self;
        let queue = state.queue.clone();
        let metrics = state.shared.metrics.clone();
        let reading = state.reading.clone();
        let grace = state.shutdown_timeout;
        let app = router(state.clone());
        let reserve_app = reserve_router(state);
        let signalled = runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let (closing, closing_rx) = tokio::sync::watch::channel(false);
            let mut connections =
                conn::serve(listener, app, reserve_app, reading, shutdown, closing_rx).await;
            // No longer listening.
            let signalled = Instant::now();
            let refused = queue.close();
            tracing::info!(
                "shutting down: {refused} queued requests answered 503; the {} in flight have \
                 {grace:?} to finish",
                metrics.busy.load(Ordering::SeqCst)
            );
            let _ = closing.send(true);
            let drained = tokio::time::timeout(grace, async {
                while connections.join_next().await.is_some() {}
            })
            .await
            .is_ok();
            if !drained {
                tracing::warn!(
                    "requests still in flight {grace:?} after the shutdown signal: stopping \
                     anyway (their connections are closed, which cancels their generations)"
                );
                connections.abort_all();
                while connections.join_next().await.is_some() {}
            }
            anyhow::Ok(signalled)
        })?;
        runtime.shutdown_timeout(Duration::from_secs(1));
        // The queue is closed and every connection is gone: a worker still busy has a request
        // whose client has gone, and stops it at its next piece of text (a debate before its
        // next turn). It gets what is left of the shutdown timeout and WORKER_GRACE more;
        // then the process exits without it.
        let deadline = (signalled + grace).max(Instant::now()) + WORKER_GRACE;
        while !workers.iter().all(|w| w.is_finished()) {
            if Instant::now() >= deadline {
                tracing::warn!(
                    "a worker is still busy {WORKER_GRACE:?} after the shutdown timeout: \
                     exiting without it"
                );
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for w in workers {
            let _ = w.join();
        }
        Ok(())
    }
}

/// SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutdown signal");
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/metrics", get(metrics_text))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/debate", post(debate))
        .route("/v1/judge", post(judge))
        .fallback(|| async {
            error(&ApiError::not_found(
                "not_found",
                "no such route: the server answers /health, /metrics, /v1/models, \
                 /v1/chat/completions, /v1/debate and /v1/judge",
            ))
        })
        .method_not_allowed_fallback(|| async {
            error(&ApiError {
                status: 405,
                kind: "method_not_allowed",
                message: "method not allowed on this route".into(),
            })
        })
        .with_state(state)
}

/// What a connection over `--max-connections` is answered: `/health` and `/metrics`, and
/// 503 for anything else.
fn reserve_router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(|State(state): State<AppState>| async move {
            error(&ApiError {
                status: 503,
                kind: "too_many_connections",
                message: format!(
                    "the server has {} connections open, its most (serve --max-connections); \
                     only /health and /metrics are answered beyond them: retry later",
                    state.reading.limits.max_connections
                ),
            })
        })
        .with_state(state)
}

fn error(e: &ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(e.body())).into_response();
    if e.status == 429 || e.status == 503 {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    // A body left unread (too large, too slow, no room for it) ends the connection.
    if matches!(e.status, 408 | 413 | 503) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// Records the answer's status and latency under `route`.
fn answered(state: &AppState, route: &'static str, since: Instant, response: Response) -> Response {
    state
        .shared
        .metrics
        .answered(route, response.status().as_u16(), since.elapsed());
    response
}

/// The request's body, read within the server's read limits and body budget.
async fn body(state: &AppState, request: Request) -> Result<conn::ReadBody, ApiError> {
    conn::read_body(request, &state.reading).await
}

async fn health(State(state): State<AppState>) -> Response {
    let m = &state.shared.metrics;
    use std::sync::atomic::Ordering::Relaxed;
    Json(json!({
        "status": "ok",
        "agents": state.shared.team.len(),
        "workers": m.workers.load(Relaxed),
        "busy_workers": m.busy.load(Relaxed),
        "queue_depth": m.queued.load(Relaxed),
        "connections": m.open.load(Relaxed),
        "max_connections": state.reading.limits.max_connections,
        "judge": state.shared.judge.is_some(),
    }))
    .into_response()
}

async fn models(State(state): State<AppState>) -> Response {
    let config = &state.shared.config;
    let data: Vec<Value> = (0..state.shared.team.len())
        .map(|a| {
            json!({
                "id": format!("agent-{a}"),
                "object": "model",
                "created": 0,
                "owned_by": "maporl",
                "root": config.agent_model(a),
                "adapter": config.agent_adapter(a),
            })
        })
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.shared.metrics.render(),
    )
        .into_response()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn chat(State(state): State<AppState>, raw: Request) -> Response {
    let since = Instant::now();
    let route = "/v1/chat/completions";
    let response = match chat_inner(&state, raw, since).await {
        Ok(r) => r,
        Err(e) => error(&e),
    };
    answered(&state, route, since, response)
}

async fn chat_inner(state: &AppState, raw: Request, since: Instant) -> Result<Response, ApiError> {
    let raw = body(state, raw).await?;
    let request = api::chat_request(&raw.bytes, state.shared.team.len(), &state.shared.limits)?;
    drop(raw);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (model, stream, usage, n) = (
        request.model.clone(),
        request.stream,
        request.stream_usage,
        request.n,
    );
    state.queue.submit(Job::Chat {
        request,
        events: tx,
    })?;
    // The worker first says whether the prompt fits: a refusal is still a plain 4xx.
    match rx.recv().await {
        Some(ChatEvent::Started) => {}
        Some(ChatEvent::Failed(e)) => return Err(e),
        _ => return Err(ApiError::internal("the worker stopped without an answer")),
    }
    let id = format!("chatcmpl-{:032x}", rand::random::<u128>());
    let created = now();
    if !stream {
        loop {
            match rx.recv().await {
                Some(ChatEvent::Text { .. }) => {}
                Some(ChatEvent::Done(c)) => {
                    return Ok(Json(api::completion_body(&id, created, &model, &c)).into_response())
                }
                Some(ChatEvent::Failed(e)) => return Err(e),
                Some(ChatEvent::Started) | None => {
                    return Err(ApiError::internal("the worker stopped without an answer"))
                }
            }
        }
    }
    // Server-sent events: a first chunk with the role for each choice, the text as it
    // comes, a last chunk per choice with its finish reason, the usage if asked, [DONE].
    let metrics = state.shared.metrics.clone();
    let mut pending: std::collections::VecDeque<Event> = (0..n)
        .map(|i| {
            chunk_event(&api::chunk_body(
                &id,
                created,
                &model,
                i,
                json!({"role": "assistant", "content": ""}),
                None,
            ))
        })
        .collect();
    let mut first_text = true;
    let mut over = false;
    let events = futures_util::stream::poll_fn(move |cx| loop {
        if let Some(e) = pending.pop_front() {
            return std::task::Poll::Ready(Some(Ok::<Event, std::convert::Infallible>(e)));
        }
        if over {
            return std::task::Poll::Ready(None);
        }
        match rx.poll_recv(cx) {
            std::task::Poll::Pending => return std::task::Poll::Pending,
            std::task::Poll::Ready(event) => match event {
                Some(ChatEvent::Text { choice, delta }) => {
                    if first_text {
                        first_text = false;
                        metrics.first_text(since.elapsed());
                    }
                    pending.push_back(chunk_event(&api::chunk_body(
                        &id,
                        created,
                        &model,
                        choice,
                        json!({"content": delta}),
                        None,
                    )));
                }
                Some(ChatEvent::Done(c)) => {
                    for (i, x) in c.choices.iter().enumerate() {
                        pending.push_back(chunk_event(&api::chunk_body(
                            &id,
                            created,
                            &model,
                            i,
                            json!({}),
                            Some(x.finish),
                        )));
                    }
                    if usage {
                        pending.push_back(chunk_event(&api::usage_chunk(&id, created, &model, &c)));
                    }
                    pending.push_back(Event::default().data("[DONE]"));
                    over = true;
                }
                Some(ChatEvent::Failed(e)) => {
                    pending.push_back(chunk_event(&e.body()));
                    over = true;
                }
                Some(ChatEvent::Started) => {}
                None => {
                    pending.push_back(chunk_event(
                        &ApiError::internal("the worker stopped without an answer").body(),
                    ));
                    over = true;
                }
            },
        }
    });
    Ok(Sse::new(events).into_response())
}

fn chunk_event(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

async fn debate(State(state): State<AppState>, raw: Request) -> Response {
    let since = Instant::now();
    let result = async {
        let request = api::debate_request(&body(&state, raw).await?.bytes)?;
        answer_of(&state, |reply| Job::Debate { request, reply }).await
    }
    .await;
    json_answer(&state, "/v1/debate", since, result)
}

async fn judge(State(state): State<AppState>, raw: Request) -> Response {
    let since = Instant::now();
    let result = async {
        let raw = body(&state, raw).await?;
        if state.shared.judge.is_none() {
            return Err(ApiError::not_found(
                "no_verifier",
                "this server has no learned verifier: name one in the config's [verifier] \
                 section (checkpoint = \"RUN/checkpoints/final\")",
            ));
        }
        let request = api::judge_request(&raw.bytes, &state.shared.limits)?;
        drop(raw);
        answer_of(&state, |reply| Job::Judge { request, reply }).await
    }
    .await;
    json_answer(&state, "/v1/judge", since, result)
}

/// Queues the job `job` makes with its reply channel, and waits for the reply.
async fn answer_of(
    state: &AppState,
    job: impl FnOnce(oneshot::Sender<Result<Value, ApiError>>) -> Job,
) -> Result<Value, ApiError> {
    let (reply, answer) = oneshot::channel();
    state.queue.submit(job(reply))?;
    answer
        .await
        .map_err(|_| ApiError::internal("the worker stopped without an answer"))?
}

/// The JSON answer or error, recorded under `route`.
fn json_answer(
    state: &AppState,
    route: &'static str,
    since: Instant,
    result: Result<Value, ApiError>,
) -> Response {
    let response = match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&e),
    };
    answered(state, route, since, response)
}
