//! GSM8K verifier: the answer is the content of the last `\boxed{...}` (nested braces
//! balanced) with everything but digits, signs and points dropped; it must parse as an
//! integer (i64), else the response has no valid answer. Score 1.0 when it equals the
//! reference (parsed the same way, so "1,234" works), else 0.0.
//!
//! Settings (JSON, all optional):
//! - `hash_fallback` (bool, false): with no `\boxed{}` at all, read the rest of the line
//!   after the last `####`;
//! - `last_number_fallback` (bool, false): with still no valid answer, the last number in
//!   the text (thousands commas removed).
//!
//! A `\boxed{}` is authoritative: when the response has one, its content alone decides
//! (an unparseable box is invalid, the fall-backs are not tried).

use maporl_plugin::answers::{after_last_hashes, last_boxed, last_number, parse_integer};
use maporl_plugin::settings::parse_settings;
use maporl_plugin::{Task, Verdict, Verifier};
use serde::Deserialize;

/// The plugin's name in error messages.
pub const PLUGIN: &str = "gsm8k";

/// The GSM8K verifier's settings.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Without a box, read the line after the last `####`.
    pub hash_fallback: bool,
    /// Without a box or a valid `####` answer, take the last number in the text.
    pub last_number_fallback: bool,
}

impl Settings {
    /// Parses the `configure` document.
    pub fn parse(json: &str) -> Result<Self, String> {
        parse_settings(PLUGIN, json)
    }
}

/// The integer answer of a response, if any.
pub fn extract(settings: &Settings, text: &str) -> Option<i64> {
    if let Some(boxed) = last_boxed(text) {
        return parse_integer(boxed);
    }
    if settings.hash_fallback {
        if let Some(n) = after_last_hashes(text).and_then(parse_integer) {
            return Some(n);
        }
    }
    if settings.last_number_fallback {
        return last_number(text).as_deref().and_then(parse_integer);
    }
    None
}

/// The task's reference as an integer.
pub fn reference(task: &Task) -> Result<i64, String> {
    parse_integer(&task.reference).ok_or_else(|| {
        format!(
            "{PLUGIN}: task `{}`: the reference `{}` is not an integer; this verifier needs \
             integer answers (use the exact-match verifier for other tasks)",
            task.id, task.reference
        )
    })
}

/// One verdict per response: score 1.0 when the answer equals the reference, else 0.0.
pub fn score(
    settings: &Settings,
    task: &Task,
    responses: &[String],
) -> Result<Vec<Verdict>, String> {
    let gold = reference(task)?;
    Ok(responses
        .iter()
        .map(|text| {
            let answer = extract(settings, text);
            let correct = answer == Some(gold);
            Verdict {
                answer: answer.map(|n| n.to_string()),
                score: if correct { 1.0 } else { 0.0 },
                correct,
            }
        })
        .collect())
}

/// The GSM8K verifier.
pub struct Gsm8k {
    settings: Settings,
}

impl Verifier for Gsm8k {
    const NAME: &'static str = PLUGIN;
    type Settings = Settings;

    fn new(settings: Settings) -> Result<Self, String> {
        Ok(Self { settings })
    }

    fn extract(&self, _task: &Task, text: &str) -> Result<Option<String>, String> {
        Ok(extract(&self.settings, text).map(|n| n.to_string()))
    }

    fn score(&self, task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String> {
        score(&self.settings, task, responses)
    }
}

maporl_plugin::export_verifier!(Gsm8k);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::task;

    fn strict() -> Settings {
        Settings::default()
    }

    #[test]
    fn boxed_answers() {
        let s = strict();
        assert_eq!(extract(&s, "so the answer is \\boxed{42}."), Some(42));
        assert_eq!(extract(&s, "\\boxed{1} ... Answer: \\boxed{-3}"), Some(-3));
        assert_eq!(extract(&s, "\\boxed{\\$1,250}"), Some(1250));
        assert_eq!(extract(&s, "\\boxed{\\text{18 apples}}"), Some(18));
        assert_eq!(extract(&s, "\\boxed{18.5}"), None);
        assert_eq!(extract(&s, "\\boxed{}"), None);
        assert_eq!(extract(&s, "\\boxed{3} then truncated \\boxed{4"), Some(3));
        assert_eq!(extract(&s, "The answer is 42."), None);
        assert_eq!(extract(&s, "#### 42"), None);
    }

    #[test]
    fn fallbacks() {
        let hash = Settings {
            hash_fallback: true,
            ..strict()
        };
        assert_eq!(extract(&hash, "work\n#### 1,024\nthanks 7"), Some(1024));
        assert_eq!(extract(&hash, "ends with 42"), None);
        // A box is authoritative.
        assert_eq!(extract(&hash, "\\boxed{x} #### 5"), None);

        let both = Settings {
            hash_fallback: true,
            last_number_fallback: true,
        };
        assert_eq!(extract(&both, "total is 1,234 dollars."), Some(1234));
        assert_eq!(extract(&both, "#### none\nso 17"), Some(17));
        assert_eq!(extract(&both, "about 2.5"), None);
        assert_eq!(extract(&both, "no numbers"), None);
        let last = Settings {
            last_number_fallback: true,
            ..strict()
        };
        assert_eq!(extract(&last, "#### 5 but then 6"), Some(6));
    }

    #[test]
    fn scores() {
        let t = task("gsm8k", "q", "1,234");
        let responses = vec![
            "\\boxed{1234}".to_string(),
            "\\boxed{1,234.0}".to_string(),
            "\\boxed{99}".to_string(),
            "nothing".to_string(),
        ];
        let v = score(&strict(), &t, &responses).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(
            (v[0].answer.as_deref(), v[0].score, v[0].correct),
            (Some("1234"), 1.0, true)
        );
        assert_eq!((v[1].answer.as_deref(), v[1].correct), (None, false));
        assert_eq!(
            (v[2].answer.as_deref(), v[2].score, v[2].correct),
            (Some("99"), 0.0, false)
        );
        assert_eq!((v[3].answer.as_deref(), v[3].score), (None, 0.0));
        assert!(score(&strict(), &t, &[]).unwrap().is_empty());
    }

    #[test]
    fn bad_reference_names_the_task() {
        let mut t = task("gsm8k", "q", "twelve");
        t.id = "gsm8k-test-17".into();
        let e = score(&strict(), &t, &["\\boxed{12}".to_string()]).unwrap_err();
        assert!(
            e.starts_with("gsm8k: task `gsm8k-test-17`: the reference `twelve` is not an integer"),
            "{e}"
        );
    }

    #[test]
    fn settings() {
        assert_eq!(Settings::parse("{}").unwrap(), strict());
        let s = Settings::parse(r#"{"hash_fallback": true}"#).unwrap();
        assert!(s.hash_fallback && !s.last_number_fallback);
        let e = Settings::parse(r#"{"hash_fallbak": true}"#).unwrap_err();
        assert!(e.contains("did you mean `hash_fallback`"), "{e}");
    }
}
