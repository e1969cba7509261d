//! Round-robin protocol: at turn t only agent (t-1) mod A speaks; it sees the question and
//! everything said before (every earlier utterance, labelled with agent and turn), then the
//! revise instruction. `decide`: majority vote over each agent's most recent answer up to
//! and including the turn ("invalid" never wins a tie).
//!
//! Settings (JSON, all optional):
//! - `show_scores` (bool, false): show each earlier answer's verifier score;
//! - `system` (string, none): a system prompt.

use maporl_plugin::prompts::{
    agent_label, answer_format, concat, first_turn_prompt, message, push_number, render_shown,
    system_message, Shown,
};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::transcript::{check, check_turn, latest};
use maporl_plugin::vote::majority;
use maporl_plugin::{Prompt, Protocol, Role, Task, Transcript};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "round-robin";

/// The instruction after the discussion.
pub const REVISE: &str = "Consider the solutions above, your own earlier ones included. If \
     you believe the latest answer is wrong, give a corrected solution; otherwise confirm it. \
     Avoid merely repeating earlier reasoning, and keep the reasoning short.";

/// The round-robin protocol's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Show each earlier answer's verifier score.
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

/// The agent that speaks at `turn`.
pub fn speaker(turn: u32, agents: u32) -> u32 {
    (turn - 1) % agents
}

/// `plan-turn`: one prompt, for the speaker of the turn.
pub fn plan(
    settings: &Settings,
    task: &Task,
    turn: u32,
    transcript: &Transcript,
) -> Result<Vec<Prompt>, String> {
    check_turn(PLUGIN, turn)?;
    check(PLUGIN, transcript)?;
    let agent = speaker(turn, transcript.agents);
    let mut earlier: Vec<_> = transcript
        .utterances
        .iter()
        .filter(|u| u.turn < turn)
        .collect();
    earlier.sort_by_key(|u| (u.turn, u.agent));
    let question = first_turn_prompt(task);
    let content = if earlier.is_empty() {
        question
    } else {
        let shown: Vec<Shown<'_>> = earlier
            .iter()
            .map(|u| Shown {
                label: {
                    let mut label = agent_label(u.agent);
                    label.push_str(if u.agent == agent {
                        " (you, turn "
                    } else {
                        " (turn "
                    });
                    push_number(&mut label, u.turn);
                    label.push(')');
                    label
                },
                text: &u.text,
                score: settings.show_scores.then_some(u.score),
            })
            .collect();
        concat(&[
            &question,
            "\n\nThe discussion so far:\n\n",
            &render_shown(&shown),
            "\n\n",
            REVISE,
            "\n",
            answer_format(task),
        ])
    };
    let mut messages: Vec<_> = system_message(settings.system.as_deref())
        .into_iter()
        .collect();
    messages.push(message(Role::User, content));
    Ok(vec![Prompt { agent, messages }])
}

/// `decide`: majority vote over every agent's most recent answer up to `turn`.
pub fn decide(turn: u32, transcript: &Transcript) -> Result<Vec<String>, String> {
    check_turn(PLUGIN, turn)?;
    check(PLUGIN, transcript)?;
    Ok(majority(
        (0..transcript.agents)
            .filter_map(|a| latest(transcript, a, turn))
            .map(|u| u.answer.as_deref()),
    ))
}

/// The round-robin protocol.
pub struct RoundRobin {
    settings: Settings,
}

impl Protocol for RoundRobin {
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
        decide(turn, transcript)
    }
}

maporl_plugin::export_protocol!(RoundRobin);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{task, transcript, utt};

    fn q() -> Task {
        task("arith", "3*4?", "12")
    }

    #[test]
    fn speakers_rotate() {
        assert_eq!(
            (1..=7).map(|t| speaker(t, 3)).collect::<Vec<_>>(),
            vec![0, 1, 2, 0, 1, 2, 0]
        );
    }

    #[test]
    fn first_turn_is_the_plain_question() {
        let planned = plan(&Settings::default(), &q(), 1, &transcript(3, 4, vec![])).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].agent, 0);
        assert_eq!(planned[0].messages.len(), 1);
        assert_eq!(planned[0].messages[0].content, first_turn_prompt(&q()));
    }

    #[test]
    fn later_turns_see_everything_said_before() {
        let tr = transcript(
            2,
            4,
            vec![
                utt(1, 0, "first \\boxed{12}", Some("12"), 0.9),
                utt(2, 1, "second \\boxed{13}", Some("13"), 0.1),
            ],
        );
        let s = Settings {
            show_scores: true,
            system: Some("sys".into()),
        };
        let planned = plan(&s, &q(), 3, &tr).unwrap();
        assert_eq!(planned.len(), 1);
        assert_eq!(planned[0].agent, 0);
        let m = &planned[0].messages;
        assert_eq!(m[0].role, Role::System);
        let text = &m[1].content;
        assert!(text.starts_with("Question: 3*4?\n"), "{text}");
        assert!(
            text.contains("Agent 1 (you, turn 1): first \\boxed{12}\nReward: 0.900"),
            "{text}"
        );
        assert!(
            text.contains("Agent 2 (turn 2): second \\boxed{13}\nReward: 0.100"),
            "{text}"
        );
        assert!(text.find("Agent 1 (you").unwrap() < text.find("Agent 2 (turn 2)").unwrap());
        assert!(text.contains(REVISE));
        assert!(text.ends_with("where N is an integer."));
        // The whole message, as the `format!` that used to build it wrote it.
        let note = |score: &str, verdict: &str| {
            format!(
                "Reward: {score} out of 1.0, which means the verifier thinks this answer is \
                 likely {verdict}."
            )
        };
        assert_eq!(
            *text,
            format!(
                "{}\n\nThe discussion so far:\n\nAgent 1 (you, turn 1): first \\boxed{{12}}\n{}\
                 \n\nAgent 2 (turn 2): second \\boxed{{13}}\n{}\n\n{REVISE}\n{}",
                first_turn_prompt(&q()),
                note("0.900", "correct"),
                note("0.100", "incorrect"),
                answer_format(&q())
            )
        );

        let planned = plan(&Settings::default(), &q(), 2, &tr).unwrap();
        let text = &planned[0].messages[0].content;
        assert_eq!(planned[0].agent, 1);
        // Only what was said before turn 2.
        assert!(
            text.contains("Agent 1 (turn 1): first") && !text.contains("second"),
            "{text}"
        );
        assert!(!text.contains("Reward:"));
    }

    #[test]
    fn decide_uses_each_agents_latest_answer() {
        let tr = transcript(
            3,
            6,
            vec![
                utt(1, 0, "", Some("5"), 0.0),
                utt(2, 1, "", Some("6"), 0.0),
                utt(3, 2, "", Some("6"), 0.0),
                utt(4, 0, "", Some("6"), 0.0),
                utt(5, 1, "", None, 0.0),
            ],
        );
        assert_eq!(decide(1, &tr).unwrap(), vec!["5"]);
        assert_eq!(decide(2, &tr).unwrap(), vec!["5", "6"]);
        assert_eq!(decide(3, &tr).unwrap(), vec!["6"]);
        assert_eq!(decide(4, &tr).unwrap(), vec!["6"]);
        // Agent 1's latest is now invalid: 6 (agents 0 and 2) still wins.
        assert_eq!(decide(5, &tr).unwrap(), vec!["6"]);
        assert!(decide(1, &transcript(2, 2, vec![])).unwrap().is_empty());
    }

    #[test]
    fn settings() {
        assert_eq!(Settings::parse("{}").unwrap(), Settings::default());
        let e = Settings::parse(r#"{"early_stop": true}"#).unwrap_err();
        assert_eq!(
            e,
            "round-robin: unknown setting `early_stop`; known: show_scores, system"
        );
    }
}
