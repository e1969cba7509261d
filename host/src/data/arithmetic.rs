//! The seeded synthetic arithmetic task: the embedded default, needing no download.
//!
//! Families 1-4 draw each question independently (a question may repeat). Families 5-7 are
//! small enough to enumerate (a few hundred distinct questions), so they are drawn without
//! replacement: a seeded permutation of every question of the family. Any two disjoint
//! ranges of the data (the held-out questions first, the training ones after them) then
//! share no question.

use anyhow::bail;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::transcript::Task;

/// The families `data.difficulty` names, for errors and docs.
pub const FAMILIES: &str = "1 (a + b, a and b in 2-99), 2 (a * b + c), 3 ((a + b) * c - d), \
    4 (a - b), 5 (a + b, a in 10-99, b in 1-9), 6 (a + b, a and b in 2-20) or \
    7 (a + b + c, single digits 1-9)";

/// The largest family number.
pub const MAX_FAMILY: u32 = 7;

/// How many distinct questions an enumerated family has (None: drawn with replacement).
pub fn distinct_questions(difficulty: u32) -> Option<usize> {
    match difficulty {
        5 => Some(90 * 9),
        6 => Some(19 * 19),
        7 => Some(9 * 9 * 9),
        _ => None,
    }
}

/// `count` arithmetic questions of the given difficulty (see [`FAMILIES`]; 4 is the
/// second task family of RESULTS.md's cross-domain test), the same for the same seed.
/// An enumerated family (5-7) refuses a count past its distinct questions.
pub fn arithmetic(count: usize, difficulty: u32, seed: u64) -> anyhow::Result<Vec<Task>> {
    if let Some(distinct) = distinct_questions(difficulty) {
        if count > distinct {
            bail!(
                "data.difficulty = {difficulty} has {distinct} distinct questions, drawn \
                 without replacement; data.offset + data.count = {count} asks for more \
                 (lower data.count or data.offset)"
            );
        }
        return Ok(enumerated(difficulty, seed)
            .into_iter()
            .take(count)
            .collect());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Ok((0..count)
        .map(|i| {
            let mut n = |hi: i64| rng.random_range(2..=hi);
            let (question, answer) = match difficulty {
                0 | 1 => {
                    let (a, b) = (n(99), n(99));
                    (format!("What is {a} + {b}?"), a + b)
                }
                2 => {
                    let (a, b, c) = (n(30), n(30), n(99));
                    (format!("What is {a} * {b} + {c}?"), a * b + c)
                }
                4 => {
                    let (a, b) = (n(99), n(99));
                    let (a, b) = (a.max(b), a.min(b));
                    (format!("What is {a} - {b}?"), a - b)
                }
                _ => {
                    let (a, b, c, d) = (n(50), n(50), n(20), n(99));
                    (format!("What is ({a} + {b}) * {c} - {d}?"), (a + b) * c - d)
                }
            };
            task(seed, i, question, answer)
        })
        .collect())
}

/// Every question of an enumerated family, in a seeded order.
fn enumerated(difficulty: u32, seed: u64) -> Vec<Task> {
    let mut items: Vec<(String, i64)> = match difficulty {
        5 => (10..=99)
            .flat_map(|a| (1..=9).map(move |b| (format!("What is {a} + {b}?"), a + b)))
            .collect(),
        6 => (2..=20)
            .flat_map(|a| (2..=20).map(move |b| (format!("What is {a} + {b}?"), a + b)))
            .collect(),
        _ => (1..=9)
            .flat_map(|a| {
                (1..=9).flat_map(move |b| {
                    (1..=9).map(move |c| (format!("What is {a} + {b} + {c}?"), a + b + c))
                })
            })
            .collect(),
    };
    items.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    items
        .into_iter()
        .enumerate()
        .map(|(i, (question, answer))| task(seed, i, question, answer))
        .collect()
}

fn task(seed: u64, i: usize, question: String, answer: i64) -> Task {
    Task {
        id: format!("arith-{seed}-{i}"),
        kind: "arith".into(),
        question,
        reference: answer.to_string(),
        fields: vec![],
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    fn numbers(question: &str) -> Vec<i64> {
        question
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|s| s.parse().ok())
            .collect()
    }

    #[test]
    fn arithmetic_is_seeded_and_answers_are_right() {
        let a = super::arithmetic(20, 3, 1).unwrap();
        assert_eq!(a, super::arithmetic(20, 3, 1).unwrap());
        assert_ne!(a, super::arithmetic(20, 3, 2).unwrap());
        for t in &a {
            // "(a + b) * c - d"
            let nums = numbers(&t.question);
            let expect = (nums[0] + nums[1]) * nums[2] - nums[3];
            assert_eq!(t.reference, expect.to_string(), "{}", t.question);
        }
        for t in super::arithmetic(50, 4, 1).unwrap() {
            let (a, b) = t
                .question
                .strip_prefix("What is ")
                .and_then(|q| q.strip_suffix('?'))
                .and_then(|q| q.split_once(" - "))
                .expect("a - b");
            let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!(a >= b, "{}", t.question);
            assert_eq!(t.reference, (a - b).to_string(), "{}", t.question);
        }
    }

    /// Families 5-7: every question of the family exactly once, in the stated ranges, with
    /// the right answer; a seed only reorders them; a prefix is the start of the whole; one
    /// question more than the family holds is refused, naming the keys.
    #[test]
    fn enumerated_families_are_permutations_without_repeats() {
        let ranges: [(u32, &[(i64, i64)]); 3] = [
            (5, &[(10, 99), (1, 9)]),
            (6, &[(2, 20), (2, 20)]),
            (7, &[(1, 9), (1, 9), (1, 9)]),
        ];
        for (family, bounds) in ranges {
            let n = super::distinct_questions(family).unwrap();
            let all = super::arithmetic(n, family, 3).unwrap();
            let questions: HashSet<&str> = all.iter().map(|t| t.question.as_str()).collect();
            assert_eq!(questions.len(), n, "family {family}: a question repeats");
            for t in &all {
                let nums = numbers(&t.question);
                assert_eq!(nums.len(), bounds.len(), "{}", t.question);
                for (x, (lo, hi)) in nums.iter().zip(bounds) {
                    assert!((lo..=hi).contains(&x), "{}", t.question);
                }
                assert_eq!(t.reference, nums.iter().sum::<i64>().to_string());
            }
            let other = super::arithmetic(n, family, 4).unwrap();
            assert_ne!(all, other, "family {family}: the seed changes nothing");
            let reordered: HashSet<&str> = other.iter().map(|t| t.question.as_str()).collect();
            assert_eq!(reordered, questions);
            assert_eq!(super::arithmetic(10, family, 3).unwrap(), all[..10]);
            let err = super::arithmetic(n + 1, family, 3).unwrap_err().to_string();
            assert!(
                err.contains(&format!("data.difficulty = {family} has {n} distinct"))
                    && err.contains("data.count"),
                "{err}"
            );
        }
    }
}
