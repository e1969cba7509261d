//! The rollout engine: drives a protocol plugin, a team of agents and a verifier through a
//! debate over a batch of tasks, then asks the reward shaper for the rewards.
//!
//! The engine batches across tasks: at each turn it collects every task's plan, asks the
//! team for all responses at once (so each model generates them in batches), scores each
//! task's responses in one verifier call, and asks the protocol for the team's answer.

mod record;
mod scripted;
mod spread;
mod team;

pub use record::{write_transcripts, PluginHashes};
pub use scripted::{worked_answer, Persuasion, ScriptedTeam};
pub use spread::SpreadTeam;
pub use team::{
    Completion, CompletionOptions, Completions, Finish, ModelTeam, Seated, TeamOptions,
};

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::plugin::{PluginError, Protocol, RewardShaper, Verifier};
use crate::transcript::{ChatMessage, Reward, Task, Transcript, Utterance};

/// One agent's answer to one request, with its size in tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub text: String,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
    /// The token ids, for training; empty when the team has no tokenizer (scripted).
    #[serde(skip)]
    pub ids: TokenIds,
}

/// The prompt and response token ids of one utterance, as its agent's model saw them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenIds {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    /// The generating policy's log-probs and values of `response`, recorded while it was
    /// generated, when the agent that spoke is a learner (has a value head) and spoke with
    /// its adapter; PPO then need not score the response again.
    pub policy: Option<crate::model::PolicyTrace>,
}

/// What the team is asked for one utterance: agent `agent` answers the conversation
/// `messages` in the debate about task `task` (its id).
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub task: &'a str,
    pub agent: u32,
    pub messages: &'a [ChatMessage],
}

/// Whoever produces the agents' responses: LLM agents, or a scripted stand-in.
pub trait Team {
    /// One response per request, in order, for debate turn `turn` (1-based).
    fn respond(&mut self, turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>>;

    /// Refuses, saying why, a conversation that agent `agent` cannot answer (its prompt and
    /// the longest response it may give do not fit its model's context). Asked of every
    /// planned prompt before the turn is generated, so that the failure belongs to the task
    /// whose plan made the prompt, not to the whole batch.
    fn admit(&self, agent: u32, messages: &[ChatMessage]) -> Result<(), String> {
        let _ = (agent, messages);
        Ok(())
    }

    /// [`admit`](Self::admit) of every prompt of a turn, in order (a team spread over
    /// several processes judges them all at once). Fails only where the team cannot judge
    /// at all (its processes cannot hear each other).
    fn admit_all(&self, asks: &[(u32, &[ChatMessage])]) -> anyhow::Result<Vec<Result<(), String>>> {
        Ok(asks.iter().map(|&(a, m)| self.admit(a, m)).collect())
    }
}

/// The three plugins a debate runs with.
pub struct Plugins {
    pub protocol: Protocol,
    pub verifier: Verifier,
    pub shaper: RewardShaper,
}

impl Plugins {
    /// Fresh instances of all three, seeded by `epoch` (a training step): plugin behaviour
    /// then depends on the step, not on the run's history, so a resumed run matches.
    pub fn restart(&mut self, epoch: u64) -> Result<(), PluginError> {
        self.protocol.restart(epoch)?;
        self.verifier.restart(epoch)?;
        self.shaper.restart(epoch)
    }
}

/// What a plugin failure on one task does to the run (`debate.on_plugin_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OnPluginError {
    /// Stop the run with the error.
    Stop,
    /// Record the error on that task's debate, leave it out, and go on.
    DropTask,
}

/// What one agent was asked and how much it said, for one utterance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Speech {
    pub messages: Vec<ChatMessage>,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
    /// Not written to transcripts.
    #[serde(skip)]
    pub ids: TokenIds,
}

/// One finished debate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Debate {
    pub task: Task,
    pub transcript: Transcript,
    /// `speeches[i]` is what led to `transcript.utterances[i]`.
    pub speeches: Vec<Speech>,
    /// The team's answer(s) after each turn that was played (index 0 is turn 1).
    pub decisions: Vec<Vec<String>>,
    pub rewards: Vec<Reward>,
    /// Set when a plugin failed on this task and the run dropped it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The debates of a batch and where the time went.
pub struct Rollout {
    pub debates: Vec<Debate>,
    /// Time spent inside plugin calls.
    pub plugin_time: Duration,
    /// Time spent by the team (generation).
    pub team_time: Duration,
}

/// Runs one debate per task with `agents` agents over at most `turns` turns.
pub fn run(
    plugins: &mut Plugins,
    team: &mut dyn Team,
    tasks: &[Task],
    agents: u32,
    turns: u32,
    on_error: OnPluginError,
) -> anyhow::Result<Rollout> {
    let mut debates: Vec<Debate> = tasks
        .iter()
        .map(|task| Debate {
            task: task.clone(),
            transcript: Transcript::new(agents, turns),
            speeches: Vec::new(),
            decisions: Vec::new(),
            rewards: Vec::new(),
            error: None,
        })
        .collect();
    let mut active: Vec<bool> = vec![true; debates.len()];
    let (mut plugin_time, mut team_time) = (Duration::ZERO, Duration::ZERO);
    // Debates whose protocol planned no speaker at turn 1: no answer at all.
    let mut silent = 0;
    // Records a plugin failure per the policy; `Err` stops the run.
    let fail = |debate: &mut Debate, active: &mut bool, err: PluginError| -> anyhow::Result<()> {
        match on_error {
            OnPluginError::Stop => Err(err.into()),
            OnPluginError::DropTask => {
                debate.error = Some(err.to_string());
                *active = false;
                Ok(())
            }
        }
    };
    for turn in 1..=turns {
        // Plan every active debate's turn.
        let mut planned = Vec::new();
        for (i, debate) in debates.iter_mut().enumerate() {
            if !active[i] {
                continue;
            }
            let started = Instant::now();
            let plan = plugins
                .protocol
                .plan_turn(&debate.task, turn, &debate.transcript);
            plugin_time += started.elapsed();
            match plan {
                Ok(plan) if plan.is_empty() => {
                    active[i] = false;
                    silent += usize::from(turn == 1);
                }
                Ok(plan) => planned.push((i, plan)),
                Err(e) => fail(debate, &mut active[i], e)?,
            }
        }
        // Every planned prompt must fit its agent's model, asked of the team at once.
        let asks: Vec<(u32, &[ChatMessage])> = planned
            .iter()
            .flat_map(|(_, plan)| plan.iter().map(|p| (p.agent, p.messages.as_slice())))
            .collect();
        let mut admitted = team.admit_all(&asks)?.into_iter();
        drop(asks);
        let mut plans = Vec::new();
        for (i, plan) in planned {
            let verdicts: Vec<Result<(), String>> = admitted.by_ref().take(plan.len()).collect();
            match verdicts.into_iter().find_map(Result::err) {
                None => plans.push((i, plan)),
                Some(msg) => {
                    let debate = &mut debates[i];
                    let err = plugins.protocol.refuse("plan-turn", &debate.task, msg);
                    fail(debate, &mut active[i], err)?
                }
            }
        }
        if plans.is_empty() {
            break;
        }
        // One batch of responses for the whole turn.
        let requests: Vec<Request<'_>> = plans
            .iter()
            .flat_map(|(i, plan)| {
                let task = debates[*i].task.id.as_str();
                plan.iter().map(move |p| Request {
                    task,
                    agent: p.agent,
                    messages: p.messages.as_slice(),
                })
            })
            .collect();
        let started = Instant::now();
        let responses = team.respond(turn, &requests)?;
        team_time += started.elapsed();
        anyhow::ensure!(
            responses.len() == requests.len(),
            "the team gave {} responses to {} requests",
            responses.len(),
            requests.len()
        );
        // The learned verifier, if any, scores the whole turn in batches now; the verifier
        // plugin's per-task `judge` calls then find their answers cached.
        if let Some(judge) = plugins.verifier.judge().cloned() {
            let questions = plans
                .iter()
                .flat_map(|(i, plan)| plan.iter().map(|_| debates[*i].task.question.as_str()));
            let pairs: Vec<(&str, &str)> = questions
                .zip(responses.iter().map(|r| r.text.as_str()))
                .collect();
            let started = Instant::now();
            judge
                .prefetch(&pairs)
                .map_err(|e| anyhow::anyhow!("turn {turn}: {e}"))?;
            plugin_time += started.elapsed();
        }
        let mut responses = responses.into_iter();
        for (i, plan) in &plans {
            let said: Vec<Response> = responses.by_ref().take(plan.len()).collect();
            let debate = &mut debates[*i];
            let texts: Vec<String> = said.iter().map(|r| r.text.clone()).collect();
            let started = Instant::now();
            let verdicts = plugins.verifier.score(&debate.task, &texts);
            plugin_time += started.elapsed();
            let verdicts = match verdicts {
                Ok(v) => v,
                Err(e) => {
                    fail(debate, &mut active[*i], e)?;
                    continue;
                }
            };
            for ((prompt, response), verdict) in plan.iter().zip(said).zip(verdicts) {
                debate.transcript.utterances.push(Utterance {
                    turn,
                    agent: prompt.agent,
                    text: response.text,
                    answer: verdict.answer,
                    score: verdict.score,
                    correct: verdict.correct,
                });
                debate.speeches.push(Speech {
                    messages: prompt.messages.clone(),
                    prompt_tokens: response.prompt_tokens,
                    response_tokens: response.response_tokens,
                    ids: response.ids,
                });
            }
            let started = Instant::now();
            let decision = plugins
                .protocol
                .decide(&debate.task, turn, &debate.transcript);
            plugin_time += started.elapsed();
            match decision {
                Ok(d) => debate.decisions.push(d),
                Err(e) => fail(debate, &mut active[*i], e)?,
            }
        }
    }
    if silent > 0 {
        tracing::warn!(
            protocol = %crate::plugin::printable(&plugins.protocol.identity().name),
            "the protocol planned no speaker at turn 1 for {silent} of {} tasks: those \
             debates have no answer and count as wrong",
            debates.len()
        );
    }
    for (i, debate) in debates.iter_mut().enumerate() {
        if debate.error.is_some() {
            continue;
        }
        let started = Instant::now();
        let rewards = plugins.shaper.shape(&debate.task, &debate.transcript);
        plugin_time += started.elapsed();
        match rewards {
            Ok(r) => debate.rewards = r,
            Err(e) => fail(debate, &mut active[i], e)?,
        }
    }
    Ok(Rollout {
        debates,
        plugin_time,
        team_time,
    })
}
