//! `maporl train` end to end on a tiny model: debates, shaped rewards, PPO on every learning
//! agent (MAPoRL) or on agent 0 only (the single-agent baseline), one metrics line per step,
//! and the adapters saved in the PEFT layout.

mod support;

use std::process::Command;

use support::*;

fn train(run: &std::path::Path, model: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let config = repo().join("configs/quickstart-arith.toml");
    let model = format!("model.path={}", model.display());
    let run_dir = format!("run_dir={}", run.display());
    let mut args = vec![
        "train",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &model,
        "--set",
        &run_dir,
        "--set",
        "train.steps=2",
        "--set",
        "debate.batch_size=2",
        "--set",
        "debate.turns=2",
        "--set",
        "generation.max_new_tokens=6",
        "--set",
        "train.ppo.minibatches=2",
        "--set",
        "train.ppo.epochs=2",
        "--set",
        "train.ppo.lr=0.001",
    ];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(&args)
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "one line per step");
    serde_json::Value::Array(lines)
}

#[test]
fn maporl_trains_every_agent_and_single_trains_agent_zero() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);

    let run = dir.path().join("maporl");
    let lines = train(&run, &model, &[]);
    for line in lines.as_array().unwrap() {
        let agents = line["agents"].as_object().unwrap();
        assert_eq!(agents.keys().collect::<Vec<_>>(), vec!["0", "1"], "{line}");
        for stats in agents.values() {
            assert!(stats["grad_norm"].as_f64().unwrap() > 0.0, "{stats}");
            assert!(stats["tokens"].as_u64().unwrap() > 0);
            assert!(stats["value_loss"].as_f64().unwrap().is_finite());
            // A random model's next-token distribution is far from deterministic, and no
            // entropy exceeds ln(vocab).
            let entropy = stats["entropy"].as_f64().unwrap();
            assert!(entropy > 1.0 && entropy <= (49152f64).ln(), "{entropy}");
        }
        assert_eq!(
            line["accuracy"].as_array().unwrap().len(),
            2,
            "one accuracy per turn"
        );
        assert!(line["reward_parts"]["influence"].is_number(), "{line}");
    }
    // The learning rate decays linearly to 0.1x by the last step.
    let lrs: Vec<f64> = lines
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["learning_rate"].as_f64().unwrap())
        .collect();
    assert!(
        (lrs[0] - 0.001).abs() < 1e-12 && (lrs[1] - 0.0001).abs() < 1e-12,
        "{lrs:?}"
    );
    // Before the first update the adapter is zero: the policy is the reference, KL 0.
    assert_eq!(lines[0]["agents"]["0"]["kl"].as_f64().unwrap(), 0.0);
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
    let lines = train(&run, &model, &["--set", "train.mode=single"]);
    for line in lines.as_array().unwrap() {
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
