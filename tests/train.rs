//! `maporl train` end to end on a tiny model: debates, shaped rewards, PPO on every learning
//! agent (MAPoRL) or on agent 0 only (the single-agent baseline), one metrics line per step,
//! and the adapters saved in the PEFT layout.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use support::*;

/// `maporl train` on the quickstart config, shrunk to a tiny run; returns the process output.
fn run_train(
    run: &Path,
    model: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    command(run, model, extra, env).output().unwrap()
}

fn command(run: &Path, model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let config = repo().join("configs/smollm2-arith.toml");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(["train", "--config", config.to_str().unwrap()]);
    for set in [
        format!("model.path={}", model.display()),
        format!("run_dir={}", run.display()),
        "train.steps=2".into(),
        "debate.batch_size=2".into(),
        "debate.turns=2".into(),
        "generation.max_new_tokens=6".into(),
        "train.ppo.minibatches=2".into(),
        "train.ppo.epochs=2".into(),
        "train.ppo.lr=0.001".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    cmd.args(extra).env("MAPORL_PLUGINS", plugins_dir());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Trains; asserts success; returns the metrics lines.
fn train(run: &Path, model: &Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let out = run_train(run, model, extra, &[]);
    assert!(out.status.success(), "{}", text(&out));
    metrics(run)
}

fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The metrics without their wall-clock fields, which differ between any two runs.
fn without_timings(lines: &[serde_json::Value]) -> Vec<serde_json::Value> {
    lines
        .iter()
        .map(|l| {
            let mut l = l.clone();
            let o = l.as_object_mut().unwrap();
            o.retain(|k, _| {
                !k.ends_with("_seconds") && !k.ends_with("_per_second") && !k.ends_with("_mib")
            });
            l
        })
        .collect()
}

/// The final adapters' weights of agents 0..n of `run`.
fn final_adapters(run: &Path, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|a| {
            std::fs::read(run.join(format!(
                "checkpoints/final/agent-{a}/adapter_model.safetensors"
            )))
            .unwrap()
        })
        .collect()
}

fn tiny_model(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);
    model
}

#[test]
fn activation_checkpointing_makes_the_plain_updates() {
    // The same run with and without it: the same metrics and the same adapters, bit for bit
    // (the recomputed layers run the same ops on the same inputs).
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut runs = Vec::new();
    for (name, on) in [("plain", "false"), ("kept", "true")] {
        let run = dir.path().join(name);
        let set = format!("train.ppo.activation_checkpointing={on}");
        let lines = without_timings(&train(&run, &model, &["--set", &set]));
        let adapter =
            std::fs::read(run.join("checkpoints/final/agent-0/adapter_model.safetensors"));
        runs.push((lines, adapter.unwrap()));
    }
    assert_eq!(runs[0].0, runs[1].0);
    assert!(runs[0].1 == runs[1].1, "the adapters differ");
    assert_ne!(
        runs[0].0[0]["agents"]["0"]["grad_norm"], 0.0,
        "the update moved the adapter"
    );
}

#[test]
fn sft_with_activation_checkpointing_makes_the_plain_updates() {
    // SFT with LoRA dropout, with and without it: the recomputed layers drop what the
    // forward dropped, so the same metrics and both agents' adapters, bit for bit.
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut runs = Vec::new();
    for on in ["false", "true"] {
        let run = dir.path().join(format!("sft-{on}"));
        let set = format!("train.sft.activation_checkpointing={on}");
        let sft = [
            "--set",
            "train.mode=sft",
            "--set",
            "train.sft.top_fraction=0.5",
            "--set",
            "train.sft.epochs=2",
            "--set",
            "train.sft.lr=0.01",
            "--set",
            "train.sft.lora_dropout=0.3",
            "--set",
            "data.count=12",
            "--set",
            "data.held_out=0",
            "--set",
            &set,
        ];
        let lines = without_timings(&train(&run, &model, &sft));
        runs.push((lines, final_adapters(&run, 2)));
    }
    assert_eq!(runs[0].0, runs[1].0);
    assert!(runs[0].1 == runs[1].1, "the adapters differ");
    assert!(
        runs[0]
            .0
            .iter()
            .all(|l| l["grad_norm"].as_f64().unwrap() > 0.0),
        "every epoch moved the adapters: {:?}",
        runs[0].0
    );
}

#[test]
fn agents_updated_side_by_side_make_the_one_by_one_updates() {
    // Two threads, so that the agents' updates do run at the same time: the same metrics
    // and every agent's adapter, bit for bit.
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut runs = Vec::new();
    for on in ["false", "true"] {
        let run = dir.path().join(format!("parallel-{on}"));
        let set = format!("train.ppo.agents_in_parallel={on}");
        let out = run_train(
            &run,
            &model,
            &["--set", &set],
            &[("RAYON_NUM_THREADS", "2")],
        );
        assert!(out.status.success(), "{}", text(&out));
        let lines = without_timings(&metrics(&run));
        runs.push((lines, final_adapters(&run, 2)));
    }
    assert_eq!(runs[0].0, runs[1].0);
    assert!(runs[0].1 == runs[1].1, "the adapters differ");
    assert_eq!(runs[0].0[0]["agents"].as_object().unwrap().len(), 2);
    assert_ne!(runs[0].0[0]["agents"]["1"]["grad_norm"], 0.0);
}

#[test]
fn maporl_trains_every_agent_and_single_trains_agent_zero() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());

    let run = dir.path().join("maporl");
    let lines = train(&run, &model, &[]);
    assert_eq!(lines.len(), 2, "one line per step");
    // TensorBoard holds every metric of every line as a scalar at its step.
    for (tag, path) in [
        ("learning_rate", vec!["learning_rate"]),
        ("accuracy/2", vec!["accuracy", "1"]),
        ("agents/1/kl", vec!["agents", "1", "kl"]),
        ("reward_parts/influence", vec!["reward_parts", "influence"]),
    ] {
        let want: Vec<(i64, f32)> = lines
            .iter()
            .map(|l| {
                let v = path.iter().fold(l, |v, k| match k.parse::<usize>() {
                    Ok(i) if v.is_array() => &v[i],
                    _ => &v[*k],
                });
                (l["step"].as_i64().unwrap(), v.as_f64().unwrap() as f32)
            })
            .collect();
        assert_eq!(tensorboard_series(&run, tag), want, "{tag}");
    }
    for line in &lines {
        let agents = line["agents"].as_object().unwrap();
        assert_eq!(agents.keys().collect::<Vec<_>>(), vec!["0", "1"], "{line}");
        for stats in agents.values() {
            assert!(stats["grad_norm"].as_f64().unwrap() > 0.0, "{stats}");
            assert!(stats["tokens"].as_u64().unwrap() > 0);
            assert!(stats["value_loss"].as_f64().unwrap().is_finite());
            // A random model's next-token distribution (at the sampling temperature, 0.7
            // here, as PPO scores it) is far from deterministic, and no entropy exceeds
            // ln(vocab).
            let entropy = stats["entropy"].as_f64().unwrap();
            assert!(entropy > 0.3 && entropy <= (49152f64).ln(), "{entropy}");
        }
        assert_eq!(
            line["accuracy"].as_array().unwrap().len(),
            2,
            "one accuracy per turn"
        );
        assert!(line["reward_parts"]["influence"].is_number(), "{line}");
        // Turn 2's prompts extend turn 1's conversations: the prefix cache serves them.
        let hit = line["generation_prefix_hit_rate"].as_f64().unwrap();
        assert!(hit > 0.1 && hit < 1.0, "{line}");
        let held = line["generation_prefix_cache_mib"].as_f64().unwrap();
        assert!(held > 0.0 && held < 1024.0, "{line}");
    }
    // The learning rate decays linearly to 0.1x by the last step.
    let lrs: Vec<f64> = lines
        .iter()
        .map(|l| l["learning_rate"].as_f64().unwrap())
        .collect();
    assert!(
        (lrs[0] - 0.001).abs() < 1e-12 && (lrs[1] - 0.0001).abs() < 1e-12,
        "{lrs:?}"
    );
    // Before the first update the adapter is zero: the policy is the reference, KL 0 (to
    // rounding: the policy's log-probs come from generation, the reference's from a
    // separate pass over the same weights).
    let kl0 = lines[0]["agents"]["0"]["kl"].as_f64().unwrap();
    assert!(kl0.abs() < 1e-5, "{kl0}");
    assert_ne!(
        lines[1]["agents"]["0"]["kl"].as_f64().unwrap(),
        0.0,
        "the update moved the policy"
    );
    for a in 0..2 {
        let agent = run.join(format!("checkpoints/final/agent-{a}"));
        for file in [
            "adapter_model.safetensors",
            "adapter_config.json",
            "value_head.safetensors",
        ] {
            assert!(
                agent.join(file).is_file(),
                "{} missing",
                agent.join(file).display()
            );
        }
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(agent.join("adapter_config.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(config["r"], 8);
    }

    let run = dir.path().join("single");
    let lines = train(
        &run,
        &model,
        &[
            "--set",
            "train.mode=single",
            "--set",
            "generation.prefix_cache_mib=0",
        ],
    );
    for line in &lines {
        assert_eq!(line["generation_prefix_hit_rate"], 0.0, "no cache: {line}");
        assert_eq!(line["generation_prefix_cache_mib"], 0.0, "no cache: {line}");
        assert_eq!(
            line["agents"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec!["0"]
        );
    }
    assert!(
        !run.join("checkpoints/final/agent-1").exists(),
        "the frozen agent is not saved"
    );
}

/// `train.algorithm = "grpo"`: each question debated by a group (`group_size` debates of
/// the 4 per step), no value head created, saved or reported; GRPO's own statistics in the
/// metrics; the data cursor advances by questions; a run stopped after a step resumes to
/// the bits of one that did not stop; and the settings GRPO cannot use are refused by name.
#[test]
fn grpo_trains_groups_without_a_critic_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let grpo = [
        "--set",
        "train.algorithm=grpo",
        "--set",
        "train.grpo.group_size=2",
        "--set",
        "debate.batch_size=4",
        "--set",
        "train.steps=3",
    ];
    let whole = dir.path().join("whole");
    let lines = train(&whole, &model, &grpo);
    assert_eq!(lines.len(), 3);
    for line in &lines {
        assert_eq!(line["tasks"], 4, "4 debates a step: {line}");
        for (a, stats) in line["agents"].as_object().unwrap() {
            assert!(stats.get("value_loss").is_none(), "agent {a}: {stats}");
            let kl_loss = stats["kl_loss"].as_f64().unwrap();
            assert!(kl_loss.is_finite() && kl_loss >= 0.0, "agent {a}: {stats}");
            let zero = stats["zero_spread"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&zero), "agent {a}: {stats}");
            assert!(stats["grad_norm"].as_f64().unwrap().is_finite(), "{stats}");
        }
    }
    // 2 questions a step, each debated twice.
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(whole.join("checkpoints/step-000003/state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(state["data_cursor"], 6, "{state}");
    let saved = files(&whole.join("checkpoints/final"));
    assert!(
        saved.contains_key("agent-0/adapter_model.safetensors"),
        "{:?}",
        saved.keys()
    );
    assert!(
        !saved.keys().any(|k| k.contains("value_head")),
        "GRPO has no value head: {:?}",
        saved.keys()
    );
    assert_ne!(
        lines[2]["agents"]["0"]["kl"].as_f64().unwrap(),
        0.0,
        "the updates moved the policy"
    );

    let parts = dir.path().join("parts");
    let out = run_train(
        &parts,
        &model,
        &[&grpo[..], &["--stop-after", "1"]].concat(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = run_train(&parts, &model, &[&grpo[..], &["--resume"]].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(without_timings(&metrics(&parts)), without_timings(&lines));
    assert_eq!(files(&parts.join("checkpoints/final")), saved);
    assert_eq!(
        files(&parts.join("checkpoints/step-000003")),
        files(&whole.join("checkpoints/step-000003"))
    );

    for (set, says) in [
        ("train.grpo.group_size=1", "train.grpo.group_size = 1"),
        (
            "train.grpo.group_size=3",
            "debate.batch_size = 4 is not a multiple of train.grpo.group_size = 3",
        ),
        (
            "train.value_heads=per-turn",
            "train.value_heads = \"per-turn\"",
        ),
        ("train.mode=sft", "train.mode = \"sft\" runs no RL update"),
    ] {
        let run = dir.path().join("refused");
        let out = run_train(&run, &model, &[&grpo[..], &["--set", set]].concat(), &[]);
        assert!(!out.status.success(), "{set}");
        assert!(text(&out).contains(says), "{set}: {}", text(&out));
        assert!(!run.exists(), "{set}: a refused run writes nothing");
    }
}

#[test]
#[cfg_attr(
    not(feature = "test-hooks"),
    ignore = "SIGKILLs a run mid-checkpoint through a hook: needs --features test-hooks \
              (cargo xtask test enables it)"
)]
fn a_stopped_or_killed_run_resumes_exactly_as_if_it_had_not_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let four = ["--set", "train.steps=4"];

    // The reference: four steps without a break (a checkpoint only at the end).
    let whole = dir.path().join("whole");
    let expected = train(&whole, &model, &four);
    assert_eq!(expected.len(), 4);
    let final_files = files(&whole.join("checkpoints/final"));
    assert!(
        final_files.contains_key("agent-1/adapter_model.safetensors"),
        "{:?}",
        final_files.keys()
    );

    // A resume from step 2 that must end where `whole` did.
    let resumes_as_expected = |run: &Path, args: &[&str]| {
        let out = run_train(run, &model, &[args, &["--resume"]].concat(), &[]);
        assert!(out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("resuming after step 2 of 4"),
            "{}",
            text(&out)
        );
        assert_eq!(without_timings(&metrics(run)), without_timings(&expected));
        assert_eq!(files(&run.join("checkpoints/final")), final_files);
        // TensorBoard shows what an unbroken run shows: the resumed process's file starts
        // with a SessionLog.START at the first step it redoes (lines count from step 0),
        // dropping what the stopped one logged from there on.
        let events = tensorboard_events(run);
        assert_eq!(events.len(), 2, "one event file per process");
        assert_eq!(events[1][0], TbEvent::Start(2));
        for tag in [
            "learning_rate",
            "agents/0/policy_loss",
            "reward_parts/influence",
        ] {
            assert_eq!(
                tensorboard_series(run, tag),
                tensorboard_series(&whole, tag),
                "{tag}"
            );
        }
    };

    // Stopped after two steps (as Ctrl-C would), then resumed.
    let parts = dir.path().join("parts");
    let out = run_train(
        &parts,
        &model,
        &[&four[..], &["--stop-after", "2"]].concat(),
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("continue with --resume"),
        "{}",
        text(&out)
    );
    assert_eq!(metrics(&parts).len(), 2);
    assert!(!parts.join("checkpoints/final").exists());
    resumes_as_expected(&parts, &four[..]);
    // The whole checkpoint, optimizer moments and samplers included, is the same.
    assert_eq!(
        files(&parts.join("checkpoints/step-000004")),
        files(&whole.join("checkpoints/step-000004"))
    );

    // SIGKILLed while writing the checkpoint of step 3: the run goes back to step 2.
    let killed = dir.path().join("killed");
    let every = [&four[..], &["--set", "train.checkpoint_every=1"]].concat();
    let mut child = command(
        &killed,
        &model,
        &every,
        &[("MAPORL_TEST_STALL_CHECKPOINT", "3")],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let started = std::time::Instant::now();
    while !killed.join("checkpoint-stalled").exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before stalling"
        );
        assert!(started.elapsed().as_secs() < 300, "the run never stalled");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let checkpoints = killed.join("checkpoints");
    assert_eq!(
        std::fs::read_to_string(checkpoints.join("latest")).unwrap(),
        "step-000002"
    );
    assert!(!checkpoints.join("step-000003").exists());
    assert!(
        std::fs::read_dir(&checkpoints).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".staging-")),
        "the half-written checkpoint was staged, not in place"
    );
    assert_eq!(
        metrics(&killed).len(),
        3,
        "step 3 finished before its checkpoint"
    );
    resumes_as_expected(&killed, &every[..]);
    let left: Vec<String> = std::fs::read_dir(&checkpoints)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left.iter().any(|n| n.starts_with(".staging-")),
        "staging leftovers are swept: {left:?}"
    );
}

#[test]
fn a_resume_refuses_another_config_or_plugin_and_a_fresh_run_refuses_a_used_dir() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    let out = run_train(&run, &model, &["--stop-after", "1"], &[]);
    assert!(out.status.success(), "{}", text(&out));

    let out = run_train(&run, &model, &[], &[]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("already holds checkpoints"),
        "{}",
        text(&out)
    );

    // A checkpoint whose state contradicts the config is refused, not resumed into doing
    // nothing: more steps done than the run has, tasks handed out that its steps did not
    // take, more metrics lines than steps. The file is put back after each.
    let latest = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("state.json").is_file())
        .expect("a checkpoint");
    let state_file = latest.join("state.json");
    let saved = std::fs::read_to_string(&state_file).unwrap();
    for (key, value, needle) in [
        (
            "step",
            json!(1_000_000_000_000_000u64),
            "train.steps must be at least",
        ),
        ("data_cursor", json!(7), "tasks handed out"),
        ("metrics_lines", json!(9), "metrics lines"),
    ] {
        let mut state: serde_json::Value = serde_json::from_str(&saved).unwrap();
        state[key] = value;
        std::fs::write(&state_file, state.to_string()).unwrap();
        let out = run_train(&run, &model, &["--resume"], &[]);
        assert!(!out.status.success(), "{key}: {}", text(&out));
        assert!(text(&out).contains(needle), "{key}: {}", text(&out));
    }
    std::fs::write(&state_file, &saved).unwrap();

    let out = run_train(
        &run,
        &model,
        &["--resume", "--set", "train.ppo.lr=0.002"],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("differs from the run's") && text(&out).contains("train.ppo.lr"),
        "{}",
        text(&out)
    );

    // The same shaper with one custom section appended: another component to a resume.
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for name in ["debate", "gsm8k", "influence"] {
        std::fs::copy(plugin(name), plugins.join(format!("{name}.wasm"))).unwrap();
    }
    let mut bytes = std::fs::read(plugins.join("influence.wasm")).unwrap();
    bytes.extend_from_slice(&[0x00, 0x05, 0x04, b't', b'e', b's', b't']);
    std::fs::write(plugins.join("influence.wasm"), bytes).unwrap();
    let env = [("MAPORL_PLUGINS", plugins.to_str().unwrap())];
    let out = run_train(&run, &model, &["--resume"], &env);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("its plugins changed since it started")
            && text(&out).contains("shaper plugin `influence.wasm`")
            && !text(&out).contains("protocol plugin")
            && text(&out).contains("--allow-plugin-change"),
        "{}",
        text(&out)
    );
    let out = run_train(&run, &model, &["--resume", "--allow-plugin-change"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(metrics(&run).len(), 2);
}

/// A plugin rebuilt from the same source (another component declaring the same
/// `maporl:source`, as the Python SDK's builds do) continues a run; another source is a change.
#[test]
fn a_resume_accepts_a_plugin_rebuilt_from_the_same_source() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for name in ["debate", "gsm8k", "influence"] {
        std::fs::copy(plugin(name), plugins.join(format!("{name}.wasm"))).unwrap();
    }
    let base = std::fs::read(plugin("influence")).unwrap();
    let source = |s: char| s.to_string().repeat(64);
    // A build's bytes differ (here: a build id) while its source stays.
    let build = |id: &[u8], src: &str| {
        let b = maporl::plugin::source::with_section(&base, "build-id", id);
        let b = maporl::plugin::source::with_section(&b, "maporl:source", src.as_bytes());
        std::fs::write(plugins.join("influence.wasm"), b).unwrap();
    };
    let env = [("MAPORL_PLUGINS", plugins.to_str().unwrap())];
    build(b"first", &source('a'));
    let out = run_train(&run, &model, &["--stop-after", "1"], &env);
    assert!(out.status.success(), "{}", text(&out));
    let lock = std::fs::read_to_string(run.join("plugins.lock")).unwrap();
    assert!(lock.contains(&source('a')), "{lock}");

    build(b"second", &source('b'));
    let out = run_train(&run, &model, &["--resume"], &env);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("shaper plugin `influence.wasm`")
            && text(&out).contains(&format!("built from source sha256 {}", source('a'))),
        "{}",
        text(&out)
    );

    build(b"second", &source('a'));
    let out = run_train(&run, &model, &["--resume"], &env);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(metrics(&run).len(), 2);
}

#[test]
fn baselines_off_the_shelf_evaluates_and_sft_learns_the_best_debates() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());

    let run = dir.path().join("off");
    let out = run_train(&run, &model, &["--set", "train.mode=off-the-shelf"], &[]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).unwrap()).unwrap();
    assert_eq!(report["tasks"], 8, "{report}");
    assert!(!run.join("checkpoints").exists(), "nothing is trained");

    let run = dir.path().join("sft");
    let sft = [
        "--set",
        "train.mode=sft",
        "--set",
        "train.sft.top_fraction=0.5",
        "--set",
        "train.sft.epochs=4",
        "--set",
        "train.sft.lr=0.01",
        "--set",
        "data.count=12",
        "--set",
        "data.held_out=4",
    ];
    let out = run_train(&run, &model, &sft, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("kept 4 of 8 debates"), "{}", text(&out));
    let lines = metrics(&run);
    assert_eq!(lines.len(), 2 * 4, "one line per agent and epoch");
    for a in 0..2 {
        let loss: Vec<f64> = lines
            .iter()
            .filter(|l| l["agent"] == a)
            .map(|l| l["loss"].as_f64().unwrap())
            .collect();
        // Each kept debate holds two utterances per agent (two turns).
        assert!(lines.iter().all(|l| l["agent"] != a || l["samples"] == 8));
        assert!(loss[3] < loss[0] - 0.1, "agent {a} losses {loss:?}");
        // TensorBoard: the agent's loss per epoch (epochs count from 1, as in the lines).
        let epochs: Vec<i64> = lines
            .iter()
            .filter(|l| l["agent"] == a)
            .map(|l| l["epoch"].as_i64().unwrap())
            .collect();
        let want: Vec<(i64, f32)> = epochs
            .into_iter()
            .zip(loss.iter().map(|x| *x as f32))
            .collect();
        assert_eq!(tensorboard_series(&run, &format!("agent_{a}/loss")), want);
        let adapter = run.join(format!("checkpoints/final/agent-{a}"));
        assert!(adapter.join("adapter_model.safetensors").is_file());
    }
    let transcripts = std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap();
    assert_eq!(
        transcripts.lines().count(),
        8,
        "the 8 training tasks' debates"
    );
    // The held-out 4, debated by the untuned team and then by the tuned one.
    let texts = |name: &str| {
        std::fs::read_to_string(run.join(format!("transcripts-{name}.jsonl"))).unwrap()
    };
    assert_eq!(texts("before").lines().count(), 4);
    assert_ne!(texts("before"), texts("after"), "the tuned adapters speak");
    assert!(text(&out).contains("held-out tasks, after training"));

    // LoRA dropout (the paper's SFT setting): the same debates and order, other adapters,
    // and PEFT's adapter_config.json says what it was trained with.
    let dropped = dir.path().join("sft-dropout");
    let with_dropout = [&sft[..], &["--set", "train.sft.lora_dropout=0.3"]].concat();
    let out = run_train(&dropped, &model, &with_dropout, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let adapter = |run: &Path| {
        std::fs::read(run.join("checkpoints/final/agent-0/adapter_model.safetensors")).unwrap()
    };
    let dropout_of = |run: &Path| {
        let c: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(run.join("checkpoints/final/agent-0/adapter_config.json"))
                .unwrap(),
        )
        .unwrap();
        c["lora_dropout"].as_f64().unwrap()
    };
    assert_ne!(adapter(&run), adapter(&dropped), "dropout changed nothing");
    assert_eq!((dropout_of(&run), dropout_of(&dropped)), (0.0, 0.3));
    assert_eq!(
        std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap(),
        std::fs::read_to_string(dropped.join("transcripts.jsonl")).unwrap(),
        "the debates SFT learns from are the same"
    );
}

#[test]
fn per_turn_value_heads_and_the_turn_based_schedule_train_only_their_turns() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    let lines = train(
        &run,
        &model,
        &[
            "--set",
            "debate.turns=3",
            "--set",
            "train.steps=3",
            "--set",
            "train.checkpoint_every=1",
            "--set",
            "train.value_heads=per-turn",
            "--set",
            "train.adapter_from_turn=2",
            "--set",
            "train.schedule=turn-based",
            "--set",
            "train.turn2_steps=1",
        ],
    );
    let turns: Vec<&serde_json::Value> = lines.iter().map(|l| &l["trained_turns"]).collect();
    use serde_json::json;
    assert_eq!(turns, [&json!([2]), &json!([3]), &json!([2])]);
    for line in &lines {
        for stats in line["agents"].as_object().unwrap().values() {
            assert!(stats["grad_norm"].as_f64().unwrap() > 0.0, "{stats}");
        }
    }
    for a in 0..2 {
        let head = |step: u32, turn: u32| {
            let agent = run.join(format!("checkpoints/step-{step:06}/agent-{a}"));
            assert!(!agent.join("value_head.safetensors").exists());
            std::fs::read(agent.join(format!("value_head.turn-{turn}.safetensors"))).unwrap()
        };
        // Steps 1..3 trained turns 2, 3, 2: a head moves only at its turn's steps.
        assert!(head(1, 1) == head(3, 1), "turn 1 is never trained");
        assert!(head(1, 2) == head(2, 2) && head(2, 2) != head(3, 2));
        assert!(head(1, 3) != head(2, 3) && head(2, 3) == head(3, 3));
    }
}

#[test]
fn full_finetuning_and_a_team_of_two_model_families() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());

    // Full fine-tuning saves the whole model, moved away from the base.
    let run = dir.path().join("full");
    let lines = train(&run, &model, &["--set", "train.full_finetune=true"]);
    assert!(lines[1]["agents"]["0"]["grad_norm"].as_f64().unwrap() > 0.0);
    let base =
        candle_core::safetensors::load(model.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    for a in 0..2 {
        let agent = run.join(format!("checkpoints/final/agent-{a}"));
        assert!(!agent.join("adapter_model.safetensors").exists());
        let tuned = candle_core::safetensors::load(
            agent.join("model.safetensors"),
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let name = "model.layers.1.mlp.down_proj.weight";
        let diff = (&tuned[name] - &base[name])
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff > 0.0, "agent {a}: {name} did not move");
        assert_eq!(tuned.len(), base.len(), "every weight is saved");
    }

    // SmolLM2 and the tiny Qwen2 co-trained: each learns, each adapter names its base.
    let run = dir.path().join("mixed");
    let agents = format!(
        "agents=[{{model = \"\"}}, {{model = \"{}\"}}]",
        smollm2().display()
    );
    let lines = train(&run, &model, &["--set", &agents, "--set", "train.steps=1"]);
    for a in ["0", "1"] {
        assert!(
            lines[0]["agents"][a]["grad_norm"].as_f64().unwrap() > 0.0,
            "{}",
            lines[0]
        );
    }
    let base_of = |a: u32| {
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                run.join(format!("checkpoints/final/agent-{a}/adapter_config.json")),
            )
            .unwrap(),
        )
        .unwrap();
        config["base_model_name_or_path"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(base_of(0).contains("tiny-qwen2"), "{}", base_of(0));
    assert!(base_of(1).contains("SmolLM2"), "{}", base_of(1));
}

/// `maporl eval` on the quickstart config shrunk like the training runs; returns each
/// debate's utterance texts as (turn, agent, text).
fn eval_texts(run: &Path, model: &Path, extra: &[&str]) -> Vec<Vec<(u64, u64, String)>> {
    let config = repo().join("configs/smollm2-arith.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config", config.to_str().unwrap()])
        .args(["--set", &format!("model.path={}", model.display())])
        .args(["--set", &format!("run_dir={}", run.display())])
        .args([
            "--set",
            "debate.turns=2",
            "--set",
            "generation.max_new_tokens=6",
        ])
        .args(extra)
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    std::fs::read_to_string(run.join("transcripts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            r["transcript"]["utterances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| {
                    (
                        u["turn"].as_u64().unwrap(),
                        u["agent"].as_u64().unwrap(),
                        u["text"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        })
        .collect()
}

/// `maporl eval` as in [`eval_texts`]; returns each debate's utterance texts by task id.
fn eval_by_task(
    run: &Path,
    model: &Path,
    extra: &[&str],
) -> std::collections::BTreeMap<String, Vec<String>> {
    eval_texts(run, model, extra);
    std::fs::read_to_string(run.join("transcripts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).unwrap();
            let texts = r["transcript"]["utterances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u["text"].as_str().unwrap().to_string())
                .collect();
            (r["task"]["id"].as_str().unwrap().to_string(), texts)
        })
        .collect()
}

#[test]
fn evaluations_draw_per_task_whatever_is_debated_beside() {
    // Paired draws: a task's debate depends on the seed and the weights, not on which other
    // tasks share its batches, nor on how many were debated before it.
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let all = eval_by_task(&dir.path().join("a"), &model, &[]);
    let one_by_one = eval_by_task(
        &dir.path().join("b"),
        &model,
        &["--set", "debate.batch_size=1"],
    );
    let fewer = eval_by_task(&dir.path().join("c"), &model, &["--set", "data.count=3"]);
    assert_eq!(all.len(), 8);
    assert_eq!(
        all, one_by_one,
        "batched or one at a time, the same debates"
    );
    let shared: Vec<&String> = fewer.keys().filter(|k| all.contains_key(*k)).collect();
    assert!(!shared.is_empty(), "{:?} vs {:?}", fewer.keys(), all.keys());
    for id in shared {
        assert_eq!(fewer[id], all[id], "task {id}");
    }
    // Another seed draws other streams (else the equalities above prove nothing).
    let other = eval_by_task(
        &dir.path().join("d"),
        &model,
        &["--set", "seed=1", "--set", "data.seed=0"],
    );
    let differs = all
        .iter()
        .filter(|(id, t)| other.get(*id) != Some(t))
        .count();
    assert!(differs > 0, "seed 1 debated every task as seed 0 did");
}

#[test]
fn eval_speaks_with_trained_adapters_from_the_configured_turn() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    train(&run, &model, &["--set", "train.ppo.lr=0.05"]);
    let adapters = format!(
        "agents=[{{adapter = \"{0}/agent-0\"}}, {{adapter = \"{0}/agent-1\"}}]",
        run.join("checkpoints/final").display()
    );
    let texts = |debates: &[Vec<(u64, u64, String)>], turn: u64| -> Vec<String> {
        debates
            .iter()
            .flatten()
            .filter(|u| u.0 == turn)
            .map(|u| u.2.clone())
            .collect()
    };
    let base = eval_texts(&dir.path().join("e0"), &model, &[]);
    let tuned = eval_texts(&dir.path().join("e1"), &model, &["--set", &adapters]);
    let later = eval_texts(
        &dir.path().join("e2"),
        &model,
        &["--set", &adapters, "--set", "train.adapter_from_turn=2"],
    );
    assert_eq!(base.len(), 8);
    assert_ne!(
        texts(&base, 1),
        texts(&tuned, 1),
        "the adapters change turn 1"
    );
    assert_eq!(
        texts(&base, 1),
        texts(&later, 1),
        "from turn 2 on, turn 1 is the base's"
    );
    assert_ne!(
        texts(&base, 2),
        texts(&later, 2),
        "the adapters speak on turn 2"
    );

    // A missing adapter is named with its agent.
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config"])
        .arg(repo().join("configs/smollm2-arith.toml"))
        .args(["--set", &format!("model.path={}", model.display())])
        .args([
            "--set",
            &format!("run_dir={}", dir.path().join("e3").display()),
        ])
        .args(["--set", "agents=[{}, {adapter = \"/nonexistent/agent-1\"}]"])
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out).contains("agents[1].adapter") && text(&out).contains("/nonexistent/agent-1"),
        "{}",
        text(&out)
    );
}

#[test]
fn held_out_tasks_are_evaluated_before_and_after_and_never_trained_on() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("held");
    let out = run_train(
        &run,
        &model,
        &["--set", "data.count=12", "--set", "data.held_out=4"],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out));
    for name in ["before", "after"] {
        assert!(
            text(&out).contains(&format!(
                "held-out tasks, {name} training:\n| 4 tasks, 2 agents"
            )),
            "{}",
            text(&out)
        );
        let report: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(run.join(format!("eval-{name}.json"))).unwrap(),
        )
        .unwrap();
        assert_eq!(report["tasks"], 4);
        let ids: Vec<String> =
            std::fs::read_to_string(run.join(format!("transcripts-{name}.jsonl")))
                .unwrap()
                .lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["task"]["id"].to_string()
                })
                .collect();
        assert_eq!(ids.len(), 4);
    }
    // The run pairs its two evaluations task by task, and `maporl compare` reads the same
    // from the run directory: each turn's accuracies are the reports' majority accuracies,
    // and the interval holds the difference.
    assert!(
        text(&out).contains("held-out tasks, after against before training, paired over 4 tasks"),
        "{}",
        text(&out)
    );
    let cmp = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["compare", "--json", "--resamples", "500"])
        .args([&run, &run])
        .output()
        .unwrap();
    assert!(cmp.status.success(), "{}", text(&cmp));
    let cmp: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    assert_eq!(cmp["tasks"], 4);
    let report = |name: &str| -> serde_json::Value {
        serde_json::from_str(
            &std::fs::read_to_string(run.join(format!("eval-{name}.json"))).unwrap(),
        )
        .unwrap()
    };
    let (before, after) = (report("before"), report("after"));
    let turns = cmp["turns"].as_array().unwrap();
    assert_eq!(turns.len(), before["turns"].as_array().unwrap().len());
    for (i, t) in turns.iter().enumerate() {
        let f = |v: &serde_json::Value| v.as_f64().unwrap();
        assert!((f(&t["first"]) - f(&before["turns"][i]["majority_accuracy"])).abs() < 1e-12);
        assert!((f(&t["second"]) - f(&after["turns"][i]["majority_accuracy"])).abs() < 1e-12);
        assert!((f(&t["difference"]) - (f(&t["second"]) - f(&t["first"]))).abs() < 1e-12);
        assert!(f(&t["low"]) <= f(&t["difference"]) && f(&t["difference"]) <= f(&t["high"]));
    }
    // A file that is not transcripts is refused, naming the file and the line.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "\nnot json\n").unwrap();
    let cmp = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["compare"])
        .args([&bad, &run.join("transcripts-after.jsonl")])
        .output()
        .unwrap();
    assert!(!cmp.status.success());
    assert!(
        text(&cmp).contains("bad.jsonl line 2: not a debate record"),
        "{}",
        text(&cmp)
    );
    // Training on tasks 5-12 with the evaluations around it is training on tasks 5-12 alone.
    let plain = dir.path().join("plain");
    let expected = train(
        &plain,
        &model,
        &["--set", "data.count=8", "--set", "data.offset=4"],
    );
    assert_eq!(without_timings(&metrics(&run)), without_timings(&expected));
    assert_eq!(
        files(&run.join("checkpoints/final")),
        files(&plain.join("checkpoints/final"))
    );
    assert!(!plain.join("eval-before.json").exists());

    // `maporl eval` debates only the held-out set; too large a set is refused.
    let e = eval_texts(
        &dir.path().join("eval"),
        &model,
        &["--set", "data.count=12", "--set", "data.held_out=4"],
    );
    assert_eq!(e.len(), 4);
    // `maporl compare` takes `maporl eval` directories too: one evaluation against itself
    // differs by nothing.
    let eval_dir = dir.path().join("eval");
    let cmp = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["compare", "--json"])
        .args([&eval_dir, &eval_dir])
        .output()
        .unwrap();
    assert!(cmp.status.success(), "{}", text(&cmp));
    let cmp: serde_json::Value = serde_json::from_slice(&cmp.stdout).unwrap();
    assert_eq!(cmp["tasks"], 4);
    for t in cmp["turns"].as_array().unwrap() {
        assert_eq!(
            (&t["difference"], &t["low"], &t["high"]),
            (&0.0.into(), &0.0.into(), &0.0.into())
        );
    }
    let out = run_train(
        &dir.path().join("bad"),
        &model,
        &["--set", "data.count=4", "--set", "data.held_out=4"],
        &[],
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("data.held_out = 4 leaves no training tasks"),
        "{}",
        text(&out)
    );
}

#[cfg(unix)]
#[test]
fn ctrl_c_checkpoints_after_the_step_in_progress_and_the_run_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let steps = [
        "--set",
        "train.steps=12",
        "--set",
        "train.checkpoint_every=100",
    ];
    let run = dir.path().join("interrupted");
    let out = interrupt_after_first_metrics_line(
        &mut command(&run, &model, &steps, &[]),
        &run.join("metrics.jsonl"),
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("interrupted: checkpointing after this step")
            && text(&out).contains("continue with --resume"),
        "the run should have stopped early (did it end before the signal?): {}",
        text(&out)
    );
    assert!(!run.join("checkpoints/final").exists());
    let done = metrics(&run).len();
    assert!(done < 12, "{done} steps");
    // No periodic checkpoint was due: the one there is Ctrl-C's.
    assert_eq!(
        std::fs::read_to_string(run.join("checkpoints/latest")).unwrap(),
        format!("step-{done:06}")
    );

    let out = run_train(&run, &model, &[&steps[..], &["--resume"]].concat(), &[]);
    assert!(out.status.success(), "{}", text(&out));
    let whole = dir.path().join("whole");
    let expected = train(&whole, &model, &steps);
    assert_eq!(without_timings(&metrics(&run)), without_timings(&expected));
    assert_eq!(
        files(&run.join("checkpoints/final")),
        files(&whole.join("checkpoints/final"))
    );
}
