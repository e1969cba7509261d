//! Look-ups and consistency checks on a transcript.

use crate::{Transcript, Utterance};

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
    let repeat = first_repeat(&transcript.utterances);
    for (i, u) in transcript.utterances.iter().enumerate() {
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
        if repeat == Some(i) {
            return Err(format!(
                "{plugin}: the transcript has two utterances of agent {} at turn {}",
                u.agent, u.turn
            ));
        }
    }
    Ok(())
}

/// The index of the first utterance whose (turn, agent) an earlier one has. Every call
/// checks, and in wasm an allocation costs more than comparing a few dozen pairs: short
/// transcripts (every debate so far) are compared pair by pair in place, longer ones by
/// sorted keys (one allocation, no set).
fn first_repeat(utterances: &[Utterance]) -> Option<usize> {
    const COMPARED_IN_PLACE: usize = 24;
    if utterances.len() <= COMPARED_IN_PLACE {
        return (1..utterances.len()).find(|&i| {
            let key = (utterances[i].turn, utterances[i].agent);
            utterances[..i].iter().any(|e| (e.turn, e.agent) == key)
        });
    }
    let mut keys: Vec<(u32, u32, usize)> = utterances
        .iter()
        .enumerate()
        .map(|(i, u)| (u.turn, u.agent, i))
        .collect();
    keys.sort_unstable();
    keys.windows(2)
        .filter(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))
        .map(|w| w[1].2)
        .min()
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

    /// The check as it was written with a set, the reference for the one with sorted keys.
    fn check_with_a_set(plugin: &str, t: &Transcript) -> Result<(), String> {
        if t.agents == 0 {
            return check(plugin, t);
        }
        let mut seen = std::collections::BTreeSet::new();
        for u in &t.utterances {
            if u.turn == 0 || u.agent >= t.agents {
                let alone = transcript(t.agents, t.turns, vec![u.clone()]);
                return check(plugin, &alone);
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

    /// Random transcripts, many with repeats, turn 0 or agents out of range (and several of
    /// these at once): the same verdict and the same first error as the set.
    #[test]
    fn the_check_finds_the_first_problem_as_the_set_did() {
        let mut rng = crate::testing::Xorshift::new(0x853c_49e6_748f_ea9b);
        let mut next = move |n: u64| rng.below(n) as u32;
        let mut failing = 0;
        for _ in 0..5_000 {
            let agents = next(4);
            let utterances = (0..next(12))
                .map(|_| utt(next(4), next(5), "", None, 0.0))
                .collect();
            let t = transcript(agents, 3, utterances);
            let expected = check_with_a_set("x", &t);
            failing += usize::from(expected.is_err());
            assert_eq!(check("x", &t), expected, "{t:?}");
        }
        assert!(
            (1_000..4_900).contains(&failing),
            "{failing} of 5,000 failed"
        );
        // Longer transcripts, most past the pairwise comparison: the sorted keys, the same
        // answers.
        let mut failing = 0;
        for _ in 0..2_000 {
            let utterances = (0..20 + next(40))
                .map(|_| utt(1 + next(40), next(8), "", None, 0.0))
                .collect();
            let t = transcript(8, 40, utterances);
            let expected = check_with_a_set("x", &t);
            failing += usize::from(expected.is_err());
            assert_eq!(check("x", &t), expected, "{t:?}");
        }
        assert!((200..1_900).contains(&failing), "{failing} of 2,000 failed");
    }
}
