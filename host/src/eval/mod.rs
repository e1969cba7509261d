//! Evaluation of finished debates: per-turn majority accuracy (the paper's tie rule),
//! per-agent accuracy per turn, transitions between consecutive turns, invalid-answer rate
//! and response length; printed as a table and written as JSON.
//!
//! A debate that ended early (the protocol planned an empty turn) keeps its last answers for
//! the turns it did not play: the team's answer stands. An agent that has not spoken yet
//! (round-robin) is left out of that turn's per-agent numbers.

mod paired;

pub use paired::{paired, read_debates, Paired, PairedTurn};

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::debate::Debate;
use crate::transcript::Utterance;

/// Counts of one agent's moves between consecutive turns: right->right, wrong->right,
/// right->wrong, wrong->wrong.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transitions {
    pub rr: usize,
    pub wr: usize,
    pub rw: usize,
    pub ww: usize,
}

impl Transitions {
    fn add(&mut self, before: bool, after: bool) {
        match (before, after) {
            (true, true) => self.rr += 1,
            (false, true) => self.wr += 1,
            (true, false) => self.rw += 1,
            (false, false) => self.ww += 1,
        }
    }
}

/// How often something happened when it could: `moved` of `of`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub moved: usize,
    pub of: usize,
}

impl Rate {
    /// `moved / of`, or None when it could not happen.
    pub fn value(&self) -> Option<f64> {
        (self.of > 0).then(|| self.moved as f64 / self.of as f64)
    }

    /// `0.500 (1/2)`, or `-` when it could not happen.
    pub fn cell(&self) -> String {
        match self.value() {
            Some(v) => format!("{v:.3} ({}/{})", self.moved, self.of),
            None => "-".into(),
        }
    }
}

/// The metrics of one turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnMetrics {
    pub turn: u32,
    /// Mean over tasks of the team answer's credit: 1/|tie| when the tie holds the gold
    /// answer, else 0.
    pub majority_accuracy: f64,
    /// Per agent: the fraction of right answers among the tasks where it has spoken.
    pub agent_accuracy: Vec<f64>,
    /// Fraction of this turn's utterances with no valid answer.
    pub invalid_rate: f64,
    /// Mean response length in characters of this turn's utterances.
    pub mean_response_chars: f64,
    /// Moves from the previous turn, summed over agents (absent for turn 1).
    pub transitions: Option<Transitions>,
    /// Agents wrong at the previous turn while a peer was right, and how many of them are
    /// right now: P(wrong→right | wrong, a peer right), collaboration's gain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub corrected_by_peers: Option<Rate>,
    /// Agents right at the previous turn while a peer was wrong, and how many of them are
    /// wrong now: P(right→wrong | right, a peer wrong), collaboration's cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub misled_by_peers: Option<Rate>,
}

/// Everything `maporl eval` reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Debates scored.
    pub tasks: usize,
    /// Debates left out because a plugin failed on them.
    pub dropped: usize,
    pub agents: u32,
    pub turns: Vec<TurnMetrics>,
}

/// Computes the report over debates that all have the same team size and turn budget;
/// debates dropped after a plugin failure are counted but not scored.
pub fn evaluate(all: &[Debate]) -> Report {
    let debates: Vec<&Debate> = all.iter().filter(|d| d.error.is_none()).collect();
    let agents = debates
        .iter()
        .map(|d| d.transcript.agents)
        .max()
        .unwrap_or(0);
    let turns = debates
        .iter()
        .map(|d| d.transcript.turns)
        .max()
        .unwrap_or(0);
    let n = debates.len().max(1) as f64;
    let mut out = Vec::new();
    for turn in 1..=turns {
        let mut majority = 0.0;
        let mut right = vec![0usize; agents as usize];
        let mut spoke = vec![0usize; agents as usize];
        let (mut said, mut invalid, mut chars) = (0usize, 0usize, 0usize);
        let mut transitions = Transitions::default();
        let (mut corrected, mut misled) = (Rate::default(), Rate::default());
        for d in &debates {
            majority += credit(d, turn);
            for u in d.transcript.utterances.iter().filter(|u| u.turn == turn) {
                said += 1;
                invalid += usize::from(u.answer.is_none());
                chars += u.text.chars().count();
            }
            for agent in 0..d.transcript.agents {
                let now = latest(&d.transcript.utterances, agent, turn);
                if let Some(now) = now {
                    spoke[agent as usize] += 1;
                    right[agent as usize] += usize::from(now.correct);
                }
                if turn > 1 {
                    if let (Some(before), Some(now)) =
                        (latest(&d.transcript.utterances, agent, turn - 1), now)
                    {
                        transitions.add(before.correct, now.correct);
                        // The conditional rates count moves: only an agent that spoke at
                        // this turn could have been corrected or misled by it.
                        if now.turn != turn {
                            continue;
                        }
                        let peers: Vec<bool> = (0..d.transcript.agents)
                            .filter(|&p| p != agent)
                            .filter_map(|p| latest(&d.transcript.utterances, p, turn - 1))
                            .map(|u| u.correct)
                            .collect();
                        if !before.correct && peers.iter().any(|&c| c) {
                            corrected.of += 1;
                            corrected.moved += usize::from(now.correct);
                        }
                        if before.correct && peers.iter().any(|&c| !c) {
                            misled.of += 1;
                            misled.moved += usize::from(!now.correct);
                        }
                    }
                }
            }
        }
        out.push(TurnMetrics {
            turn,
            majority_accuracy: majority / n,
            agent_accuracy: right
                .iter()
                .zip(&spoke)
                .map(|(&r, &s)| if s == 0 { 0.0 } else { r as f64 / s as f64 })
                .collect(),
            invalid_rate: if said == 0 {
                0.0
            } else {
                invalid as f64 / said as f64
            },
            mean_response_chars: if said == 0 {
                0.0
            } else {
                chars as f64 / said as f64
            },
            transitions: (turn > 1).then_some(transitions),
            corrected_by_peers: (turn > 1).then_some(corrected),
            misled_by_peers: (turn > 1).then_some(misled),
        });
    }
    Report {
        tasks: debates.len(),
        dropped: all.len() - debates.len(),
        agents,
        turns: out,
    }
}

/// The team answer's credit after `turn`, carrying the last decision past an early stop: 1/n
/// when the decision holds n answers and one of them is right.
///
/// A decided answer is right when the verifier judged it so: when an utterance that gave that
/// answer (as the verifier extracted it), at this turn or, failing that, the latest earlier
/// one, was marked correct. Comparing the answer with the task's raw reference instead would
/// score "Paris" against a reference "paris", or "1234" against a GSM8K "1,234", as wrong
/// while every agent was marked right. An answer nobody gave cannot be judged and earns
/// nothing.
fn credit(d: &Debate, turn: u32) -> f64 {
    let Some(decision) = d
        .decisions
        .get(turn as usize - 1)
        .or_else(|| d.decisions.last())
    else {
        return 0.0;
    };
    let right = |answer: &String| {
        let giving = |u: &&Utterance| u.turn <= turn && u.answer.as_ref() == Some(answer);
        let utterances = &d.transcript.utterances;
        let Some(last) = utterances.iter().filter(giving).map(|u| u.turn).max() else {
            return false;
        };
        utterances
            .iter()
            .filter(giving)
            .any(|u| u.turn == last && u.correct)
    };
    if decision.iter().any(right) {
        1.0 / decision.len() as f64
    } else {
        0.0
    }
}

/// The agent's most recent utterance at or before `turn`.
fn latest(utterances: &[Utterance], agent: u32, turn: u32) -> Option<&Utterance> {
    utterances
        .iter()
        .filter(|u| u.agent == agent && u.turn <= turn)
        .max_by_key(|u| u.turn)
}

impl Report {
    /// The paper's table: one row per metric, one column per turn.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let header: Vec<String> = self
            .turns
            .iter()
            .map(|t| format!("turn {}", t.turn))
            .collect();
        let _ = writeln!(
            s,
            "| {} tasks, {} agents | {} |",
            self.tasks,
            self.agents,
            header.join(" | ")
        );
        let _ = writeln!(s, "|---|{}", "---|".repeat(self.turns.len()));
        let row = |s: &mut String, name: &str, cell: &dyn Fn(&TurnMetrics) -> String| {
            let cells: Vec<String> = self.turns.iter().map(cell).collect();
            let _ = writeln!(s, "| {name} | {} |", cells.join(" | "));
        };
        row(&mut s, "majority accuracy", &|t| {
            format!("{:.3}", t.majority_accuracy)
        });
        for a in 0..self.agents as usize {
            row(&mut s, &format!("agent {a} accuracy"), &|t| {
                format!("{:.3}", t.agent_accuracy[a])
            });
        }
        row(&mut s, "invalid rate", &|t| {
            format!("{:.3}", t.invalid_rate)
        });
        row(&mut s, "mean response chars", &|t| {
            format!("{:.0}", t.mean_response_chars)
        });
        row(
            &mut s,
            "transitions RR/WR/RW/WW",
            &|t| match t.transitions {
                Some(x) => format!("{}/{}/{}/{}", x.rr, x.wr, x.rw, x.ww),
                None => "-".into(),
            },
        );
        row(&mut s, "P(W→R \\| wrong, a peer right)", &|t| {
            t.corrected_by_peers.map_or("-".into(), |r| r.cell())
        });
        row(&mut s, "P(R→W \\| right, a peer wrong)", &|t| {
            t.misled_by_peers.map_or("-".into(), |r| r.cell())
        });
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{Task, Transcript};

    fn u(turn: u32, agent: u32, answer: Option<&str>, reference: &str) -> Utterance {
        Utterance {
            turn,
            agent,
            text: "x".repeat(10 * turn as usize),
            answer: answer.map(Into::into),
            score: 0.0,
            correct: answer == Some(reference),
        }
    }

    fn debate(reference: &str, utterances: Vec<Utterance>, decisions: Vec<Vec<&str>>) -> Debate {
        Debate {
            task: Task {
                id: "t".into(),
                kind: "arith".into(),
                question: "q".into(),
                reference: reference.into(),
                fields: vec![],
            },
            transcript: Transcript {
                agents: 2,
                turns: 3,
                utterances,
            },
            decisions: decisions
                .into_iter()
                .map(|d| d.into_iter().map(String::from).collect())
                .collect(),
            rewards: vec![],
            speeches: vec![],
            error: None,
        }
    }

    #[test]
    fn the_team_answer_is_credited_through_the_verifiers_judgement() {
        // The verifier normalises: "1234" is right for a GSM8K reference "1,234", "paris" for
        // "Paris". The raw reference never appears among the answers.
        let mark = |mut x: Utterance, correct: bool| {
            x.correct = correct;
            x
        };
        let gsm = debate(
            "1,234",
            vec![
                mark(u(1, 0, Some("1234"), ""), true),
                mark(u(1, 1, Some("99"), ""), false),
            ],
            vec![vec!["1234"]],
        );
        let qa = debate(
            "Paris",
            vec![
                mark(u(1, 0, Some("paris"), ""), true),
                mark(u(1, 1, Some("paris"), ""), true),
            ],
            vec![vec!["paris"]],
        );
        // A decided answer nobody gave cannot be judged; a wrong one earns nothing.
        let unjudged = debate(
            "3",
            vec![
                mark(u(1, 0, Some("4"), ""), false),
                mark(u(1, 1, Some("5"), ""), false),
            ],
            vec![vec!["3"]],
        );
        let wrong = debate(
            "3",
            vec![
                mark(u(1, 0, Some("4"), ""), false),
                mark(u(1, 1, None, ""), false),
            ],
            vec![vec!["4"]],
        );
        let r = evaluate(&[gsm, qa, unjudged, wrong]);
        assert_eq!(r.turns[0].majority_accuracy, 0.5);
        // The answer's latest judgement counts: "4" wrong at turn 1, right at turn 2.
        let later = debate(
            "x",
            vec![
                mark(u(1, 0, Some("4"), ""), false),
                mark(u(1, 1, Some("4"), ""), false),
                mark(u(2, 0, Some("4"), ""), true),
                mark(u(2, 1, Some("4"), ""), true),
            ],
            vec![vec!["4"], vec!["4"]],
        );
        let r = evaluate(&[later]);
        assert_eq!(
            r.turns
                .iter()
                .map(|t| t.majority_accuracy)
                .collect::<Vec<_>>(),
            vec![0.0, 1.0, 1.0],
            "the last decision carries past the early stop"
        );
    }

    #[test]
    fn conditional_rates_count_any_peer_of_the_other_kind() {
        // Three agents at turn 1: right, wrong, wrong. Agent 0 has wrong peers (misled if
        // it turns wrong); agents 1 and 2 each have a right peer (corrected if they turn
        // right), although each also has a wrong one.
        let mut d = debate(
            "5",
            vec![
                u(1, 0, Some("5"), "5"),
                u(1, 1, Some("4"), "5"),
                u(1, 2, Some("3"), "5"),
                u(2, 0, Some("4"), "5"),
                u(2, 1, Some("5"), "5"),
                u(2, 2, Some("3"), "5"),
                // Turn 3: only agent 0 speaks (round-robin style). Agents 1 and 2 made no
                // move, so they count in neither rate.
                u(3, 0, Some("5"), "5"),
            ],
            vec![vec!["5"], vec!["4"], vec!["5"]],
        );
        d.transcript.agents = 3;
        d.transcript.turns = 3;
        let r = evaluate(&[d]);
        assert_eq!(
            (r.turns[2].corrected_by_peers, r.turns[2].misled_by_peers),
            (Some(Rate { moved: 1, of: 1 }), Some(Rate::default()))
        );
        assert_eq!(
            r.turns[1].corrected_by_peers,
            Some(Rate { moved: 1, of: 2 })
        );
        assert_eq!(r.turns[1].misled_by_peers, Some(Rate { moved: 1, of: 1 }));
        assert_eq!(r.turns[1].misled_by_peers.unwrap().value(), Some(1.0));
        assert_eq!(Rate::default().value(), None);
    }

    #[test]
    fn majority_ties_transitions_and_early_stop() {
        // Task 1: a tie holding the gold answer at turn 1, then both right; stops after turn 2.
        let d1 = debate(
            "5",
            vec![
                u(1, 0, Some("5"), "5"),
                u(1, 1, Some("4"), "5"),
                u(2, 0, Some("5"), "5"),
                u(2, 1, Some("5"), "5"),
            ],
            vec![vec!["4", "5"], vec!["5"]],
        );
        // Task 2: right then persuaded wrong; one invalid answer.
        let d2 = debate(
            "7",
            vec![
                u(1, 0, Some("7"), "7"),
                u(1, 1, None, "7"),
                u(2, 0, Some("8"), "7"),
                u(2, 1, Some("8"), "7"),
                u(3, 0, Some("8"), "7"),
                u(3, 1, Some("7"), "7"),
            ],
            vec![vec!["7"], vec!["8"], vec!["7", "8"]],
        );
        let r = evaluate(&[d1, d2]);
        assert_eq!(r.turns.len(), 3);
        let acc: Vec<f64> = r.turns.iter().map(|t| t.majority_accuracy).collect();
        assert_eq!(
            acc,
            vec![(0.5 + 1.0) / 2.0, (1.0 + 0.0) / 2.0, (1.0 + 0.5) / 2.0]
        );
        assert_eq!(r.turns[0].agent_accuracy, vec![1.0, 0.0]);
        assert_eq!(r.turns[0].invalid_rate, 0.25);
        assert_eq!(r.turns[0].transitions, None);
        // Turn 1 -> 2: d1 agent0 RR, agent1 WR; d2 agent0 RW, agent1 WW.
        assert_eq!(
            r.turns[1].transitions,
            Some(Transitions {
                rr: 1,
                wr: 1,
                rw: 1,
                ww: 1
            })
        );
        // Turn 2 -> 3: d1 carried (RR, RR); d2 agent0 WW, agent1 WR.
        assert_eq!(
            r.turns[2].transitions,
            Some(Transitions {
                rr: 2,
                wr: 1,
                rw: 0,
                ww: 1
            })
        );
        assert_eq!(r.turns[2].mean_response_chars, 30.0);
        // Conditional rates, turn 1 -> 2: wrong beside a right peer, d1 agent1 (corrected)
        // and d2 agent1 (not); right beside a wrong (or invalid) peer, d1 agent0 (held) and
        // d2 agent0 (misled). Turn 2 -> 3: no agent has a peer of the other kind.
        assert_eq!(r.turns[0].corrected_by_peers, None);
        assert_eq!(
            (r.turns[1].corrected_by_peers, r.turns[1].misled_by_peers),
            (
                Some(Rate { moved: 1, of: 2 }),
                Some(Rate { moved: 1, of: 2 })
            )
        );
        assert_eq!(
            (r.turns[2].corrected_by_peers, r.turns[2].misled_by_peers),
            (Some(Rate::default()), Some(Rate::default()))
        );
        let table = r.table();
        assert!(
            table.contains("| P(W→R \\| wrong, a peer right) | - | 0.500 (1/2) | - |"),
            "{table}"
        );
        assert!(
            table.contains("| majority accuracy | 0.750 | 0.500 | 0.750 |"),
            "{table}"
        );
        assert!(
            table.contains("| transitions RR/WR/RW/WW | - | 1/1/1/1 | 2/1/0/1 |"),
            "{table}"
        );
    }
}
