//! A scripted stand-in for LLM agents, for demos and tests of the debate machinery: it
//! answers arithmetic questions right with a fixed probability per agent, and at later turns
//! may adopt the answer most of its peers gave. It is not a model and learns nothing.

use std::collections::HashMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{Request, Response, Team};
use crate::transcript::{ChatMessage, Role, Task};

/// Scripted agents that know each task's reference answer and get it right with a
/// per-agent probability.
pub struct ScriptedTeam {
    /// Question text -> reference answer (an integer).
    answers: HashMap<String, i64>,
    /// Per agent: probability of a right answer at turn 1.
    skill: Vec<f64>,
    persuasion: Persuasion,
    rng: ChaCha8Rng,
}

/// How the scripted agents follow their peers at later turns: the probability of adopting
/// the peers' majority answer when it differs from one's own, when that majority is right
/// and when it is wrong. Equal rates (`From<f64>`) make agents that follow a peer whether
/// or not it is right; a higher `to_right` makes agents that check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Persuasion {
    pub to_right: f64,
    pub to_wrong: f64,
}

impl From<f64> for Persuasion {
    fn from(p: f64) -> Self {
        Persuasion {
            to_right: p,
            to_wrong: p,
        }
    }
}

impl ScriptedTeam {
    /// `skill[a]` is agent a's chance of a right first answer.
    pub fn new(
        tasks: &[Task],
        skill: Vec<f64>,
        persuasion: impl Into<Persuasion>,
        seed: u64,
    ) -> Self {
        let answers = tasks
            .iter()
            .filter_map(|t| Some((t.question.clone(), t.reference.trim().parse().ok()?)))
            .collect();
        ScriptedTeam {
            answers,
            skill,
            persuasion: persuasion.into(),
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    fn respond_one(&mut self, agent: u32, messages: &[ChatMessage]) -> String {
        let Some((question, reference)) = self
            .answers
            .iter()
            .find(|(q, _)| messages.iter().any(|m| m.content.contains(q.as_str())))
            .map(|(q, r)| (q.clone(), *r))
        else {
            return "I do not know this question.".to_string();
        };
        let own_history: Vec<i64> = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .filter_map(|m| last_boxed_integer(&m.content))
            .collect();
        let skill = self.skill.get(agent as usize).copied().unwrap_or(0.5);
        let answer = match own_history.last() {
            None => {
                if self.rng.random_bool(skill.clamp(0.0, 1.0)) {
                    reference
                } else {
                    reference
                        + self.rng.random_range(1..=9)
                            * if self.rng.random_bool(0.5) { 1 } else { -1 }
                }
            }
            Some(&previous) => {
                // Peers' answers are in the last user message.
                let peers = messages
                    .iter()
                    .rev()
                    .find(|m| m.role == Role::User)
                    .map(|m| all_boxed_integers(&m.content))
                    .unwrap_or_default();
                let majority = majority(&peers);
                let rate = |m: i64| {
                    let Persuasion { to_right, to_wrong } = self.persuasion;
                    if m == reference {
                        to_right
                    } else {
                        to_wrong
                    }
                };
                match majority {
                    Some(m) if m != previous && self.rng.random_bool(rate(m).clamp(0.0, 1.0)) => m,
                    _ => previous,
                }
            }
        };
        worked_answer(&question, answer)
    }
}

/// How the scripted agents answer `question` with `answer`: for "What is a + b?" the
/// digit-by-digit working ("71 + 47: 1 + 7 = 8, 7 + 4 = 11, so 118."), for "What is a - b?"
/// the same with borrows ("83 - 47: 13 - 7 = 6, 8 - 1 - 4 = 3, so 36."), then the boxed
/// answer. The working is right even when `answer` is not (a slip at the end).
pub fn worked_answer(question: &str, answer: i64) -> String {
    let first = question.lines().next().unwrap_or_default().trim();
    let expr = first
        .strip_prefix("What is ")
        .and_then(|q| q.strip_suffix('?'));
    match expr {
        Some(expr) => match column_sums(expr).or_else(|| column_differences(expr)) {
            Some(steps) => format!("{expr}: {steps}, so {answer}.\nAnswer: \\boxed{{{answer}}}"),
            None => format!("{expr} = {answer}\nAnswer: \\boxed{{{answer}}}"),
        },
        None => format!("I get {answer}.\nAnswer: \\boxed{{{answer}}}"),
    }
}

impl Team for ScriptedTeam {
    fn respond(&mut self, _turn: u32, requests: &[Request<'_>]) -> anyhow::Result<Vec<Response>> {
        // Token counts are word counts: there is no tokenizer here.
        let words = |s: &str| s.split_whitespace().count();
        Ok(requests
            .iter()
            .map(
                |&Request {
                     agent, messages, ..
                 }| {
                    let text = self.respond_one(agent, messages);
                    Response {
                        prompt_tokens: messages.iter().map(|m| words(&m.content)).sum(),
                        response_tokens: words(&text),
                        text,
                        ids: Default::default(),
                    }
                },
            )
            .collect())
    }
}

/// The digit-by-digit working of "a + b" for two numbers below 100: "8 + 5 = 13, 8 + 5 + 1
/// = 14" for 88 + 55 (units, then tens with the carry). `None` for other expressions.
fn column_sums(expr: &str) -> Option<String> {
    let (a, b) = expr.split_once(" + ")?;
    let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    if a >= 100 || b >= 100 {
        return None;
    }
    let units = a % 10 + b % 10;
    let carry = if units >= 10 { " + 1" } else { "" };
    let tens = a / 10 + b / 10 + units / 10;
    Some(format!(
        "{} + {} = {units}, {} + {}{carry} = {tens}",
        a % 10,
        b % 10,
        a / 10,
        b / 10
    ))
}

/// The digit-by-digit working of "a - b" for a ≥ b, both below 100: "13 - 7 = 6, 8 - 1 - 4
/// = 3" for 83 - 47 (units, borrowing when needed, then tens). `None` for other expressions.
fn column_differences(expr: &str) -> Option<String> {
    let (a, b) = expr.split_once(" - ")?;
    let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    if a >= 100 || b > a {
        return None;
    }
    let (au, bu) = (a % 10, b % 10);
    let borrow = au < bu;
    let units = if borrow {
        format!("1{au} - {bu} = {}", 10 + au - bu)
    } else {
        format!("{au} - {bu} = {}", au - bu)
    };
    let tens = a / 10 - b / 10 - u32::from(borrow);
    let less = if borrow { " - 1" } else { "" };
    Some(format!("{units}, {}{less} - {} = {tens}", a / 10, b / 10))
}

fn all_boxed_integers(text: &str) -> Vec<i64> {
    text.match_indices("\\boxed{")
        .filter_map(|(i, m)| {
            let rest = &text[i + m.len()..];
            rest[..rest.find('}')?].trim().parse().ok()
        })
        .collect()
}

fn last_boxed_integer(text: &str) -> Option<i64> {
    all_boxed_integers(text).last().copied()
}

fn majority(values: &[i64]) -> Option<i64> {
    let mut counts: Vec<(i64, usize)> = Vec::new();
    for &v in values {
        match counts.iter_mut().find(|(x, _)| *x == v) {
            Some((_, n)) => *n += 1,
            None => counts.push((v, 1)),
        }
    }
    let best = counts.iter().map(|(_, n)| *n).max()?;
    let top: Vec<i64> = counts
        .iter()
        .filter(|(_, n)| *n == best)
        .map(|(v, _)| *v)
        .collect();
    (top.len() == 1).then(|| top[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_boxed_answers_and_majorities() {
        assert_eq!(
            all_boxed_integers("a \\boxed{3} b \\boxed{ -4 } \\boxed{x}"),
            vec![3, -4]
        );
        assert_eq!(last_boxed_integer("none"), None);
        assert_eq!(majority(&[1, 2, 2]), Some(2));
        assert_eq!(majority(&[1, 2]), None);
        assert_eq!(majority(&[]), None);
    }

    #[test]
    fn column_sums_work_digit_by_digit_with_the_carry() {
        assert_eq!(
            column_sums("88 + 55").as_deref(),
            Some("8 + 5 = 13, 8 + 5 + 1 = 14")
        );
        assert_eq!(
            column_sums("71 + 7").as_deref(),
            Some("1 + 7 = 8, 7 + 0 = 7")
        );
        assert_eq!(column_sums("3 * 4 + 5"), None);
        assert_eq!(
            column_differences("83 - 47").as_deref(),
            Some("13 - 7 = 6, 8 - 1 - 4 = 3")
        );
        assert_eq!(
            column_differences("58 - 23").as_deref(),
            Some("8 - 3 = 5, 5 - 2 = 3")
        );
        assert_eq!(
            column_differences("7 - 7").as_deref(),
            Some("7 - 7 = 0, 0 - 0 = 0")
        );
        assert_eq!(column_differences("23 - 58"), None);
        assert_eq!(
            worked_answer("What is 83 - 47?", 35),
            "83 - 47: 13 - 7 = 6, 8 - 1 - 4 = 3, so 35.\nAnswer: \\boxed{35}",
            "a slip after right working"
        );
        // Every difference's working ends at its answer.
        for a in 0..100u32 {
            for b in 0..=a {
                let w = column_differences(&format!("{a} - {b}")).unwrap();
                let tens: u32 = w.rsplit(" = ").next().unwrap().parse().unwrap();
                let units: u32 = w
                    .split(", ")
                    .next()
                    .unwrap()
                    .rsplit(" = ")
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(tens * 10 + units, a - b, "{a} - {b}: {w}");
            }
        }
        assert_eq!(column_sums("120 + 4"), None);
    }

    #[test]
    fn a_perfect_agent_answers_right_and_is_deterministic() {
        let task = Task {
            id: "t".into(),
            kind: "arith".into(),
            question: "What is 2 + 3?".into(),
            reference: "5".into(),
            fields: vec![],
        };
        let msgs = [ChatMessage {
            role: Role::User,
            content: "Question: What is 2 + 3?".into(),
        }];
        let mut team = ScriptedTeam::new(std::slice::from_ref(&task), vec![1.0, 0.0], 0.5, 7);
        let ask = |agent| Request {
            task: "t",
            agent,
            messages: &msgs,
        };
        let out = team.respond(1, &[ask(0), ask(1)]).unwrap();
        assert_eq!(last_boxed_integer(&out[0].text), Some(5));
        assert_ne!(last_boxed_integer(&out[1].text), Some(5));
        assert_eq!(
            out[0].prompt_tokens, 6,
            "words of \"Question: What is 2 + 3?\""
        );
        let mut again = ScriptedTeam::new(&[task], vec![1.0, 0.0], 0.5, 7);
        assert_eq!(again.respond(1, &[ask(0), ask(1)]).unwrap(), out);
    }

    /// Agents that check: with `to_right` 1 and `to_wrong` 0 an agent adopts a right peer
    /// majority every time and a wrong one never; with equal rates (the old behaviour) it
    /// follows a wrong majority as often as a right one.
    #[test]
    fn discerning_agents_adopt_right_peers_and_keep_against_wrong_ones() {
        let task = Task {
            id: "t".into(),
            kind: "arith".into(),
            question: "What is 20 + 30?".into(),
            reference: "50".into(),
            fields: vec![],
        };
        // Agent 0 said `own` at turn 1; its peers now say `peer` (twice: a majority).
        let later = |own: i64, peer: i64| {
            vec![
                ChatMessage {
                    role: Role::User,
                    content: "Question: What is 20 + 30?".into(),
                },
                ChatMessage {
                    role: Role::Assistant,
                    content: format!("\\boxed{{{own}}}"),
                },
                ChatMessage {
                    role: Role::User,
                    content: format!("Peers: \\boxed{{{peer}}} and \\boxed{{{peer}}}"),
                },
            ]
        };
        let adopted = |persuasion: Persuasion, own: i64, peer: i64| -> usize {
            let mut team = ScriptedTeam::new(std::slice::from_ref(&task), vec![0.5], persuasion, 3);
            let msgs = later(own, peer);
            (0..400)
                .filter(|_| {
                    let out = team
                        .respond(
                            2,
                            &[Request {
                                task: "t",
                                agent: 0,
                                messages: &msgs,
                            }],
                        )
                        .unwrap();
                    last_boxed_integer(&out[0].text) == Some(peer)
                })
                .count()
        };
        let checking = Persuasion {
            to_right: 1.0,
            to_wrong: 0.0,
        };
        assert_eq!(
            adopted(checking, 47, 50),
            400,
            "a right majority is always adopted"
        );
        assert_eq!(
            adopted(checking, 50, 47),
            0,
            "a wrong majority is never adopted"
        );
        let leaning = Persuasion {
            to_right: 0.8,
            to_wrong: 0.2,
        };
        let (right, wrong) = (adopted(leaning, 47, 50), adopted(leaning, 50, 47));
        assert!(
            (280..=360).contains(&right),
            "adopted a right majority {right}/400"
        );
        assert!(
            (40..=120).contains(&wrong),
            "adopted a wrong majority {wrong}/400"
        );
        let (right, wrong) = (adopted(0.5.into(), 47, 50), adopted(0.5.into(), 50, 47));
        assert!((160..=240).contains(&right) && (160..=240).contains(&wrong));
    }
}
