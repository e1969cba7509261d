//! TEST FIXTURE: a verifier component that misbehaves according to `task.question`; see
//! plugins/testing/README.md. Normally the answer is the trimmed text (none when empty),
//! scored 1 when it equals the trimmed reference.

use maporl_hostile_common::{misbehave, Outcome};
use maporl_plugin::{Task, Verdict};

/// The fixture's name in messages.
pub const PLUGIN: &str = "hostile-verifier";

/// The normal answer: the trimmed text.
pub fn answer(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.to_string())
}

/// `extract`; the bool says whether it behaved normally.
pub fn extract(task: &Task, text: &str) -> Result<(Option<String>, bool), String> {
    if let Some(answer) = oversized_answer(&task.question) {
        return Ok((Some(answer), false));
    }
    match misbehave(&task.question) {
        Outcome::Normal => Ok((answer(text), true)),
        Outcome::Output(out) => Ok((Some(out), false)),
        Outcome::Error(e) => Err(e),
    }
}

/// Modes whose answers are too long for the host to keep: `long-answer`, 2 KiB (over the
/// default `max_answer_bytes`, within the call's data budget); `huge-answer`, 20 MiB (over
/// the data budget: refused while the host reads it).
pub fn oversized_answer(mode: &str) -> Option<String> {
    match mode.trim() {
        "long-answer" => Some("7".repeat(2 << 10)),
        "huge-answer" => Some("7".repeat(20 << 20)),
        _ => None,
    }
}

/// `score`; the bool says whether it behaved normally.
pub fn score(task: &Task, responses: &[String]) -> Result<(Vec<Verdict>, bool), String> {
    let normal = |score_override: Option<f32>| {
        responses
            .iter()
            .map(|text| {
                let answer = answer(text);
                let correct = answer.as_deref() == Some(task.reference.trim());
                Verdict {
                    answer,
                    score: score_override.unwrap_or(if correct { 1.0 } else { 0.0 }),
                    correct,
                }
            })
            .collect::<Vec<_>>()
    };
    if let Some(answer) = oversized_answer(&task.question) {
        let verdicts = responses
            .iter()
            .map(|_| Verdict {
                answer: Some(answer.clone()),
                score: 0.0,
                correct: false,
            })
            .collect();
        return Ok((verdicts, false));
    }
    match task.question.trim() {
        "nan" => Ok((normal(Some(f32::NAN)), false)),
        "out-of-range" => Ok((normal(Some(1.5)), false)),
        mode => match misbehave(mode) {
            Outcome::Normal => Ok((normal(None), true)),
            Outcome::Output(out) => Ok((
                responses
                    .iter()
                    .map(|_| Verdict {
                        answer: Some(out.clone()),
                        score: 0.0,
                        correct: false,
                    })
                    .collect(),
                false,
            )),
            Outcome::Error(e) => Err(e),
        },
    }
}

mod bindings {
    wit_bindgen::generate!({
        world: "verifier",
        path: "../../../wit",
        with: { "maporl:plugin/types@0.2.0": maporl_plugin::wit::types },
    });
}

use bindings::maporl::plugin::host::{judge, limits, log, Level};

struct Hostile;

impl bindings::exports::maporl::plugin::verification::Guest for Hostile {
    fn configure(settings: String) -> Result<(), String> {
        if maporl_hostile_common::configure(PLUGIN, &settings)? {
            log(
                Level::Info,
                &format!("{PLUGIN}: configure: behaving normally"),
            );
        }
        Ok(())
    }

    fn extract(task: Task, text: String) -> Result<Option<String>, String> {
        let (answer, normal) = extract(&task, &text)?;
        if normal {
            log(
                Level::Info,
                &format!("{PLUGIN}: extract: behaving normally"),
            );
        }
        Ok(answer)
    }

    fn score(task: Task, responses: Vec<String>) -> Result<Vec<Verdict>, String> {
        // Mode `judge`: the scores are the host's learned verifier's, as they come.
        // Modes that ask the host for far more work than a call may: many responses in one
        // call, many calls of a few, a huge question, a huge response. The host's error is
        // returned as this plugin's.
        let flood = |n: usize, size: usize| vec!["7".repeat(size); n];
        match task.question.trim() {
            "judge-many" => judge("q", &flood(100_000, 1)).map(|_| ())?,
            "judge-often" => {
                for _ in 0..1_000 {
                    judge("q", &flood(200, 1))?;
                }
            }
            // Within one call's bound, so a debate that scores this task many times
            // reaches the per-debate bound.
            "judge-1000" => {
                for _ in 0..4 {
                    judge("q", &flood(250, 1))?;
                }
            }
            "judge-long-question" => judge(&"q".repeat(16 << 20), &flood(1, 1)).map(|_| ())?,
            "judge-long-response" => judge("q", &flood(2, 16 << 20)).map(|_| ())?,
            // Within every per-call bound (256 responses of 64 KiB), but long: the host's
            // work for it must stop at the call's deadline.
            "judge-wide" => judge("q", &flood(256, 64 << 10)).map(|_| ())?,
            // The host's `limits` (contract 0.2.0), as an error that shows every field,
            // after judging `responses` when the question is `limits-after-judge`.
            "limits" | "limits-after-judge" => {
                if task.question.trim() == "limits-after-judge" {
                    judge("q", &responses)?;
                }
                let l = limits();
                return Err(format!(
                    "limits: fuel={} deadline-ms={} memory-bytes={} max-result-bytes={} \
                     max-prompt-bytes={} max-answer-bytes={} max-abs-reward={} \
                     max-reward-parts={} max-part-name-bytes={} judge-responses-left={}",
                    l.fuel,
                    l.deadline_ms,
                    l.memory_bytes,
                    l.max_result_bytes,
                    l.max_prompt_bytes,
                    l.max_answer_bytes,
                    l.max_abs_reward,
                    l.max_reward_parts,
                    l.max_part_name_bytes,
                    l.judge_responses_left
                ));
            }
            _ => {}
        }
        if task.question.trim() == "judge" {
            let scores = judge(&task.question, &responses)?;
            return Ok(scores
                .into_iter()
                .map(|score| Verdict {
                    answer: None,
                    score,
                    correct: false,
                })
                .collect());
        }
        let (verdicts, normal) = score(&task, &responses)?;
        if normal {
            log(
                Level::Info,
                &format!(
                    "{PLUGIN}: score: behaving normally ({} responses)",
                    responses.len()
                ),
            );
        }
        Ok(verdicts)
    }
}

#[cfg(target_arch = "wasm32")]
bindings::export!(Hostile with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::task;

    fn texts() -> Vec<String> {
        vec![" 4 ".to_string(), "5".to_string(), "  ".to_string()]
    }

    #[test]
    fn behaves_normally_on_other_questions() {
        let (v, normal) = score(&task("x", "2+2?", "4"), &texts()).unwrap();
        assert!(normal);
        let got: Vec<_> = v
            .iter()
            .map(|v| (v.answer.as_deref(), v.score, v.correct))
            .collect();
        assert_eq!(
            got,
            vec![
                (Some("4"), 1.0, true),
                (Some("5"), 0.0, false),
                (None, 0.0, false)
            ]
        );
        assert_eq!(
            extract(&task("x", "q", "4"), " 7 ").unwrap(),
            (Some("7".into()), true)
        );
    }

    #[test]
    fn world_specific_misbehaviours() {
        let (v, _) = score(&task("x", "nan", "4"), &texts()).unwrap();
        assert!(v.iter().all(|v| v.score.is_nan()));
        let (v, _) = score(&task("x", "out-of-range", "4"), &texts()).unwrap();
        assert!(v.iter().all(|v| v.score == 1.5));
        assert!(score(&task("x", "env", "4"), &texts())
            .unwrap_err()
            .starts_with("env: "));
    }
}
