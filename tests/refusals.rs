//! A run refused at start-up writes nothing: whatever was wrong (no model, a plugin that is
//! missing or cannot run under its limits), `eval`, `train` (PPO and SFT) and `verifier
//! train` stop with an error that says what, and leave no run directory behind.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What is wrong, as `--set`s, and a word the error must contain.
const BROKEN: &[(&str, &str)] = &[
    ("model.path=/nonexistent/model", "/nonexistent/model"),
    ("plugins.protocol.limits.fuel=0", "fuel"),
    ("plugins.verifier.limits.memory_mib=0", "memory"),
    ("plugins.shaper.limits.deadline_ms=0", "deadline"),
    (
        "plugins.shaper.path=./no/such/shaper.wasm",
        "no/such/shaper.wasm",
    ),
    (
        "plugins.verifier.path=not-a-reference-plugin",
        "not-a-reference-plugin",
    ),
    // A GPU this build or machine does not have.
    ("device=cuda:3", "cuda:3"),
];

fn refused(cmd: &mut Command, run_dir: &Path, what: &str, word: &str) {
    let out = cmd.env("MAPORL_PLUGINS", plugins_dir()).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{what}: ran although broken\n{t}");
    assert!(
        t.contains(word),
        "{what}: the error does not say `{word}`:\n{t}"
    );
    assert!(
        !run_dir.exists(),
        "{what}: a refused run left {} behind",
        run_dir.display()
    );
}

#[test]
fn refused_runs_leave_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    let config = repo().join("configs/smollm2-arith.toml");
    for (i, (broken, word)) in BROKEN.iter().enumerate() {
        for (name, args, extra) in [
            ("eval", &["eval"][..], &[][..]),
            ("train", &["train"][..], &["train.steps=1"][..]),
            (
                "sft",
                &["train"][..],
                &["train.mode=sft", "train.sft.epochs=1"][..],
            ),
        ] {
            let run_dir = dir.path().join(format!("run-{i}-{name}"));
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
            cmd.args(args).arg("--config").arg(&config);
            for set in [
                format!("model.path={}", model.display()),
                format!("run_dir={}", run_dir.display()),
                "data.count=2".into(),
                "debate.turns=1".into(),
                "generation.max_new_tokens=2".into(),
            ]
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .chain([*broken])
            {
                cmd.args(["--set", set]);
            }
            refused(&mut cmd, &run_dir, &format!("{name} with {broken}"), word);
        }
    }
}

#[test]
fn a_refused_verifier_training_leaves_no_run_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("answers.jsonl");
    std::fs::write(
        &data,
        "{\"task_id\":\"q\",\"question\":\"1+1?\",\"response\":\"2\",\"correct\":true,\
         \"answer\":\"2\",\"reference\":\"2\"}\n",
    )
    .unwrap();
    let run_dir = dir.path().join("verifier");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(["verifier", "train", "--config"])
        .arg(repo().join("configs/smollm2-arith.toml"))
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&run_dir)
        .args(["--set", "verifier.model=/nonexistent/verifier-model"]);
    refused(
        &mut cmd,
        &run_dir,
        "verifier train without a model",
        "/nonexistent/verifier-model",
    );
}
