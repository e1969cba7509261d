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

/// `maporl` with `args`, in the repository, without the test plugin directory.
fn maporl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(args)
        .current_dir(repo())
        .env_remove("MAPORL_PLUGINS")
        .output()
        .unwrap()
}

/// An error names the command or the key that fixes it: a model the config's [warm_start]
/// makes, a hub model written without `hf:`, a dataset `data fetch` downloads, a plugin
/// name one letter off, a run to resume that does not exist, the old name of a command.
#[test]
fn errors_name_what_fixes_them() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-model");
    let missing = missing.to_str().unwrap();
    let quickstart = "configs/quickstart.toml";
    let smollm2 = "configs/smollm2-arith.toml";
    let run = dir.path().join("run");
    let run_dir = format!("run_dir={}", run.display());
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "eval".into(),
                "--config".into(),
                quickstart.into(),
                "--set".into(),
                format!("model.path={missing}"),
                "--set".into(),
                run_dir.clone(),
            ],
            "this config has a [warm_start] section that makes it: run `maporl warm-start",
        ),
        (
            vec![
                "eval".into(),
                "--config".into(),
                smollm2.into(),
                "--set".into(),
                "model.path=HuggingFaceTB/SmolLM2-360M".into(),
                "--set".into(),
                run_dir.clone(),
            ],
            r#"write model.path = "hf:HuggingFaceTB/SmolLM2-360M""#,
        ),
        (
            vec![
                "eval".into(),
                "--config".into(),
                "configs/gsm8k-debate.toml".into(),
                "--set".into(),
                format!("data.path={missing}/test.jsonl"),
                "--set".into(),
                run_dir.clone(),
            ],
            "`maporl data fetch gsm8k DIR` downloads",
        ),
        (
            vec![
                "eval".into(),
                "--config".into(),
                quickstart.into(),
                "--set".into(),
                "plugins.shaper.path=final-onyl".into(),
                "--set".into(),
                run_dir.clone(),
            ],
            "(did you mean `final-only`?)",
        ),
        (
            vec![
                "train".into(),
                "--config".into(),
                quickstart.into(),
                "--resume".into(),
                "--set".into(),
                run_dir.clone(),
            ],
            "does not exist, so there is no run to continue",
        ),
        (vec!["demo".into()], "is now `maporl scripted`"),
        (
            vec![
                "eval".into(),
                "--config".into(),
                quickstart.into(),
                "--set".into(),
                "data.count=300000000".into(),
            ],
            "data.count = 300000000: expected at most 10000000",
        ),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = maporl(&args);
        let t = text(&out);
        assert!(!out.status.success(), "{args:?} ran:\n{t}");
        assert!(t.contains(needle), "{args:?}: no `{needle}` in:\n{t}");
        assert!(!run.exists(), "{args:?} left {}", run.display());
    }
}

/// `maporl config show` prints the config a run would use: the file with every default and
/// every `--set` applied, as TOML that loads back to the same config.
#[test]
fn config_show_prints_the_resolved_config_which_loads_back_unchanged() {
    let out = maporl(&[
        "config",
        "show",
        "--config",
        "configs/quickstart.toml",
        "--set",
        "train.steps=3",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8(out.stdout).unwrap();
    let table: toml::Table = toml::from_str(&shown).unwrap();
    assert_eq!(table["train"]["steps"].as_integer(), Some(3), "the --set");
    assert_eq!(
        table["train"]["ppo"]["clip"].as_float(),
        Some(0.2),
        "a default the file does not set"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shown.toml");
    std::fs::write(&file, &shown).unwrap();
    let again = maporl(&["config", "show", "--config", file.to_str().unwrap()]);
    assert!(again.status.success(), "{}", text(&again));
    assert_eq!(String::from_utf8(again.stdout).unwrap(), shown);
}

/// A protocol that plans no speaker at turn 1 leaves debates with no answer; the run says
/// so (how many tasks, which protocol) instead of reporting their accuracy of 0 silently.
#[test]
fn a_debate_nobody_speaks_in_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    let data = dir.path().join("tasks.jsonl");
    std::fs::write(
        &data,
        "{\"q\": \"silent\", \"a\": \"1\"}\n{\"q\": \"What is 1 + 1?\", \"a\": \"2\"}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config"])
        .arg(repo().join("configs/smollm2-arith.toml"))
        .args(["--set", &format!("model.path={}", model.display())])
        .args([
            "--set",
            &format!("run_dir={}", dir.path().join("run").display()),
        ])
        .args(["--set", "data.source=jsonl"])
        .args(["--set", &format!("data.path={}", data.display())])
        .args(["--set", "data.fields={question = \"q\", reference = \"a\"}"])
        .args(["--set", "plugins.protocol.path=hostile_protocol.wasm"])
        .args(["--set", "plugins.protocol.settings={}"])
        .args([
            "--set",
            "debate.turns=1",
            "--set",
            "generation.max_new_tokens=2",
        ])
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("the protocol planned no speaker at turn 1 for 1 of 2 tasks")
            && t.contains("hostile_protocol.wasm"),
        "{t}"
    );
}
