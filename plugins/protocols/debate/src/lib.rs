//! The paper's debate protocol (MAPoRL §1).
//!
//! Turn 1: every agent answers the question independently. Turn t >= 2: every agent sees its
//! own history as a chat and, in the last user message, the other agents' turn t-1 answers
//! and the revise instruction, then answers again. `decide`: majority vote over the turn's
//! answers ("invalid" never wins a tie).
//!
//! Settings (JSON, all optional):
//! - `show_scores` (bool, false): show each peer answer's verifier score;
//! - `early_stop` (bool, false): end the debate when every agent gave the same valid answer
//!   at the previous turn;
//! - `peers` (u32, all): show at most this many other agents, cyclically from agent a+1;
//! - `echo` (bool, false): a control with no peer information in the debate's own format:
//!   every answer shown as a peer's is the agent's own answer of that turn (its text, answer
//!   and score), so the prompts look as in a debate but say nothing the agent did not say;
//! - `system` (string, none): a system prompt.

use maporl_plugin::prompts::{debate_messages, DebateView};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::transcript::{at_turn, check, check_turn, find};
use maporl_plugin::vote::majority;
use maporl_plugin::{Prompt, Protocol, Task, Transcript};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "debate";

/// The debate's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Show each peer answer's verifier score ("Reward: 0.734 out of 1.0, ...").
    pub show_scores: bool,
    /// End the debate (an empty plan) when all agents agree on a valid answer.
    pub early_stop: bool,
    /// Show at most this many other agents (all when unset).
    pub peers: Option<u32>,
    /// Show the agent's own answer wherever a peer's would be shown.
    pub echo: bool,
    /// The system prompt (none when unset).
    pub system: Option<String>,
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// Whether every agent gave the same valid answer at `turn`.
pub fn all_agree(transcript: &Transcript, turn: u32) -> bool {
    let answers: Vec<Option<&str>> = (0..transcript.agents)
        .map(|a| find(transcript, turn, a).and_then(|u| u.answer.as_deref()))
        .collect();
    answers.iter().all(Option::is_some) && answers.windows(2).all(|w| w[0] == w[1])
}

/// `plan-turn`: every agent speaks; see the crate docs.
pub fn plan(
    settings: &Settings,
    task: &Task,
    turn: u32,
    transcript: &Transcript,
) -> Result<Vec<Prompt>, String> {
    check_turn(PLUGIN, turn)?;
    check(PLUGIN, transcript)?;
    if turn >= 2 && settings.early_stop && all_agree(transcript, turn - 1) {
        return Ok(Vec::new());
    }
    let participants: Vec<u32> = (0..transcript.agents).collect();
    let view = DebateView {
        participants: &participants,
        peers: settings.peers,
        show_scores: settings.show_scores,
        system: settings.system.as_deref(),
    };
    participants
        .iter()
        .map(|&agent| {
            let messages = if settings.echo && turn >= 2 {
                let echoed = echo(transcript, agent);
                debate_messages(PLUGIN, task, &echoed, agent, turn, view)?
            } else {
                debate_messages(PLUGIN, task, transcript, agent, turn, view)?
            };
            Ok(Prompt { agent, messages })
        })
        .collect()
}

/// The transcript as `agent` sees it under `echo`: every other agent's utterance of a turn
/// says what `agent` said at that turn (text, answer, score); a turn `agent` did not speak
/// at keeps the others' utterances as they were.
pub fn echo(transcript: &Transcript, agent: u32) -> Transcript {
    let mut out = transcript.clone();
    for u in out.utterances.iter_mut().filter(|u| u.agent != agent) {
        if let Some(own) = find(transcript, u.turn, agent) {
            u.text = own.text.clone();
            u.answer = own.answer.clone();
            u.score = own.score;
        }
    }
    out
}

/// `decide`: majority vote over the answers given at `turn`.
pub fn decide(turn: u32, transcript: &Transcript) -> Result<Vec<String>, String> {
    check_turn(PLUGIN, turn)?;
    check(PLUGIN, transcript)?;
    Ok(majority(
        at_turn(transcript, turn).map(|u| u.answer.as_deref()),
    ))
}

/// The debate protocol.
pub struct Debate {
    settings: Settings,
}

impl Protocol for Debate {
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

maporl_plugin::export_protocol!(Debate);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{task, transcript, utt};
    use maporl_plugin::Role;

    fn gsm() -> Task {
        task("gsm8k", "What is 2+2?", "4")
    }

    fn three_agents_two_turns() -> Transcript {
        transcript(
            3,
            3,
            vec![
                utt(1, 0, "zero-1 \\boxed{4}", Some("4"), 0.9),
                utt(1, 1, "one-1 \\boxed{5}", Some("5"), 0.2),
                utt(1, 2, "two-1 \\boxed{4}", Some("4"), 0.734),
                utt(2, 0, "zero-2", Some("4"), 0.9),
                utt(2, 1, "one-2", Some("4"), 0.8),
                utt(2, 2, "two-2", Some("4"), 0.7),
            ],
        )
    }

    #[test]
    fn turn_one_everyone_gets_the_question() {
        let s = Settings::default();
        let planned = plan(&s, &gsm(), 1, &transcript(3, 3, vec![])).unwrap();
        assert_eq!(
            planned.iter().map(|p| p.agent).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        for p in &planned {
            assert_eq!(p.messages.len(), 1);
            assert_eq!(p.messages[0].role, Role::User);
            assert!(p.messages[0]
                .content
                .starts_with("Question: What is 2+2?\n"));
        }
        let s = Settings {
            system: Some("You are a careful solver.".into()),
            ..Settings::default()
        };
        let planned = plan(&s, &gsm(), 1, &transcript(2, 3, vec![])).unwrap();
        assert_eq!(planned[0].messages[0].role, Role::System);
        assert_eq!(planned[0].messages[0].content, "You are a careful solver.");
    }

    #[test]
    fn later_turns_show_own_history_and_the_others_previous_answers() {
        let planned = plan(&Settings::default(), &gsm(), 3, &three_agents_two_turns()).unwrap();
        assert_eq!(planned.len(), 3);
        let m = &planned[1].messages;
        let roles: Vec<Role> = m.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            vec![
                Role::User,
                Role::Assistant,
                Role::User,
                Role::Assistant,
                Role::User
            ]
        );
        assert_eq!(m[1].content, "one-1 \\boxed{5}");
        assert_eq!(m[3].content, "one-2");
        // Follow-up before turn 2: agent 1 sees agents 2 and 0 (cyclic from a+1), at turn 1.
        assert!(m[2]
            .content
            .contains("Agent 3: two-1 \\boxed{4}\n\nAgent 1: zero-1"));
        assert!(!m[2].content.contains("one-1"));
        // Final message: turn-2 answers, the instruction and the question again.
        let last = &m[4].content;
        assert!(last.contains("Agent 3: two-2\n\nAgent 1: zero-2"), "{last}");
        assert!(last.contains("If you believe your previous answer was wrong, revise it"));
        assert!(last.contains("keep the reasoning short"));
        assert!(last.ends_with("where N is an integer."));
        assert!(last.contains("Question: What is 2+2?"));
        assert!(!last.contains("Reward:"));
    }

    #[test]
    fn peers_limits_the_others_shown() {
        let s = Settings {
            peers: Some(1),
            ..Settings::default()
        };
        let planned = plan(&s, &gsm(), 2, &three_agents_two_turns()).unwrap();
        let shown = |a: usize| planned[a].messages.last().unwrap().content.clone();
        assert!(shown(0).contains("Agent 2: one-1") && !shown(0).contains("Agent 3"));
        assert!(shown(1).contains("Agent 3: two-1") && !shown(1).contains("Agent 1:"));
        assert!(shown(2).contains("Agent 1: zero-1") && !shown(2).contains("Agent 2"));

        let alone = Settings {
            peers: Some(0),
            ..Settings::default()
        };
        let planned = plan(&alone, &gsm(), 2, &three_agents_two_turns()).unwrap();
        let text = &planned[0].messages.last().unwrap().content;
        assert!(
            text.starts_with("Consider your previous solution. If you believe"),
            "{text}"
        );
    }

    #[test]
    fn echo_shows_the_agents_own_answers_where_peers_would_be() {
        let s = Settings {
            echo: true,
            ..Settings::default()
        };
        let planned = plan(&s, &gsm(), 3, &three_agents_two_turns()).unwrap();
        let m = &planned[1].messages;
        // Agent 1's follow-up before turn 2 shows "agents 3 and 1" saying its own turn-1
        // answer, and its last message its own turn-2 answer, in the debate's format.
        assert!(m[2]
            .content
            .contains("Agent 3: one-1 \\boxed{5}\n\nAgent 1: one-1 \\boxed{5}"));
        assert!(!m[2].content.contains("zero-1") && !m[2].content.contains("two-1"));
        let last = &m[4].content;
        assert!(last.contains("Agent 3: one-2\n\nAgent 1: one-2"), "{last}");
        assert!(
            !last.contains("zero-2") && !last.contains("two-2"),
            "{last}"
        );
        // The prompts are the debate's: the same as with real peers who said the same.
        let echoed = echo(&three_agents_two_turns(), 1);
        let as_debate = plan(&Settings::default(), &gsm(), 3, &echoed).unwrap();
        assert_eq!(as_debate[1].messages, planned[1].messages);
        // Turn 1 is unchanged.
        let first = plan(&s, &gsm(), 1, &transcript(3, 3, vec![])).unwrap();
        let plain = plan(&Settings::default(), &gsm(), 1, &transcript(3, 3, vec![])).unwrap();
        assert_eq!(first, plain);
    }

    #[test]
    fn show_scores_adds_the_reward_note() {
        let s = Settings {
            show_scores: true,
            ..Settings::default()
        };
        let planned = plan(&s, &gsm(), 2, &three_agents_two_turns()).unwrap();
        let text = &planned[0].messages.last().unwrap().content;
        assert!(text.contains(
            "Agent 2: one-1 \\boxed{5}\nReward: 0.200 out of 1.0, which means the verifier thinks this answer is likely incorrect."
        ), "{text}");
        assert!(text.contains(
            "Agent 3: two-1 \\boxed{4}\nReward: 0.734 out of 1.0, which means the verifier thinks this answer is likely correct."
        ), "{text}");
    }

    #[test]
    fn early_stop_ends_the_debate_when_all_agree() {
        let tr = three_agents_two_turns();
        let on = Settings {
            early_stop: true,
            ..Settings::default()
        };
        // Turn 2 answers all "4": stop before turn 3.
        assert!(plan(&on, &gsm(), 3, &tr).unwrap().is_empty());
        // Turn 1 answers differ: go on.
        assert_eq!(plan(&on, &gsm(), 2, &tr).unwrap().len(), 3);
        // Off by default.
        assert_eq!(plan(&Settings::default(), &gsm(), 3, &tr).unwrap().len(), 3);
        // All invalid is no agreement.
        let none = transcript(
            2,
            3,
            vec![utt(1, 0, "", None, 0.0), utt(1, 1, "", None, 0.0)],
        );
        assert_eq!(plan(&on, &gsm(), 2, &none).unwrap().len(), 2);
        // A missing agent is no agreement either.
        let one = transcript(2, 3, vec![utt(1, 0, "", Some("4"), 0.0)]);
        assert!(!all_agree(&one, 1));
    }

    #[test]
    fn decide_uses_the_tie_rule() {
        let tr = transcript(
            4,
            3,
            vec![
                utt(1, 0, "", Some("7"), 0.0),
                utt(1, 1, "", None, 0.0),
                utt(1, 2, "", Some("3"), 0.0),
                utt(1, 3, "", None, 0.0),
                utt(2, 0, "", Some("7"), 0.0),
                utt(2, 1, "", None, 0.0),
                utt(2, 2, "", Some("3"), 0.0),
                utt(2, 3, "", Some("3"), 0.0),
            ],
        );
        // Turn 1: invalid has 2 votes, 7 and 3 one each -> no answer.
        assert!(decide(1, &tr).unwrap().is_empty());
        assert_eq!(decide(2, &tr).unwrap(), vec!["3"]);
        assert!(decide(3, &tr).unwrap().is_empty());
        let tie = transcript(
            2,
            3,
            vec![
                utt(1, 0, "", Some("9"), 0.0),
                utt(1, 1, "", Some("10"), 0.0),
            ],
        );
        assert_eq!(decide(1, &tie).unwrap(), vec!["10", "9"]);
    }

    #[test]
    fn inconsistent_input_is_refused() {
        let s = Settings::default();
        assert!(plan(&s, &gsm(), 0, &transcript(2, 3, vec![])).is_err());
        let missing = transcript(2, 3, vec![utt(1, 1, "x", None, 0.0)]);
        let e = plan(&s, &gsm(), 2, &missing).unwrap_err();
        assert!(e.contains("agent 0 has no utterance at turn 1"), "{e}");
    }

    #[test]
    fn settings() {
        assert_eq!(Settings::parse("{}").unwrap(), Settings::default());
        let s = Settings::parse(r#"{"show_scores":true,"early_stop":true,"peers":2,"system":"x"}"#)
            .unwrap();
        assert!(s.show_scores && s.early_stop);
        assert_eq!(s.peers, Some(2));
        let e = Settings::parse(r#"{"peerz": 1}"#).unwrap_err();
        assert_eq!(
            e,
            "debate: unknown setting `peerz` (did you mean `peers`?); known: show_scores, early_stop, peers, echo, system"
        );
    }
}
