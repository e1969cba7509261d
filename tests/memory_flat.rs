//! Every loop that steps an optimizer runs in flat memory: the warm start, `maporl train`
//! (MAPoRL and the single-agent baseline, LoRA and full fine-tuning), SFT and `maporl
//! verifier train`. Each runs the binary on a tiny model for enough steps to show a trend
//! and reads the resident memory the command itself reports after its steps (VmRSS, in its
//! metrics or progress lines): what it holds after the last step may exceed what it held
//! after an early one (once the allocator has seen a step's working set) by less than
//! [`GROWTH_MIB`].
//!
//! The bound catches the class of leak that killed the quickstart's warm start: a tensor
//! that keeps its graph across steps (the optimizer's moments were computed from gradients
//! still attached to the forward pass, so every step kept the last one's activations alive:
//! about 170 MB a step there, 5-40 MB a step at these sizes, so several hundred MB over
//! these runs).

#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

/// How much resident memory may grow from the early step to the last, in MiB.
const GROWTH_MIB: u64 = 48;

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.env("MAPORL_PLUGINS", plugins_dir()).output().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{cmd:?}\n{t}");
    t
}

/// `resident_mib` of each line of `run/metrics.jsonl`, in order.
fn resident_per_line(run: &Path) -> Vec<u64> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["resident_mib"]
                .as_u64()
                .unwrap_or_else(|| panic!("no resident_mib in {l}"))
        })
        .collect()
}

/// Asserts that the last of `points` (resident MiB after successive steps) exceeds the one
/// at `early` by less than [`GROWTH_MIB`].
fn assert_flat(what: &str, points: &[u64], early: usize) {
    assert!(
        points.len() >= early + 4,
        "{what}: {} points are too few to show a trend: {points:?}",
        points.len()
    );
    let (e, last) = (points[early], *points.last().unwrap());
    assert!(
        last < e + GROWTH_MIB,
        "{what}: resident memory grew from {e} MiB after step {} to {last} MiB after the \
         last step (bound {GROWTH_MIB} MiB): something is kept from step to step. \
         All: {points:?}",
        early + 1
    );
    eprintln!("{what}: {points:?} MiB");
}

fn tiny_qwen2(dir: &Path) -> PathBuf {
    let model = dir.join("tiny-qwen2");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    model
}

fn maporl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_maporl"))
}

/// `maporl train` on the SmolLM2 config with the tiny model, `steps` steps.
fn train(dir: &Path, name: &str, steps: usize, extra: &[&str]) -> PathBuf {
    let model = tiny_qwen2(&dir.join(name).with_extension("model"));
    let run_dir = dir.join(name);
    let mut cmd = maporl();
    cmd.args(["train", "--config"])
        .arg(repo().join("configs/smollm2-arith.toml"));
    for set in [
        format!("model.path={}", model.display()),
        format!("run_dir={}", run_dir.display()),
        format!("train.steps={steps}"),
        "train.checkpoint_every=0".into(),
        "data.count=64".into(),
        "data.held_out=0".into(),
        "debate.batch_size=4".into(),
        "debate.turns=2".into(),
        "generation.max_new_tokens=16".into(),
        "train.ppo.minibatches=2".into(),
        "train.ppo.epochs=2".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    for set in extra {
        cmd.args(["--set", set]);
    }
    run(&mut cmd);
    run_dir
}

#[test]
fn the_warm_start_runs_in_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = maporl();
    cmd.args(["warm-start", "--config"])
        .arg(repo().join("configs/quickstart.toml"));
    // The quickstart's model at its own size; fewer teacher debates and steps.
    for set in [
        format!("model.path={}", dir.path().join("model").display()),
        "warm_start.tasks=200".into(),
        "warm_start.drills=600".into(),
        "warm_start.steps=40".into(),
        "warm_start.batch_tokens=1024".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    let out = run(&mut cmd);
    // "  step    12: loss 2.1, resident 120 MiB (peak 130)", every 4 steps.
    let points: Vec<u64> = out
        .lines()
        .filter_map(|l| {
            let rest = l.split_once(", resident ")?.1;
            rest.split_whitespace().next()?.parse().ok()
        })
        .collect();
    assert_eq!(points.len(), 10, "{out}");
    assert_flat("warm start", &points, 3);
}

#[test]
fn maporl_training_with_lora_runs_in_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = train(dir.path(), "maporl", 10, &[]);
    assert_flat("train (maporl, LoRA)", &resident_per_line(&run_dir), 2);
}

#[test]
fn single_agent_training_runs_in_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = train(dir.path(), "single", 10, &["train.mode=single"]);
    assert_flat("train (single)", &resident_per_line(&run_dir), 2);
}

#[test]
fn full_finetuning_runs_in_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = train(dir.path(), "full", 10, &["train.full_finetune=true"]);
    assert_flat(
        "train (maporl, full fine-tuning)",
        &resident_per_line(&run_dir),
        2,
    );
}

#[test]
fn sft_runs_in_flat_memory() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = train(
        dir.path(),
        "sft",
        1,
        &[
            "train.mode=sft",
            "data.count=24",
            "train.sft.top_fraction=1.0",
            "train.sft.epochs=10",
            "train.sft.batch_size=2",
        ],
    );
    // One line per agent and epoch; agent 0's epochs, then agent 1's.
    let all = resident_per_line(&run_dir);
    assert_eq!(all.len(), 20);
    assert_flat("sft", &all, 2);
}

#[test]
fn verifier_training_runs_in_flat_memory() {
    use maporl::verifier::data::{write_jsonl, Sample};
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_qwen2(dir.path());
    let data = dir.path().join("answers.jsonl");
    let samples: Vec<Sample> = (0..24)
        .flat_map(|q| {
            let (a, b) = (q % 7 + 2, q % 5 + 3);
            [(a + b, true), (a + b + 1, false)].map(|(c, correct)| Sample {
                task_id: format!("q{q}"),
                question: format!("What is {a} + {b}?"),
                response: format!("{a} + {b} makes \\boxed{{{c}}}"),
                correct,
                answer: Some(c.to_string()),
                reference: (a + b).to_string(),
            })
        })
        .collect();
    write_jsonl(&data, &samples).unwrap();
    let run_dir = dir.path().join("verifier");
    let mut cmd = maporl();
    cmd.args(["verifier", "train", "--config"])
        .arg(repo().join("configs/smollm2-arith.toml"))
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&run_dir);
    for set in [
        format!("model.path={}", model.display()),
        format!("verifier.model={}", model.display()),
        "verifier.train.epochs=10".into(),
        "verifier.train.batch_size=8".into(),
        "verifier.train.val_fraction=0.25".into(),
        "verifier.train.checkpoint_every=0".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    run(&mut cmd);
    assert_flat("verifier train", &resident_per_line(&run_dir), 2);
}
