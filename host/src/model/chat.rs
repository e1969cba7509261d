//! Chat templates in Hugging Face's Jinja dialect (rendered with minijinja, the way
//! text-generation-inference does it), and tokenizers built from GGUF metadata.

use anyhow::{anyhow, bail, Context, Result};
use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::Serialize;
use serde_json::{json, Value};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template plus the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles a template (HF dialect: trim_blocks, lstrip_blocks, Python string methods,
    /// `raise_exception`, `strftime_now`).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<JValue, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_function("strftime_now", |fmt: String| -> String {
            strftime_now(&fmt)
        });
        // HF templates are written with `.strip()` etc. in mind; minijinja's `tojson` matches.
        env.add_template_owned("chat", source.to_string())
            .map_err(|e| anyhow!("chat template does not compile: {e:#}"))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Reads `chat_template` (a string, or a list of named templates: "default" is used) and
    /// the bos/eos tokens from a tokenizer_config.json document.
    pub fn from_tokenizer_config(text: &str) -> Result<Option<ChatTemplate>> {
        let v: Value =
            serde_json::from_str(text).context("tokenizer_config.json is not valid JSON")?;
        let source = match v.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    anyhow!("tokenizer_config.json: chat_template list has no template")
                })?
                .to_string(),
            _ => return Ok(None),
        };
        let tok = |k: &str| -> String {
            match v.get(k) {
                Some(Value::String(s)) => s.clone(),
                Some(o @ Value::Object(_)) => o
                    .get("content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                _ => String::new(),
            }
        };
        Ok(Some(ChatTemplate::new(
            &source,
            &tok("bos_token"),
            &tok("eos_token"),
        )?))
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends where the assistant's
    /// reply begins.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let t = self.env.get_template("chat")?;
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| anyhow!("rendering the chat template: {e:#}"))
    }
}

/// `strftime_now(fmt)` for templates that print today's date (Llama 3.x): supports %Y %m %d
/// %e %B %b %H %M %S %%, in UTC.
fn strftime_now(fmt: &str) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    format_time(secs, fmt)
}

fn format_time(secs: i64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Days since 1970-01-01 to a civil date (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out += &y.to_string(),
            Some('m') => out += &format!("{m:02}"),
            Some('d') => out += &format!("{d:02}"),
            Some('e') => out += &format!("{d:>2}"),
            Some('B') => out += MONTHS[(m - 1) as usize],
            Some('b') => out += &MONTHS[(m - 1) as usize][..3],
            Some('H') => out += &format!("{:02}", rem / 3600),
            Some('M') => out += &format!("{:02}", rem % 3600 / 60),
            Some('S') => out += &format!("{:02}", rem % 60),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The parts of a GGUF file's tokenizer metadata needed to rebuild a byte-level BPE tokenizer.
pub(crate) struct GgufVocab<'a> {
    pub model: &'a str,
    pub pre: &'a str,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub merges: Vec<String>,
}

/// Pre-tokenizer per llama.cpp `tokenizer.ggml.pre` value, as HF tokenizer.json JSON.
fn pre_tokenizer(pre: &str) -> Result<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
    Ok(match pre {
        "gpt2" | "default" => byte_level(true),
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "llama-bpe" | "llama3" | "smaug-bpe" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [
            split(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
            byte_level(false)]}),
        other => bail!("GGUF tokenizer pre-tokenizer `{other}` is not supported (gpt2, smollm, llama-bpe, qwen2); use an HF folder with tokenizer.json"),
    })
}

/// Builds a tokenizers `Tokenizer` from GGUF vocabulary metadata (byte-level BPE only).
pub(crate) fn tokenizer_from_gguf(v: &GgufVocab) -> Result<tokenizers::Tokenizer> {
    if v.model != "gpt2" {
        bail!(
            "GGUF tokenizer model `{}` is not supported (only byte-level BPE, `gpt2`); use an HF folder with tokenizer.json",
            v.model
        );
    }
    let vocab: serde_json::Map<String, Value> = v
        .tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    // Control (3) and user-defined (4) tokens are matched whole before BPE.
    let added: Vec<Value> = v
        .tokens
        .iter()
        .enumerate()
        .filter(|(i, _)| matches!(v.token_types.get(*i), Some(3) | Some(4)))
        .map(|(i, t)| {
            let special = v.token_types.get(i) == Some(&3);
            json!({"id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": special})
        })
        .collect();
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(v.pre)?,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false, "vocab": vocab, "merges": v.merges},
    });
    tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&doc)?)
        .map_err(|e| anyhow!("building the tokenizer from GGUF metadata: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_dialect_features_render() {
        let src = "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}\
                   [{{ m.role.upper() }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        let out = t
            .render(&[ChatMessage::new("user", "  hi  ")], true)
            .unwrap();
        assert_eq!(out, "[USER] hi\n[ASSISTANT]");
        let e = format!(
            "{:#}",
            t.render(&[ChatMessage::new("bad", "x")], false)
                .unwrap_err()
        );
        assert!(e.contains("no bad roles"), "{e}");
    }

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-07-26 13:05:09 UTC
        assert_eq!(
            format_time(1_721_999_109, "%d %b %Y %H:%M:%S"),
            "26 Jul 2024 13:05:09"
        );
        assert_eq!(format_time(0, "%Y-%m-%d %B"), "1970-01-01 January");
    }
}
