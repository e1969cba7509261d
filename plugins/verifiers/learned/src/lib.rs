//! Learned verifier (arXiv 2502.18439): the score of a response is the run's learned verifier's
//! probability that it answers the question correctly, asked of the host through `judge`
//! (one call per task with every scored response, so the host can batch). Answer
//! extraction and format rules stay here: a response without a valid answer is not sent
//! to the model and scores `invalid_score`. `correct` is ground truth, as in the rule-based
//! verifiers.
//!
//! Settings (JSON, all optional):
//! - `answers` ("auto"): how answers are read: "integer" (GSM8K's rules: the last
//!   `\boxed{}`, an integer), "label" (ANLI's: entailment / neutral / contradiction), or
//!   "auto": "label" for tasks of kind "anli", else "integer";
//! - `invalid_score` (0.0): the score of a response with no valid answer;
//! - `max_chars` (0: no limit): a response longer than this breaks the format rules and
//!   scores `invalid_score` too.
//!
//! `configure` fails when the run has no learned verifier (`[verifier] checkpoint`), so
//! such a run stops at start-up with the host's explanation.

use maporl_plugin::answers::{last_boxed, nli_label, nli_reference, parse_integer};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::{host, Task, Verdict, Verifier};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "learned";

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub answers: String,
    pub invalid_score: f32,
    pub max_chars: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            answers: "auto".into(),
            invalid_score: 0.0,
            max_chars: 0,
        }
    }
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        let s: Settings = parse_settings(PLUGIN, json)?;
        s.check()?;
        Ok(s)
    }

    /// The checks serde cannot express.
    pub fn check(&self) -> Result<(), String> {
        if !["auto", "integer", "label"].contains(&self.answers.as_str()) {
            return Err(format!(
                "{PLUGIN}: settings.answers = {:?}: expected \"auto\", \"integer\" or \"label\"",
                self.answers
            ));
        }
        if !(0.0..=1.0).contains(&self.invalid_score) {
            return Err(format!(
                "{PLUGIN}: settings.invalid_score = {}: expected a score in [0, 1]",
                self.invalid_score
            ));
        }
        Ok(())
    }

    fn labels(&self, task: &Task) -> bool {
        match self.answers.as_str() {
            "label" => true,
            "integer" => false,
            _ => task.kind == "anli",
        }
    }
}

/// The answer in one response, if it passes the format rules.
pub fn extract(settings: &Settings, task: &Task, text: &str) -> Option<String> {
    if settings.max_chars > 0 && text.chars().count() > settings.max_chars {
        return None;
    }
    if settings.labels(task) {
        nli_label(text).map(str::to_string)
    } else {
        last_boxed(text)
            .and_then(parse_integer)
            .map(|n| n.to_string())
    }
}

/// The task's reference, read the way answers are.
fn reference(settings: &Settings, task: &Task) -> Result<String, String> {
    let parsed = if settings.labels(task) {
        nli_reference(&task.reference).map(str::to_string)
    } else {
        parse_integer(&task.reference).map(|n| n.to_string())
    };
    parsed.ok_or_else(|| {
        format!(
            "{PLUGIN}: task `{}`: the reference `{}` cannot be read as a{} answer",
            task.id,
            task.reference,
            if settings.labels(task) {
                "n NLI label"
            } else {
                "n integer"
            }
        )
    })
}

/// One verdict per response; `judge` is asked once, for the responses with a valid answer.
pub fn score(
    settings: &Settings,
    task: &Task,
    responses: &[String],
    judge: impl FnOnce(&str, &[String]) -> Result<Vec<f32>, String>,
) -> Result<Vec<Verdict>, String> {
    let gold = reference(settings, task)?;
    let answers: Vec<Option<String>> = responses
        .iter()
        .map(|t| extract(settings, task, t))
        .collect();
    let valid: Vec<String> = responses
        .iter()
        .zip(&answers)
        .filter(|(_, a)| a.is_some())
        .map(|(t, _)| t.clone())
        .collect();
    let probs = if valid.is_empty() {
        Vec::new()
    } else {
        judge(&task.question, &valid)
            .map_err(|e| format!("{PLUGIN}: task `{}`: judge: {e}", task.id))?
    };
    if probs.len() != valid.len() {
        return Err(format!(
            "{PLUGIN}: task `{}`: judge gave {} scores for {} responses",
            task.id,
            probs.len(),
            valid.len()
        ));
    }
    let mut probs = probs.into_iter();
    Ok(answers
        .into_iter()
        .map(|answer| {
            let score = match &answer {
                Some(_) => probs.next().expect("one score per valid answer"),
                None => settings.invalid_score,
            };
            Verdict {
                correct: answer.as_deref() == Some(gold.as_str()),
                answer,
                score,
            }
        })
        .collect())
}

/// The learned verifier.
pub struct Learned {
    settings: Settings,
}

impl Verifier for Learned {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        settings.check()?;
        // An empty question asks nothing of the model: it only checks that the run has a
        // learned verifier, so that a run without one stops before any generation.
        host::judge("", &[]).map_err(|e| {
            format!("{PLUGIN}: this verifier needs the run's learned verifier: {e}")
        })?;
        Ok(Self { settings })
    }

    fn extract(&self, task: &Task, text: &str) -> Result<Option<String>, String> {
        Ok(extract(&self.settings, task, text))
    }

    fn score(&self, task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String> {
        score(&self.settings, task, responses, host::judge)
    }
}

maporl_plugin::export_verifier!(Learned);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::task;

    #[test]
    fn valid_answers_get_the_judges_numbers_and_invalid_ones_the_invalid_score() {
        let s = Settings {
            invalid_score: 0.1,
            ..Settings::default()
        };
        let t = task("gsm8k", "What is 2 + 2?", "4");
        let responses = vec![
            "so \\boxed{4}".to_string(),
            "no box: 4".to_string(),
            "\\boxed{5}".to_string(),
        ];
        let mut asked = Vec::new();
        let v = score(&s, &t, &responses, |q, r| {
            asked.push((q.to_string(), r.to_vec()));
            Ok(vec![0.9, 0.3])
        })
        .unwrap();
        assert_eq!(asked.len(), 1);
        assert_eq!(asked[0].1, vec![responses[0].clone(), responses[2].clone()]);
        let scores: Vec<f32> = v.iter().map(|x| x.score).collect();
        assert_eq!(scores, vec![0.9, 0.1, 0.3]);
        let correct: Vec<bool> = v.iter().map(|x| x.correct).collect();
        assert_eq!(correct, vec![true, false, false]);
    }

    #[test]
    fn labels_for_anli_and_judge_errors_name_the_task() {
        let s = Settings::default();
        let t = task("anli", "premise / hypothesis", "e");
        let v = score(&s, &t, &["\\boxed{Entailment}".to_string()], |_, _| {
            Ok(vec![0.5])
        })
        .unwrap();
        assert_eq!(v[0].answer.as_deref(), Some("entailment"));
        assert!(v[0].correct);
        let err = score(&s, &t, &["\\boxed{neutral}".to_string()], |_, _| {
            Err("no verifier model configured".into())
        })
        .unwrap_err();
        assert!(err.contains("no verifier model configured"), "{err}");
        assert!(err.contains(&t.id), "{err}");
    }

    #[test]
    fn settings_are_checked() {
        assert!(Settings::parse("{\"answers\": \"words\"}").is_err());
        assert!(Settings::parse("{\"invalid_score\": 2}").is_err());
        assert_eq!(Settings::parse("{}").unwrap(), Settings::default());
    }
}
