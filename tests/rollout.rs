//! Debates between real LLM agents (SmolLM2-135M), driven through the `maporl` binary:
//! `eval` writes the resolved config, transcripts and metrics; the same seed gives identical
//! transcripts; a plugin failure stops the run or drops the task, as the config says.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use support::*;

fn maporl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(args)
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .expect("running maporl")
}

/// A small, fast eval: 3 arithmetic tasks, 2 agents, 2 turns, 12 new tokens.
fn eval(run_dir: &Path, extra: &[&str]) -> Output {
    let config = repo().join("configs/smollm2-arith.toml");
    let model = format!("model.path={}", smollm2().display());
    let run = format!("run_dir={}", run_dir.display());
    let mut args = vec![
        "eval",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &model,
        "--set",
        &run,
        "--set",
        "data.count=3",
        "--set",
        "debate.turns=2",
        "--set",
        "generation.max_new_tokens=12",
    ];
    args.extend_from_slice(extra);
    maporl(&args)
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn eval_writes_config_transcripts_and_metrics_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    let out = eval(&a, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    assert!(printed.contains("| majority accuracy |"), "{printed}");
    assert!(printed.contains("plugins took"), "{printed}");
    // The run says where its agents are (device = "auto": the CPU in a build without CUDA).
    #[cfg(not(feature = "cuda"))]
    assert!(
        printed.contains("devices: agent 0 on cpu (auto), agent 1 on cpu (auto)"),
        "{printed}"
    );

    // The resolved config holds every default and the overrides.
    let config = maporl::config::Config::load(&a.join("config.toml"), &[]).unwrap();
    assert_eq!(
        (
            config.data.count,
            config.debate.turns,
            config.generation.max_new_tokens
        ),
        (3, 2, 12)
    );

    // One transcript record per task, with prompts, answers, token counts and plugin hashes.
    let transcripts = std::fs::read_to_string(a.join("transcripts.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = transcripts
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 3);
    for r in &records {
        let utterances = r["transcript"]["utterances"].as_array().unwrap();
        assert_eq!(utterances.len(), 4, "2 agents x 2 turns");
        let speeches = r["speeches"].as_array().unwrap();
        assert_eq!(speeches.len(), 4);
        for s in speeches {
            assert!(s["prompt_tokens"].as_u64().unwrap() > 10);
            let n = s["response_tokens"].as_u64().unwrap();
            assert!((1..=12).contains(&n), "{n}");
            assert!(s["messages"][0]["content"]
                .as_str()
                .unwrap()
                .contains(r["task"]["question"].as_str().unwrap()));
        }
        for key in ["protocol", "verifier", "shaper"] {
            assert_eq!(r["plugins"][key].as_str().unwrap().len(), 64);
        }
        assert_eq!(r["rewards"].as_array().unwrap().len(), 4);
    }
    let report: maporl::eval::Report =
        serde_json::from_str(&std::fs::read_to_string(a.join("eval.json")).unwrap()).unwrap();
    assert_eq!((report.tasks, report.turns.len()), (3, 2));

    // Same seed, same transcripts, byte for byte; another seed, other samples.
    assert!(eval(&b, &[]).status.success());
    assert_eq!(
        transcripts,
        std::fs::read_to_string(b.join("transcripts.jsonl")).unwrap()
    );
    assert!(eval(&c, &["--set", "seed=1"]).status.success());
    assert_ne!(
        transcripts,
        std::fs::read_to_string(c.join("transcripts.jsonl")).unwrap()
    );
}

/// Two tasks, the second of which (`jsonl-2`, question `mode`) makes the hostile plugin in
/// `world` ("protocol" or "verifier") fail. With `on_plugin_error = "stop"` the run exits 1
/// with an error holding every one of `needles`; with "drop-task" it succeeds, says it
/// dropped that task, and reports the other.
fn fails_its_task(world: &str, mode: &str, needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tasks.jsonl");
    std::fs::write(
        &data,
        format!(
            "{{\"q\": \"What is 2 + 2?\", \"a\": \"4\"}}\n{{\"q\": \"{mode}\", \"a\": \"1\"}}\n"
        ),
    )
    .unwrap();
    let path = format!(
        "plugins.{world}.path={}",
        plugin(&format!("hostile_{world}")).display()
    );
    let settings = format!("plugins.{world}.settings={{}}");
    let source = format!("data.path={}", data.display());
    let common = [
        "--set",
        "data.source=jsonl",
        "--set",
        &source,
        "--set",
        "data.count=0",
        "--set",
        "data.fields={question = \"q\", reference = \"a\"}",
        "--set",
        &path,
        "--set",
        &settings,
    ];
    let stop = eval(&dir.path().join("stop"), &common);
    assert_eq!(stop.status.code(), Some(1), "{}", text(&stop));
    let err = text(&stop);
    for needle in [
        &[format!("hostile_{world}.wasm").as_str(), "jsonl-2"][..],
        needles,
    ]
    .concat()
    {
        assert!(err.contains(needle), "{needle}: {err}");
    }

    let mut drop = common.to_vec();
    drop.extend_from_slice(&["--set", "debate.on_plugin_error=drop-task"]);
    let out = eval(&dir.path().join("drop"), &drop);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("dropped task jsonl-2"),
        "{}",
        text(&out)
    );
    let report: maporl::eval::Report =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("drop/eval.json")).unwrap())
            .unwrap();
    assert_eq!((report.tasks, report.dropped), (1, 1));
}

#[test]
fn a_plugin_failure_stops_the_run_or_drops_the_task() {
    fails_its_task("verifier", "nan", &["`score`", "NaN"]);
}

/// A prompt under the byte bound but past the model's context is the protocol's failure on
/// that task, found before generation: the run stops naming the plugin, call and task, or
/// drops that task and answers the others.
#[test]
fn a_prompt_past_the_models_context_fails_its_task_not_the_batch() {
    fails_its_task(
        "protocol",
        "long-prompt",
        &[
            "`plan-turn`",
            "max_position_embeddings",
            "8192",
            "generation.max_new_tokens",
        ],
    );
}

#[test]
fn debate_shows_one_debate_turn_by_turn() {
    let config = repo().join("configs/smollm2-arith.toml");
    let model = format!("model.path={}", smollm2().display());
    let out = maporl(&[
        "debate",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &model,
        "--set",
        "generation.max_new_tokens=16",
        "--set",
        "debate.turns=2",
        "--question",
        "What is 3 + 4?",
        "--reference",
        "7",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = text(&out);
    assert!(printed.starts_with("Question: What is 3 + 4?"), "{printed}");
    for needle in [
        "──────── turn 1",
        "──────── turn 2",
        "Agent 1 (answer",
        "Agent 2 (answer",
        "Team answer after turn 2",
    ] {
        assert!(printed.contains(needle), "{needle} missing: {printed}");
    }
}

#[test]
fn config_errors_name_the_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "seed = 1\n[debate]\nagents = 2\nrounds = 3\n").unwrap();
    let out = maporl(&["eval", "--config", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out);
    assert!(
        err.contains("line 4") && err.contains("rounds") && err.contains("bad.toml"),
        "{err}"
    );
}

#[test]
fn agents_of_different_model_families_share_one_debate() {
    let dir = tempfile::tempdir().unwrap();
    let qwen = dir.path().join("tiny-qwen2");
    std::fs::create_dir(&qwen).unwrap();
    write_tiny_qwen2(&qwen);
    let agents = format!(
        "agents=[{{model = \"\"}}, {{model = \"{}\"}}]",
        qwen.display()
    );
    let run = dir.path().join("run");
    let out = eval(&run, &["--set", &agents]);
    assert!(out.status.success(), "{}", text(&out));
    let transcripts = std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap();
    for line in transcripts.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        let speeches = r["speeches"].as_array().unwrap();
        let utterances = r["transcript"]["utterances"].as_array().unwrap();
        let turn1 = |agent: u64| {
            utterances
                .iter()
                .zip(speeches)
                .find(|(u, _)| u["turn"] == 1 && u["agent"] == agent)
                .map(|(_, s)| (s["messages"].clone(), s["prompt_tokens"].as_u64().unwrap()))
                .unwrap()
        };
        let ((m0, p0), (m1, p1)) = (turn1(0), turn1(1));
        assert_eq!(m0, m1, "both agents get the same turn-1 question");
        // Each agent's own chat template: SmolLM2's adds its default system prompt.
        assert!(
            p0 > p1 + 5,
            "SmolLM2 prompt {p0} tokens, tiny Qwen2 prompt {p1} tokens"
        );
    }
}
