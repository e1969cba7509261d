//! Two evaluations of the same tasks compared task by task: per turn, the difference in the
//! team's accuracy (the second minus the first) with a bootstrap 95% confidence interval
//! over tasks. With paired draws (`ModelTeam::pair_draws`) the two share their sampling
//! noise, so what differs is the weights; pairing removes the between-task variance that
//! two independent accuracies would each carry.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::{credit, latest};
use crate::debate::Debate;

/// One turn's paired difference.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PairedTurn {
    pub turn: u32,
    /// Mean over tasks of the team answer's credit, in each evaluation.
    pub first: f64,
    pub second: f64,
    /// `second - first`, and its bootstrap 95% interval (2.5th and 97.5th percentiles).
    pub difference: f64,
    pub low: f64,
    pub high: f64,
    /// The same for the mean over agents of each agent's accuracy.
    pub agent_difference: f64,
    pub agent_low: f64,
    pub agent_high: f64,
}

/// The comparison of two evaluations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Paired {
    /// Tasks scored in both (matched by id); the others are left out.
    pub tasks: usize,
    pub resamples: usize,
    pub turns: Vec<PairedTurn>,
}

/// Compares `first` and `second` task by task (by id; a debate a plugin dropped, or a task
/// only one of them has, is left out), with `resamples` bootstrap resamples of the tasks
/// drawn from a stream seeded by `seed`.
pub fn paired(
    first: &[Debate],
    second: &[Debate],
    resamples: usize,
    seed: u64,
) -> anyhow::Result<Paired> {
    let index = |ds: &[Debate]| -> anyhow::Result<BTreeMap<String, Debate>> {
        let mut out = BTreeMap::new();
        for d in ds.iter().filter(|d| d.error.is_none()) {
            if out.insert(d.task.id.clone(), d.clone()).is_some() {
                bail!(
                    "task `{}` is debated twice in one evaluation",
                    crate::plugin::printable(&d.task.id)
                );
            }
        }
        Ok(out)
    };
    let (a, b) = (index(first)?, index(second)?);
    let both: Vec<(&Debate, &Debate)> = a
        .iter()
        .filter_map(|(id, x)| b.get(id).map(|y| (x, y)))
        .collect();
    if both.is_empty() {
        bail!("the two evaluations share no scored task");
    }
    let turns = both
        .iter()
        .map(|(x, y)| x.transcript.turns.min(y.transcript.turns))
        .min()
        .unwrap_or(0);
    let n = both.len();
    // The same resampled task sets for every turn and both measures: each interval draws
    // them afresh from the same seed (memory O(tasks + resamples), not their product).
    let draws = Resamples { seed, resamples };
    let mut out = Vec::new();
    for turn in 1..=turns {
        let team: Vec<(f64, f64)> = both
            .iter()
            .map(|(x, y)| (credit(x, turn), credit(y, turn)))
            .collect();
        let agents: Vec<(f64, f64)> = both
            .iter()
            .map(|(x, y)| (agent_mean(x, turn), agent_mean(y, turn)))
            .collect();
        let (first, second) = means(&team);
        let (low, high) = interval(&team, &draws);
        let (af, as_) = means(&agents);
        let (agent_low, agent_high) = interval(&agents, &draws);
        out.push(PairedTurn {
            turn,
            first,
            second,
            difference: second - first,
            low,
            high,
            agent_difference: as_ - af,
            agent_low,
            agent_high,
        });
    }
    Ok(Paired {
        tasks: n,
        resamples,
        turns: out,
    })
}

/// The fraction of a debate's agents that are right after `turn` (their latest answer),
/// over the agents that have spoken by then, as `eval`'s per-agent accuracy counts them.
fn agent_mean(d: &Debate, turn: u32) -> f64 {
    let latest: Vec<bool> = (0..d.transcript.agents)
        .filter_map(|a| latest(&d.transcript.utterances, a, turn).map(|u| u.correct))
        .collect();
    if latest.is_empty() {
        return 0.0;
    }
    latest.iter().filter(|&&c| c).count() as f64 / latest.len() as f64
}

fn means(pairs: &[(f64, f64)]) -> (f64, f64) {
    let n = pairs.len().max(1) as f64;
    (
        pairs.iter().map(|p| p.0).sum::<f64>() / n,
        pairs.iter().map(|p| p.1).sum::<f64>() / n,
    )
}

/// Bootstrap resamples of the tasks, drawn from a stream seeded by `seed`.
struct Resamples {
    seed: u64,
    resamples: usize,
}

/// The 2.5th and 97.5th percentiles of the mean paired difference over the resamples.
fn interval(pairs: &[(f64, f64)], draws: &Resamples) -> (f64, f64) {
    if draws.resamples == 0 || pairs.is_empty() {
        let (a, b) = means(pairs);
        return (b - a, b - a);
    }
    let n = pairs.len();
    let mut rng = ChaCha8Rng::seed_from_u64(draws.seed);
    let mut stats: Vec<f64> = (0..draws.resamples)
        .map(|_| {
            (0..n)
                .map(|_| {
                    let i = rng.random_range(0..n);
                    pairs[i].1 - pairs[i].0
                })
                .sum::<f64>()
                / n as f64
        })
        .collect();
    stats.sort_by(f64::total_cmp);
    let at = |q: f64| stats[((q * stats.len() as f64) as usize).min(stats.len() - 1)];
    (at(0.025), at(0.975))
}

impl Paired {
    /// One row per turn: both accuracies, the difference and its interval.
    pub fn table(&self, first: &str, second: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "paired over {} tasks ({} bootstrap resamples; 95% intervals):",
            self.tasks, self.resamples
        );
        let _ = writeln!(
            s,
            "| turn | majority, {first} | majority, {second} | difference [95% CI] | agents' mean difference [95% CI] |"
        );
        let _ = writeln!(s, "|---|---|---|---|---|");
        for t in &self.turns {
            let _ = writeln!(
                s,
                "| {} | {:.3} | {:.3} | {:+.3} [{:+.3}, {:+.3}] | {:+.3} [{:+.3}, {:+.3}] |",
                t.turn,
                t.first,
                t.second,
                t.difference,
                t.low,
                t.high,
                t.agent_difference,
                t.agent_low,
                t.agent_high
            );
        }
        s
    }
}

/// The debates of a transcripts file (`transcripts*.jsonl`), naming the file and line of
/// anything that is not a debate record.
pub fn read_debates(path: &Path) -> anyhow::Result<Vec<Debate>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .with_context(|| format!("{} line {}: not a debate record", path.display(), i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{Task, Transcript, Utterance};

    fn debate(id: &str, right: &[[bool; 2]]) -> Debate {
        let mut utterances = Vec::new();
        let mut decisions = Vec::new();
        for (t, agents) in right.iter().enumerate() {
            for (a, &r) in agents.iter().enumerate() {
                utterances.push(Utterance {
                    turn: t as u32 + 1,
                    agent: a as u32,
                    text: String::new(),
                    answer: Some(if r { "4" } else { "5" }.into()),
                    score: 0.0,
                    correct: r,
                });
            }
            // Agent 0 decides.
            decisions.push(vec![if agents[0] { "4" } else { "5" }.to_string()]);
        }
        Debate {
            task: Task {
                id: id.into(),
                kind: "arith".into(),
                question: "2+2".into(),
                reference: "4".into(),
                fields: vec![],
            },
            transcript: Transcript {
                agents: 2,
                turns: right.len() as u32,
                utterances,
            },
            speeches: vec![],
            decisions,
            rewards: vec![],
            error: None,
        }
    }

    #[test]
    fn differences_are_paired_by_task_and_intervals_cover_them() {
        // 40 tasks: the second evaluation fixes turn 2 on 10 of them and breaks it on 2.
        let mut first = Vec::new();
        let mut second = Vec::new();
        for i in 0..40 {
            let id = format!("t{i}");
            let base = i % 2 == 0;
            first.push(debate(&id, &[[base, false], [base, base]]));
            let t2 = if i % 4 == 1 && i < 40 {
                true
            } else if i == 0 || i == 2 {
                false
            } else {
                base
            };
            second.push(debate(&id, &[[base, false], [t2, t2]]));
        }
        // Order does not matter, and a task only one side has is left out.
        second.reverse();
        second.push(debate("extra", &[[true, true], [true, true]]));
        let p = paired(&first, &second, 2000, 7).unwrap();
        assert_eq!(p.tasks, 40);
        assert_eq!(p.turns.len(), 2);
        let t1 = &p.turns[0];
        assert_eq!((t1.difference, t1.low, t1.high), (0.0, 0.0, 0.0));
        let t2 = &p.turns[1];
        assert!((t2.difference - 8.0 / 40.0).abs() < 1e-12, "{t2:?}");
        assert!(t2.low < t2.difference && t2.difference < t2.high, "{t2:?}");
        assert!(t2.low > 0.0, "10 fixed against 2 broken is clear: {t2:?}");
        // Agents' mean: both agents move together here.
        assert!((t2.agent_difference - 8.0 / 40.0).abs() < 1e-12);
        // Same seed, same interval; the table shows it.
        assert_eq!(paired(&first, &second, 2000, 7).unwrap(), p);
        assert!(p.table("before", "after").contains("+0.200"));
        // Nothing shared, or a task twice, is refused.
        assert!(paired(&first, &[debate("x", &[[true, true]])], 10, 0).is_err());
        let twice = [first[0].clone(), first[0].clone()];
        assert!(paired(&twice, &second, 10, 0)
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }
}
