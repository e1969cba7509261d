//! Shared by the end-to-end tests: builds the plugin components (reference and hostile
//! fixtures) once per test binary, and makes runtimes and tasks.
#![allow(dead_code)]

pub mod hostile;
pub mod polyglot;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use maporl::plugin::{LogLevel, Runtime, RuntimeOptions};
use maporl::transcript::{Task, Transcript, Utterance};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The directory of built components; builds them (cargo is a no-op when up to date).
pub fn plugins_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .current_dir(repo())
            .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path", "plugins/Cargo.toml", "--target-dir", "plugins/target"])
            .status()
            .expect("running cargo to build the plugins");
        assert!(
            status.success(),
            "building the plugins failed; is the wasm32-wasip2 target installed? (`cargo xtask plugins` installs it)"
        );
        repo().join("plugins/target/wasm32-wasip2/release")
    })
}

/// The three reference plugins (debate, gsm8k, influence) built against the frozen contract
/// 0.1.0, as `cargo xtask plugins` builds them; builds them (a no-op when up to date).
pub fn plugins_since_v0_1_0_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = std::process::Command::new(cargo)
            .current_dir(repo())
            .args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip2",
                "--manifest-path",
                "plugins/Cargo.toml",
            ])
            .args([
                "--target-dir",
                "plugins/target/since-v0.1.0",
                "--features",
                "maporl-plugin/since-v0-1-0",
            ])
            .args([
                "-p",
                "maporl-protocol-debate",
                "-p",
                "maporl-verifier-gsm8k",
                "-p",
                "maporl-shaper-influence",
            ])
            .status()
            .expect("running cargo to build the 0.1.0 plugins");
        assert!(
            status.success(),
            "building the reference plugins against 0.1.0 failed"
        );
        repo().join("plugins/target/since-v0.1.0/wasm32-wasip2/release")
    })
}

/// The Python example plugins (plugins/python: debate, gsm8k, influence, and the `hostile`
/// fixture), built with the
/// Python SDK's build command (plugins/sdk-python) (componentize-py) into plugins/target/python when missing or
/// older than their sources. Fails loudly without componentize-py (`cargo xtask test`
/// installs it).
pub fn python_plugins_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let root = repo().join("plugins/python");
        let out = repo().join("plugins/target/python");
        // math-verify bundles packages `cargo xtask test` installs beside it.
        let site = out.join("math-verify-site");
        for (name, world) in [
            ("debate", "protocol"),
            ("gsm8k", "verifier"),
            ("influence", "reward-shaper"),
            ("hostile", "verifier"),
            ("bare", "verifier"),
            ("math-verify", "verifier"),
        ] {
            let wasm = out.join(format!("{name}.wasm"));
            let sources = [repo().join("plugins/sdk-python"), root.join(name)];
            if !older_than_sources(&wasm, &sources, &["py", "wit"]) {
                continue;
            }
            let status = std::process::Command::new("python3")
                .current_dir(repo().join("plugins/sdk-python"))
                .args([
                    "-m",
                    "maporl_plugin",
                    "build",
                    root.join(name).join("app.py").to_str().unwrap(),
                ])
                .args(["--world", world, "-o", wasm.to_str().unwrap()])
                .args(match name {
                    "math-verify" => vec!["--path", site.to_str().unwrap()],
                    _ => vec![],
                })
                .status()
                .expect("running python3");
            assert!(
                status.success(),
                "building the Python plugin {name} failed; are componentize-py and (for \
                 math-verify) its packages installed? (`cargo xtask test` installs both: \
                 componentize-py==0.25.1, and plugins/python/math-verify/requirements.txt into \
                 {})",
                site.display()
            );
        }
        out
    })
}

/// The JavaScript example plugins (plugins/js: debate, gsm8k, influence, and the `hostile`
/// fixture), built with the JavaScript SDK's build command (plugins/sdk-js) for `engine`
/// (`spidermonkey`, componentize-js; `quickjs`, componentize-qjs) into
/// plugins/target/js/ENGINE when missing or older than their sources. Fails loudly without
/// node or the SDK's packages (`cargo xtask test` installs them: `npm ci --prefix
/// plugins/sdk-js`).
pub fn js_plugins_dir(engine: &str) -> PathBuf {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let root = repo().join("plugins/js");
    let out = repo().join("plugins/target/js").join(engine);
    let mut built = BUILT.lock().unwrap();
    if built.iter().any(|e| e == engine) {
        return out;
    }
    for (name, world) in [
        ("debate", "protocol"),
        ("gsm8k", "verifier"),
        ("influence", "reward-shaper"),
        ("hostile", "verifier"),
    ] {
        let wasm = out.join(format!("{name}.wasm"));
        let sources = [repo().join("plugins/sdk-js/maporl-plugin"), root.join(name)];
        if !older_than_sources(&wasm, &sources, &["js", "mjs", "wit"]) {
            continue;
        }
        let status = std::process::Command::new("node")
            .arg(repo().join("plugins/sdk-js/maporl-plugin/build.mjs"))
            .arg(root.join(name).join("app.js"))
            .args(["--world", world, "--engine", engine, "-o"])
            .arg(&wasm)
            .status()
            .expect("running node (the JavaScript plugins need Node.js 20 or later)");
        assert!(
            status.success(),
            "building the JavaScript plugin {name} for {engine} failed; are the SDK's packages \
             installed? (`cargo xtask test` installs them: `npm ci --prefix plugins/sdk-js`)"
        );
    }
    built.push(engine.to_string());
    out
}

/// Whether `built` is missing or older than the newest file with one of `extensions` under
/// `sources`: a component to build again.
fn older_than_sources(built: &Path, sources: &[PathBuf], extensions: &[&str]) -> bool {
    let newest = sources
        .iter()
        .flat_map(|d| walk(d))
        .filter(|p| {
            p.extension()
                .is_some_and(|e| extensions.iter().any(|x| e == *x))
        })
        .filter_map(|p| p.metadata().and_then(|m| m.modified()).ok())
        .max()
        .expect("a plugin has sources");
    let modified = built.metadata().and_then(|m| m.modified()).ok();
    modified.is_none_or(|b| b < newest)
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A component's bytes with every `maporl:plugin/...@` name moved from the host's current WIT
/// version to `version` (of the same length, so that the binary stays valid).
pub fn with_wit_version(bytes: &[u8], version: &str) -> Vec<u8> {
    let current = maporl::plugin::wit_version();
    assert_eq!(version.len(), current.len());
    let mut bytes = bytes.to_vec();
    let from = b"maporl:plugin/";
    let mut i = 0;
    let mut replaced = 0;
    while let Some(pos) = bytes[i..].windows(from.len()).position(|w| w == from) {
        let start = i + pos;
        let at = bytes[start..]
            .iter()
            .position(|&b| b == b'@')
            .map(|p| start + p + 1);
        if let Some(at) = at.filter(|&at| bytes[at..].starts_with(current.as_bytes())) {
            bytes[at..at + current.len()].copy_from_slice(version.as_bytes());
            replaced += 1;
        }
        i = start + from.len();
    }
    assert!(
        replaced > 0,
        "no maporl names at {current} in the component"
    );
    bytes
}

pub fn plugin(name: &str) -> PathBuf {
    let path = plugins_dir().join(format!("{name}.wasm"));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// Log lines captured from plugins: (plugin, level, line).
pub type Captured = Arc<Mutex<Vec<(String, LogLevel, String)>>>;

/// A runtime with its own cache dir, seed 0, capturing plugin logs.
pub fn runtime() -> (Runtime, Captured, tempfile::TempDir) {
    runtime_with(0, None)
}

pub fn runtime_with(
    seed: u64,
    judge: Option<Arc<dyn maporl::plugin::Judge>>,
) -> (Runtime, Captured, tempfile::TempDir) {
    let cache = tempfile::tempdir().expect("temp dir");
    let captured: Captured = Arc::default();
    let sink = captured.clone();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        seed,
        log: Arc::new(move |o: &maporl::plugin::LogOrigin<'_>, l, m| {
            sink.lock().unwrap().push((o.plugin.into(), l, m.into()))
        }),
        judge,
    })
    .expect("runtime");
    (runtime, captured, cache)
}

pub fn task(id: &str, kind: &str, question: &str, reference: &str) -> Task {
    Task {
        id: id.into(),
        kind: kind.into(),
        question: question.into(),
        reference: reference.into(),
        fields: vec![],
    }
}

pub fn utterance(
    turn: u32,
    agent: u32,
    answer: Option<&str>,
    score: f32,
    correct: bool,
) -> Utterance {
    Utterance {
        turn,
        agent,
        text: match answer {
            Some(a) => format!("Reasoning... Answer: \\boxed{{{a}}}"),
            None => "I am not sure.".into(),
        },
        answer: answer.map(str::to_string),
        score,
        correct,
    }
}

/// Adds one turn's utterances to `transcript`: plan `plan`'s agents said `texts`, which the
/// verifier read as `verdicts` (all three in plan order).
pub fn add_turn(
    transcript: &mut Transcript,
    turn: u32,
    plan: &[maporl::transcript::Prompt],
    texts: &[String],
    verdicts: &[maporl::transcript::Verdict],
) {
    for (p, (text, v)) in plan.iter().zip(texts.iter().zip(verdicts)) {
        transcript.utterances.push(Utterance {
            turn,
            agent: p.agent,
            text: text.clone(),
            answer: v.answer.clone(),
            score: v.score,
            correct: v.correct,
        });
    }
}

pub fn transcript(agents: u32, turns: u32, utterances: Vec<Utterance>) -> Transcript {
    Transcript {
        agents,
        turns,
        utterances,
    }
}

/// SmolLM2-135M-Instruct's GGUF (fetched by scripts/fetch-smollm2.sh); fails loudly if absent.
pub fn smollm2() -> PathBuf {
    let path = std::env::var_os("MAPORL_SMOLLM2_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            maporl::files::expand_home("~/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "SmolLM2 GGUF not found at {}: run scripts/fetch-smollm2.sh (or set MAPORL_SMOLLM2_GGUF)",
        path.display()
    );
    path
}

/// Writes a tiny random Qwen2 model as a Hugging Face folder, with SmolLM2's tokenizer and a
/// plain ChatML template of its own (no system prompt): a second model family for a team.
pub fn write_tiny_qwen2(dir: &Path) {
    use candle_core::{DType, Device, Tensor};
    use rand::{Rng, SeedableRng};
    let loaded = maporl::model::load(&smollm2(), DType::F32, &Device::Cpu).unwrap();
    let tokenizer = loaded.tokenizer.expect("SmolLM2 has a tokenizer");
    let vocab = tokenizer.get_vocab_size(true);
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let (h, i, layers) = (32usize, 64usize, 2usize);
    let config = serde_json::json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": h,
        "intermediate_size": i, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": vocab, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": true, "hidden_act": "silu",
        "eos_token_id": eos, "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut t = |dims: &[usize], scale: f32, offset: f32| {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| offset + rng.random_range(-scale..scale))
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    };
    let kv = h / 4 * 2;
    let mut w = std::collections::HashMap::new();
    w.insert(
        "model.embed_tokens.weight".to_string(),
        t(&[vocab, h], 1.0, 0.0),
    );
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (name, dims) in [
            ("self_attn.q_proj.weight", [h, h]),
            ("self_attn.k_proj.weight", [kv, h]),
            ("self_attn.v_proj.weight", [kv, h]),
            ("self_attn.o_proj.weight", [h, h]),
            ("mlp.gate_proj.weight", [i, h]),
            ("mlp.up_proj.weight", [i, h]),
            ("mlp.down_proj.weight", [h, i]),
        ] {
            w.insert(
                format!("{p}.{name}"),
                t(&dims, 1.0 / (dims[1] as f32).sqrt(), 0.0),
            );
        }
        for b in ["q", "k", "v"] {
            let n = if b == "q" { h } else { kv };
            w.insert(format!("{p}.self_attn.{b}_proj.bias"), t(&[n], 0.1, 0.0));
        }
        w.insert(format!("{p}.input_layernorm.weight"), t(&[h], 0.1, 1.0));
        w.insert(
            format!("{p}.post_attention_layernorm.weight"),
            t(&[h], 0.1, 1.0),
        );
    }
    w.insert("model.norm.weight".to_string(), t(&[h], 0.1, 1.0));
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tokenizer.to_string(false).unwrap(),
    )
    .unwrap();
    let tc = serde_json::json!({
        "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    });
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

/// A tiny random llama (hidden 32, 2 layers, untied lm_head scaled so that a confident
/// answer is reachable through it) with `V` tokens; the same weights for the same `V`.
pub fn tiny_llama<const V: usize>() -> maporl::model::Base {
    use candle_core::{DType, Device, Tensor};
    use rand::{Rng, SeedableRng};
    const H: usize = 32;
    let cfg = maporl::model::Config::from_hf_json(&format!(
        r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{H},"intermediate_size":64,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":{V},
        "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":32,"tie_word_embeddings":false}}"#
    ))
    .unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let mut t = |dims: &[usize], scale: f32, offset: f32| {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| offset + rng.random_range(-scale..scale))
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    };
    let mut w = std::collections::HashMap::new();
    w.insert(
        "model.embed_tokens.weight".to_string(),
        t(&[V, H], 1.0, 0.0),
    );
    w.insert("lm_head.weight".to_string(), t(&[V, H], 0.35, 0.0));
    w.insert("model.norm.weight".to_string(), t(&[H], 0.1, 1.0));
    for l in 0..2 {
        let p = format!("model.layers.{l}");
        for (name, dims) in [
            ("self_attn.q_proj.weight", [H, H]),
            ("self_attn.k_proj.weight", [16, H]),
            ("self_attn.v_proj.weight", [16, H]),
            ("self_attn.o_proj.weight", [H, H]),
            ("mlp.gate_proj.weight", [64, H]),
            ("mlp.up_proj.weight", [64, H]),
            ("mlp.down_proj.weight", [H, 64]),
        ] {
            w.insert(
                format!("{p}.{name}"),
                t(&dims, 1.0 / (dims[1] as f32).sqrt(), 0.0),
            );
        }
        w.insert(format!("{p}.input_layernorm.weight"), t(&[H], 0.1, 1.0));
        w.insert(
            format!("{p}.post_attention_layernorm.weight"),
            t(&[H], 0.1, 1.0),
        );
    }
    maporl::model::Base::new(
        &cfg,
        candle_nn::VarBuilder::from_tensors(w, DType::F32, &Device::Cpu),
    )
    .unwrap()
}

/// Spawns `cmd`, sends it SIGINT (as Ctrl-C would) once `metrics` has its first line, and
/// waits for it to exit.
pub fn interrupt_after_first_metrics_line(
    cmd: &mut std::process::Command,
    metrics: &Path,
) -> std::process::Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_to_string(metrics).map_or(true, |m| m.is_empty()) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before its first metrics line"
        );
        assert!(
            started.elapsed().as_secs() < 300,
            "no metrics line after 300 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    child.wait_with_output().unwrap()
}

/// The loss of one PPO micro-batch (policy + 0.1 × value, with made-up old log-probs,
/// advantages and returns) and the gradient of every LoRA weight, flattened in name order.
pub fn ppo_loss_and_lora_grads(
    agent: &maporl::model::Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
) -> (f32, Vec<f32>) {
    use candle_core::{DType, Tensor};
    use maporl::model::{score, Pass};
    use maporl::train::ppo::{policy_loss, value_loss};
    let s = score(agent, pairs, Pass::Training, 64).unwrap();
    assert_eq!(s.logprobs.dtype(), DType::F32, "log-probs are f32");
    let values = s.values.as_ref().unwrap();
    assert_eq!(values.dtype(), DType::F32, "values are f32");
    let (b, n) = s.logprobs.dims2().unwrap();
    let old = (s.logprobs.detach() - 0.05).unwrap();
    let adv: Vec<f32> = (0..b * n)
        .map(|k| ((k * 37 % 11) as f32 - 5.0) / 5.0)
        .collect();
    let adv = Tensor::from_vec(adv, (b, n), s.logprobs.device()).unwrap();
    let returns = (adv.clone() * 0.5).unwrap();
    let (pg, _) = policy_loss(&s.logprobs, &old, &adv, &s.mask, 0.2).unwrap();
    let vf = value_loss(values, &values.detach(), &returns, &s.mask, 0.2).unwrap();
    let loss = (pg + (vf * 0.1).unwrap()).unwrap();
    let grads = loss.backward().unwrap();
    let cpu = candle_core::Device::Cpu;
    let mut flat = Vec::new();
    for (name, var) in agent.lora.as_ref().unwrap().named_vars() {
        assert_eq!(var.dtype(), DType::F32, "{name}: the adapter stays f32");
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no grad"));
        assert_eq!(g.dtype(), DType::F32);
        flat.extend(
            g.to_device(&cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
        );
    }
    (loss.to_scalar::<f32>().unwrap(), flat)
}

/// One event of a TensorBoard event file, as read back by [`tensorboard_events`].
#[derive(Debug, Clone, PartialEq)]
pub enum TbEvent {
    /// `SessionLog.START` at a step: TensorBoard drops earlier files' events from it on.
    Start(i64),
    Scalars(i64, Vec<(String, f32)>),
}

/// Reads every event file under `run/tensorboard`, in name order, with a reader of its own
/// (not the writer's code): TFRecord framing with both CRC-32Cs checked bit by bit, and the
/// few `Event` fields maporl writes. The `file_version` record must come first in each file.
pub fn tensorboard_events(run: &Path) -> Vec<Vec<TbEvent>> {
    fn crc32c(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82f6_3b78
                } else {
                    crc >> 1
                };
            }
        }
        let crc = !crc;
        crc.rotate_right(15).wrapping_add(0xa282_ead8)
    }
    fn varint(b: &[u8], at: &mut usize) -> u64 {
        let (mut x, mut shift) = (0u64, 0);
        loop {
            let byte = b[*at];
            *at += 1;
            x |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return x;
            }
            shift += 7;
        }
    }
    /// (field, wire type, payload) of a message.
    fn fields(b: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
        let (mut at, mut out) = (0, Vec::new());
        while at < b.len() {
            let key = varint(b, &mut at);
            let payload = match key & 7 {
                0 => varint(b, &mut at).to_le_bytes().to_vec(),
                1 => {
                    at += 8;
                    b[at - 8..at].to_vec()
                }
                2 => {
                    let n = varint(b, &mut at) as usize;
                    at += n;
                    b[at - n..at].to_vec()
                }
                5 => {
                    at += 4;
                    b[at - 4..at].to_vec()
                }
                w => panic!("wire type {w}"),
            };
            out.push((key >> 3, key & 7, payload));
        }
        out
    }
    let dir = run.join("tensorboard");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    let mut files = Vec::new();
    for path in names {
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .contains("tfevents"),
            "{}",
            path.display()
        );
        let bytes = std::fs::read(&path).unwrap();
        let (mut at, mut events, mut first) = (0, Vec::new(), true);
        while at < bytes.len() {
            let len_bytes = &bytes[at..at + 8];
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
            let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(len_crc, crc32c(len_bytes), "length CRC at byte {at}");
            let data = &bytes[at + 12..at + 12 + len];
            let data_crc =
                u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(data_crc, crc32c(data), "data CRC at byte {at}");
            at += 16 + len;
            let event = fields(data);
            let step = event.iter().find(|f| f.0 == 2).map_or(0, |f| {
                u64::from_le_bytes(f.2.clone().try_into().unwrap()) as i64
            });
            assert!(event.iter().any(|f| f.0 == 1 && f.1 == 1), "wall_time");
            if first {
                let version = event.iter().find(|f| f.0 == 3).expect("file_version first");
                assert_eq!(version.2, b"brain.Event:2");
                first = false;
                continue;
            }
            if let Some(log) = event.iter().find(|f| f.0 == 6) {
                assert_eq!(fields(&log.2)[0].0, 1, "SessionLog.status");
                assert_eq!(fields(&log.2)[0].2[0], 1, "START");
                events.push(TbEvent::Start(step));
            } else if let Some(summary) = event.iter().find(|f| f.0 == 5) {
                let values = fields(&summary.2)
                    .into_iter()
                    .map(|(_, _, v)| {
                        let v = fields(&v);
                        let tag = String::from_utf8(v[0].2.clone()).unwrap();
                        let x = f32::from_le_bytes(v[1].2.clone().try_into().unwrap());
                        (tag, x)
                    })
                    .collect();
                events.push(TbEvent::Scalars(step, values));
            } else {
                panic!("an event with neither a summary nor a session log");
            }
        }
        files.push(events);
    }
    files
}

/// What TensorBoard shows for `tag`: every file's scalars in order, where a `Start` at step s
/// drops what earlier files logged from step s on.
pub fn tensorboard_series(run: &Path, tag: &str) -> Vec<(i64, f32)> {
    let mut series: Vec<(i64, f32)> = Vec::new();
    for file in tensorboard_events(run) {
        for event in file {
            match event {
                TbEvent::Start(s) => series.retain(|(step, _)| *step < s),
                TbEvent::Scalars(step, values) => {
                    if let Some((_, x)) = values.iter().find(|(t, _)| t == tag) {
                        series.push((step, *x));
                    }
                }
            }
        }
    }
    series
}

/// Every file under `dir`, relative path -> bytes (none for a directory that holds no file).
pub fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}
