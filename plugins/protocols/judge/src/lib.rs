//! Judge protocol: turns 1..T-1 the debaters (every agent but the judge) debate as in the
//! paper's debate while the judge stays silent; at turn T (the run's `turns`) only the judge
//! speaks: it sees the question and every debater's latest answer and gives the final
//! answer. `decide`: before T, majority vote over the debaters ("invalid" never wins a tie);
//! at T, the judge's answer (none when it is invalid). Needs T >= 2 and at least 2 agents.
//!
//! Settings (JSON, all optional):
//! - `judge` (u32, last agent): the judge's agent index;
//! - `peers` (u32, all): show each debater at most this many other debaters;
//! - `show_scores` (bool, false): show verifier scores next to shown answers (the judge's
//!   view included);
//! - `system` (string, none): a system prompt for every agent.

use maporl_plugin::prompts::{
    agent_label, answer_format, concat, debate_messages, message, question_block, render_shown,
    system_message, DebateView, Shown,
};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::transcript::{at_turn, check, check_turn, find, latest};
use maporl_plugin::vote::majority;
use maporl_plugin::{Prompt, Protocol, Role, Task, Transcript};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "judge";

/// What the judge is asked to do.
pub const JUDGE_INSTRUCTION: &str = "You are the judge. Weigh the agents' reasoning, decide \
     which answer is right (or work out the right one if none is), and give the final \
     answer. Keep the reasoning short.";

/// The judge protocol's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// The judge's agent index (the last agent when unset).
    pub judge: Option<u32>,
    /// Show each debater at most this many other debaters (all when unset).
    pub peers: Option<u32>,
    /// Show verifier scores next to shown answers.
    pub show_scores: bool,
    /// The system prompt (none when unset).
    pub system: Option<String>,
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// The team's roles for one transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct Roles {
    /// The judge's agent index.
    pub judge: u32,
    /// Every other agent, in order.
    pub debaters: Vec<u32>,
    /// The judge's turn (the run's `turns`).
    pub last_turn: u32,
}

/// Validates the judge index and the debate's shape against the transcript.
pub fn roles(settings: &Settings, transcript: &Transcript) -> Result<Roles, String> {
    check(PLUGIN, transcript)?;
    let agents = transcript.agents;
    if agents < 2 {
        return Err(format!(
            "{PLUGIN}: needs at least 2 agents (debaters and a judge); the team has {agents}"
        ));
    }
    if transcript.turns < 2 {
        return Err(format!(
            "{PLUGIN}: needs at least 2 turns (debate turns, then the judge's turn); the run \
             has turns = {}",
            transcript.turns
        ));
    }
    let judge = settings.judge.unwrap_or(agents - 1);
    if judge >= agents {
        return Err(format!(
            "{PLUGIN}: setting `judge` = {judge} is out of range: the team has {agents} agents \
             (0..{})",
            agents - 1
        ));
    }
    Ok(Roles {
        judge,
        debaters: (0..agents).filter(|a| *a != judge).collect(),
        last_turn: transcript.turns,
    })
}

/// `plan-turn`: the debaters before the last turn, the judge alone at the last turn.
pub fn plan(
    settings: &Settings,
    task: &Task,
    turn: u32,
    transcript: &Transcript,
) -> Result<Vec<Prompt>, String> {
    check_turn(PLUGIN, turn)?;
    let roles = roles(settings, transcript)?;
    if turn > roles.last_turn {
        return Ok(Vec::new());
    }
    if turn < roles.last_turn {
        let view = DebateView {
            participants: &roles.debaters,
            peers: settings.peers,
            show_scores: settings.show_scores,
            system: settings.system.as_deref(),
        };
        return roles
            .debaters
            .iter()
            .map(|&agent| {
                Ok(Prompt {
                    agent,
                    messages: debate_messages(PLUGIN, task, transcript, agent, turn, view)?,
                })
            })
            .collect();
    }
    let shown: Vec<Shown<'_>> = roles
        .debaters
        .iter()
        .filter_map(|&a| latest(transcript, a, turn - 1))
        .map(|u| Shown {
            label: agent_label(u.agent),
            text: &u.text,
            score: settings.show_scores.then_some(u.score),
        })
        .collect();
    if shown.is_empty() {
        return Err(format!(
            "{PLUGIN}: task `{}`: no debater has spoken before the judge's turn {turn}",
            task.id
        ));
    }
    let content = concat(&[
        &question_block(task),
        "\n\nThe other agents debated this question. Their latest answers:\n\n",
        &render_shown(&shown),
        "\n\n",
        JUDGE_INSTRUCTION,
        "\n",
        answer_format(task),
    ]);
    let mut messages: Vec<_> = system_message(settings.system.as_deref())
        .into_iter()
        .collect();
    messages.push(message(Role::User, content));
    Ok(vec![Prompt {
        agent: roles.judge,
        messages,
    }])
}

/// `decide`: debaters' majority before the last turn, the judge's answer at it.
pub fn decide(
    settings: &Settings,
    turn: u32,
    transcript: &Transcript,
) -> Result<Vec<String>, String> {
    check_turn(PLUGIN, turn)?;
    let roles = roles(settings, transcript)?;
    if turn < roles.last_turn {
        return Ok(majority(
            at_turn(transcript, turn)
                .filter(|u| u.agent != roles.judge)
                .map(|u| u.answer.as_deref()),
        ));
    }
    let verdict = find(transcript, roles.last_turn, roles.judge).ok_or_else(|| {
        format!(
            "{PLUGIN}: the judge (agent {}) has no utterance at its turn {}",
            roles.judge, roles.last_turn
        )
    })?;
    Ok(verdict.answer.iter().cloned().collect())
}

/// The judge protocol.
pub struct Judge {
    settings: Settings,
}

impl Protocol for Judge {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        Ok(Self { settings })
    }

    fn plan_turn(
        &self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<Prompt>, String> {
        plan(&self.settings, task, turn, transcript)
    }

    fn decide(
        &self,
        _task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<String>, String> {
        decide(&self.settings, turn, transcript)
    }
}

maporl_plugin::export_protocol!(Judge);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{task, transcript, utt};

    fn debate() -> Transcript {
        transcript(
            3,
            3,
            vec![
                utt(1, 0, "a1 \\boxed{4}", Some("4"), 0.9),
                utt(1, 1, "b1 \\boxed{5}", Some("5"), 0.2),
                utt(2, 0, "a2 \\boxed{4}", Some("4"), 0.9),
                utt(2, 1, "b2 \\boxed{4}", Some("4"), 0.8),
            ],
        )
    }

    fn q() -> Task {
        task("gsm8k", "2+2?", "4")
    }

    #[test]
    fn debaters_debate_then_the_judge_speaks_alone() {
        let s = Settings::default();
        let t1 = plan(&s, &q(), 1, &transcript(3, 3, vec![])).unwrap();
        assert_eq!(t1.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1]);
        let t2 = plan(&s, &q(), 2, &debate()).unwrap();
        assert_eq!(t2.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1]);
        let last = &t2[0].messages.last().unwrap().content;
        assert!(
            last.contains("Agent 2: b1") && !last.contains("Agent 3"),
            "{last}"
        );

        let t3 = plan(&s, &q(), 3, &debate()).unwrap();
        assert_eq!(t3.len(), 1);
        assert_eq!(t3[0].agent, 2);
        let text = &t3[0].messages[0].content;
        assert!(
            text.starts_with("Question: 2+2?\n\nThe other agents debated"),
            "{text}"
        );
        assert!(
            text.contains("Agent 1: a2 \\boxed{4}\n\nAgent 2: b2 \\boxed{4}"),
            "{text}"
        );
        assert!(!text.contains("a1") && !text.contains("Reward:"));
        assert!(text.contains(JUDGE_INSTRUCTION));
        assert!(text.ends_with("where N is an integer."));
        // The whole message, as the `format!` that used to build it wrote it.
        assert_eq!(
            *text,
            format!(
                "Question: 2+2?\n\nThe other agents debated this question. Their latest \
                 answers:\n\nAgent 1: a2 \\boxed{{4}}\n\nAgent 2: b2 \\boxed{{4}}\n\n\
                 {JUDGE_INSTRUCTION}\n{}",
                answer_format(&q())
            )
        );
        assert!(plan(&s, &q(), 4, &debate()).unwrap().is_empty());
    }

    #[test]
    fn the_judge_can_be_any_agent() {
        let s = Settings {
            judge: Some(0),
            show_scores: true,
            ..Settings::default()
        };
        let tr = transcript(
            3,
            2,
            vec![
                utt(1, 1, "b1", Some("4"), 0.9),
                utt(1, 2, "c1", Some("5"), 0.25),
            ],
        );
        let t1 = plan(&s, &q(), 1, &transcript(3, 2, vec![])).unwrap();
        assert_eq!(t1.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![1, 2]);
        let t2 = plan(&s, &q(), 2, &tr).unwrap();
        assert_eq!(t2[0].agent, 0);
        let text = &t2[0].messages[0].content;
        assert!(text.contains("Agent 3: c1\nReward: 0.250"), "{text}");
    }

    #[test]
    fn decide_follows_the_roles() {
        let s = Settings::default();
        let mut tr = debate();
        assert_eq!(decide(&s, 1, &tr).unwrap(), vec!["4", "5"]);
        assert_eq!(decide(&s, 2, &tr).unwrap(), vec!["4"]);
        let e = decide(&s, 3, &tr).unwrap_err();
        assert!(
            e.contains("the judge (agent 2) has no utterance at its turn 3"),
            "{e}"
        );
        tr.utterances
            .push(utt(3, 2, "judge says 5", Some("5"), 0.0));
        assert_eq!(decide(&s, 3, &tr).unwrap(), vec!["5"]);
        tr.utterances.pop();
        tr.utterances.push(utt(3, 2, "judge rambles", None, 0.0));
        assert!(decide(&s, 3, &tr).unwrap().is_empty());
    }

    #[test]
    fn shape_errors() {
        let e = plan(
            &Settings {
                judge: Some(3),
                ..Settings::default()
            },
            &q(),
            1,
            &transcript(3, 3, vec![]),
        )
        .unwrap_err();
        assert_eq!(
            e,
            "judge: setting `judge` = 3 is out of range: the team has 3 agents (0..2)"
        );
        let e = plan(&Settings::default(), &q(), 1, &transcript(3, 1, vec![])).unwrap_err();
        assert!(e.contains("needs at least 2 turns"), "{e}");
        let e = plan(&Settings::default(), &q(), 1, &transcript(1, 3, vec![])).unwrap_err();
        assert!(e.contains("needs at least 2 agents"), "{e}");
        let e = plan(&Settings::default(), &q(), 3, &transcript(3, 3, vec![])).unwrap_err();
        assert!(e.contains("no debater has spoken"), "{e}");
    }

    #[test]
    fn settings() {
        let s = Settings::parse(r#"{"judge": 0, "peers": 1}"#).unwrap();
        assert_eq!(s.judge, Some(0));
        let e = Settings::parse(r#"{"judge": "last"}"#).unwrap_err();
        assert!(
            e.starts_with("judge: setting `judge` = \"last\": invalid type"),
            "{e}"
        );
    }
}
