//! What the server's clients send and get back: the OpenAI chat-completions shapes, the
//! debate and judge requests, and the JSON errors. Requests are checked here, before any
//! model work is queued; every refusal names the field and what was wrong with it.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::debate::{Completions, Finish};
use crate::model::SamplingParams;
use crate::transcript::{ChatMessage, Role};

/// A refusal or failure, as the client sees it: an HTTP status and an OpenAI-style body
/// `{"error": {"message", "type", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub kind: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            kind: "invalid_request_error",
            message: message.into(),
        }
    }

    pub fn not_found(kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 404,
            kind,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            kind: "server_error",
            message: message.into(),
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.status}})
    }
}

/// The limits a request must fit in.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Most tokens a completion may ask for (`max_tokens`); also the default.
    pub max_tokens: usize,
    /// Most completions per request (`n`).
    pub max_n: usize,
    /// Most messages in one chat.
    pub max_messages: usize,
    /// Most responses one judge request may score.
    pub max_responses: usize,
    /// Longest prompt a chat may have, and longest question a debate or a judge request may
    /// ask, in tokens (as agent 0 counts them for a question): prefill memory grows with the
    /// square of the prompt, so a model's whole context is not offered to every client.
    pub max_prompt_tokens: usize,
}

/// Temperatures below this decode greedily (as 0 does).
pub const MIN_TEMPERATURE: f64 = 1e-4;

/// A checked `POST /v1/chat/completions` request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub agent: usize,
    /// The `model` the client named, echoed back.
    pub model: String,
    pub messages: Vec<ChatMessage>,
    /// None: the agent's own sampling settings.
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub max_tokens: usize,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub n: usize,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with the usage.
    pub stream_usage: bool,
}

impl ChatRequest {
    /// How this request samples, from agent defaults `agent` and the request's overrides.
    pub fn sampling(&self, agent: SamplingParams) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.unwrap_or(agent.temperature),
            top_p: self.top_p.unwrap_or(agent.top_p),
            top_k: self.top_k.unwrap_or(agent.top_k),
        }
    }
}

#[derive(Deserialize)]
struct RawMessage {
    role: String,
    #[serde(default)]
    content: Value,
}

#[derive(Deserialize)]
struct RawChat {
    model: Option<String>,
    messages: Option<Vec<RawMessage>>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    seed: Option<serde_json::Number>,
    stop: Option<Value>,
    n: Option<i64>,
    stream: Option<bool>,
    stream_options: Option<Value>,
    // Accepted when absent or neutral, refused otherwise: these would change the answer,
    // and a silent ignore would hand the client something it did not ask for.
    presence_penalty: Option<f64>,
    frequency_penalty: Option<f64>,
    logit_bias: Option<Value>,
    logprobs: Option<bool>,
    tools: Option<Value>,
    response_format: Option<Value>,
}

/// Parses JSON, saying where it is broken.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("the request body: {e}")))
}

/// The agent a `model` names: `agent-N` or `N` (as `/v1/models` lists them).
pub fn agent_of(model: &str, agents: usize) -> Result<usize, ApiError> {
    let index = model.strip_prefix("agent-").unwrap_or(model);
    match index.parse::<usize>() {
        Ok(a) if a < agents && index == a.to_string() => Ok(a),
        _ => Err(ApiError::not_found(
            "model_not_found",
            format!(
                "model {}: this server has agents agent-0 … agent-{} (GET /v1/models)",
                serde_json::to_string(model).unwrap_or_default(),
                agents.saturating_sub(1)
            ),
        )),
    }
}

/// Checks a chat-completions body against the team and `limits`.
pub fn chat_request(body: &[u8], agents: usize, limits: &Limits) -> Result<ChatRequest, ApiError> {
    let raw: RawChat = parse_json(body)?;
    let model = raw
        .model
        .ok_or_else(|| ApiError::invalid("`model` is required: an agent, e.g. \"agent-0\""))?;
    let agent = agent_of(&model, agents)?;
    let raw_messages = raw
        .messages
        .ok_or_else(|| ApiError::invalid("`messages` is required"))?;
    if raw_messages.is_empty() || raw_messages.len() > limits.max_messages {
        return Err(ApiError::invalid(format!(
            "`messages` has {} entries; 1 to {} are allowed",
            raw_messages.len(),
            limits.max_messages
        )));
    }
    let mut messages = Vec::with_capacity(raw_messages.len());
    for (i, m) in raw_messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            other => {
                return Err(ApiError::invalid(format!(
                    "messages[{i}].role: {} is not system, user or assistant",
                    serde_json::to_string(other).unwrap_or_default()
                )))
            }
        };
        let content = message_text(&m.content)
            .map_err(|why| ApiError::invalid(format!("messages[{i}].content: {why}")))?;
        messages.push(ChatMessage { role, content });
    }
    let neutral = [
        (
            "presence_penalty",
            raw.presence_penalty.is_none_or(|p| p == 0.0),
        ),
        (
            "frequency_penalty",
            raw.frequency_penalty.is_none_or(|p| p == 0.0),
        ),
        (
            "logit_bias",
            raw.logit_bias
                .as_ref()
                .is_none_or(|b| b.is_null() || b.as_object().is_some_and(|o| o.is_empty())),
        ),
        ("logprobs", raw.logprobs != Some(true)),
        (
            "tools",
            raw.tools
                .as_ref()
                .is_none_or(|t| t.is_null() || t.as_array().is_some_and(|a| a.is_empty())),
        ),
        (
            "response_format",
            raw.response_format.as_ref().is_none_or(|f| {
                f.is_null() || f.get("type").and_then(Value::as_str) == Some("text")
            }),
        ),
    ];
    if let Some((field, _)) = neutral.iter().find(|(_, ok)| !ok) {
        return Err(ApiError::invalid(format!(
            "`{field}` is not supported by this server (leave it out)"
        )));
    }
    let temperature = match raw.temperature {
        Some(t) if !(0.0..=2.0).contains(&t) => {
            return Err(ApiError::invalid(format!(
                "`temperature` is {t}; it must be between 0 and 2"
            )))
        }
        // Dividing logits by less overflows them: such a temperature is greedy decoding.
        Some(t) if t < MIN_TEMPERATURE => Some(0.0),
        t => t,
    };
    if let Some(p) = raw.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(ApiError::invalid(format!(
                "`top_p` is {p}; it must be in (0, 1]"
            )));
        }
    }
    let top_k = match raw.top_k {
        None => None,
        Some(k) if (0..=1_000_000).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(format!(
                "`top_k` is {k}; it must be 0 (off) or a positive count"
            )))
        }
    };
    let max_tokens = match raw.max_completion_tokens.or(raw.max_tokens) {
        None => limits.max_tokens,
        Some(m) if m >= 1 && m as u64 <= limits.max_tokens as u64 => m as usize,
        Some(m) => {
            return Err(ApiError::invalid(format!(
                "`max_tokens` is {m}; this server allows 1 to {} (serve --max-tokens)",
                limits.max_tokens
            )))
        }
    };
    let n = match raw.n {
        None => 1,
        Some(n) if n >= 1 && n as u64 <= limits.max_n as u64 => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "`n` is {n}; this server allows 1 to {} (serve --max-n)",
                limits.max_n
            )))
        }
    };
    let seed = match raw.seed {
        None => None,
        Some(s) => Some(
            s.as_u64()
                .or_else(|| s.as_i64().map(|i| i as u64))
                .ok_or_else(|| {
                    ApiError::invalid(format!("`seed` is {s}; it must be an integer"))
                })?,
        ),
    };
    let stop = match raw.stop {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(a)) => a
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                other => Err(ApiError::invalid(format!(
                    "`stop` holds {other}; it must be a string or a list of strings"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`stop` is {other}; it must be a string or a list of strings"
            )))
        }
    };
    if stop.len() > 4 || stop.iter().any(|s| s.is_empty() || s.len() > 256) {
        return Err(ApiError::invalid(
            "`stop`: at most 4 strings, each 1 to 256 bytes",
        ));
    }
    let stream_usage = raw
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ChatRequest {
        agent,
        model,
        messages,
        temperature,
        top_p: raw.top_p,
        top_k,
        max_tokens,
        seed,
        stop,
        n,
        stream: raw.stream.unwrap_or(false),
        stream_usage,
    })
}

/// A message's text: a string, or a list of `{"type": "text", "text": ...}` parts.
fn message_text(content: &Value) -> Result<String, String> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => return Err(format!("part {j} is not a text part (only text is served)")),
                }
            }
            Ok(text)
        }
        Value::Null => Err("missing".into()),
        other => Err(format!("{other} is neither text nor a list of text parts")),
    }
}

/// The OpenAI name of a finish reason.
pub fn finish_reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Cancelled => "cancelled",
    }
}

fn usage(c: &Completions) -> Value {
    let completion: usize = c.choices.iter().map(|x| x.tokens).sum();
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": c.prompt_tokens + completion,
    })
}

/// A whole `chat.completion` object.
pub fn completion_body(id: &str, created: u64, model: &str, c: &Completions) -> Value {
    let choices: Vec<Value> = c
        .choices
        .iter()
        .enumerate()
        .map(|(i, x)| {
            json!({
                "index": i,
                "message": {"role": "assistant", "content": x.text},
                "finish_reason": finish_reason(x.finish),
            })
        })
        .collect();
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(c),
    })
}

/// One `chat.completion.chunk` of a stream.
pub fn chunk_body(
    id: &str,
    created: u64,
    model: &str,
    choice: usize,
    delta: Value,
    finish: Option<Finish>,
) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": choice, "delta": delta, "finish_reason": finish.map(finish_reason)}],
    })
}

/// The stream's last chunk with `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(id: &str, created: u64, model: &str, c: &Completions) -> Value {
    json!({
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(c),
    })
}

/// A checked `POST /v1/debate` request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebateRequest {
    pub question: String,
    /// The gold answer, if known (for scores, correctness and rewards).
    #[serde(default)]
    pub reference: String,
    /// The task kind the plugins see; default: the config's.
    #[serde(default)]
    pub kind: Option<String>,
    /// The task id the plugins and errors name; default "request".
    #[serde(default)]
    pub id: Option<String>,
    /// Same seed, same debate.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// A checked `POST /v1/judge` request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeRequest {
    pub question: String,
    pub responses: Vec<String>,
}

pub fn debate_request(body: &[u8]) -> Result<DebateRequest, ApiError> {
    let r: DebateRequest = parse_json(body)?;
    if r.question.trim().is_empty() {
        return Err(ApiError::invalid("`question` is empty"));
    }
    if let Some(id) = &r.id {
        if id.is_empty() || id.len() > 200 || id.chars().any(char::is_control) {
            return Err(ApiError::invalid(
                "`id`: 1 to 200 bytes, no control characters",
            ));
        }
    }
    Ok(r)
}

pub fn judge_request(body: &[u8], limits: &Limits) -> Result<JudgeRequest, ApiError> {
    let r: JudgeRequest = parse_json(body)?;
    if r.responses.is_empty() || r.responses.len() > limits.max_responses {
        return Err(ApiError::invalid(format!(
            "`responses` has {} entries; 1 to {} are allowed",
            r.responses.len(),
            limits.max_responses
        )));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_tokens: 64,
            max_n: 4,
            max_messages: 8,
            max_responses: 16,
            max_prompt_tokens: 100,
        }
    }

    fn refused(body: &str) -> String {
        match chat_request(body.as_bytes(), 2, &limits()) {
            Ok(r) => panic!("accepted {body}: {r:?}"),
            Err(e) => {
                assert!(e.status == 400 || e.status == 404, "{e:?}");
                e.message
            }
        }
    }

    #[test]
    fn a_full_request_is_read_with_its_defaults() {
        let r = chat_request(
            br#"{"model":"agent-1","messages":[{"role":"system","content":"be brief"},
                {"role":"user","content":[{"type":"text","text":"2+"},{"type":"text","text":"2?"}]}],
                "seed":-1,"stop":"\n\n","user":"ignored","stream_options":{"include_usage":true}}"#,
            2,
            &limits(),
        )
        .unwrap();
        assert_eq!(r.agent, 1);
        assert_eq!(r.messages[1].content, "2+2?");
        assert_eq!(r.messages[0].role, Role::System);
        assert_eq!(r.max_tokens, 64);
        assert_eq!(r.seed, Some(u64::MAX));
        assert_eq!(r.stop, vec!["\n\n".to_string()]);
        assert_eq!((r.n, r.stream, r.stream_usage), (1, false, true));
        let agent = SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: 5,
        };
        assert_eq!(r.sampling(agent), agent);
        for (t, read) in [(1e-40, 0.0), (0.0, 0.0), (1e-4, 1e-4), (0.7, 0.7)] {
            let body = format!(
                r#"{{"model":"0","messages":[{{"role":"user","content":"q"}}],"temperature":{t}}}"#
            );
            let r = chat_request(body.as_bytes(), 2, &limits()).unwrap();
            assert_eq!(r.temperature, Some(read), "{t}");
        }
    }

    #[test]
    fn every_bad_field_is_named() {
        let msgs = r#""messages":[{"role":"user","content":"hi"}]"#;
        for (body, says) in [
            ("{", "the request body"),
            (r#"{"messages":[]}"#, "`model` is required"),
            (
                &format!(r#"{{"model":"agent-2",{msgs}}}"#),
                "agent-0 … agent-1",
            ),
            (&format!(r#"{{"model":"01",{msgs}}}"#), "model \"01\""),
            (r#"{"model":"0","messages":[]}"#, "`messages` has 0 entries"),
            (
                r#"{"model":"0","messages":[{"role":"tool","content":"x"}]}"#,
                "messages[0].role",
            ),
            (
                r#"{"model":"0","messages":[{"role":"user"}]}"#,
                "messages[0].content: missing",
            ),
            (
                r#"{"model":"0","messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
                "part 0 is not a text part",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"temperature":3}}"#),
                "`temperature` is 3",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"top_p":0}}"#),
                "`top_p` is 0",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"max_tokens":65}}"#),
                "`max_tokens` is 65",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"max_tokens":0}}"#),
                "`max_tokens` is 0",
            ),
            (&format!(r#"{{"model":"0",{msgs},"n":5}}"#), "`n` is 5"),
            (
                &format!(r#"{{"model":"0",{msgs},"seed":1.5}}"#),
                "`seed` is 1.5",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"stop":[1]}}"#),
                "`stop` holds 1",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"stop":["a","b","c","d","e"]}}"#),
                "at most 4",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"logprobs":true}}"#),
                "`logprobs` is not supported",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"presence_penalty":0.5}}"#),
                "`presence_penalty`",
            ),
            (
                &format!(r#"{{"model":"0",{msgs},"temperature":"hot"}}"#),
                "the request body",
            ),
        ] {
            let message = refused(body);
            assert!(message.contains(says), "{body}: {message}");
        }
        // Neutral values of unsupported fields pass.
        chat_request(
            format!(r#"{{"model":"0",{msgs},"presence_penalty":0,"logprobs":false,"tools":[]}}"#)
                .as_bytes(),
            2,
            &limits(),
        )
        .unwrap();
    }

    #[test]
    fn debate_and_judge_requests_are_checked() {
        assert!(debate_request(br#"{"question":"  "}"#)
            .unwrap_err()
            .message
            .contains("empty"));
        assert!(debate_request(br#"{"question":"q","turns":3}"#)
            .unwrap_err()
            .message
            .contains("unknown field `turns`"));
        let d = debate_request(br#"{"question":"q","seed":7}"#).unwrap();
        assert_eq!((d.seed, d.reference.as_str()), (Some(7), ""));
        let many = serde_json::json!({"question": "q", "responses": vec!["r"; 17]}).to_string();
        assert!(judge_request(many.as_bytes(), &limits())
            .unwrap_err()
            .message
            .contains("17"));
        assert_eq!(
            judge_request(br#"{"question":"q","responses":["a","b"]}"#, &limits())
                .unwrap()
                .responses
                .len(),
            2
        );
    }
}
