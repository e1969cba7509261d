//! MAPoRL's loop through the library, as a server or a launcher calls it (no binary): a
//! run asked to stop ends with a checkpoint, resumes from it, and finishes with the metrics
//! of a run that never stopped; progress and notes reach the caller.

mod support;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use maporl::config::Config;
use maporl::session::Progress;
use maporl::train::{self, Options, Outcome};
use support::*;

/// Records what the library reports.
#[derive(Default)]
struct Recorded {
    /// (phase, len, done at the start, advanced).
    phases: Vec<(String, u64, u64, u64)>,
    notes: Vec<String>,
}

impl Progress for Recorded {
    fn begin(&mut self, what: &str, len: u64, done: u64) {
        self.phases.push((what.to_string(), len, done, 0));
    }
    fn advance(&mut self, by: u64) {
        self.phases.last_mut().expect("a phase began").3 += by;
    }
    fn note(&mut self, line: &str) {
        self.notes.push(line.to_string());
    }
}

fn config(run: &Path, model: &Path) -> Config {
    let plugin_path =
        |world: &str, name: &str| format!("plugins.{world}.path={}", plugin(name).display());
    let overrides = vec![
        format!("model.path={}", model.display()),
        format!("run_dir={}", run.display()),
        plugin_path("protocol", "debate"),
        plugin_path("verifier", "gsm8k"),
        plugin_path("shaper", "influence"),
        "train.steps=2".into(),
        "debate.batch_size=2".into(),
        "debate.turns=2".into(),
        "generation.max_new_tokens=6".into(),
        "train.ppo.minibatches=2".into(),
        "train.ppo.epochs=1".into(),
    ];
    Config::load(&repo().join("configs/smollm2-arith.toml"), &overrides).unwrap()
}

/// The metrics lines without wall-clock and memory fields.
fn metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().retain(|k, _| {
                !k.ends_with("_seconds") && !k.ends_with("_per_second") && !k.ends_with("_mib")
            });
            v
        })
        .collect()
}

#[test]
fn the_library_trains_stops_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);
    let (stopped, whole) = (dir.path().join("stopped"), dir.path().join("whole"));

    // Asked to stop before it began: it ends after the step in progress, with a checkpoint.
    let mut seen = Recorded::default();
    let outcome = train::run(
        config(&stopped, &model),
        &Options::default(),
        &mut seen,
        &AtomicBool::new(true),
    )
    .unwrap();
    let Outcome::Stopped {
        step,
        steps,
        checkpoint,
    } = outcome
    else {
        panic!("expected a stopped run");
    };
    assert_eq!((step, steps), (1, 2));
    assert!(checkpoint.join("state.json").is_file(), "{checkpoint:?}");
    assert_eq!(seen.phases, vec![("training".to_string(), 2, 0, 1)]);

    // Resumed, it finishes where it left off.
    let mut seen = Recorded::default();
    let resume = Options {
        resume: true,
        ..Options::default()
    };
    let outcome = train::run(
        config(&stopped, &model),
        &resume,
        &mut seen,
        &AtomicBool::new(false),
    )
    .unwrap();
    let Outcome::Trained {
        steps,
        metrics: resumed_metrics,
        adapters,
        held_out,
    } = outcome
    else {
        panic!("expected a finished run");
    };
    assert_eq!(steps, 2);
    assert!(held_out.is_none());
    assert!(adapters.join("agent-0/adapter_model.safetensors").is_file());
    assert_eq!(seen.phases, vec![("training".to_string(), 2, 1, 1)]);
    assert!(
        seen.notes
            .iter()
            .any(|n| n.starts_with("resuming after step 1 of 2")),
        "{:?}",
        seen.notes
    );

    // The same run without a stop: the same metrics, line for line.
    let Outcome::Trained {
        metrics: whole_metrics,
        ..
    } = train::run(
        config(&whole, &model),
        &Options::default(),
        &mut maporl::session::Quiet,
        &AtomicBool::new(false),
    )
    .unwrap()
    else {
        panic!("expected a finished run");
    };
    let (a, b) = (metrics(&resumed_metrics), metrics(&whole_metrics));
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}
