//! `maporl warm-start` end to end, shrunk: the quickstart config's tiny model made from
//! scratch on scripted debates, then loaded and trained by `maporl train` with a held-out
//! evaluation before and after.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn maporl(args: &[&str], sets: &[String]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(args);
    for s in sets {
        cmd.args(["--set", s]);
    }
    cmd.env("MAPORL_PLUGINS", plugins_dir()).output().unwrap()
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The quickstart config at a size a test can afford.
fn sets(model: &Path, run: &Path) -> Vec<String> {
    [
        format!("model.path={}", model.display()),
        format!("run_dir={}", run.display()),
        "warm_start.hidden_size=32".into(),
        "warm_start.intermediate_size=64".into(),
        "warm_start.layers=2".into(),
        "warm_start.heads=2".into(),
        "warm_start.vocab_size=400".into(),
        "warm_start.tasks=60".into(),
        "warm_start.drills=200".into(),
        "warm_start.steps=30".into(),
        "warm_start.batch_tokens=1024".into(),
        "data.count=12".into(),
        "data.held_out=4".into(),
        "debate.batch_size=4".into(),
        "generation.max_new_tokens=24".into(),
        "train.steps=2".into(),
        "train.checkpoint_every=0".into(),
    ]
    .to_vec()
}

#[test]
fn warm_start_makes_a_model_that_train_loads_and_keeps_it_while_the_settings_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (model, run) = (dir.path().join("model"), dir.path().join("run"));
    let config = repo().join("configs/quickstart.toml");
    let config = config.to_str().unwrap();
    let s = sets(&model, &run);

    let out = maporl(&["warm-start", "--config", config], &s);
    assert!(out.status.success(), "{}", text(&out));
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "warm_start.json",
    ] {
        assert!(model.join(f).is_file(), "{f} missing");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("warm_start.json")).unwrap())
            .unwrap();
    let (first, last) = (
        summary["first_loss"].as_f64().unwrap(),
        summary["last_loss"].as_f64().unwrap(),
    );
    assert!(last < first * 0.8, "the loss fell: {first} -> {last}");
    assert_eq!(summary["utterances"], 60 * 2 * 3, "2 agents x 3 turns each");
    let hf: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(hf["hidden_size"], 32);
    assert!(hf["vocab_size"].as_u64().unwrap() <= 402);

    // The same settings again: kept, not remade.
    let written = std::fs::metadata(model.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    let out = maporl(&["warm-start", "--config", config], &s);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("already holds this warm start"),
        "{}",
        text(&out)
    );
    let again = std::fs::metadata(model.join("model.safetensors"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(written, again);

    // MAPoRL on it, with the held-out tables before and after.
    let out = maporl(&["train", "--config", config], &s);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("held-out tasks, before training:"), "{t}");
    assert!(t.contains("held-out tasks, after training:"), "{t}");
    assert!(t.contains("transitions RR/WR/RW/WW"), "{t}");
    for f in ["eval-before.json", "eval-after.json", "metrics.jsonl"] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2, "{metrics}");

    // Other settings: remade.
    let mut changed = s.clone();
    changed.push("warm_start.steps=3".into());
    let out = maporl(&["warm-start", "--config", config], &changed);
    assert!(out.status.success(), "{}", text(&out));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("warm_start.json")).unwrap())
            .unwrap();
    assert_eq!(summary["config"]["steps"], 3);
}

#[test]
fn warm_start_refuses_configs_it_cannot_serve() {
    let dir = tempfile::tempdir().unwrap();
    let (model, run) = (dir.path().join("model"), dir.path().join("run"));
    let smollm2 = repo().join("configs/smollm2-arith.toml");
    let out = maporl(
        &["warm-start", "--config", smollm2.to_str().unwrap()],
        &[format!("model.path={}", model.display())],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("smollm2-arith.toml: no [warm_start] section"),
        "{}",
        text(&out)
    );

    let quick = repo().join("configs/quickstart.toml");
    let mut s = sets(&model, &run);
    s.push("data.source=gsm8k".into());
    s.push("data.path=/nonexistent.jsonl".into());
    let out = maporl(&["warm-start", "--config", quick.to_str().unwrap()], &s);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("answer arithmetic questions only"),
        "{}",
        text(&out)
    );

    let mut s = sets(&model, &run);
    s.push("warm_start.heads=3".into());
    let out = maporl(&["warm-start", "--config", quick.to_str().unwrap()], &s);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("warm_start.hidden_size = 32 must split into warm_start.heads = 3"),
        "{}",
        text(&out)
    );
    assert!(!model.exists(), "nothing written on a refused config");
}
