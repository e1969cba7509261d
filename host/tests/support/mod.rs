//! Shared by the end-to-end tests: builds the plugin components (reference and hostile
//! fixtures) once per test binary, and makes runtimes and tasks.
#![allow(dead_code)]

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
        log: Arc::new(move |p, l, m| sink.lock().unwrap().push((p.into(), l, m.into()))),
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
            maporl::config::expand_home("~/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "SmolLM2 GGUF not found at {}: run scripts/fetch-smollm2.sh (or set MAPORL_SMOLLM2_GGUF)",
        path.display()
    );
    path
}
