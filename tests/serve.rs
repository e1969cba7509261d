//! `maporl serve` on loopback with a tiny random-weights model: concurrent clients get the
//! answers the library gives for their seeds, streams carry the same text, whole debates and
//! the learned verifier answer, bad requests get 4xx JSON errors and the server keeps
//! serving, SIGTERM finishes what is in flight. Hostile clients: slow heads and bodies are
//! cut after their timeouts, unfinished bodies hold no more than the body budget, a flood of
//! connections is capped and `/health` still answers, SIGTERM answers the queue 503 at once
//! and cuts what is still running after `--shutdown-timeout`.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;

use serde_json::{json, Value};
use support::write_tiny_qwen2;

struct Served {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
    config: PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config for two agents on the tiny model, debating arithmetic; `extra` is appended.
fn write_config(dir: &Path, model: &Path, extra: &str) -> PathBuf {
    let config = dir.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            r#"seed = 1
[data]
source = "arithmetic"
count = 4
[model]
path = "{}"
[debate]
agents = 2
turns = 2
[generation]
temperature = 1.0
max_new_tokens = 12
[plugins.protocol]
path = "debate.wasm"
[plugins.verifier]
path = "gsm8k.wasm"
[plugins.shaper]
path = "influence.wasm"
{extra}
"#,
            model.display()
        ),
    )
    .unwrap();
    config
}

/// The tiny model, written into `dir/tiny`.
fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    model
}

/// The tiny model in `dir` and [`write_config`]'s config for it, with nothing appended.
fn tiny_config(dir: &Path) -> PathBuf {
    write_config(dir, &tiny_model(dir), "")
}

fn serve(extra_config: &str, args: &[&str]) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let extra = extra_config.replace("MODEL", &model.display().to_string());
    let extra = extra.replace("DIR", &dir.path().display().to_string());
    if extra_config.contains("checkpoint") {
        train_verifier(&model, dir.path());
    }
    let config = write_config(dir.path(), &model, &extra);
    let mut all = vec!["--config".to_string(), config.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let (child, base) = spawn(&all);
    Served {
        child,
        base,
        _dir: dir,
        config,
    }
}

/// `maporl serve ARGS --addr 127.0.0.1:0`, and the address it says it listens on.
fn spawn(args: &[String]) -> (Child, String) {
    spawn_logging(args, Stdio::inherit())
}

/// [`spawn`] with the server's stderr going to `stderr`.
fn spawn_logging(args: &[String], stderr: Stdio) -> (Child, String) {
    spawn_with(args, stderr, &[])
}

/// [`spawn_logging`] with environment variables `env` set for the server.
fn spawn_with(args: &[String], stderr: Stdio, env: &[(&str, &str)]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .arg("serve")
        .args(args)
        .envs(env.iter().copied())
        .args(["--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("the server said {line:?}"))
        .to_string();
    // Keep reading stdout so that the server never blocks on it.
    std::thread::spawn(move || {
        let mut rest = String::new();
        while stdout.read_line(&mut rest).map(|n| n > 0).unwrap_or(false) {}
    });
    (child, format!("http://{addr}"))
}

/// A verifier checkpoint for the tiny model (one short epoch: its numbers, not its skill,
/// are what the test compares) at DIR/verifier/checkpoints/final.
fn train_verifier(model: &Path, dir: &Path) {
    use maporl::verifier::data::{write_jsonl, Sample};
    use maporl::verifier::train::{train, TrainOptions};
    let samples: Vec<Sample> = (0..8)
        .map(|i| Sample {
            task_id: format!("q{i}"),
            question: format!("What is {i} + 1?"),
            response: format!("\\boxed{{{}}}", i + 1 + i % 2),
            correct: i % 2 == 0,
            answer: Some((i + 1 + i % 2).to_string()),
            reference: (i + 1).to_string(),
        })
        .collect();
    let data = dir.join("answers.jsonl");
    write_jsonl(&data, &samples).unwrap();
    let opts = TrainOptions {
        model: model.to_path_buf(),
        model_name: "tiny".into(),
        data,
        run_dir: dir.join("verifier"),
        train: maporl::config::VerifierTrainConfig {
            epochs: 1,
            batch_size: 4,
            val_fraction: 0.0,
            checkpoint_every: 0,
            ..Default::default()
        },
        max_response_tokens: 16,
        seed: 1,
        dtype: candle_core::DType::F32,
        device: candle_core::Device::Cpu,
        resume: false,
        stop_after: None,
        verbose: false,
    };
    train(&opts, &AtomicBool::new(false)).unwrap();
}

fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(std::time::Duration::from_secs(300)))
        .build()
        .into()
}

/// (status, body as JSON).
fn post(base: &str, path: &str, body: &str) -> (u16, Value) {
    let mut r = client()
        .post(&format!("{base}{path}"))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    let v =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
    (status, v)
}

fn get(base: &str, path: &str) -> (u16, String) {
    let mut r = client().get(&format!("{base}{path}")).call().unwrap();
    let status = r.status().as_u16();
    (status, r.body_mut().read_to_string().unwrap())
}

fn chat_body(agent: usize, question: &str, seed: u64, stream: bool) -> String {
    json!({
        "model": format!("agent-{agent}"),
        "messages": [{"role": "user", "content": question}],
        "seed": seed,
        "max_tokens": 10,
        "stream": stream,
    })
    .to_string()
}

/// The streamed text of a chat request, its finish reason, its chunks' count, and when the
/// text's last chunk came.
fn stream(base: &str, body: &str) -> (String, String, usize, std::time::Instant) {
    let r = client()
        .post(&format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .send(body)
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ctype = r
        .headers()
        .get("content-type")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    let reader = BufReader::new(r.into_body().into_reader());
    let (mut text, mut finish, mut chunks, mut done) = (String::new(), String::new(), 0, false);
    let mut last_text = std::time::Instant::now();
    for line in reader.lines() {
        let line = line.unwrap();
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        assert!(!done, "data after [DONE]: {data}");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk", "{v}");
        chunks += 1;
        let choice = &v["choices"][0];
        if let Some(t) = choice["delta"]["content"].as_str() {
            text.push_str(t);
            last_text = std::time::Instant::now();
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    assert!(done, "the stream ended without [DONE]");
    (text, finish, chunks, last_text)
}

/// Polls `/health` until its `field` is `value` (a minute at most).
fn wait_for_health(base: &str, field: &str, value: u64) {
    let t0 = std::time::Instant::now();
    loop {
        let (_, h) = get(base, "/health");
        let h: Value = serde_json::from_str(&h).unwrap();
        if h[field].as_u64() == Some(value) {
            return;
        }
        assert!(
            t0.elapsed().as_secs() < 60,
            "{field} never reached {value}: {h}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// 32 clients at once each get the completion the library gives for their agent, question
/// and seed (so answers are correct and independent of each other); the same seed again
/// gives the same text; a stream gives the same text as a whole answer; debates repeat by
/// seed; bad requests are refused with JSON errors and the server keeps serving.
#[test]
fn concurrent_clients_get_their_own_seeded_answers_and_bad_requests_get_4xx() {
    let s = serve(
        "",
        &[
            "--workers",
            "2",
            "--queue",
            "64",
            "--max-body-bytes",
            "65536",
            "--max-prompt-tokens",
            "200",
        ],
    );
    let base = s.base.clone();

    let (status, health) = get(&base, "/health");
    assert_eq!(status, 200, "{health}");
    let health: Value = serde_json::from_str(&health).unwrap();
    assert_eq!(
        (health["status"].as_str(), health["agents"].as_u64()),
        (Some("ok"), Some(2))
    );
    let (_, models) = get(&base, "/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["agent-0", "agent-1"]);

    // What the library says for each (agent, question, seed).
    let config = maporl::config::Config::load(&s.config, &[]).unwrap();
    let team = maporl::session::load_team(&config).unwrap();
    let requests: Vec<(usize, String, u64)> = (0..32)
        .map(|i| (i % 2, format!("What is {i} + {}?", 40 - i), 1000 + i as u64))
        .collect();
    let expected: Vec<String> = requests
        .iter()
        .map(|(a, q, seed)| {
            let messages = [maporl::transcript::ChatMessage {
                role: maporl::transcript::Role::User,
                content: q.clone(),
            }];
            let opts = maporl::debate::CompletionOptions {
                sampling: team.sampling(*a),
                seed: *seed,
                max_tokens: 10,
                stop: vec![],
                n: 1,
            };
            let c = team
                .complete(*a, &messages, &opts, &mut |_, _| true)
                .unwrap();
            c.choices[0].text.clone()
        })
        .collect();
    assert!(
        expected
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len()
            > 16,
        "the seeds should give different answers: {expected:?}"
    );

    let answers = |round: usize| -> Vec<String> {
        let handles: Vec<_> = requests
            .iter()
            .map(|(a, q, seed)| {
                let (base, body) = (base.clone(), chat_body(*a, q, *seed, false));
                std::thread::spawn(move || post(&base, "/v1/chat/completions", &body))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let (status, v) = h.join().unwrap();
                assert_eq!(status, 200, "round {round}: {v}");
                assert_eq!(v["object"], "chat.completion");
                let usage = &v["usage"];
                assert_eq!(
                    usage["total_tokens"].as_u64(),
                    Some(
                        usage["prompt_tokens"].as_u64().unwrap()
                            + usage["completion_tokens"].as_u64().unwrap()
                    )
                );
                assert!(usage["completion_tokens"].as_u64().unwrap() <= 10);
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let first = answers(1);
    assert_eq!(
        first, expected,
        "concurrent answers differ from the library's"
    );
    assert_eq!(answers(2), first, "the same seeds gave different answers");

    // A stream carries the same text as the whole answer of the same seed.
    let (a, q, seed) = &requests[5];
    let (text, finish, chunks, _) = stream(&base, &chat_body(*a, q, *seed, true));
    assert_eq!(text, expected[5]);
    assert!(finish == "stop" || finish == "length", "{finish}");
    assert!(chunks >= 2, "{chunks} chunks");

    // A stop string cuts the answer where it first appears, in a whole answer and a stream.
    let (i, cut) = expected
        .iter()
        .enumerate()
        .find_map(|(i, t)| {
            let chars: Vec<(usize, char)> = t.char_indices().collect();
            (chars.len() >= 8).then(|| (i, chars[4].0))
        })
        .expect("an answer of 8 characters or more");
    let stop: String = expected[i][cut..].chars().take(3).collect();
    let (a, q, seed) = &requests[i];
    let with_stop = |stream: bool| {
        let mut v: Value = serde_json::from_str(&chat_body(*a, q, *seed, stream)).unwrap();
        v["stop"] = json!([stop]);
        v.to_string()
    };
    let (status, v) = post(&base, "/v1/chat/completions", &with_stop(false));
    assert_eq!(status, 200, "{v}");
    let first_stop = expected[i].find(&stop).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(&expected[i][..first_stop]),
        "stop {stop:?} in {:?}",
        expected[i]
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (text, finish, _, _) = stream(&base, &with_stop(true));
    assert_eq!(
        (text.as_str(), finish.as_str()),
        (&expected[i][..first_stop], "stop")
    );

    // `n` completions come from one stream of the seed: reproducible, and not all equal.
    let body = json!({"model": "agent-0", "messages": [{"role": "user", "content": "Hi"}],
                      "seed": 9, "n": 3, "max_tokens": 8})
    .to_string();
    let (status, v) = post(&base, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 3);
    assert_eq!(
        post(&base, "/v1/chat/completions", &body).1["choices"],
        v["choices"]
    );

    // Whole debates through the plugins: every turn, every agent, scores and rewards.
    let debate = json!({"question": "What is 2 + 3?", "reference": "5", "seed": 4}).to_string();
    let (status, d) = post(&base, "/v1/debate", &debate);
    assert_eq!(status, 200, "{d}");
    let turns = d["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{d}");
    for (t, turn) in turns.iter().enumerate() {
        assert_eq!(turn["turn"].as_u64(), Some(t as u64 + 1));
        let utterances = turn["utterances"].as_array().unwrap();
        assert_eq!(utterances.len(), 2, "{turn}");
        for u in utterances {
            assert!(u["score"].is_number() && u["correct"].is_boolean(), "{u}");
            assert!(u["reward"]["total"].is_number(), "{u}");
        }
    }
    assert_eq!(
        post(&base, "/v1/debate", &debate).1,
        d,
        "the same seed gave another debate"
    );

    // Bad requests: each a JSON error with the right status, naming what was wrong.
    let long = "word ".repeat(5000);
    let huge = "x".repeat(70_000);
    for (path, body, status, says) in [
        ("/v1/chat/completions", "{not json", 400, "the request body"),
        ("/v1/chat/completions", &chat_body(7, "q", 1, false), 404, "agent-0 … agent-1"),
        (
            "/v1/chat/completions",
            &json!({"model": "agent-0", "messages": [{"role": "user", "content": "q"}], "max_tokens": 13}).to_string(),
            400,
            "`max_tokens` is 13",
        ),
        ("/v1/chat/completions", &chat_body(0, &long, 1, false), 400, "positions"),
        ("/v1/chat/completions", &chat_body(0, &huge, 1, false), 413, "65536 bytes"),
        (
            "/v1/chat/completions",
            &chat_body(0, &"word ".repeat(300), 1, false),
            400,
            "--max-prompt-tokens",
        ),
        ("/v1/debate", r#"{"question": ""}"#, 400, "`question` is empty"),
        (
            "/v1/debate",
            &json!({"question": "word ".repeat(300)}).to_string(),
            400,
            "this server reads at most 200",
        ),
        ("/v1/judge", r#"{"question": "q", "responses": ["a"]}"#, 404, "no learned verifier"),
        ("/v1/nothing", "{}", 404, "no such route"),
    ] {
        let (got, v) = post(&base, path, body);
        assert_eq!(got, status, "{path} {}: {v}", &body[..body.len().min(80)]);
        let message = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{v}"));
        assert!(message.contains(says), "{path}: {message}");
    }
    let r = client()
        .get(&format!("{base}/v1/chat/completions"))
        .call()
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);

    // Still serving, and the metrics counted all of it.
    let (a, q, seed) = &requests[0];
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(*a, q, *seed, false),
    );
    assert_eq!(
        (status, v["choices"][0]["message"]["content"].as_str()),
        (200, Some(expected[0].as_str()))
    );
    let (_, m) = get(&base, "/metrics");
    let route = "route=\"/v1/chat/completions\"";
    assert_eq!(
        metric(
            &m,
            &format!("maporl_requests_total{{{route},status=\"200\"}}")
        ),
        70.0,
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            &format!("maporl_requests_total{{{route},status=\"400\"}}")
        ),
        4.0
    );
    assert_eq!(
        metric(
            &m,
            &format!("maporl_requests_total{{{route},status=\"413\"}}")
        ),
        1.0
    );
    assert_eq!(
        metric(
            &m,
            &format!("maporl_request_duration_seconds_count{{{route}}}")
        ),
        76.0
    );
    assert!(metric(&m, "maporl_generated_tokens_total{agent=\"0\"}") > 0.0);
    assert_eq!(metric(&m, "maporl_queue_depth"), 0.0);
    assert_eq!(metric(&m, "maporl_workers"), 2.0);
}

/// The learned verifier as a remote reward model: `/v1/judge` gives the numbers the library
/// gives. SIGTERM while a request is in flight: the request still completes, then the
/// server stops listening and exits 0.
#[test]
fn judge_answers_like_the_library_and_sigterm_finishes_in_flight_requests() {
    let mut s = serve(
        "[verifier]\ncheckpoint = \"DIR/verifier/checkpoints/final\"\n",
        &["--workers", "1", "--queue", "1", "--max-tokens", "4000"],
    );
    let base = s.base.clone();
    let responses = ["\\boxed{3}", "The answer is \\boxed{4}.", "no idea"];
    let body = json!({"question": "What is 1 + 2?", "responses": responses}).to_string();
    let (status, v) = post(&base, "/v1/judge", &body);
    assert_eq!(status, 200, "{v}");
    let served: Vec<f64> = v["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    let config = maporl::config::Config::load(&s.config, &[]).unwrap();
    let judge = maporl::verifier::LearnedVerifier::from_config(&config)
        .unwrap()
        .unwrap();
    let pairs: Vec<(&str, &str)> = responses.iter().map(|r| ("What is 1 + 2?", *r)).collect();
    let direct = judge.probabilities(&pairs).unwrap();
    assert_eq!(served.len(), 3);
    for (a, b) in served.iter().zip(&direct) {
        assert!((a - *b as f64).abs() < 1e-6, "{served:?} vs {direct:?}");
    }
    assert_eq!(v["checkpoint_sha256"].as_str(), Some(judge.sha256()));

    // Full: one request generating, one waiting (--queue 1); a third is refused with 429 and
    // Retry-After, and the two others are served.
    let busy_until = |field: &str, value: u64| wait_for_health(&base, field, value);
    let long_body = |seed: u64| {
        json!({"model": "agent-0", "messages": [{"role": "user", "content": "Tell a story."}],
               "seed": seed, "max_tokens": 4000, "temperature": 1.0, "stream": true})
        .to_string()
    };
    let b = base.clone();
    let generating = std::thread::spawn(move || stream(&b, &long_body(3)));
    busy_until("busy_workers", 1);
    let b = base.clone();
    let waiting =
        std::thread::spawn(move || post(&b, "/v1/chat/completions", &chat_body(1, "q", 2, false)));
    busy_until("queue_depth", 1);
    let mut refused = client()
        .post(&format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .send(&chat_body(0, "q", 1, false))
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    let v: Value = serde_json::from_str(&refused.body_mut().read_to_string().unwrap()).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the server is busy"),
        "{v}"
    );
    assert!(!generating.join().unwrap().0.is_empty());
    let (status, v) = waiting.join().unwrap();
    assert_eq!(status, 200, "{v}");
    let (_, m) = get(&base, "/metrics");
    assert_eq!(metric(&m, "maporl_rejected_busy_total"), 1.0, "{m}");

    // A long stream in flight, then SIGTERM: text still comes after it, and the stream ends
    // with [DONE].
    let long =
        json!({"model": "agent-0", "messages": [{"role": "user", "content": "Tell a story."}],
                      "seed": 3, "max_tokens": 4000, "temperature": 1.0, "stream": true})
        .to_string();
    let b = base.clone();
    let in_flight = std::thread::spawn(move || stream(&b, &long));
    // Wait until the worker is busy with it.
    wait_for_health(&base, "busy_workers", 1);
    let terminated = std::time::Instant::now();
    unsafe {
        libc::kill(s.child.id() as i32, libc::SIGTERM);
    }
    let (text, finish, _, last_text) = in_flight.join().unwrap();
    assert!(
        !text.is_empty() && (finish == "stop" || finish == "length"),
        "{finish}: {text}"
    );
    assert!(
        last_text > terminated,
        "no text came after SIGTERM: the stream was over before ({} tokens' worth)",
        text.len()
    );
    eprintln!(
        "text kept coming for {:?} after SIGTERM",
        last_text.duration_since(terminated)
    );
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let refused = client().get(&format!("{base}/health")).call();
    assert!(refused.is_err(), "still listening after SIGTERM");
}

/// `--run RUN_DIR`: the run's config, and each agent with its adapter from
/// `checkpoints/final/agent-N` (here agent 1 only): its answers are the library's with that
/// adapter, not the base's.
#[test]
fn a_training_run_is_served_with_its_agents_adapters() {
    let mut s = serve("", &[]);
    let _ = s.child.kill();
    let dir = s._dir.path().to_path_buf();
    let dir = dir.as_path();
    let run = dir.join("run");
    std::fs::create_dir_all(run.join("checkpoints/final")).unwrap();
    std::fs::copy(&s.config, run.join("config.toml")).unwrap();
    let config = maporl::config::Config::load(&s.config, &[]).unwrap();
    let loaded = maporl::model::load(
        Path::new(config.agent_model(1)),
        candle_core::DType::F32,
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let lora = maporl::model::Lora::new(
        &loaded.base,
        maporl::model::LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: vec!["q_proj".into(), "v_proj".into()],
        },
        5,
    )
    .unwrap();
    for (name, var) in lora.named_vars() {
        if name.contains("lora_B") {
            let noise =
                candle_core::Tensor::randn(0f32, 0.5, var.shape(), &candle_core::Device::Cpu)
                    .unwrap();
            var.set(&noise).unwrap();
        }
    }
    let adapter = run.join("checkpoints/final/agent-1");
    lora.save(&adapter, "tiny").unwrap();

    let (child, base) = spawn(&["--run".into(), run.display().to_string()]);
    let _guard = Served {
        child,
        base: base.clone(),
        _dir: tempfile::tempdir().unwrap(),
        config: PathBuf::new(),
    };
    let (_, models) = get(&base, "/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["adapter"], Value::Null, "{models}");
    assert_eq!(
        models["data"][1]["adapter"].as_str(),
        Some(adapter.display().to_string().as_str())
    );

    let mut adapted = config.clone();
    adapted.agents.resize_with(2, Default::default);
    adapted.agents[1].adapter = adapter.display().to_string();
    let library = |config: &maporl::config::Config| {
        let team = maporl::session::load_team(config).unwrap();
        let messages = [maporl::transcript::ChatMessage {
            role: maporl::transcript::Role::User,
            content: "What is 3 + 4?".into(),
        }];
        let opts = maporl::debate::CompletionOptions {
            sampling: team.sampling(1),
            seed: 11,
            max_tokens: 10,
            stop: vec![],
            n: 1,
        };
        team.complete(1, &messages, &opts, &mut |_, _| true)
            .unwrap()
            .choices[0]
            .text
            .clone()
    };
    let (with_adapter, without) = (library(&adapted), library(&config));
    assert_ne!(
        with_adapter, without,
        "the adapter should change the answer"
    );
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(1, "What is 3 + 4?", 11, false),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["message"]["content"].as_str(),
        Some(with_adapter.as_str())
    );

    // A run without adapters is refused, saying why.
    let empty = dir.join("empty-run");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::copy(run.join("config.toml"), empty.join("config.toml")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["serve", "--run"])
        .arg(&empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds no agent adapters"), "{err}");
}

/// A client that starts a stream and stops reading cannot hold the server up: after SIGTERM,
/// `--shutdown-timeout` later, it stops anyway and exits 0.
#[test]
fn a_client_that_stops_reading_cannot_hold_up_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path());
    let log = dir.path().join("stderr.log");
    let args: Vec<String> = ["--config", &config.display().to_string(), "--workers", "1"]
        .into_iter()
        .chain(["--max-tokens", "4000", "--shutdown-timeout", "1"])
        .map(String::from)
        .collect();
    let (child, base) = spawn_logging(&args, Stdio::from(std::fs::File::create(&log).unwrap()));
    let mut s = Served {
        child,
        base: base.clone(),
        _dir: dir,
        config,
    };
    // A raw connection that asks for a long stream (4 completions of up to 4000 tokens:
    // megabytes of events) and never reads.
    let body = json!({"model": "agent-0", "messages": [{"role": "user", "content": "Go on."}],
                      "seed": 3, "n": 4, "max_tokens": 4000, "stream": true})
    .to_string();
    let addr = base.strip_prefix("http://").unwrap();
    let mut stalled = std::net::TcpStream::connect(addr).unwrap();
    use std::io::Write;
    write!(
        stalled,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    wait_for_health(&base, "busy_workers", 1);
    unsafe {
        libc::kill(s.child.id() as i32, libc::SIGTERM);
    }
    let status = s.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let stderr = std::fs::read_to_string(s._dir.path().join("stderr.log")).unwrap();
    assert!(
        stderr.contains("after the shutdown signal: stopping anyway"),
        "{stderr}"
    );
    drop(stalled);
}

/// A server's debates (seated views of one team) are the same for the same seed whatever
/// was asked before or beside them. Each seat shares prompt prefixes within its own
/// debate only: a prefix another request left in a shared cache would be reused where it
/// was computed whole the first time, and change the rounding of the log-probs (and at
/// times a sampled token). A learner's recorded log-probs show the rounding.
#[test]
fn a_seated_debate_does_not_depend_on_what_was_asked_before() {
    use maporl::debate::{Request, Team};
    use maporl::model::{Lora, LoraConfig, ValueHead};
    use maporl::transcript::{ChatMessage, Role};

    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path());
    let config = maporl::config::Config::load(&config, &[]).unwrap();
    assert!(
        config.generation.prefix_cache_mib > 0,
        "the cache should be on"
    );
    let mut team = maporl::session::load_team(&config).unwrap();
    for a in 0..2 {
        let agent = team.agent_mut(a);
        let targets = ["q_proj", "v_proj"].map(String::from).to_vec();
        let cfg = LoraConfig {
            r: 4,
            alpha: 8.0,
            target_modules: targets,
        };
        agent.lora = Some(Lora::new(&agent.base, cfg, 5 + a as u64).unwrap());
        let hidden = agent.base.config().hidden_size;
        let device = candle_core::Device::Cpu;
        let head = ValueHead::new(hidden, candle_core::DType::F32, &device, 7).unwrap();
        agent.value_head = Some(head);
        team.mark_learner(a);
    }
    let user = |q: &str| ChatMessage {
        role: Role::User,
        content: q.to_string(),
    };
    let first = [user("What is 12 + 30? Answer with a number.")];
    // Another conversation that extends the first one's prompt.
    let longer = [
        first[0].clone(),
        ChatMessage {
            role: Role::Assistant,
            content: "42".into(),
        },
        user("Are you sure? Check again."),
    ];
    /// Both agents' answers to `m` in a debate seated with `seed`: their texts, tokens,
    /// log-probs and values.
    type Answers = Vec<(String, Vec<u32>, Vec<f32>, Vec<f32>)>;
    fn debate(team: &maporl::debate::ModelTeam, seed: u64, m: &[ChatMessage]) -> Answers {
        let ask = |agent| Request {
            task: "t",
            agent,
            messages: m,
        };
        let mut seat = team.seated(seed);
        let responses = seat.respond(1, &[ask(0), ask(1)]).unwrap();
        responses
            .into_iter()
            .map(|r| {
                let trace = r.ids.policy.expect("a learner records its log-probs");
                (r.text, r.ids.response, trace.logprobs, trace.values)
            })
            .collect()
    }
    let alone = debate(&team, 4, &first);
    // Other requests first, then the same one again: the same answer, bit for bit.
    debate(&team, 9, &longer);
    debate(&team, 5, &first);
    assert_eq!(debate(&team, 4, &first), alone, "after other debates");
    // And beside another seat's debate.
    let beside = std::thread::scope(|s| {
        let other = s.spawn(|| debate(&team, 11, &longer));
        let mine = debate(&team, 4, &first);
        other.join().unwrap();
        mine
    });
    assert_eq!(beside, alone, "beside another debate");
}

// Hostile clients: slow heads and bodies, unfinished bodies, connection floods, and SIGTERM
// with a full queue. Each bound below is generous for a loaded 2-core machine; the figures
// themselves are measured by scripts/serve_hostile.py (BENCHMARKS.md).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The tiny team served with `args`, each piece of chat text and each debate turn `slow_ms`
/// longer (the `test-hooks` feature's MAPORL_TEST_SERVE_SLOW_MS), its stderr in
/// DIR/stderr.log.
fn serve_hostile(args: &[&str], slow_ms: u64) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path());
    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
    let mut all = vec!["--config".to_string(), config.display().to_string()];
    all.extend(args.iter().map(|a| a.to_string()));
    let slow = slow_ms.to_string();
    let (child, base) = spawn_with(
        &all,
        Stdio::from(log),
        &[("MAPORL_TEST_SERVE_SLOW_MS", slow.as_str())],
    );
    Served {
        child,
        base,
        _dir: dir,
        config,
    }
}

fn stderr_of(s: &Served) -> String {
    std::fs::read_to_string(s._dir.path().join("stderr.log")).unwrap()
}

fn connect(base: &str) -> TcpStream {
    TcpStream::connect(base.strip_prefix("http://").unwrap()).unwrap()
}

/// A connection that has sent `bytes` (a request head, whole or not).
fn sent(base: &str, bytes: &[u8]) -> TcpStream {
    let mut c = connect(base);
    c.write_all(bytes).unwrap();
    c
}

/// What `c` receives until the server closes it (or resets it), and when that was after
/// `since`; panics if it is still open `bound` after `since`.
fn read_until_closed(
    c: &mut TcpStream,
    since: Instant,
    bound: Duration,
    what: &str,
) -> (String, Duration) {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let Some(left) = bound.checked_sub(since.elapsed()) else {
            panic!(
                "{what}: still open {bound:?} later, having received {:?}",
                String::from_utf8_lossy(&got)
            );
        };
        c.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break, // reset: closed too
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), since.elapsed())
}

/// One whole response (with a Content-Length) read from `c`, within `bound`.
fn read_answer(c: &mut TcpStream, bound: Duration) -> String {
    c.set_read_timeout(Some(bound)).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            });
            if length.is_some_and(|n| body.len() >= n) {
                return text;
            }
        }
        let n = c
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("no whole answer within {bound:?} ({e}): {text:?}"));
        assert!(n > 0, "closed before a whole answer: {text:?}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Whether the server has closed `c` (without waiting), and what it had sent.
fn is_closed(c: &mut TcpStream) -> (bool, String) {
    c.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    c.set_nonblocking(false).unwrap();
    (closed, String::from_utf8_lossy(&got).into_owned())
}

/// The status of a raw HTTP response, and its body as JSON (Null if it is not).
fn response_of(raw: &str) -> (u16, Value) {
    let status = raw
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {raw:?}"));
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// The server's resident memory (VmRSS), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {status}"))
}

/// `/health` on a new connection, which must answer 200 within `bound`: its JSON, and how
/// long it took.
fn health_within(base: &str, bound: Duration) -> (Value, Duration) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(bound))
        .build()
        .into();
    let t = Instant::now();
    let mut r = agent
        .get(&format!("{base}/health"))
        .call()
        .unwrap_or_else(|e| panic!("/health did not answer within {bound:?}: {e}"));
    let took = t.elapsed();
    assert_eq!(r.status().as_u16(), 200);
    (
        serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap(),
        took,
    )
}

const POST_CHAT: &str = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: \
                         application/json\r\n";

/// Slow-loris heads in four shapes (nothing sent; a head trickling in a byte at a time;
/// fifty half-sent heads; a kept-alive connection gone idle) are each closed about
/// `--header-timeout` after the server began waiting, and counted.
#[test]
fn slow_request_heads_are_cut_after_the_header_timeout() {
    let s = serve_hostile(
        &[
            "--header-timeout",
            "1",
            "--body-timeout",
            "1",
            "--request-timeout",
            "3",
        ],
        0,
    );
    let base = s.base.clone();
    let bound = Duration::from_secs(10);
    let t = Instant::now();
    let mut silent = connect(&base);
    let mut trickle = sent(&base, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ");
    let mut writer = trickle.try_clone().unwrap();
    let trickling = std::thread::spawn(move || {
        let mut bytes = 0;
        while writer.write_all(b"a").is_ok() {
            bytes += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
        bytes
    });
    let mut half: Vec<TcpStream> = (0..50)
        .map(|_| sent(&base, b"GET /health HTTP/1.1\r\nHost: x\r\n"))
        .collect();
    let mut idle = sent(&base, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n");

    let (got, took) = read_until_closed(&mut silent, t, bound, "a silent connection");
    assert!(
        got.is_empty() && took >= Duration::from_millis(900),
        "{took:?} {got:?}"
    );
    let (got, took) = read_until_closed(&mut trickle, t, bound, "a trickling head");
    assert!(
        got.is_empty() && took >= Duration::from_millis(900),
        "{took:?} {got:?}"
    );
    // It kept sending until it was cut, and was cut for all that.
    assert!(trickling.join().unwrap() >= 5);
    for (i, c) in half.iter_mut().enumerate() {
        let (got, _) = read_until_closed(c, t, bound, &format!("half-sent head {i}"));
        assert!(got.is_empty(), "{got:?}");
    }
    // The kept-alive connection got its answer, then was closed when idle for as long.
    let (got, took) = read_until_closed(&mut idle, t, bound, "an idle kept-alive connection");
    assert_eq!(response_of(&got).0, 200, "{got}");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    eprintln!("slow heads cut {:?} after they connected", t.elapsed());

    let (_, m) = get(&base, "/metrics");
    assert!(metric(&m, "maporl_head_timeouts_total") >= 53.0, "{m}");
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(0, "What is 1 + 1?", 1, false),
    );
    assert_eq!(status, 200, "{v}");
}

/// Slow bodies: one that stalls is answered 408 after `--body-timeout`; one that trickles in
/// (plain or chunked) fast enough for that is answered 408 at `--request-timeout`, counted
/// from the connection, a slow head included. The server goes on serving.
#[test]
fn slow_request_bodies_get_408_after_the_body_or_request_timeout() {
    let s = serve_hostile(
        &[
            "--header-timeout",
            "2.5",
            "--body-timeout",
            "1",
            "--request-timeout",
            "3",
        ],
        0,
    );
    let base = s.base.clone();
    let bound = Duration::from_secs(12);
    /// Sends `first`, then `piece` every `every` until the connection fails.
    fn dribble(mut c: TcpStream, first: Vec<u8>, piece: &'static [u8], every: Duration) {
        std::thread::spawn(move || {
            for b in first {
                if c.write_all(&[b]).is_err() {
                    return;
                }
            }
            while c.write_all(piece).is_ok() {
                std::thread::sleep(every);
            }
        });
    }
    let t = Instant::now();
    let mut stalled = sent(
        &base,
        format!("{POST_CHAT}Content-Length: 100\r\n\r\n{{\"model\": ").as_bytes(),
    );
    let plain = connect(&base);
    let mut plain_reader = plain.try_clone().unwrap();
    dribble(
        plain,
        format!("{POST_CHAT}Content-Length: 100000\r\n\r\n").into_bytes(),
        b" ",
        Duration::from_millis(250),
    );
    let chunked = connect(&base);
    let mut chunked_reader = chunked.try_clone().unwrap();
    dribble(
        chunked,
        format!("{POST_CHAT}Transfer-Encoding: chunked\r\n\r\n").into_bytes(),
        b"1\r\n \r\n",
        Duration::from_millis(250),
    );
    // A head that takes 1.8 s (within --header-timeout), then a trickling body: the 3 s
    // count from the connection, not from the head.
    let slow_head = connect(&base);
    let mut slow_head_reader = slow_head.try_clone().unwrap();
    let t_slow = Instant::now();
    std::thread::spawn(move || {
        let mut c = slow_head;
        let head = format!("{POST_CHAT}Content-Length: 100000\r\n\r\n");
        for part in head.as_bytes().chunks(head.len() / 4 + 1) {
            if c.write_all(part).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(600));
        }
        while c.write_all(b" ").is_ok() {
            std::thread::sleep(Duration::from_millis(250));
        }
    });

    let (got, took) = read_until_closed(&mut stalled, t, bound, "a stalled body");
    let (status, v) = response_of(&got);
    assert_eq!(status, 408, "{got}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--body-timeout"),
        "{v}"
    );
    assert!(took >= Duration::from_millis(900), "{took:?}");
    for (what, c) in [
        ("a trickling body", &mut plain_reader),
        ("a trickling chunked body", &mut chunked_reader),
    ] {
        let (got, took) = read_until_closed(c, t, bound, what);
        let (status, v) = response_of(&got);
        assert_eq!(status, 408, "{what}: {got}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains("--request-timeout"), "{what}: {message}");
        assert!(took >= Duration::from_millis(2800), "{what}: {took:?}");
    }
    let (got, took) = read_until_closed(&mut slow_head_reader, t_slow, bound, "a slow head");
    assert_eq!(response_of(&got).0, 408, "{got}");
    assert!(
        took >= Duration::from_millis(2800) && took < Duration::from_millis(4200),
        "408 {took:?} after connecting: the deadline should count from the connection (3 s), \
         not from the head (1.8 s later)"
    );

    let (_, m) = get(&base, "/metrics");
    assert_eq!(metric(&m, "maporl_body_timeouts_total"), 1.0, "{m}");
    assert_eq!(metric(&m, "maporl_request_timeouts_total"), 3.0, "{m}");
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(1, "What is 2 + 2?", 2, false),
    );
    assert_eq!(status, 200, "{v}");
}

/// 200 bodies of 1 MiB, each sent but for its last byte, and 40 chunked ones: the server
/// holds at most `--max-buffered-body-bytes` (8 MiB) of them, answers the others 503 at
/// once, and its resident memory grows by less than that and 40 MiB (it grew by over
/// 400 MB for 400 such bodies before the budget). Bodies that are declared but not sent
/// take nothing from the budget, and what the budget held is given back.
#[test]
fn unfinished_bodies_hold_no_more_than_the_body_budget() {
    let budget: u64 = 8 << 20;
    let s = serve_hostile(
        &[
            "--max-connections",
            "512",
            "--max-buffered-body-bytes",
            &budget.to_string(),
            "--header-timeout",
            "30",
            "--body-timeout",
            "30",
            "--request-timeout",
            "60",
        ],
        0,
    );
    let base = s.base.clone();
    let pid = s.child.id();
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(0, "What is 3 + 3?", 3, false),
    );
    assert_eq!(status, 200, "{v}");
    let before = rss_kib(pid);

    let mib = vec![b' '; 1 << 20];
    let mut open: Vec<TcpStream> = Vec::new();
    for i in 0..240 {
        let mut c = connect(&base);
        c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        if i < 200 {
            let _ =
                c.write_all(format!("{POST_CHAT}Content-Length: {}\r\n\r\n", 1 << 20).as_bytes());
            let _ = c.write_all(&mib[..(1 << 20) - 1]);
        } else {
            let _ =
                c.write_all(format!("{POST_CHAT}Transfer-Encoding: chunked\r\n\r\n").as_bytes());
            for piece in mib.chunks(64 << 10) {
                if c.write_all(format!("{:x}\r\n", piece.len()).as_bytes())
                    .is_err()
                    || c.write_all(piece).is_err()
                    || c.write_all(b"\r\n").is_err()
                {
                    break;
                }
            }
        }
        open.push(c);
    }
    // Let the server read what it will.
    std::thread::sleep(Duration::from_secs(2));
    let after = rss_kib(pid);
    let grown = after.saturating_sub(before) / 1024;
    eprintln!("240 unfinished 1 MiB bodies: resident {before} -> {after} KiB (+{grown} MiB)");
    assert!(
        grown < budget / (1 << 20) + 40,
        "the server grew by {grown} MiB under 240 unfinished bodies of 1 MiB"
    );
    let (mut refused, mut held) = (0, Vec::new());
    for (i, c) in open.iter_mut().enumerate() {
        let (closed, got) = is_closed(c);
        if !got.is_empty() {
            let (status, v) = response_of(&got);
            assert_eq!(status, 503, "{got}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("--max-buffered-body-bytes"),
                "{v}"
            );
            refused += 1;
        } else if !closed {
            held.push(i);
        }
    }
    eprintln!("{refused} answered 503, {} held", held.len());
    assert!(refused >= 150, "only {refused} of 240 were answered 503");
    assert!(
        !held.is_empty() && held.len() <= 8,
        "{} bodies held under a budget of 8 MiB",
        held.len()
    );
    // A held body is being read, not dropped: its last byte makes it whole, and it is
    // answered (it is no JSON).
    let whole = held.iter().copied().find(|&i| i < 200);
    if let Some(i) = whole {
        let c = &mut open[i];
        c.write_all(b" ").unwrap();
        let got = read_answer(c, Duration::from_secs(20));
        let (status, v) = response_of(&got);
        assert_eq!(status, 400, "{got}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("column 1048576"),
            "{v}"
        );
    }
    drop(open);
    // What they held is given back.
    let t = Instant::now();
    loop {
        let (_, m) = get(&base, "/metrics");
        if metric(&m, "maporl_body_bytes_buffered") == 0.0 {
            assert!(metric(&m, "maporl_body_budget_refused_total") >= refused as f64);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the budget was not given back: {m}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // 100 bodies that declare 1 MiB and send 10 bytes hold 1000 bytes of the budget, and
    // others are still read.
    let declared: Vec<TcpStream> = (0..100)
        .map(|_| {
            sent(
                &base,
                format!("{POST_CHAT}Content-Length: {}\r\n\r\n{{\"model\":", 1 << 20).as_bytes(),
            )
        })
        .collect();
    let (status, v) = post(
        &base,
        "/v1/chat/completions",
        &chat_body(1, "What is 4 + 4?", 4, false),
    );
    assert_eq!(status, 200, "{v}");
    let (_, m) = get(&base, "/metrics");
    assert!(metric(&m, "maporl_body_bytes_buffered") <= 1000.0, "{m}");
    drop(declared);
}

/// Connections beyond `--max-connections` are not served: with the cap reached by a full
/// server (its worker busy, its queue full) and half-sent heads, a flood of 300 more is
/// closed (all but the reserve at once, the reserve within its 2 s), anything but `/health`
/// and `/metrics` beyond the cap is answered 503, and `/health` answers within a bound,
/// right after the flood too. Once `--header-timeout` has cut the heads, new clients are
/// served again.
#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "holds the worker busy through a hook: needs --features test-hooks"
)]
fn a_connection_flood_is_capped_and_health_answers_while_saturated() {
    let s = serve_hostile(
        &[
            "--workers",
            "1",
            "--queue",
            "2",
            "--max-connections",
            "16",
            "--header-timeout",
            "5",
            "--request-timeout",
            "5",
            "--max-tokens",
            "4000",
        ],
        50,
    );
    let base = s.base.clone();
    let bound = Duration::from_secs(5);
    // The worker busy with a long stream, two requests queued behind it: 3 connections.
    let long = |seed: u64, stream: bool| {
        let body = json!({"model": "agent-0", "messages": [{"role": "user", "content": "Go."}],
                          "seed": seed, "max_tokens": 4000, "stream": stream})
        .to_string();
        sent(
            &base,
            format!("{POST_CHAT}Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes(),
        )
    };
    let mut saturating = vec![long(1, true)];
    wait_for_health(&base, "busy_workers", 1);
    saturating.push(long(2, false));
    saturating.push(long(3, false));
    wait_for_health(&base, "queue_depth", 2);
    // Those three and a probe kept alive, so that no slot is still being freed when the
    // heads arrive: a probe that closes frees its slot some time after it was answered, and
    // a head sent meanwhile would be taken over the cap while a later client found the slot.
    let mut probe = connect(&base);
    let t = Instant::now();
    loop {
        probe
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let (status, h) = response_of(&read_answer(&mut probe, bound));
        assert_eq!(status, 200, "{h}");
        if h["connections"].as_u64() == Some(4) {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{h}");
        std::thread::sleep(Duration::from_millis(5));
    }
    // 12 half-sent heads reach the cap of 16.
    let t0 = Instant::now();
    let mut heads: Vec<TcpStream> = (0..12)
        .map(|_| sent(&base, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"))
        .collect();
    let t = Instant::now();
    loop {
        let (status, v) = get(&base, "/v1/models");
        if status == 503 {
            let message = v.as_str();
            assert!(message.contains("--max-connections"), "{message}");
            break;
        }
        assert!(t.elapsed() < bound, "the cap of 16 was never reached");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A flood of 300 more half-sent heads, and /health right after it.
    let mut flood: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut c = connect(&base);
            let _ = c.write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n");
            c
        })
        .collect();
    let t_flood = Instant::now();
    let mut latencies = Vec::new();
    for _ in 0..10 {
        let (h, took) = health_within(&base, bound);
        assert_eq!(
            (
                h["busy_workers"].as_u64(),
                h["queue_depth"].as_u64(),
                h["connections"].as_u64(),
                h["max_connections"].as_u64()
            ),
            (Some(1), Some(2), Some(16), Some(16)),
            "{h}"
        );
        latencies.push(took);
    }
    eprintln!("/health while saturated: {latencies:?}");
    let (status, v) = post(&base, "/v1/chat/completions", &chat_body(0, "q", 1, false));
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["type"], "too_many_connections", "{v}");
    // The flood is closed: all but the reserve at once, the reserve after its head timeout.
    let closed_now = flood
        .iter_mut()
        .map(|c| is_closed(c).0)
        .filter(|&c| c)
        .count();
    eprintln!("{closed_now} of the flood's 300 connections closed at once");
    for (i, c) in flood.iter_mut().enumerate() {
        read_until_closed(
            c,
            t_flood,
            Duration::from_secs(8),
            &format!("flood connection {i}"),
        );
    }
    let (_, m) = get(&base, "/metrics");
    assert!(
        metric(&m, "maporl_connections_over_cap_total") >= 300.0,
        "{m}"
    );
    // The cap's heads are cut after --header-timeout; then new clients are served.
    for (i, c) in heads.iter_mut().enumerate() {
        let (got, took) = read_until_closed(c, t0, Duration::from_secs(15), &format!("head {i}"));
        assert!(
            got.is_empty() && took >= Duration::from_millis(4500),
            "{took:?} {got}"
        );
    }
    let (status, models) = get(&base, "/v1/models");
    assert_eq!(status, 200, "{models}");
}

/// SIGTERM with both workers generating (a stream and a whole answer) and four requests
/// queued, `--shutdown-timeout 3`: the server stops listening, the queued requests are
/// answered 503 at once, the generations go on until the timeout and are then cut (the
/// stream ends without [DONE]; closing its connection cancels a generation as a client that
/// leaves does), and the process exits within the timeout and a few seconds, its workers
/// having stopped their generations (not left behind).
#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "slows generation through a hook: needs --features test-hooks"
)]
fn sigterm_answers_the_queue_503_and_cuts_what_runs_after_the_shutdown_timeout() {
    let mut s = serve_hostile(
        &[
            "--workers",
            "2",
            "--queue",
            "4",
            "--shutdown-timeout",
            "3",
            "--max-tokens",
            "4000",
        ],
        20,
    );
    let base = s.base.clone();
    // 4000 tokens at 20 ms each: over a minute.
    let long = |stream: bool| {
        json!({"model": "agent-0", "messages": [{"role": "user", "content": "Go on."}],
               "seed": 5, "max_tokens": 4000, "stream": stream})
        .to_string()
    };
    let b = base.clone();
    let body = long(true);
    let streaming = std::thread::spawn(move || {
        let r = client()
            .post(&format!("{b}/v1/chat/completions"))
            .header("content-type", "application/json")
            .send(&body)
            .unwrap();
        let (mut done, mut last_text) = (false, None);
        for line in BufReader::new(r.into_body().into_reader()).lines() {
            let Ok(line) = line else { break };
            if line == "data: [DONE]" {
                done = true;
            } else if line.contains("\"content\":\"") && !line.contains("\"content\":\"\"") {
                last_text = Some(Instant::now());
            }
        }
        (done, last_text)
    });
    wait_for_health(&base, "busy_workers", 1);
    let b = base.clone();
    let body = long(false);
    let whole = std::thread::spawn(move || {
        client()
            .post(&format!("{b}/v1/chat/completions"))
            .header("content-type", "application/json")
            .send(&body)
            .map(|r| r.status().as_u16())
    });
    wait_for_health(&base, "busy_workers", 2);
    let queued: Vec<_> = (0..4)
        .map(|i| {
            let b = base.clone();
            std::thread::spawn(move || {
                let (status, v) = if i == 3 {
                    post(
                        &b,
                        "/v1/debate",
                        r#"{"question": "What is 1 + 1?", "seed": 1}"#,
                    )
                } else {
                    post(&b, "/v1/chat/completions", &chat_body(1, "q", i, false))
                };
                (status, v, Instant::now())
            })
        })
        .collect();
    wait_for_health(&base, "queue_depth", 4);

    let t = Instant::now();
    unsafe {
        libc::kill(s.child.id() as i32, libc::SIGTERM);
    }
    // It stops listening.
    let addr = base.strip_prefix("http://").unwrap().to_string();
    while TcpStream::connect(&addr).is_ok() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "still listening after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The queued requests are answered 503 at once, long before the timeout.
    for q in queued {
        let (status, v, at) = q.join().unwrap();
        assert_eq!(status, 503, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("shutting down"),
            "{v}"
        );
        let after = at.duration_since(t);
        assert!(
            after < Duration::from_millis(2500),
            "answered {after:?} after SIGTERM"
        );
    }
    // The generations went on after the signal, and were cut at the timeout.
    let (done, last_text) = streaming.join().unwrap();
    assert!(!done, "the stream was finished, not cut");
    assert!(
        last_text.is_some_and(|l| l > t),
        "no text came after SIGTERM: the stream stopped before the timeout"
    );
    assert!(
        whole.join().unwrap().is_err(),
        "the whole answer should have been cut"
    );
    // The process exits within the timeout and a few seconds, its workers stopped.
    let exited = loop {
        if let Some(status) = s.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            t.elapsed() < Duration::from_secs(3 + 7),
            "still running {:?} after SIGTERM with --shutdown-timeout 3",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    eprintln!("exited {:?} after SIGTERM", t.elapsed());
    assert!(exited.success(), "{exited}");
    assert!(
        t.elapsed() >= Duration::from_millis(2900),
        "{:?}",
        t.elapsed()
    );
    let stderr = stderr_of(&s);
    assert!(stderr.contains("stopping anyway"), "{stderr}");
    assert!(
        !stderr.contains("exiting without it"),
        "a worker did not stop its cancelled generation: {stderr}"
    );
}

/// The read-limit flags refuse what cannot work, saying why, before any model is loaded.
#[test]
fn read_limit_flags_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_config(dir.path());
    for (args, says) in [
        (&["--header-timeout", "0"][..], "give more than 0"),
        (&["--body-timeout", "soon"][..], "not a number of seconds"),
        (
            &["--header-timeout", "5", "--request-timeout", "2"][..],
            "is shorter than --header-timeout",
        ),
        (
            &["--max-buffered-body-bytes", "10"][..],
            "--max-buffered-body-bytes (10) is below --max-body-bytes (1048576)",
        ),
        (
            &["--max-connections", "0"][..],
            "--max-connections must be at least 1",
        ),
        (&["--max-connections", "100000000"][..], "ulimit -n"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
            .args(["serve", "--addr", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
