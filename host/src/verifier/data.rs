//! The verifier's training data: answers sampled from a model, labelled right or wrong by a
//! verifier plugin (so extraction rules are the plugins'), balanced per question, as JSONL.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::debate::{Debate, Request, Team};
use crate::plugin::{Protocol, Verifier};
use crate::transcript::{Task, Transcript};

/// One labelled answer: a line of the JSONL file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub task_id: String,
    /// The question as the verifier sees it (the task's `question`, as `judge` receives it).
    pub question: String,
    pub response: String,
    /// Whether the response's answer matches the reference.
    pub correct: bool,
    /// The answer the labelling verifier extracted; `None`: no valid answer.
    #[serde(default)]
    pub answer: Option<String>,
    #[serde(default)]
    pub reference: String,
}

/// Samples `n` answers per task: the protocol's turn-1 conversation for agent 0, answered
/// `n` times by the team's agent 0, each labelled by `verifier`. Every task's answers are
/// generated in one batch.
pub fn sample_answers(
    protocol: &mut Protocol,
    verifier: &mut Verifier,
    team: &mut dyn Team,
    tasks: &[Task],
    n: usize,
    agents: u32,
    turns: u32,
) -> anyhow::Result<Vec<Sample>> {
    let mut conversations = Vec::with_capacity(tasks.len());
    for task in tasks {
        let plan = protocol.plan_turn(task, 1, &Transcript::new(agents, turns))?;
        let Some(prompt) = plan.into_iter().next() else {
            bail!(
                "task `{}`: the protocol plans no turn-1 prompt to sample answers with",
                task.id
            );
        };
        conversations.push((task.id.as_str(), prompt.agent, prompt.messages));
    }
    let requests: Vec<Request<'_>> = conversations
        .iter()
        .flat_map(|(task, agent, messages)| {
            std::iter::repeat_n(
                Request {
                    task,
                    agent: *agent,
                    messages: messages.as_slice(),
                },
                n,
            )
        })
        .collect();
    let responses = team.respond(1, &requests)?;
    let mut out = Vec::with_capacity(responses.len());
    for (task, said) in tasks.iter().zip(responses.chunks(n)) {
        let texts: Vec<String> = said.iter().map(|r| r.text.clone()).collect();
        let verdicts = verifier.score(task, &texts)?;
        for (text, v) in texts.into_iter().zip(verdicts) {
            out.push(Sample {
                task_id: task.id.clone(),
                question: task.question.clone(),
                response: text,
                correct: v.correct,
                answer: v.answer,
                reference: task.reference.clone(),
            });
        }
    }
    Ok(out)
}

/// Labelled answers from whole debates: every utterance (every agent, every turn) of
/// `rounds` (each round one debate per task, in task order), up to `n` per task in the
/// order they were said, labelled with the verifier's judgement of that utterance. A
/// debate dropped for a plugin error gives none.
pub fn answers_from_debates(rounds: &[Vec<Debate>], n: usize) -> Vec<Sample> {
    let mut per_task: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for debate in rounds.iter().flatten() {
        if debate.error.is_some() {
            continue;
        }
        let task = &debate.task;
        let taken = per_task.entry(task.id.as_str()).or_insert_with(|| {
            order.push(task.id.as_str());
            Vec::new()
        });
        for u in &debate.transcript.utterances {
            if taken.len() == n {
                break;
            }
            taken.push(Sample {
                task_id: task.id.clone(),
                question: task.question.clone(),
                response: u.text.clone(),
                correct: u.correct,
                answer: u.answer.clone(),
                reference: task.reference.clone(),
            });
        }
    }
    order
        .into_iter()
        .flat_map(|id| per_task.remove(id).unwrap_or_default())
        .collect()
}

/// What [`balance`] kept and dropped.
#[derive(Debug, Default, PartialEq)]
pub struct Balance {
    pub kept_questions: usize,
    /// Questions with fewer than k right or k wrong answers.
    pub dropped_questions: usize,
}

/// Keeps, per question (in first-seen order), `k` right and `k` wrong answers drawn at
/// random (seeded), dropping questions that have fewer than `k` of either.
pub fn balance(samples: Vec<Sample>, k: usize, seed: u64) -> (Vec<Sample>, Balance) {
    let mut order: Vec<String> = Vec::new();
    let mut by_task: BTreeMap<String, (Vec<Sample>, Vec<Sample>)> = BTreeMap::new();
    for s in samples {
        let entry = by_task.entry(s.task_id.clone()).or_insert_with(|| {
            order.push(s.task_id.clone());
            (Vec::new(), Vec::new())
        });
        if s.correct {
            entry.0.push(s);
        } else {
            entry.1.push(s);
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut stats = Balance::default();
    for id in order {
        let (mut right, mut wrong) = by_task.remove(&id).expect("every id has an entry");
        if right.len() < k || wrong.len() < k {
            stats.dropped_questions += 1;
            continue;
        }
        stats.kept_questions += 1;
        right.shuffle(&mut rng);
        wrong.shuffle(&mut rng);
        // Alternate right and wrong, so that any prefix of the file stays balanced.
        for (r, w) in right.into_iter().zip(wrong).take(k) {
            out.push(r);
            out.push(w);
        }
    }
    (out, stats)
}

/// Writes samples as JSONL, atomically.
pub fn write_jsonl(path: &Path, samples: &[Sample]) -> anyhow::Result<()> {
    let mut text = Vec::new();
    for s in samples {
        serde_json::to_writer(&mut text, s)?;
        text.push(b'\n');
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    crate::files::write_atomic(path, &text)
}

/// Reads samples from JSONL; errors name the file and line.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<Sample>> {
    let text = crate::files::read_regular_text(path, crate::files::DATASET_MAX, "verifier data")?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let s: Sample = serde_json::from_str(line).with_context(|| {
            format!(
                "{}:{}: not a verifier sample (task_id, question, response, correct)",
                path.display(),
                i + 1
            )
        })?;
        out.push(s);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(task: &str, i: usize, correct: bool) -> Sample {
        Sample {
            task_id: task.into(),
            question: format!("q{task}"),
            response: format!("r{i}"),
            correct,
            answer: None,
            reference: String::new(),
        }
    }

    fn debate(id: &str, round: usize, error: bool) -> Debate {
        let utterances = (0..4u32)
            .map(|k| crate::transcript::Utterance {
                turn: k / 2 + 1,
                agent: k % 2,
                text: format!("{id} round {round} utterance {k}"),
                answer: Some(k.to_string()),
                score: 0.0,
                correct: k % 2 == 1,
            })
            .collect();
        Debate {
            task: Task {
                id: id.into(),
                kind: "arith".into(),
                question: format!("q{id}"),
                reference: "1".into(),
                fields: vec![],
            },
            transcript: Transcript {
                agents: 2,
                turns: 2,
                utterances,
            },
            speeches: vec![],
            decisions: vec![],
            rewards: vec![],
            error: error.then(|| "plugin failed".to_string()),
        }
    }

    #[test]
    fn every_turn_of_every_round_gives_answers_up_to_n_per_task() {
        let rounds = vec![
            vec![debate("a", 1, false), debate("b", 1, true)],
            vec![debate("a", 2, false), debate("b", 2, false)],
        ];
        let got = answers_from_debates(&rounds, 6);
        let of = |id: &str| -> Vec<&Sample> { got.iter().filter(|x| x.task_id == id).collect() };
        // a: all four of round 1 (both turns, both agents), then two of round 2.
        let a: Vec<&str> = of("a").iter().map(|x| x.response.as_str()).collect();
        assert_eq!(a.len(), 6);
        assert_eq!(a[0], "a round 1 utterance 0");
        assert_eq!(a[3], "a round 1 utterance 3");
        assert_eq!(a[5], "a round 2 utterance 1");
        // b's first debate failed: only round 2's four.
        assert_eq!(of("b").len(), 4);
        assert!(of("b").iter().all(|x| x.response.contains("round 2")));
        // Labels and answers are the verifier's, per utterance; tasks stay in order.
        assert!(got
            .iter()
            .all(|x| x.correct == x.answer.as_deref().is_some_and(|a| a == "1" || a == "3")));
        assert_eq!(got[0].task_id, "a");
        assert_eq!(got[6].task_id, "b");
        assert_eq!(got[0].question, "qa");
    }

    #[test]
    fn balance_keeps_k_of_each_class_and_drops_what_cannot_be_balanced() {
        let mut all = Vec::new();
        // a: 3 right, 5 wrong; b: 1 right, 7 wrong (dropped for k = 2); c: 2 and 2.
        for i in 0..8 {
            all.push(s("a", i, i < 3));
            all.push(s("b", i, i < 1));
        }
        for i in 0..4 {
            all.push(s("c", i, i % 2 == 0));
        }
        let (kept, stats) = balance(all, 2, 7);
        assert_eq!(
            stats,
            Balance {
                kept_questions: 2,
                dropped_questions: 1
            }
        );
        for task in ["a", "c"] {
            let of: Vec<&Sample> = kept.iter().filter(|x| x.task_id == task).collect();
            assert_eq!(of.len(), 4, "{task}");
            assert_eq!(of.iter().filter(|x| x.correct).count(), 2, "{task}");
        }
        assert!(kept.iter().all(|x| x.task_id != "b"));
        // No answer twice.
        let mut seen: Vec<(&str, &str)> = kept
            .iter()
            .map(|x| (x.task_id.as_str(), x.response.as_str()))
            .collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), kept.len());
    }

    #[test]
    fn jsonl_round_trip_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.jsonl");
        let samples = vec![s("a", 0, true), s("a", 1, false)];
        write_jsonl(&path, &samples).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), samples);
        std::fs::write(&path, "{\"task_id\": \"a\"}\n").unwrap();
        let err = format!("{:#}", read_jsonl(&path).unwrap_err());
        assert!(err.contains("v.jsonl:1"), "{err}");
    }
}
