//! `maporl serve`: a trained team over HTTP. OpenAI-compatible chat completions (each agent a
//! `model`, its adapter over the shared base), whole debates through the run's plugins, the
//! learned verifier as a remote reward model, health, models and Prometheus metrics.
//!
//! The HTTP side runs on tokio (axum) and only parses, checks, queues and answers; the model
//! work runs on a fixed pool of worker threads behind a bounded queue ([`workers`]), so a
//! full server refuses with 429 rather than piling up work, and a long generation never
//! blocks the runtime that accepts connections. Every refusal is a JSON error with a 4xx
//! status; a client that goes away cancels its generation at the next token.

mod api;
mod metrics;
mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use api::ApiError;
pub use api::Limits;
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
    /// Largest request body, in bytes; larger gets 413.
    pub max_body_bytes: usize,
    pub limits: Limits,
    /// After the shutdown signal, how long requests in flight may take to finish; then the
    /// server stops anyway (a client that stopped reading cannot hold it up).
    pub shutdown_timeout: std::time::Duration,
}

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
    max_body_bytes: usize,
    shutdown_timeout: std::time::Duration,
}

impl Server {
    /// Loads the config's team (with the adapters it names), its learned verifier if it has
    /// one, and each worker's plugins; binds `opts.addr`. Nothing is served until
    /// [`run`](Self::run).
    pub fn start(config: Config, opts: ServeOptions) -> anyhow::Result<Server> {
        anyhow::ensure!(opts.workers >= 1, "serve: --workers must be at least 1");
        anyhow::ensure!(opts.queue >= 1, "serve: --queue must be at least 1");
        let team = crate::session::load_team(&config)?;
        let judge = crate::verifier::LearnedVerifier::from_config(&config)?.map(Arc::new);
        let metrics = Arc::new(Metrics::default());
        let shared = Arc::new(Shared {
            config,
            team,
            judge,
            metrics,
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
                queue: Arc::new(queue),
                max_body_bytes: opts.max_body_bytes,
                shutdown_timeout: opts.shutdown_timeout,
            },
            workers,
        })
    }

    /// The address it listens on (the port the system chose for port 0).
    pub fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.listener.local_addr()?)
    }

    /// Serves until `shutdown` completes; then takes no new connections, finishes the
    /// requests in flight (streams included) within the shutdown timeout, lets the workers
    /// drain and returns.
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
        let grace = state.shutdown_timeout;
        let app = router(state);
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener)?;
            let (told, mut heard) = tokio::sync::watch::channel(false);
            let signal = async move {
                shutdown.await;
                let _ = told.send(true);
            };
            let deadline = async move {
                while !*heard.borrow_and_update() {
                    if heard.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                tokio::time::sleep(grace).await;
            };
            tokio::select! {
                served = axum::serve(listener, app).with_graceful_shutdown(signal) => {
                    served.context("serve")
                }
                _ = deadline => {
                    tracing::warn!(
                        "requests still in flight {grace:?} after the shutdown signal: stopping \
                         anyway"
                    );
                    Ok(())
                }
            }
        })?;
        queue.close();
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
    tracing::info!("shutting down: finishing the requests in flight");
}

fn router(state: AppState) -> Router {
    let limit = state.max_body_bytes;
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
        .layer(DefaultBodyLimit::max(limit))
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

/// The body, or the JSON error for one that is too large or unreadable.
fn body(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|r| {
        let status = r.status().as_u16();
        if status == 413 {
            ApiError {
                status,
                kind: "request_too_large",
                message: format!(
                    "the request body is over this server's limit of {} bytes (serve \
                     --max-body-bytes)",
                    state.max_body_bytes
                ),
            }
        } else {
            ApiError {
                status,
                kind: "invalid_request_error",
                message: format!("the request body: {}", r.body_text()),
            }
        }
    })
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

async fn chat(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Response {
    let since = Instant::now();
    let route = "/v1/chat/completions";
    let response = match chat_inner(&state, raw, since).await {
        Ok(r) => r,
        Err(e) => error(&e),
    };
    answered(&state, route, since, response)
}

async fn chat_inner(
    state: &AppState,
    raw: Result<Bytes, BytesRejection>,
    since: Instant,
) -> Result<Response, ApiError> {
    let raw = body(state, raw)?;
    let request = api::chat_request(&raw, state.shared.team.len(), &state.shared.limits)?;
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

async fn debate(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Response {
    let since = Instant::now();
    let result = async {
        let raw = body(&state, raw)?;
        let request = api::debate_request(&raw)?;
        answer_of(&state, |reply| Job::Debate { request, reply }).await
    }
    .await;
    json_answer(&state, "/v1/debate", since, result)
}

async fn judge(State(state): State<AppState>, raw: Result<Bytes, BytesRejection>) -> Response {
    let since = Instant::now();
    let result = async {
        let raw = body(&state, raw)?;
        if state.shared.judge.is_none() {
            return Err(ApiError::not_found(
                "no_verifier",
                "this server has no learned verifier: name one in the config's [verifier] \
                 section (checkpoint = \"RUN/checkpoints/final\")",
            ));
        }
        let request = api::judge_request(&raw, &state.shared.limits)?;
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
