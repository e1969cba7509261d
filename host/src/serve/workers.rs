//! The model work of the server: a bounded queue of jobs and a fixed pool of worker threads
//! that take them. The async side only queues a job and waits for its answer, so a long
//! generation never holds up the runtime that accepts connections.
//!
//! Every worker shares the one team (its frozen weights and adapters are read-only while
//! serving) and the one learned verifier, and has its own plugin instances, since a debate
//! drives its plugins' state.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::api::{ApiError, ChatRequest, DebateRequest, JudgeRequest, Limits};
use super::metrics::Metrics;
use crate::config::Config;
use crate::debate::{
    self, CompletionOptions, Completions, Debate, ModelTeam, OnPluginError, Plugins,
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

/// The queue's sending end; closed (None) once the server stops taking requests.
pub struct Queue {
    sender: Mutex<Option<SyncSender<Queued>>>,
    capacity: usize,
    metrics: Arc<Metrics>,
}

impl Queue {
    /// Queues `job`, or says why not: the queue is full (429, retry later) or closed (503).
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        let sender = self.sender.lock().unwrap().clone();
        let Some(sender) = sender else {
            return Err(shutting_down());
        };
        self.metrics.queued.fetch_add(1, Ordering::SeqCst);
        let queued = Queued {
            job,
            since: Instant::now(),
        };
        match sender.try_send(queued) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.metrics.queued.fetch_sub(1, Ordering::SeqCst);
                Err(match e {
                    TrySendError::Full(_) => ApiError {
                        status: 429,
                        kind: "server_busy",
                        message: format!(
                            "the server is busy: {} requests are waiting (serve --queue); retry \
                             later",
                            self.capacity
                        ),
                    },
                    TrySendError::Disconnected(_) => shutting_down(),
                })
            }
        }
    }

    /// Takes no more jobs; workers finish the queued ones and exit.
    pub fn close(&self) {
        self.sender.lock().unwrap().take();
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
) -> anyhow::Result<(Queue, Vec<std::thread::JoinHandle<()>>)> {
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Queued>(capacity);
    let receiver = Arc::new(Mutex::new(receiver));
    let mut handles = Vec::with_capacity(workers);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    for w in 0..workers {
        let (shared, receiver, ready) = (shared.clone(), receiver.clone(), ready_tx.clone());
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
                        work(&shared, plugins, &receiver);
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
        ready_rx.recv()??;
    }
    shared.metrics.workers.store(workers, Ordering::SeqCst);
    let queue = Queue {
        sender: Mutex::new(Some(sender)),
        capacity,
        metrics: shared.metrics.clone(),
    };
    Ok((queue, handles))
}

fn work(shared: &Shared, mut plugins: Plugins, receiver: &Mutex<Receiver<Queued>>) {
    loop {
        let next = receiver.lock().unwrap().recv();
        let Ok(Queued { job, since }) = next else {
            return; // closed and drained
        };
        let m = &shared.metrics;
        m.queued.fetch_sub(1, Ordering::SeqCst);
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
                let _ = reply.send(debate(shared, &mut plugins, &request));
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
    let result = team.complete(a, &request.messages, &opts, &mut |choice, delta| {
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
    let mut team = shared.team.seated(seed);
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
