//! ANLI verifier: the answer is the last `\boxed{}` (LaTeX command names such as `\text`
//! removed, letters only, lower-cased), which must be exactly entailment, neutral or
//! contradiction; with no box at all, the whole text read the same way must be a label (a
//! response that only mentions labels has no valid answer). Score 1.0 when it equals the
//! reference (the label or its initial e / n / c), else 0.0.
//!
//! Settings: none (`{}`).

use maporl_plugin::answers::{nli_label, nli_reference};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::{Task, Verdict, Verifier};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "anli";

/// The ANLI verifier takes no settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {}

impl Settings {
    /// Parses the `configure` document (only `{}` is accepted).
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// The task's reference as a label.
pub fn reference(task: &Task) -> Result<&'static str, String> {
    nli_reference(&task.reference).ok_or_else(|| {
        format!(
            "{PLUGIN}: task `{}`: the reference `{}` is not an NLI label; expected entailment, \
             neutral or contradiction (or e, n, c)",
            task.id, task.reference
        )
    })
}

/// One verdict per response.
pub fn score(task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String> {
    let gold = reference(task)?;
    Ok(responses
        .iter()
        .map(|text| {
            let answer = nli_label(text);
            let correct = answer == Some(gold);
            Verdict {
                answer: answer.map(str::to_string),
                score: if correct { 1.0 } else { 0.0 },
                correct,
            }
        })
        .collect())
}

/// The ANLI verifier.
pub struct Anli;

impl Verifier for Anli {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(_settings: Settings) -> Result<Self, String> {
        Ok(Self)
    }

    fn extract(&self, _task: &Task, text: &str) -> Result<Option<String>, String> {
        Ok(nli_label(text).map(str::to_string))
    }

    fn score(&self, task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String> {
        score(task, responses)
    }
}

maporl_plugin::export_verifier!(Anli);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::task;

    #[test]
    fn scores_against_short_and_long_references() {
        let responses: Vec<String> = [
            "The hypothesis follows. Answer: \\boxed{Entailment}",
            "Answer: \\boxed{\\text{neutral}}",
            "It is not neutral; it is an entailment.",
            "Entailment.",
            "\\boxed{yes}",
            "I cannot tell.",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for reference in ["e", "E", "entailment", " Entailment "] {
            let v = score(&task("anli", "p/h", reference), &responses).unwrap();
            let got: Vec<_> = v
                .iter()
                .map(|v| (v.answer.as_deref(), v.score, v.correct))
                .collect();
            assert_eq!(
                got,
                vec![
                    (Some("entailment"), 1.0, true),
                    (Some("neutral"), 0.0, false),
                    (None, 0.0, false),
                    (Some("entailment"), 1.0, true),
                    (None, 0.0, false),
                    (None, 0.0, false),
                ]
            );
        }
    }

    #[test]
    fn bad_reference_and_settings() {
        let e = score(&task("anli", "p/h", "maybe"), &[]).unwrap_err();
        assert!(
            e.starts_with("anli: task `t-1`: the reference `maybe` is not an NLI label"),
            "{e}"
        );
        assert!(Settings::parse("{}").is_ok());
        let e = Settings::parse(r#"{"strict": true}"#).unwrap_err();
        assert_eq!(
            e,
            "anli: unknown setting `strict`; this plugin takes no settings (use {})"
        );
    }
}
