//! Plugins in other languages against the Rust reference plugins: the same plans, decisions,
//! verdicts and rewards call for call, and the same transcripts from a whole `maporl eval`.
//! Shared by tests/python_plugins.rs and tests/js_plugins.rs.

use std::path::{Path, PathBuf};

use maporl::plugin::{Limits, Protocol, RewardShaper, Runtime, Verifier};
use maporl::transcript::{Task, Transcript};
use serde_json::json;

use super::{add_turn, plugin, repo, task, write_tiny_qwen2};

/// Responses that reach the SDKs' edge cases: boxes nested, unclosed, several, spaced; a
/// Unicode minus; numbers past i64; Rust's whitespace (narrower than Python's and
/// JavaScript's) around text.
pub fn response(agent: u32, turn: u32, task: u32) -> String {
    let cases = [
        "3 + 4 = 7. Answer: \\boxed{7}".to_string(),
        "I think \\boxed{8} but then \\boxed {7}".to_string(),
        "It is \\boxed{\\frac{14}{2}} or \\boxed{7".to_string(),
        "\u{2212}7? no: \\boxed{\u{2212}7}".to_string(),
        "\\boxed{99999999999999999999}".to_string(),
        "\u{1c} \\boxed{7}\u{1f}".to_string(),
        "\u{2003}no answer here\u{a0}".to_string(),
        String::new(),
        "Answer: \\boxed{+7}\n\nAgent 2 said \\boxed{6}.".to_string(),
    ];
    cases[((agent * 7 + turn * 3 + task) % cases.len() as u32) as usize].clone()
}

pub fn tasks() -> Vec<Task> {
    vec![
        task("t0", "gsm8k", "What is 3 + 4?", "7"),
        task("t1", "arith", "  What is 10 - 17?\u{1c}", "-7"),
        task("t2", "qa", "Name a prime.", "7"),
        Task {
            fields: vec![
                ("premise".into(), " p ".into()),
                ("hypothesis".into(), "h".into()),
            ],
            ..task("t3", "anli", "ignored", "7")
        },
    ]
}

/// Debates of 3 agents over 3 turns through the Rust reference plugins (`debate`, `gsm8k`,
/// `influence`) and `other`'s (the same names) side by side, asserting every call's result
/// equal, rewards to the bit.
pub fn same_debates(
    rt: &Runtime,
    other: &dyn Fn(&str) -> PathBuf,
    protocol: serde_json::Value,
    shaper: serde_json::Value,
) {
    let limits = Limits::default();
    let load_p = |p: PathBuf| Protocol::load(rt, &p, &protocol, &limits).unwrap();
    let load_v = |p: PathBuf| Verifier::load(rt, &p, &json!({}), &limits).unwrap();
    let load_s = |p: PathBuf| RewardShaper::load(rt, &p, &shaper, &limits).unwrap();
    let (mut p_rs, mut p_o) = (load_p(plugin("debate")), load_p(other("debate")));
    let (mut v_rs, mut v_o) = (load_v(plugin("gsm8k")), load_v(other("gsm8k")));
    let (mut s_rs, mut s_o) = (load_s(plugin("influence")), load_s(other("influence")));
    for (i, task) in tasks().iter().enumerate() {
        let mut transcript = Transcript::new(3, 3);
        for turn in 1..=3 {
            let plan = p_rs.plan_turn(task, turn, &transcript).unwrap();
            assert_eq!(
                plan,
                p_o.plan_turn(task, turn, &transcript).unwrap(),
                "{} turn {turn}",
                task.id
            );
            if plan.is_empty() {
                break;
            }
            let texts: Vec<String> = plan
                .iter()
                .map(|p| response(p.agent, turn, i as u32))
                .collect();
            let verdicts = v_rs.score(task, &texts).unwrap();
            assert_eq!(
                verdicts,
                v_o.score(task, &texts).unwrap(),
                "{} turn {turn}",
                task.id
            );
            for text in &texts {
                assert_eq!(
                    v_rs.extract(task, text).unwrap(),
                    v_o.extract(task, text).unwrap(),
                    "{text:?}"
                );
            }
            add_turn(&mut transcript, turn, &plan, &texts, &verdicts);
            assert_eq!(
                p_rs.decide(task, turn, &transcript).unwrap(),
                p_o.decide(task, turn, &transcript).unwrap(),
                "{} turn {turn}",
                task.id
            );
        }
        let rewards = s_rs.shape(task, &transcript).unwrap();
        let theirs = s_o.shape(task, &transcript).unwrap();
        assert_eq!(rewards, theirs, "{}", task.id);
        // The same bits, not only equal floats (0.0 and -0.0 compare equal).
        let bits = |r: &[maporl::transcript::Reward]| -> Vec<(u32, Vec<u32>)> {
            r.iter()
                .map(|r| {
                    (
                        r.total.to_bits(),
                        r.parts.iter().map(|p| p.1.to_bits()).collect(),
                    )
                })
                .collect()
        };
        assert_eq!(bits(&rewards), bits(&theirs), "{}", task.id);
    }
}

/// A whole `maporl eval` of the quickstart's config (a tiny random model, so that it runs in
/// seconds) with these protocol, verifier and shaper components, in `dir/name`: its
/// transcripts with the plugins' hashes left out, and its report's per-turn figures.
pub fn eval_transcripts(
    dir: &Path,
    name: &str,
    plugins: [PathBuf; 3],
) -> (Vec<serde_json::Value>, serde_json::Value) {
    let model = dir.join("tiny-qwen2");
    if !model.exists() {
        std::fs::create_dir(&model).unwrap();
        write_tiny_qwen2(&model);
    }
    let run = dir.join(name);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config"])
        .arg(repo().join("configs/quickstart.toml"))
        .args(["--set", &format!("model.path={}", model.display())])
        .args(["--set", &format!("run_dir={}", run.display())])
        .args([
            "--set",
            "data.held_out=6",
            "--set",
            "generation.max_new_tokens=24",
        ])
        .args([
            "--set",
            &format!("plugins.protocol.path={}", plugins[0].display()),
        ])
        .args([
            "--set",
            &format!("plugins.verifier.path={}", plugins[1].display()),
        ])
        .args([
            "--set",
            &format!("plugins.shaper.path={}", plugins[2].display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let transcripts: Vec<serde_json::Value> =
        std::fs::read_to_string(run.join("transcripts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                v.as_object_mut().unwrap().remove("plugins");
                v
            })
            .collect();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).unwrap()).unwrap();
    (transcripts, report["turns"].clone())
}

/// The Rust reference plugins' eval against `other`'s (the same names): the same
/// transcripts, rewards and report.
pub fn same_eval(other: &dyn Fn(&str) -> PathBuf, label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let names = |f: &dyn Fn(&str) -> PathBuf| [f("debate"), f("gsm8k"), f("influence")];
    let (rs, rs_report) = eval_transcripts(dir.path(), "rust", names(&plugin));
    let (theirs, their_report) = eval_transcripts(dir.path(), label, names(other));
    assert_eq!(rs.len(), 6);
    assert!(rs
        .iter()
        .all(|d| !d["rewards"].as_array().unwrap().is_empty()));
    assert_eq!(rs, theirs);
    assert_eq!(rs_report, their_report);
}
