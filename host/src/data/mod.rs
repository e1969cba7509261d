//! Datasets: GSM8K and ANLI JSONL files, generic JSONL with a field mapping, and the seeded
//! synthetic arithmetic generator (the embedded default task). Every error names the file,
//! the line and the field.

mod arithmetic;
mod fetch;

pub use arithmetic::{arithmetic, distinct_questions, FAMILIES as ARITHMETIC_FAMILIES, MAX_FAMILY};
pub use fetch::{fetch, FETCH_DATASETS, MIRROR_ENV};

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::transcript::Task;

/// How to read a generic JSONL file: which field holds what.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldMap {
    /// Field with a unique id; the line number when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Field with the question.
    pub question: String,
    /// Field with the gold answer.
    pub reference: String,
    /// Further fields passed to plugins as `task.fields`.
    #[serde(default)]
    pub fields: Vec<String>,
}

/// A JSON object holding only the `wanted` fields of the object on `line` (every other
/// field is parsed and dropped without being built).
fn selected_fields(line: &str, wanted: &[&str]) -> anyhow::Result<serde_json::Value> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Select<'a>(&'a [&'a str]);
    impl<'de> DeserializeSeed<'de> for Select<'_> {
        type Value = serde_json::Map<String, serde_json::Value>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Select<'_> {
        type Value = serde_json::Map<String, serde_json::Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = serde_json::Map::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if self.0.contains(&key.as_ref()) {
                    out.insert(key.into_owned(), map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(line);
    let fields = Select(wanted).deserialize(&mut de)?;
    de.end()?;
    Ok(serde_json::Value::Object(fields))
}

/// Reads GSM8K (`{"question", "answer": "...#### 42"}`): the reference is the number after
/// "####", without thousands separators.
pub fn gsm8k(path: &Path) -> anyhow::Result<Vec<Task>> {
    read_jsonl(path, &["question", "answer"], |line, value| {
        let question = str_field(value, "question")?;
        let answer = str_field(value, "answer")?;
        let (_, after) = answer
            .rsplit_once("####")
            .context("field `answer` has no \"####\" before the final answer")?;
        let reference = after.trim().replace(',', "");
        if reference.is_empty() {
            bail!("field `answer` has nothing after \"####\"");
        }
        Ok(Task {
            id: format!("gsm8k-{line}"),
            kind: "gsm8k".into(),
            question: question.to_string(),
            reference,
            fields: vec![],
        })
    })
}

/// Reads ANLI (`{"uid", "context", "hypothesis", "label": "e"|"n"|"c"}`): the reference is
/// the full label, the premise and hypothesis are passed as fields.
pub fn anli(path: &Path) -> anyhow::Result<Vec<Task>> {
    read_jsonl(
        path,
        &["uid", "context", "hypothesis", "label"],
        |line, value| {
            let premise = str_field(value, "context")?;
            let hypothesis = str_field(value, "hypothesis")?;
            let reference = match str_field(value, "label")? {
                "e" => "entailment",
                "n" => "neutral",
                "c" => "contradiction",
                other => bail!("field `label` is {other:?}; expected \"e\", \"n\" or \"c\""),
            };
            let id = match value.get("uid").and_then(|v| v.as_str()) {
                Some(uid) => uid.to_string(),
                None => format!("anli-{line}"),
            };
            Ok(Task {
                id,
                kind: "anli".into(),
                question: format!("Premise: {premise}\nHypothesis: {hypothesis}"),
                reference: reference.into(),
                fields: vec![
                    ("premise".into(), premise.into()),
                    ("hypothesis".into(), hypothesis.into()),
                ],
            })
        },
    )
}

/// Reads any JSONL file through a field mapping; `kind` is the task kind plugins see.
pub fn jsonl(path: &Path, kind: &str, map: &FieldMap) -> anyhow::Result<Vec<Task>> {
    let mut wanted: Vec<&str> = vec![&map.question, &map.reference];
    wanted.extend(map.id.as_deref());
    wanted.extend(map.fields.iter().map(String::as_str));
    read_jsonl(path, &wanted, |line, value| {
        let id = match &map.id {
            Some(field) => scalar_field(value, field)?,
            None => format!("{kind}-{line}"),
        };
        let fields = map
            .fields
            .iter()
            .map(|f| Ok((f.clone(), scalar_field(value, f)?)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Task {
            id,
            kind: kind.to_string(),
            question: scalar_field(value, &map.question)?,
            reference: scalar_field(value, &map.reference)?,
            fields,
        })
    })
}

/// Parses every non-empty line as a JSON object and maps it; errors carry `file:line`. The
/// file is read a line at a time and only the `wanted` fields of each record are kept (the
/// others are skipped while parsing): memory grows with the tasks, not with the file.
fn read_jsonl(
    path: &Path,
    wanted: &[&str],
    mut parse: impl FnMut(usize, &serde_json::Value) -> anyhow::Result<Task>,
) -> anyhow::Result<Vec<Task>> {
    use std::io::BufRead;
    let file = crate::files::open_regular(path, crate::files::DATASET_MAX, "dataset")?;
    let mut reader = std::io::BufReader::new(file);
    let mut tasks = Vec::new();
    let mut line = String::new();
    let mut n = 0;
    loop {
        line.clear();
        let read = reader.read_line(&mut line).with_context(|| {
            format!(
                "{}:{}: cannot read (not UTF-8 text?)",
                path.display(),
                n + 1
            )
        })?;
        if read == 0 {
            break;
        }
        n += 1;
        if line.trim().is_empty() {
            continue;
        }
        let value = selected_fields(&line, wanted)
            .with_context(|| format!("{}:{n}: not valid JSON", path.display()))?;
        let task = parse(n, &value).with_context(|| format!("{}:{n}", path.display()))?;
        tasks.push(task);
    }
    if tasks.is_empty() {
        bail!("{}: the dataset has no records", path.display());
    }
    let mut ids = std::collections::HashSet::new();
    for (n, t) in tasks.iter().enumerate() {
        if !ids.insert(t.id.as_str()) {
            bail!(
                "{}: task id `{}` appears twice (record {})",
                path.display(),
                t.id,
                n + 1
            );
        }
    }
    Ok(tasks)
}

fn str_field<'a>(value: &'a serde_json::Value, field: &str) -> anyhow::Result<&'a str> {
    match value.get(field) {
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(other) => bail!("field `{field}` is not a string: {other}"),
        None => bail!("missing field `{field}`"),
    }
}

/// A string, number or bool field as text.
fn scalar_field(value: &serde_json::Value, field: &str) -> anyhow::Result<String> {
    match value.get(field) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => Ok(v.to_string()),
        Some(other) => bail!("field `{field}` is not a string or number: {other}"),
        None => bail!("missing field `{field}`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn gsm8k_reference_is_the_number_after_the_hashes() {
        let f = file("{\"question\": \"q1\", \"answer\": \"a\\n#### 1,234\"}\n\n{\"question\": \"q2\", \"answer\": \"#### -5\"}\n");
        let tasks = gsm8k(f.path()).unwrap();
        assert_eq!(tasks.len(), 2);
        assert_eq!(
            (tasks[0].reference.as_str(), tasks[1].reference.as_str()),
            ("1234", "-5")
        );
        assert_eq!(tasks[1].id, "gsm8k-3");
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let f = file("{\"question\": \"q\", \"answer\": \"#### 1\"}\n{\"question\": \"q\"}\n");
        let err = format!("{:#}", gsm8k(f.path()).unwrap_err());
        assert!(err.contains(&format!("{}:2", f.path().display())), "{err}");
        assert!(err.contains("missing field `answer`"), "{err}");
        let f = file("{\"question\": \"q\", \"answer\": \"no hashes\"}\n");
        assert!(format!("{:#}", gsm8k(f.path()).unwrap_err()).contains("####"));
        let f = file("not json\n");
        assert!(format!("{:#}", gsm8k(f.path()).unwrap_err()).contains(":1: not valid JSON"));
        let f =
            file("{\"uid\": \"u\", \"context\": \"p\", \"hypothesis\": \"h\", \"label\": \"x\"}\n");
        let err = format!("{:#}", anli(f.path()).unwrap_err());
        assert!(err.contains("field `label`") && err.contains(":1"), "{err}");
        let err = format!("{:#}", gsm8k(Path::new("/no/such.jsonl")).unwrap_err());
        assert!(err.contains("/no/such.jsonl"), "{err}");
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let line =
            "{\"uid\": \"same\", \"context\": \"p\", \"hypothesis\": \"h\", \"label\": \"e\"}\n";
        let f = file(&line.repeat(2));
        assert!(format!("{:#}", anli(f.path()).unwrap_err()).contains("`same` appears twice"));
    }

    #[test]
    fn generic_jsonl_follows_the_field_map() {
        let f = file(
            "{\"k\": 7, \"q\": \"Capital of France?\", \"a\": \"Paris\", \"topic\": \"geo\"}\n",
        );
        let map = FieldMap {
            id: Some("k".into()),
            question: "q".into(),
            reference: "a".into(),
            fields: vec!["topic".into()],
        };
        let tasks = jsonl(f.path(), "qa", &map).unwrap();
        assert_eq!(tasks[0].id, "7");
        assert_eq!(tasks[0].kind, "qa");
        assert_eq!(
            tasks[0].fields,
            vec![("topic".to_string(), "geo".to_string())]
        );
        let map = FieldMap {
            question: "question".into(),
            ..map
        };
        let err = format!("{:#}", jsonl(f.path(), "qa", &map).unwrap_err());
        assert!(
            err.contains(":1") && err.contains("missing field `question`"),
            "{err}"
        );
    }

    #[test]
    fn the_shared_gsm8k_and_anli_files_load() {
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data");
        let test = gsm8k(&data.join("gsm8k/test.jsonl")).unwrap();
        assert_eq!(test.len(), 1319);
        assert_eq!(test[0].reference, "18");
        assert!(
            test.iter().all(|t| t.reference.parse::<i64>().is_ok()),
            "GSM8K answers are integers"
        );
        let r3 = anli(&data.join("anli/R3/test.jsonl")).unwrap();
        assert_eq!(r3.len(), 1200);
        assert!(r3
            .iter()
            .all(|t| ["entailment", "neutral", "contradiction"].contains(&t.reference.as_str())));
    }
}
