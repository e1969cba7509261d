//! The seeded synthetic arithmetic task: the embedded default, needing no download.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::transcript::Task;

/// `count` arithmetic questions of the given difficulty (1: a + b; 2: a × b + c;
/// 3: (a + b) × c − d; 4: a − b with a ≥ b, the second task family of RESULTS.md's
/// cross-domain test), the same for the same seed.
pub fn arithmetic(count: usize, difficulty: u32, seed: u64) -> Vec<Task> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..count)
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
            Task {
                id: format!("arith-{seed}-{i}"),
                kind: "arith".into(),
                question,
                reference: answer.to_string(),
                fields: vec![],
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn arithmetic_is_seeded_and_answers_are_right() {
        let a = super::arithmetic(20, 3, 1);
        assert_eq!(a, super::arithmetic(20, 3, 1));
        assert_ne!(a, super::arithmetic(20, 3, 2));
        for t in &a {
            // "(a + b) * c - d"
            let nums: Vec<i64> = t
                .question
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|s| s.parse().ok())
                .collect();
            let expect = (nums[0] + nums[1]) * nums[2] - nums[3];
            assert_eq!(t.reference, expect.to_string(), "{}", t.question);
        }
        for t in super::arithmetic(50, 4, 1) {
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
}
