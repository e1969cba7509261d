//! The `configure` JSON: every plugin declares a `#[serde(deny_unknown_fields)]` struct with
//! `#[serde(default)]` and parses it with [`parse_settings`], which turns serde's messages
//! into ones that name the plugin and the offending key.

use serde::de::{self, DeserializeOwned, Visitor};
use serde_json::{Map, Value};
use std::fmt;

/// Parses a plugin's settings document.
///
/// `{}`, `null` and an empty string all mean "no settings" (every field takes its default).
/// Errors name the plugin and the key: "debate: unknown setting `peerz` (did you mean
/// `peers`?); known: show_scores, early_stop, peers, system".
pub fn parse_settings<T: DeserializeOwned>(plugin: &str, json: &str) -> Result<T, String> {
    let known = field_names::<T>();
    let trimmed = json.trim();
    let value = if trimmed.is_empty() {
        Value::Null
    } else {
        serde_json::from_str::<Value>(trimmed).map_err(|e| {
            format!(
                "{plugin}: the settings are not valid JSON ({e}); expected an object such as {{}}"
            )
        })?
    };
    let map = match value {
        Value::Null => Map::new(),
        Value::Object(map) => map,
        other => {
            return Err(format!(
                "{plugin}: the settings must be a JSON object (e.g. {{}}), got {}",
                json_kind(&other)
            ))
        }
    };
    for key in map.keys() {
        if !known.contains(&key.as_str()) {
            return Err(unknown_key(plugin, key, known));
        }
    }
    match serde_json::from_value::<T>(Value::Object(map.clone())) {
        Ok(settings) => Ok(settings),
        Err(whole) => {
            // Every field has a default, so each key can be checked on its own to find the
            // one that is wrong.
            for (key, value) in &map {
                let mut single = Map::new();
                single.insert(key.clone(), value.clone());
                if let Err(e) = serde_json::from_value::<T>(Value::Object(single)) {
                    return Err(format!("{plugin}: setting `{key}` = {value}: {e}"));
                }
            }
            Err(format!("{plugin}: invalid settings: {whole}"))
        }
    }
}

fn unknown_key(plugin: &str, key: &str, known: &[&str]) -> String {
    if known.is_empty() {
        return format!(
            "{plugin}: unknown setting `{key}`; this plugin takes no settings (use {{}})"
        );
    }
    let hint = known
        .iter()
        .map(|k| (edit_distance(k, key), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| format!(" (did you mean `{k}`?)"))
        .unwrap_or_default();
    format!(
        "{plugin}: unknown setting `{key}`{hint}; known: {}",
        known.join(", ")
    )
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Levenshtein distance over chars (settings names are short).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The (serialised) field names of a settings struct, read from its `Deserialize` impl by a
/// deserializer that records what `deserialize_struct` is asked for. Empty for non-structs.
pub fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut fields = None;
    let _ = T::deserialize(FieldProbe {
        fields: &mut fields,
    });
    fields.unwrap_or(&[])
}

struct FieldProbe<'a> {
    fields: &'a mut Option<&'static [&'static str]>,
}

#[derive(Debug)]
struct ProbeDone;

impl fmt::Display for ProbeDone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field probe")
    }
}

impl std::error::Error for ProbeDone {}

impl de::Error for ProbeDone {
    fn custom<M: fmt::Display>(_msg: M) -> Self {
        ProbeDone
    }
}

impl<'de> de::Deserializer<'de> for FieldProbe<'_> {
    type Error = ProbeDone;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, ProbeDone> {
        Err(ProbeDone)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, ProbeDone> {
        *self.fields = Some(fields);
        Err(ProbeDone)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Demo {
        show_scores: bool,
        peers: Option<u32>,
        gamma: f64,
    }

    #[derive(Debug, Default, Deserialize, PartialEq)]
    #[serde(default, deny_unknown_fields)]
    struct Nothing {}

    #[test]
    fn field_names_come_from_the_struct() {
        assert_eq!(field_names::<Demo>(), &["show_scores", "peers", "gamma"]);
        assert!(field_names::<Nothing>().is_empty());
    }

    #[test]
    fn empty_documents_mean_defaults() {
        for doc in ["{}", "", "  ", "null"] {
            assert_eq!(
                parse_settings::<Demo>("demo", doc).unwrap(),
                Demo::default()
            );
        }
    }

    #[test]
    fn values_are_read() {
        let d: Demo = parse_settings("demo", r#"{"show_scores": true, "peers": 2}"#).unwrap();
        assert_eq!(
            d,
            Demo {
                show_scores: true,
                peers: Some(2),
                gamma: 0.0
            }
        );
    }

    #[test]
    fn unknown_keys_are_named_with_a_suggestion() {
        let e = parse_settings::<Demo>("debate", r#"{"peerz": 1}"#).unwrap_err();
        assert_eq!(
            e,
            "debate: unknown setting `peerz` (did you mean `peers`?); known: show_scores, peers, gamma"
        );
        let e = parse_settings::<Demo>("debate", r#"{"zzzzzzzz": 1}"#).unwrap_err();
        assert!(!e.contains("did you mean"), "{e}");
        let e = parse_settings::<Nothing>("x", r#"{"a": 1}"#).unwrap_err();
        assert!(e.contains("takes no settings"), "{e}");
    }

    #[test]
    fn type_errors_name_the_key() {
        let e =
            parse_settings::<Demo>("debate", r#"{"peers": 2, "show_scores": "yes"}"#).unwrap_err();
        assert!(
            e.starts_with("debate: setting `show_scores` = \"yes\": invalid type"),
            "{e}"
        );
        let e = parse_settings::<Demo>("debate", r#"{"peers": -1}"#).unwrap_err();
        assert!(e.starts_with("debate: setting `peers` = -1:"), "{e}");
    }

    #[test]
    fn non_objects_and_bad_json_are_refused() {
        let e = parse_settings::<Demo>("debate", "[1]").unwrap_err();
        assert_eq!(
            e,
            "debate: the settings must be a JSON object (e.g. {}), got an array"
        );
        let e = parse_settings::<Demo>("debate", "{peers: 1}").unwrap_err();
        assert!(
            e.starts_with("debate: the settings are not valid JSON"),
            "{e}"
        );
    }

    #[test]
    fn edit_distance_works() {
        assert_eq!(edit_distance("peers", "peerz"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("gamma", "gamma"), 0);
    }
}
