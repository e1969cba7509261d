//! Exact-match verifier: the answer is extracted (by default the last `\boxed{}`, else the
//! last `Answer:` line, else the whole text) and normalised (lower-cased, surrounding
//! punctuation stripped, whitespace collapsed, optionally articles removed); score 1.0 when
//! it equals the reference normalised the same way, else 0.0. An answer that normalises
//! to nothing is invalid.
//!
//! Settings (JSON, all optional):
//! - `extract` ("boxed" | "answer-line" | "whole", "boxed"): where the answer is read;
//! - `strip_articles` (bool, false): drop the words "a", "an" and "the".

use maporl_plugin::answers::{answer_line, last_boxed, normalize};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::{Task, Verdict, Verifier};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "exact-match";

/// Where the answer is read from.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Extract {
    /// The last `\boxed{}`, else the last `Answer:` line, else the whole text.
    #[default]
    Boxed,
    /// The last `Answer:` line only (no such line: invalid).
    AnswerLine,
    /// The whole response.
    Whole,
}

/// The exact-match verifier's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Where the answer is read from.
    pub extract: Extract,
    /// Drop the words "a", "an" and "the" when normalising.
    pub strip_articles: bool,
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// The normalised answer of a response, if any.
pub fn extract(settings: &Settings, text: &str) -> Option<String> {
    let raw = match settings.extract {
        Extract::Boxed => last_boxed(text)
            .or_else(|| answer_line(text))
            .unwrap_or(text),
        Extract::AnswerLine => answer_line(text)?,
        Extract::Whole => text,
    };
    let answer = normalize(raw, settings.strip_articles);
    (!answer.is_empty()).then_some(answer)
}

/// One verdict per response.
pub fn score(
    settings: &Settings,
    task: &Task,
    responses: &[String],
) -> Result<Vec<Verdict>, String> {
    let gold = normalize(&task.reference, settings.strip_articles);
    if gold.is_empty() {
        return Err(format!(
            "{PLUGIN}: task `{}`: the reference `{}` is empty after normalisation",
            task.id, task.reference
        ));
    }
    Ok(responses
        .iter()
        .map(|text| {
            let answer = extract(settings, text);
            let correct = answer.as_deref() == Some(gold.as_str());
            Verdict {
                answer,
                score: if correct { 1.0 } else { 0.0 },
                correct,
            }
        })
        .collect())
}

/// The exact-match verifier.
pub struct ExactMatch {
    settings: Settings,
}

impl Verifier for ExactMatch {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        Ok(Self { settings })
    }

    fn extract(&self, _task: &Task, text: &str) -> Result<Option<String>, String> {
        Ok(extract(&self.settings, text))
    }

    fn score(&self, task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String> {
        score(&self.settings, task, responses)
    }
}

maporl_plugin::export_verifier!(ExactMatch);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::task;

    fn with(extract: Extract, strip_articles: bool) -> Settings {
        Settings {
            extract,
            strip_articles,
        }
    }

    #[test]
    fn boxed_mode_falls_back_to_answer_line_then_whole_text() {
        let s = Settings::default();
        assert_eq!(
            extract(&s, "x \\boxed{ Paris. } y").as_deref(),
            Some("paris")
        );
        assert_eq!(
            extract(&s, "Thinking.\nAnswer: The  Louvre\n").as_deref(),
            Some("the louvre")
        );
        assert_eq!(extract(&s, "  Blue!  ").as_deref(), Some("blue"));
        assert_eq!(extract(&s, " ... "), None);
    }

    #[test]
    fn answer_line_and_whole_modes() {
        let line = with(Extract::AnswerLine, false);
        assert_eq!(
            extract(&line, "Answer: Rome\nmore").as_deref(),
            Some("rome")
        );
        assert_eq!(extract(&line, "\\boxed{Rome}"), None);
        let whole = with(Extract::Whole, false);
        assert_eq!(
            extract(&whole, "Answer: Rome").as_deref(),
            Some("answer: rome")
        );
    }

    #[test]
    fn articles_and_scores() {
        let t = task("trivia", "q", "The Eiffel Tower");
        let responses = vec![
            "\\boxed{eiffel tower}".to_string(),
            "\\boxed{The Eiffel  Tower.}".to_string(),
            "\\boxed{Big Ben}".to_string(),
        ];
        let plain = score(&Settings::default(), &t, &responses).unwrap();
        assert_eq!(
            plain.iter().map(|v| v.correct).collect::<Vec<_>>(),
            vec![false, true, false]
        );
        let strip = score(&with(Extract::Boxed, true), &t, &responses).unwrap();
        assert_eq!(
            strip.iter().map(|v| v.score).collect::<Vec<_>>(),
            vec![1.0, 1.0, 0.0]
        );
        assert_eq!(strip[1].answer.as_deref(), Some("eiffel tower"));
        let e = score(&Settings::default(), &task("x", "q", " ?! "), &[]).unwrap_err();
        assert!(e.contains("empty after normalisation"), "{e}");
    }

    #[test]
    fn settings() {
        let s = Settings::parse(r#"{"extract": "answer-line", "strip_articles": true}"#).unwrap();
        assert_eq!(s, with(Extract::AnswerLine, true));
        let e = Settings::parse(r#"{"extract": "last"}"#).unwrap_err();
        assert!(
            e.starts_with("exact-match: setting `extract` = \"last\": unknown variant `last`, expected one of `boxed`, `answer-line`, `whole`"),
            "{e}"
        );
    }
}
