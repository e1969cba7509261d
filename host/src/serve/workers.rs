//! The model work of the server: a bounded queue of jobs and a fixed pool of worker threads
//! that take them. The async side only queues a job and waits for its answer, so a long
//! generation never holds up the runtime that accepts connections.
//!
//! Every worker shares the one team (its frozen weights and adapters are read-only while
//! serving) and the one learned verifier, and has its own plugin instances, since a debate
//! drives its plugins' state.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::api::{ApiError, ChatRequest, DebateRequest, JudgeRequest, Limits};
use super::metrics::Metrics;
use crate::config::Config;
use crate::debate::{
    self, CompletionOptions, Completions, Debate, ModelTeam, OnPluginError, Plugins, Request,
    Response, Team,
};
use crate::transcript::{ChatMessage, Role, Task};
use crate::verifier::LearnedVerifier;

/// What a chat job tells its request as it goes.
pub enum ChatEvent {
    /// The prompt fits; generation begins.
    Started,
    /// More text of choice `choice`.
    Text {
        choice: usize,
        delta: String,
    },
    Done(Completions),
    Failed(ApiError),
}

/// One unit of model work.
pub enum Job {
    Chat {
        request: ChatRequest,
        events: mpsc::UnboundedSender<ChatEvent>,
    },
    Debate {
        request: DebateRequest,
        reply: oneshot::Sender<Result<Value, ApiError>>,
    },
    Judge {
        request: JudgeRequest,
        reply: oneshot::Sender<Result<Value, ApiError>>,
    },
}

impl Job {
    /// The client has gone: nobody will read the answer.
    fn abandoned(&self) -> bool {
        match self {
            Job::Chat { events, .. } => events.is_closed(),
            Job::Debate { reply, .. } | Job::Judge { reply, .. } => reply.is_closed(),
        }
    }

    /// Answers `e` without running the job.
    fn refuse(self, e: ApiError) {
        match self {
            Job::Chat { events, .. } => {
                let _ = events.send(ChatEvent::Failed(e));
            }
            Job::Debate { reply, .. } | Job::Judge { reply, .. } => {
                let _ = reply.send(Err(e));
            }
        }
    }
}

struct Queued {
    job: Job,
    since: Instant,
}

/// What every worker reads.
pub struct Shared {
    pub config: Config,
    pub team: ModelTeam,
    pub judge: Option<Arc<LearnedVerifier>>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
}

impl Shared {
    /// Refuses a question longer than `--max-prompt-tokens` (as agent 0 counts it).
    fn check_question(&self, question: &str) -> Result<(), ApiError> {
        let messages = [ChatMessage {
            role: Role::User,
            content: question.to_string(),
        }];
        let tokens = self
            .team
            .prompt_tokens(0, &messages)
            .map_err(|e| ApiError::invalid(format!("`question`: {e:#}")))?;
        let most = self.limits.max_prompt_tokens;
        if tokens > most {
            return Err(ApiError::invalid(format!(
                "`question` is {tokens} tokens as a prompt; this server reads at most {most} \
                 (serve --max-prompt-tokens)"
            )));
        }
        Ok(())
    }
}

/// The jobs waiting for a worker; closed once the server stops taking requests.
pub struct Queue {
    state: Mutex<Waiting>,
    /// Wakes a worker when a job comes or the queue closes.
    ready: Condvar,
    capacity: usize,
    metrics: Arc<Metrics>,
}

struct Waiting {
    jobs: VecDeque<Queued>,
    closed: bool,
}

impl Queue {
    /// Queues `job`, or says why not: the queue is full (429, retry later) or closed (503).
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let mut state = self.state.lock().unwrap();
        if state.closed {
            return Err(shutting_down());
        }
        if state.jobs.len() >= self.capacity {
            return Err(ApiError {
                status: 429,
                kind: "server_busy",
                message: format!(
                    "the server is busy: {} requests are waiting (serve --queue); retry later",
                    self.capacity
                ),
            });
        }
        state.jobs.push_back(Queued {
            job,
            since: Instant::now(),
        });
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        drop(state);
        self.ready.notify_one();
        Ok(())
    }

    /// The next job, waiting for one; None once the queue is closed.
    fn next(&self) -> Option<Queued> {
        let mut state = self.state.lock().unwrap();
        loop {
            if let Some(q) = state.jobs.pop_front() {
                self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
                return Some(q);
            }
            if state.closed {
                return None;
            }
            state = self.ready.wait(state).unwrap();
        }
    }

    /// Takes no more jobs, and answers the ones still waiting 503 at once (the server is
    /// stopping; they have not started); workers finish their current job and exit.
    /// Returns how many were refused.
    pub fn close(&self) -> usize {
        let refused: Vec<Queued> = {
            let mut state = self.state.lock().unwrap();
            state.closed = true;
            state.jobs.drain(..).collect()
        };
        self.ready.notify_all();
        let n = refused.len();
        self.metrics.queued.fetch_sub(n, Ordering::SeqCst);
        self.metrics
            .refused_at_shutdown
            .fetch_add(n as u64, Ordering::Relaxed);
        for q in refused {
            q.job.refuse(shutting_down());
        }
        n
    }
}

fn shutting_down() -> ApiError {
    ApiError {
        status: 503,
        kind: "shutting_down",
        message: "the server is shutting down".to_string(),
    }
}

/// Starts `workers` threads over a queue of `capacity` jobs. Each worker loads its own
/// plugins first; a failure there fails the start.
pub fn start(
    shared: Arc<Shared>,
    workers: usize,
    capacity: usize,
) -> anyhow::Result<(Arc<Queue>, Vec<std::thread::JoinHandle<()>>)> {
    let queue = Arc::new(Queue {
        state: Mutex::new(Waiting {
            jobs: VecDeque::with_capacity(capacity),
            closed: false,
        }),
        ready: Condvar::new(),
        capacity,
        metrics: shared.metrics.clone(),
    });
    let mut handles = Vec::with_capacity(workers);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    for w in 0..workers {
        let (shared, queue, ready) = (shared.clone(), queue.clone(), ready_tx.clone());
        let handle = std::thread::Builder::new()
            .name(format!("maporl-worker-{w}"))
            .spawn(move || {
                // One model, a score cache per worker: concurrent debates do not empty each
                // other's.
                let judge = shared.judge.as_ref().map(|j| Arc::new(j.with_own_cache()));
                let plugins = crate::session::load_plugins_judged(&shared.config, judge);
                match plugins {
                    Ok((plugins, _)) => {
                        let _ = ready.send(Ok(()));
                        work(&shared, plugins, &queue);
                    }
                    Err(e) => {
                        let _ =
                            ready.send(Err(e.context(format!("worker {w}: loading the plugins"))));
                    }
                }
            })?;
        handles.push(handle);
    }
    drop(ready_tx);
    for _ in 0..workers {
        if let Err(e) = ready_rx.recv()? {
            queue.close();
            return Err(e);
        }
    }
    shared.metrics.workers.store(workers, Ordering::SeqCst);
    Ok((queue, handles))
}

fn work(shared: &Shared, mut plugins: Plugins, queue: &Queue) {
    while let Some(Queued { job, since }) = queue.next() {
        let m = &shared.metrics;
        m.waited(since.elapsed());
        if job.abandoned() {
            m.cancelled();
            continue;
        }
        m.busy.fetch_add(1, Ordering::SeqCst);
        // A panic fails its request (the reply is dropped: a 500), not the worker.
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match job {
            Job::Chat { request, events } => chat(shared, &request, &events),
            Job::Debate { request, reply } => {
                let gone = || reply.is_closed();
                let answer = debate(shared, &mut plugins, &request, &gone);
                let _ = reply.send(answer);
            }
            Job::Judge { request, reply } => {
                let _ = reply.send(judge(shared, &request));
            }
        }));
        if outcome.is_err() {
            tracing::error!("a request panicked in its worker; the worker goes on");
        }
        m.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A test hook (feature `test-hooks`): with `MAPORL_TEST_SERVE_SLOW_MS=N`, each piece of a
/// chat's text and each debate turn takes N ms longer, so that tests can hold workers busy
/// without a large model.
fn slow_down() {
    #[cfg(feature = "test-hooks")]
    {
        static SLOW: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let ms = *SLOW.get_or_init(|| {
            std::env::var("MAPORL_TEST_SERVE_SLOW_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        });
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
    }
}

/// A debate's team that stops before a turn once the debate's client has gone (it went
/// away, or the server cut its connection at the shutdown timeout).
struct Watched<'a, T> {
    team: T,
    stop: &'a dyn Fn() -> bool,
}

impl<T: Team> Team for Watched<'_, T> {
    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        slow_down();
        if (self.stop)() {
            anyhow::bail!("cancelled: the client has gone");
        }
        self.team.respond(turn, requests)
    }

    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        self.team.admit(agent, messages)
    }

    fn admit_all(&self, asks: &[(u32, &[ChatMessage])]) -> anyhow::Result<Vec<Result<(), String>>> {
        self.team.admit_all(asks)
    }
}

fn chat(shared: &Shared, request: &ChatRequest, events: &mpsc::UnboundedSender<ChatEvent>) {
    let team = &shared.team;
    let a = request.agent;
    let most = shared.limits.max_prompt_tokens;
    let refusal = match team.check_chat(a, &request.messages, request.max_tokens) {
        Err(why) => Some(why),
        Ok(tokens) if tokens > most => Some(format!(
            "the prompt is {tokens} tokens; this server reads at most {most} (serve \
             --max-prompt-tokens)"
        )),
        Ok(_) => None,
    };
    if let Some(why) = refusal {
        let _ = events.send(ChatEvent::Failed(ApiError::invalid(why)));
        return;
    }
    if events.send(ChatEvent::Started).is_err() {
        shared.metrics.cancelled();
        return;
    }
    let opts = CompletionOptions {
        sampling: request.sampling(team.sampling(a)),
        seed: request.seed.unwrap_or_else(rand::random),
        max_tokens: request.max_tokens,
        stop: request.stop.clone(),
        n: request.n,
    };
    // Stops at the next piece of text once the client has gone (it went away, or the server
    // cut its connection at the shutdown timeout).
    let result = team.complete(a, &request.messages, &opts, &mut |choice, delta| {
        slow_down();
        events
            .send(ChatEvent::Text {
                choice,
                delta: delta.to_string(),
            })
            .is_ok()
    });
    match result {
        Ok(c) => {
            let generated = c.choices.iter().map(|x| x.tokens).sum();
            shared.metrics.tokens(a, c.prompt_tokens, generated);
            if events.send(ChatEvent::Done(c)).is_err() {
                shared.metrics.cancelled();
            }
        }
        Err(e) => {
            tracing::error!(agent = a, "chat completion failed: {e:#}");
            let _ = events.send(ChatEvent::Failed(ApiError::internal(format!(
                "generation failed: {e:#}"
            ))));
        }
    }
}

fn debate(
    shared: &Shared,
    plugins: &mut Plugins,
    request: &DebateRequest,
    gone: &dyn Fn() -> bool,
) -> Result<Value, ApiError> {
    let config = &shared.config;
    shared.check_question(&request.question)?;
    let seed = request.seed.unwrap_or_else(rand::random);
    let task = Task {
        id: request.id.clone().unwrap_or_else(|| "request".into()),
        kind: request.kind.clone().unwrap_or_else(|| config.task_kind()),
        question: request.question.clone(),
        reference: request.reference.clone(),
        fields: vec![],
    };
    // Fresh plugin instances, seeded by the request: the same seed, the same debate.
    plugins
        .restart(seed)
        .map_err(|e| ApiError::internal(format!("restarting the plugins: {e}")))?;
    let mut team = Watched {
        team: shared.team.seated(seed),
        stop: gone,
    };
    let rollout = debate::run(
        plugins,
        &mut team,
        std::slice::from_ref(&task),
        config.debate.agents,
        config.debate.turns,
        OnPluginError::DropTask,
    )
    .map_err(|e| ApiError::internal(format!("the debate failed: {e:#}")))?;
    let d = &rollout.debates[0];
    if let Some(error) = &d.error {
        return Err(ApiError {
            status: 422,
            kind: "debate_failed",
            message: error.clone(),
        });
    }
    for (u, s) in d.transcript.utterances.iter().zip(&d.speeches) {
        shared
            .metrics
            .tokens(u.agent as usize, s.prompt_tokens, s.response_tokens);
    }
    Ok(debate_body(d, seed))
}

/// A debate as `/v1/debate` answers it: every turn's utterances (text, answer, score,
/// correctness, reward and its parts) and the team's decision after it.
fn debate_body(d: &Debate, seed: u64) -> Value {
    let turns: Vec<Value> = d
        .decisions
        .iter()
        .enumerate()
        .map(|(t, decision)| {
            let turn = t as u32 + 1;
            let utterances: Vec<Value> = d
                .transcript
                .utterances
                .iter()
                .zip(&d.speeches)
                .filter(|(u, _)| u.turn == turn)
                .map(|(u, s)| {
                    let reward = d
                        .rewards
                        .iter()
                        .find(|r| r.turn == turn && r.agent == u.agent)
                        .map(|r| {
                            let parts: serde_json::Map<String, Value> =
                                r.parts.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
                            json!({"total": r.total, "parts": parts})
                        });
                    json!({
                        "agent": u.agent,
                        "text": u.text,
                        "answer": u.answer,
                        "score": u.score,
                        "correct": u.correct,
                        "reward": reward,
                        "prompt_tokens": s.prompt_tokens,
                        "completion_tokens": s.response_tokens,
                    })
                })
                .collect();
            json!({"turn": turn, "utterances": utterances, "decision": decision})
        })
        .collect();
    json!({
        "id": d.task.id,
        "kind": d.task.kind,
        "question": d.task.question,
        "reference": d.task.reference,
        "seed": seed,
        "turns": turns,
    })
}

fn judge(shared: &Shared, request: &JudgeRequest) -> Result<Value, ApiError> {
    let judge = shared
        .judge
        .as_ref()
        .ok_or_else(|| ApiError::internal("no learned verifier"))?;
    shared.check_question(&request.question)?;
    let pairs: Vec<(&str, &str)> = request
        .responses
        .iter()
        .map(|r| (request.question.as_str(), r.as_str()))
        .collect();
    let probabilities = judge
        .probabilities(&pairs)
        .map_err(|e| ApiError::internal(format!("the learned verifier failed: {e:#}")))?;
    Ok(json!({
        "probabilities": probabilities,
        "checkpoint_sha256": judge.sha256(),
    }))
}
