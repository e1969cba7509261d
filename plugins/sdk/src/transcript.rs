//! Look-ups and consistency checks on a transcript.

use crate::{Transcript, Utterance};
use std::collections::BTreeSet;

/// The utterance of `agent` at `turn`, if any.
pub fn find(transcript: &Transcript, turn: u32, agent: u32) -> Option<&Utterance> {
    transcript
        .utterances
        .iter()
        .find(|u| u.turn == turn && u.agent == agent)
}

/// The utterances of one turn, in transcript order.
pub fn at_turn(transcript: &Transcript, turn: u32) -> impl Iterator<Item = &Utterance> {
    transcript.utterances.iter().filter(move |u| u.turn == turn)
}

/// The last turn anyone spoke at (`None` for an empty transcript).
pub fn last_turn(transcript: &Transcript) -> Option<u32> {
    transcript.utterances.iter().map(|u| u.turn).max()
}

/// The most recent utterance of `agent` at or before `turn`.
pub fn latest(transcript: &Transcript, agent: u32, turn: u32) -> Option<&Utterance> {
    transcript
        .utterances
        .iter()
        .filter(|u| u.agent == agent && u.turn <= turn)
        .max_by_key(|u| u.turn)
}

/// The mean score of the utterances at `turn` (`None` when nobody spoke then).
pub fn mean_score(transcript: &Transcript, turn: u32) -> Option<f64> {
    let (sum, n) = at_turn(transcript, turn).fold((0.0f64, 0usize), |(s, n), u| {
        (s + f64::from(u.score), n + 1)
    });
    (n > 0).then(|| sum / n as f64)
}

/// Checks what the host promises: at least one agent, turns from 1, agents below
/// `transcript.agents`, at most one utterance per (turn, agent). Errors name the plugin.
pub fn check(plugin: &str, transcript: &Transcript) -> Result<(), String> {
    if transcript.agents == 0 {
        return Err(format!(
            "{plugin}: the transcript has no agents (agents = 0)"
        ));
    }
    let mut seen = BTreeSet::new();
    for u in &transcript.utterances {
        if u.turn == 0 {
            return Err(format!(
                "{plugin}: the transcript has an utterance of agent {} at turn 0; turns are 1-based",
                u.agent
            ));
        }
        if u.agent >= transcript.agents {
            return Err(format!(
                "{plugin}: the transcript has an utterance of agent {} at turn {}, but the team has {} agents (0..{})",
                u.agent,
                u.turn,
                transcript.agents,
                transcript.agents - 1
            ));
        }
        if !seen.insert((u.turn, u.agent)) {
            return Err(format!(
                "{plugin}: the transcript has two utterances of agent {} at turn {}",
                u.agent, u.turn
            ));
        }
    }
    Ok(())
}

/// Checks a 1-based turn number passed to `plan-turn` / `decide`.
pub fn check_turn(plugin: &str, turn: u32) -> Result<(), String> {
    if turn == 0 {
        Err(format!("{plugin}: turns are 1-based, got turn 0"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{transcript, utt};

    #[test]
    fn lookups() {
        let t = transcript(
            2,
            3,
            vec![
                utt(1, 0, "a", Some("1"), 0.0),
                utt(1, 1, "b", None, 0.0),
                utt(2, 1, "c", Some("2"), 1.0),
            ],
        );
        assert_eq!(find(&t, 1, 1).unwrap().text, "b");
        assert!(find(&t, 2, 0).is_none());
        assert_eq!(at_turn(&t, 1).count(), 2);
        assert_eq!(last_turn(&t), Some(2));
        assert_eq!(latest(&t, 0, 3).unwrap().text, "a");
        assert_eq!(latest(&t, 1, 3).unwrap().text, "c");
        assert_eq!(latest(&t, 1, 1).unwrap().text, "b");
        assert_eq!(mean_score(&t, 1), Some(0.0));
        assert_eq!(mean_score(&t, 2), Some(1.0));
        assert_eq!(mean_score(&t, 3), None);
        assert!(check("x", &t).is_ok());
    }

    #[test]
    fn checks() {
        let dup = transcript(
            2,
            3,
            vec![utt(1, 0, "a", None, 0.0), utt(1, 0, "b", None, 0.0)],
        );
        assert_eq!(
            check("x", &dup).unwrap_err(),
            "x: the transcript has two utterances of agent 0 at turn 1"
        );
        let out = transcript(2, 3, vec![utt(1, 2, "a", None, 0.0)]);
        assert!(check("x", &out)
            .unwrap_err()
            .contains("team has 2 agents (0..1)"));
        let zero = transcript(2, 3, vec![utt(0, 0, "a", None, 0.0)]);
        assert!(check("x", &zero).unwrap_err().contains("turn 0"));
        assert!(check("x", &transcript(0, 3, vec![])).is_err());
        assert!(check_turn("x", 0).is_err());
        assert!(check_turn("x", 1).is_ok());
    }
}
