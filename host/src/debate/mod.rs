//! The rollout engine: drives a protocol plugin, a team of agents and a verifier through a
//! debate over a batch of tasks, then asks the reward shaper for the rewards.
//!
//! The engine batches across tasks: at each turn it collects every task's plan, asks the
//! team for all responses at once (so a model can generate them in one batch), scores each
//! task's responses in one verifier call, and asks the protocol for the team's answer.

mod scripted;

pub use scripted::ScriptedTeam;

use serde::{Deserialize, Serialize};

use crate::plugin::{Protocol, RewardShaper, Verifier};
use crate::transcript::{ChatMessage, Reward, Task, Transcript, Utterance};

/// Whoever produces the agents' responses: LLM agents, or a scripted stand-in.
pub trait Team {
    /// One response per request, in order. Each request is an agent index and the
    /// conversation that agent sees.
    fn respond(&mut self, requests: &[(u32, &[ChatMessage])]) -> anyhow::Result<Vec<String>>;
}

/// The three plugins a debate runs with.
pub struct Plugins {
    pub protocol: Protocol,
    pub verifier: Verifier,
    pub shaper: RewardShaper,
}

/// One finished debate.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Debate {
    pub task: Task,
    pub transcript: Transcript,
    /// The team's answer(s) after each turn that was played (index 0 is turn 1).
    pub decisions: Vec<Vec<String>>,
    pub rewards: Vec<Reward>,
}

/// Runs one debate per task with `agents` agents over at most `turns` turns.
pub fn run(
    plugins: &mut Plugins,
    team: &mut dyn Team,
    tasks: &[Task],
    agents: u32,
    turns: u32,
) -> anyhow::Result<Vec<Debate>> {
    let mut debates: Vec<Debate> = tasks
        .iter()
        .map(|task| Debate {
            task: task.clone(),
            transcript: Transcript::new(agents, turns),
            decisions: Vec::new(),
            rewards: Vec::new(),
        })
        .collect();
    let mut active: Vec<bool> = vec![true; debates.len()];
    for turn in 1..=turns {
        // Plan every active debate's turn.
        let mut plans = Vec::new();
        for (i, debate) in debates.iter().enumerate() {
            if !active[i] {
                continue;
            }
            let plan = plugins
                .protocol
                .plan_turn(&debate.task, turn, &debate.transcript)?;
            if plan.is_empty() {
                active[i] = false;
            } else {
                plans.push((i, plan));
            }
        }
        if plans.is_empty() {
            break;
        }
        // One batch of responses for the whole turn.
        let requests: Vec<(u32, &[ChatMessage])> = plans
            .iter()
            .flat_map(|(_, plan)| plan.iter().map(|p| (p.agent, p.messages.as_slice())))
            .collect();
        let responses = team.respond(&requests)?;
        anyhow::ensure!(
            responses.len() == requests.len(),
            "the team gave {} responses to {} requests",
            responses.len(),
            requests.len()
        );
        let mut responses = responses.into_iter();
        for (i, plan) in &plans {
            let texts: Vec<String> = responses.by_ref().take(plan.len()).collect();
            let debate = &mut debates[*i];
            let verdicts = plugins.verifier.score(&debate.task, &texts)?;
            for ((prompt, text), verdict) in plan.iter().zip(texts).zip(verdicts) {
                debate.transcript.utterances.push(Utterance {
                    turn,
                    agent: prompt.agent,
                    text,
                    answer: verdict.answer,
                    score: verdict.score,
                    correct: verdict.correct,
                });
            }
            let decision = plugins
                .protocol
                .decide(&debate.task, turn, &debate.transcript)?;
            debate.decisions.push(decision);
        }
    }
    for debate in &mut debates {
        debate.rewards = plugins.shaper.shape(&debate.task, &debate.transcript)?;
    }
    Ok(debates)
}
