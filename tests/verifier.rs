//! The learned verifier: labelled data, training to separate right from wrong answers, and
//! serving through the host function `judge` to wasm verifier plugins.

mod support;

use std::sync::atomic::AtomicBool;

use candle_core::{DType, Device};
use maporl::config::VerifierTrainConfig;
use maporl::verifier::data::{write_jsonl, Sample};
use maporl::verifier::train::{train, TrainOptions};
use rand::{Rng, SeedableRng};
use support::{interrupt_after_first_metrics_line, write_tiny_qwen2};

/// A synthetic task: "What is a + b?" (a, b in 1..=3), answered `\boxed{c}`; right when
/// c = a + b. Telling right from wrong needs the question: every c appears in both classes.
fn synthetic(questions: usize, per_class: usize, seed: u64) -> Vec<Sample> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let styles = [
        "\\boxed{C}",
        "The answer is \\boxed{C}.",
        "So a + b gives \\boxed{C}",
    ];
    let mut out = Vec::new();
    for q in 0..questions {
        let (a, b) = (rng.random_range(1..=2), rng.random_range(1..=2));
        let sum: i32 = a + b;
        let question = format!("What is {a} + {b}?");
        for k in 0..2 * per_class {
            let correct = k % 2 == 0;
            let c = if correct {
                sum
            } else {
                loop {
                    let c = rng.random_range(2..=4);
                    if c != sum {
                        break c;
                    }
                }
            };
            let style = styles[rng.random_range(0..styles.len())];
            out.push(Sample {
                task_id: format!("q{q}"),
                question: question.clone(),
                response: style.replace('C', &c.to_string()),
                correct,
                answer: Some(c.to_string()),
                reference: sum.to_string(),
            });
        }
    }
    out
}

fn options(model: &std::path::Path, data: &std::path::Path, run: &std::path::Path) -> TrainOptions {
    TrainOptions {
        model: model.to_path_buf(),
        model_name: "tiny-qwen2".into(),
        data: data.to_path_buf(),
        run_dir: run.to_path_buf(),
        train: VerifierTrainConfig {
            epochs: 25,
            batch_size: 16,
            lr: 2e-3,
            lora_r: 8,
            lora_alpha: 16.0,
            val_fraction: 0.25,
            checkpoint_every: 0,
            ..VerifierTrainConfig::default()
        },
        max_response_tokens: 64,
        seed: 3,
        dtype: DType::F32,
        device: Device::Cpu,
        resume: false,
        stop_after: None,
        verbose: true,
    }
}

fn tiny_model(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("tiny");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    model
}

/// BCE on every response token (the paper's code) and on the last token both learn the
/// synthetic task: validation AUC >= 0.9 on held-out questions.
#[test]
fn a_tiny_verifier_learns_to_separate_right_from_wrong_answers() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(120, 2, 1)).unwrap();
    for loss in ["all-tokens", "last-token"] {
        let run = dir.path().join(loss);
        let mut opts = options(&model, &data, &run);
        opts.train.loss = loss.into();
        let out = train(&opts, &AtomicBool::new(false)).unwrap();
        let v = out.validation.expect("a validation set");
        // 30 held-out questions x 4 answers.
        assert_eq!(v.answers, 120, "{v:?}");
        let auc = v.auc.unwrap();
        assert!(auc >= 0.9, "{loss}: validation AUC {auc} < 0.9: {v:?}");
        assert!(v.ece < 0.1, "{loss}: badly calibrated: {v:?}");
        // What serving loads gives the validation's numbers.
        let final_dir = out.final_dir.unwrap();
        let meta = maporl::verifier::read_meta(&final_dir).unwrap();
        assert_eq!(meta.validation.as_ref(), Some(&v));
    }
}

/// A judge that answers from a table and records what it was asked.
struct TableJudge {
    asked: std::sync::Mutex<Vec<(String, Vec<String>)>>,
}

impl maporl::plugin::Judge for TableJudge {
    fn judge(&self, question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
        self.asked
            .lock()
            .unwrap()
            .push((question.to_string(), responses.to_vec()));
        // Distinct, exactly representable numbers per response.
        Ok(responses
            .iter()
            .map(|r| (r.len() % 16) as f32 / 16.0 + 1.0 / 64.0)
            .collect())
    }
}

fn learned(
    runtime: &maporl::plugin::Runtime,
) -> Result<maporl::plugin::Verifier, maporl::plugin::PluginError> {
    maporl::plugin::Verifier::load(
        runtime,
        &support::plugin("learned"),
        &serde_json::json!({}),
        &maporl::plugin::Limits::default(),
    )
}

#[test]
fn judge_calls_from_wasm_return_the_hosts_numbers() {
    let judge = std::sync::Arc::new(TableJudge {
        asked: Default::default(),
    });
    let (rt, _, _c) = support::runtime_with(0, Some(judge.clone()));
    let mut v = learned(&rt).unwrap();
    let task = support::task("t7", "gsm8k", "What is 2 + 2?", "4");
    let responses: Vec<String> = [
        "so \\boxed{4}",
        "I think \\boxed{5}, surely",
        "no answer here",
        "\\boxed{4}",
    ]
    .map(String::from)
    .to_vec();
    let verdicts = v.score(&task, &responses).unwrap();
    let expect = |r: &str| (r.len() % 16) as f32 / 16.0 + 1.0 / 64.0;
    let scores: Vec<f32> = verdicts.iter().map(|x| x.score).collect();
    assert_eq!(
        scores,
        vec![
            expect(&responses[0]),
            expect(&responses[1]),
            0.0,
            expect(&responses[3])
        ]
    );
    let correct: Vec<bool> = verdicts.iter().map(|x| x.correct).collect();
    assert_eq!(correct, vec![true, false, false, true]);
    // One call for the task's valid responses. Configure's probe, `judge("", [])`, was
    // answered by the host (an empty list) without reaching the model.
    let asked = judge.asked.lock().unwrap();
    let calls: Vec<&(String, Vec<String>)> = asked.iter().collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, "What is 2 + 2?");
    assert_eq!(
        calls[0].1,
        vec![
            responses[0].clone(),
            responses[1].clone(),
            responses[3].clone()
        ]
    );
}

#[test]
fn a_learned_verifier_plugin_without_a_verifier_model_is_a_clear_error() {
    // The plugin, loaded by hand into a runtime without a judge.
    let (rt, _, _c) = support::runtime();
    let err = learned(&rt).err().expect("no verifier model").to_string();
    assert!(err.contains("no verifier model configured"), "{err}");
    assert!(err.contains("[verifier]"), "{err}");
    assert!(err.contains("learned"), "{err}");

    // A run: stops at start-up, before any generation, saying what to configure.
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config"])
        .arg(support::repo().join("configs/smollm2-arith.toml"))
        .args(["--set", "model.path=/nonexistent/model"])
        .args([
            "--set",
            &format!("run_dir={}", dir.path().join("r").display()),
        ])
        .args(["--set", "plugins.verifier.path=learned.wasm"])
        .args(["--set", "plugins.verifier.settings={}"])
        .env("MAPORL_PLUGINS", support::plugins_dir())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success());
    assert!(text.contains("no verifier model configured"), "{text}");
    assert!(text.contains("maporl verifier train"), "{text}");
    assert!(
        !text.contains("/nonexistent/model"),
        "stopped before the model: {text}"
    );
}

/// A trained verifier served through `judge`: the wasm plugin's scores are the model's
/// probabilities, and a run records the checkpoint's sha256 in its transcripts,
/// plugins.lock and eval.json.
#[test]
fn a_trained_verifier_scores_runs_and_every_run_records_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(16, 2, 2)).unwrap();
    let mut opts = options(&model, &data, &dir.path().join("v"));
    opts.train.epochs = 1;
    let final_dir = train(&opts, &AtomicBool::new(false))
        .unwrap()
        .final_dir
        .unwrap();
    let sha = maporl::verifier::checkpoint_sha256(&final_dir).unwrap();

    let served =
        maporl::verifier::LearnedVerifier::load(&model, &final_dir, DType::F32, &Device::Cpu, 4)
            .unwrap();
    let responses: Vec<String> = ["\\boxed{3}", "The answer is \\boxed{4}.", "\\boxed{2}"]
        .map(String::from)
        .to_vec();
    let pairs: Vec<(&str, &str)> = responses
        .iter()
        .map(|r| ("What is 1 + 2?", r.as_str()))
        .collect();
    let direct = served.probabilities(&pairs).unwrap();
    let served = std::sync::Arc::new(served);
    let (rt, _, _c) = support::runtime_with(0, Some(served.clone()));
    let mut v = learned(&rt).unwrap();
    let task = support::task("t1", "gsm8k", "What is 1 + 2?", "3");
    let scores: Vec<f32> = v
        .score(&task, &responses)
        .unwrap()
        .iter()
        .map(|x| x.score)
        .collect();
    assert_eq!(scores, direct);
    assert!(direct.iter().all(|p| (0.0..=1.0).contains(p)));

    // A run with the verifier configured records which checkpoint scored it.
    let run = dir.path().join("eval");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(["eval", "--config"])
        .arg(support::repo().join("configs/smollm2-arith.toml"))
        .args(["--set", &format!("model.path={}", model.display())])
        .args(["--set", &format!("run_dir={}", run.display())])
        .args(["--set", "data.count=2", "--set", "debate.turns=1"])
        .args(["--set", "generation.max_new_tokens=4"])
        .args(["--set", "plugins.verifier.path=learned.wasm"])
        .args(["--set", "plugins.verifier.settings={}"])
        .args([
            "--set",
            &format!("verifier.checkpoint={}", final_dir.display()),
        ])
        .env("MAPORL_PLUGINS", support::plugins_dir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let transcripts = std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap();
    assert!(transcripts.lines().count() > 0, "no transcripts");
    for line in transcripts.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["plugins"]["verifier_checkpoint"], sha.as_str());
    }
    let lock = std::fs::read_to_string(run.join("plugins.lock")).unwrap();
    assert!(lock.contains(&sha), "{lock}");
    let eval: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("eval.json")).unwrap()).unwrap();
    assert_eq!(eval["verifier_checkpoint_sha256"], sha.as_str());
}

/// Host work done for a plugin is held to the plugin's deadline, and a long response costs
/// no more than the end of it the verifier reads: 256 responses of 64 KiB (inside every
/// per-call bound) through `judge` return within the call's deadline and a batch, where
/// tokenizing every response whole held the host for half a minute; and a response's score
/// depends only on its end (what `max_response_tokens` keeps), not on what comes before.
#[test]
fn judge_work_stops_at_the_callers_deadline_and_long_responses_cost_their_end() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(16, 2, 2)).unwrap();
    let mut opts = options(&model, &data, &dir.path().join("v"));
    opts.train.epochs = 1;
    let final_dir = train(&opts, &AtomicBool::new(false))
        .unwrap()
        .final_dir
        .unwrap();
    let served =
        maporl::verifier::LearnedVerifier::load(&model, &final_dir, DType::F32, &Device::Cpu, 8)
            .unwrap();

    // Only the end is read: two 64 KiB responses that differ in all but their last 32 KiB
    // (far more than the 512 tokens the verifier keeps) score the same.
    let end = "7 ".repeat(16 << 10) + "so \\boxed{3}";
    let a = "a ".repeat(16 << 10) + &end;
    let b = "zz".repeat(16 << 10) + &end;
    let p = served
        .probabilities(&[
            ("What is 1 + 2?", a.as_str()),
            ("What is 1 + 2?", b.as_str()),
        ])
        .unwrap();
    assert_eq!(
        p[0], p[1],
        "the score of a long response depends on its end only"
    );

    // A judge call past its deadline stops, between pairs and batches, with what it did.
    let wide: Vec<String> = (0..256).map(|i| format!("{i} {a}")).collect();
    let started = std::time::Instant::now();
    let err = maporl::plugin::Judge::judge_until(
        &served,
        "What is 1 + 2?",
        &wide,
        started + std::time::Duration::from_millis(5),
    )
    .unwrap_err();
    assert!(
        err.contains("deadline passed with") && err.contains("of 256"),
        "{err}"
    );
    assert!(
        started.elapsed().as_secs_f64() < 5.0,
        "{:?}",
        started.elapsed()
    );

    // The wide judge call, through a real plugin, under a deadline of one second.
    let served = std::sync::Arc::new(served);
    let (rt, _, _c) = support::runtime_with(0, Some(served));
    let limits = maporl::plugin::Limits {
        deadline_ms: 1000,
        memory_mib: 256,
        max_result_kib: 64 << 10,
        ..maporl::plugin::Limits::default()
    };
    let mut v = maporl::plugin::Verifier::load(
        &rt,
        &support::plugin("hostile_verifier"),
        &serde_json::json!({}),
        &limits,
    )
    .unwrap();
    let task = support::task("wide", "gsm8k", "judge-wide", "3");
    let started = std::time::Instant::now();
    let outcome = v.score(&task, &["3".to_string()]);
    let took = started.elapsed();
    // Generous for a loaded 2-core machine; tokenizing every response whole took 26-37 s.
    assert!(
        took.as_secs_f64() < 10.0,
        "the judge call held the host {took:?}"
    );
    if let Err(e) = outcome {
        let e = e.to_string();
        assert!(
            e.contains("deadline") && e.contains("task `wide`") && e.contains("score"),
            "{e}"
        );
    }
}

/// The benchmark in BENCHMARKS.md: scoring throughput of a verifier on SmolLM2-135M (LoRA
/// r16 on every projection, as trained), against batched generation by the same model in
/// the same process. Run: cargo test --release -p maporl --test verifier -- --ignored
/// --nocapture bench_scoring
#[test]
#[ignore]
fn bench_scoring_throughput_on_smollm2() {
    use maporl::model::{generate, GenerateOptions, Lora, LoraConfig, Sampler, SamplingParams};
    use maporl::verifier::VerifierModel;
    let (mut agent, prompter) =
        VerifierModel::base(&support::smollm2(), DType::F32, &Device::Cpu, 512).unwrap();
    let bare = maporl::model::Agent::new(agent.base.clone());
    let cfg = VerifierTrainConfig::default();
    agent.lora = Some(
        Lora::new(
            &agent.base,
            LoraConfig {
                r: cfg.lora_r,
                alpha: cfg.lora_alpha,
                target_modules: cfg.lora_targets.clone(),
            },
            0,
        )
        .unwrap(),
    );
    let hidden = agent.base.config().hidden_size;
    agent.value_head = Some(
        maporl::model::ValueHead::new(hidden, DType::F32, &candle_core::Device::Cpu, 1).unwrap(),
    );
    let model = VerifierModel { agent, prompter };
    // GSM8K-sized answers: ~100 tokens of working and a boxed answer.
    let samples = synthetic(16, 2, 9);
    let pairs: Vec<(String, String)> = samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let work = format!(
                "Let me think step by step. We add the two numbers together, carefully \
                 carrying where needed, and check the sum twice against the question. \
                 Attempt {i}: the first number plus the second number gives the total. "
            )
            .repeat(2);
            (s.question.clone(), format!("{work}{}", s.response))
        })
        .collect();
    let refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(q, r)| (q.as_str(), r.as_str()))
        .collect();
    let ids: Vec<(Vec<u32>, Vec<u32>)> = refs
        .iter()
        .map(|(q, r)| model.prompter.ids(q, r).unwrap())
        .collect();
    let tokens: usize = ids.iter().map(|(p, r)| p.len() + r.len()).sum();
    model.probabilities(&refs[..4], 16).unwrap(); // warm-up
    let t = std::time::Instant::now();
    model.probabilities(&refs, 16).unwrap();
    let score_s = t.elapsed().as_secs_f64();
    println!(
        "scoring: {} answers ({tokens} tokens, {:.0} per answer) in {score_s:.2} s: {:.1} \
         answers/s, {:.0} tokens/s (batch 16)",
        refs.len(),
        tokens as f64 / refs.len() as f64,
        refs.len() as f64 / score_s,
        tokens as f64 / score_s
    );
    let prompts: Vec<Vec<u32>> = ids.iter().take(8).map(|(p, _)| p.clone()).collect();
    let mut sampler = Sampler::new(SamplingParams::greedy(), 0);
    let opts = GenerateOptions {
        max_new_tokens: 64,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let t = std::time::Instant::now();
    let out = generate(&bare, &prompts, &mut sampler, &opts).unwrap();
    let gen_s = t.elapsed().as_secs_f64();
    let generated: usize = out.iter().map(|g| g.tokens.len()).sum();
    println!(
        "generation (same model, batch 8, 64 new tokens): {generated} tokens in {gen_s:.2} s: \
         {:.1} tokens/s",
        generated as f64 / gen_s
    );
    println!(
        "ratio: scoring reads {:.1}x as many tokens/s as generation writes; one ~{:.0}-token \
         answer is scored in the time generation writes {:.1} tokens",
        (tokens as f64 / score_s) / (generated as f64 / gen_s),
        tokens as f64 / refs.len() as f64,
        (generated as f64 / gen_s) / (refs.len() as f64 / score_s)
    );
}

/// `maporl verifier SUB` on the quickstart config, with the tiny `model` as every model and
/// a small verifier training setup (2 epochs of 6 steps on `synthetic(8, 2, _)`).
fn verifier_cmd(sub: &str, model: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(["verifier", sub, "--config"])
        .arg(support::repo().join("configs/smollm2-arith.toml"));
    for set in [
        format!("model.path={}", model.display()),
        format!("verifier.model={}", model.display()),
        "seed=3".into(),
        "verifier.max_response_tokens=64".into(),
        "verifier.train.epochs=2".into(),
        "verifier.train.batch_size=4".into(),
        "verifier.train.lr=0.002".into(),
        "verifier.train.lora_r=4".into(),
        "verifier.train.lora_alpha=8.0".into(),
        "verifier.train.val_fraction=0.25".into(),
        "verifier.train.checkpoint_every=0".into(),
        "verifier.train.keep_checkpoints=0".into(),
    ] {
        cmd.args(["--set", &set]);
    }
    cmd.args(extra)
        .env("MAPORL_PLUGINS", support::plugins_dir());
    cmd
}

fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `maporl verifier train --data DATA --out RUN EXTRA`; asserts success; returns the output.
fn verifier_train(
    model: &std::path::Path,
    data: &std::path::Path,
    run: &std::path::Path,
    extra: &[&str],
) -> String {
    let out = verifier_cmd(
        "train",
        model,
        &[
            &[
                "--data",
                data.to_str().unwrap(),
                "--out",
                run.to_str().unwrap(),
            ],
            extra,
        ]
        .concat(),
    )
    .output()
    .unwrap();
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    text
}

/// metrics.jsonl without wall-clock fields (the verifier's lines have none today; any that
/// are added must end in `_seconds` or `_per_second` to be left out here).
fn verifier_metrics(run: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
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

/// Every file under `dir`, relative path -> bytes; there must be some.
fn files(dir: &std::path::Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let out = support::files(dir);
    assert!(!out.is_empty(), "{} holds no files", dir.display());
    out
}

/// Stopped mid-epoch (step 3 of 12), resumed and stopped again in the next epoch (step 8),
/// resumed to the end: the same metrics lines (epoch losses included), the same final
/// verifier and the same last checkpoint, optimizer moments included, byte for byte, as an
/// uninterrupted run.
#[test]
fn verifier_train_stopped_and_resumed_ends_exactly_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(8, 2, 4)).unwrap();

    let whole = dir.path().join("whole");
    let text = verifier_train(&model, &data, &whole, &[]);
    assert!(text.contains("verifier trained: 12 steps"), "{text}");
    let expected = verifier_metrics(&whole);
    assert_eq!(expected.len(), 2, "one line per epoch");

    let parts = dir.path().join("parts");
    let text = verifier_train(&model, &data, &parts, &["--stop-after", "3"]);
    assert!(text.contains("stopped after step 3"), "{text}");
    assert!(verifier_metrics(&parts).is_empty(), "no epoch ended yet");
    assert!(!parts.join("checkpoints/final").exists());
    let text = verifier_train(&model, &data, &parts, &["--resume", "--stop-after", "8"]);
    assert!(text.contains("(step 3)"), "{text}");
    assert!(text.contains("stopped after step 8"), "{text}");
    assert_eq!(verifier_metrics(&parts), expected[..1]);
    let text = verifier_train(&model, &data, &parts, &["--resume"]);
    assert!(text.contains("(step 8)"), "{text}");
    assert!(text.contains("verifier trained: 12 steps"), "{text}");

    assert_eq!(verifier_metrics(&parts), expected);
    // TensorBoard: the training loss at each epoch's last step, the same as the unbroken
    // run's (three processes, three files, the two resumed ones starting with a START).
    let loss = support::tensorboard_series(&parts, "train_loss");
    assert_eq!(loss, support::tensorboard_series(&whole, "train_loss"));
    let want: Vec<(i64, f32)> = expected
        .iter()
        .map(|l| {
            (
                l["step"].as_i64().unwrap(),
                l["train_loss"].as_f64().unwrap() as f32,
            )
        })
        .collect();
    assert_eq!(loss, want);
    assert_eq!(support::tensorboard_events(&parts).len(), 3);
    assert_eq!(
        files(&parts.join("checkpoints/final")),
        files(&whole.join("checkpoints/final"))
    );
    assert_eq!(
        files(&parts.join("checkpoints/step-000012")),
        files(&whole.join("checkpoints/step-000012"))
    );
}

/// With activation checkpointing, for both losses: the same metrics and the same verifier,
/// byte for byte, as without (the recomputed layers run the same ops on the same inputs).
#[test]
fn verifier_train_with_activation_checkpointing_trains_the_plain_verifier() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(8, 2, 4)).unwrap();
    for loss in ["all-tokens", "last-token"] {
        let runs: Vec<_> = ["false", "true"]
            .iter()
            .map(|on| {
                let run = dir.path().join(format!("{loss}-{on}"));
                let sets = [
                    format!("verifier.train.loss={loss}"),
                    format!("verifier.train.activation_checkpointing={on}"),
                ];
                verifier_train(&model, &data, &run, &["--set", &sets[0], "--set", &sets[1]]);
                (
                    verifier_metrics(&run),
                    files(&run.join("checkpoints/final")),
                )
            })
            .collect();
        assert_eq!(runs[0].0.len(), 2, "{loss}: one line per epoch");
        assert_ne!(
            runs[0].0[0]["train_loss"], runs[0].0[1]["train_loss"],
            "{loss}: the verifier trains"
        );
        assert_eq!(runs[0], runs[1], "{loss}");
    }
}

/// A tiny llama (an HF folder, SmolLM2's tokenizer, a ChatML template) that answers every
/// prompt with "1" or "2", each with probability 1/2 at any temperature: its layers add
/// nothing to the residual (o_proj and down_proj are zero), every embedding carries 10 in
/// dimension 0, and lm_head reads only that dimension, -30 for every token but the two.
fn write_coin_model(dir: &std::path::Path) {
    use candle_core::{Device, Tensor};
    let loaded = maporl::model::load(&support::smollm2(), DType::F32, &Device::Cpu).unwrap();
    let tokenizer = loaded.tokenizer.expect("SmolLM2 has a tokenizer");
    let vocab = tokenizer.get_vocab_size(true);
    let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
    let answers = ["1", "2"].map(|t| tokenizer.token_to_id(t).unwrap() as usize);
    let (h, i) = (32usize, 64usize);
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "hidden_size": h, "intermediate_size": i,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": vocab, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": false, "eos_token_id": eos,
        "torch_dtype": "float32"
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
    let mut random = |dims: &[usize]| {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-0.5f32..0.5)).collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    };
    let zeros = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &Device::Cpu).unwrap();
    let ones = |n: usize| Tensor::ones(n, DType::F32, &Device::Cpu).unwrap();
    let mut embed = random(&[vocab, h]).to_vec2::<f32>().unwrap();
    for row in &mut embed {
        row[0] = 10.0;
    }
    let mut head = vec![0f32; vocab * h];
    for t in 0..vocab {
        if !answers.contains(&t) {
            head[t * h] = -30.0;
        }
    }
    let mut w = std::collections::HashMap::new();
    w.insert(
        "model.embed_tokens.weight".to_string(),
        Tensor::new(embed, &Device::Cpu).unwrap(),
    );
    w.insert(
        "lm_head.weight".to_string(),
        Tensor::from_vec(head, (vocab, h), &Device::Cpu).unwrap(),
    );
    w.insert("model.norm.weight".to_string(), ones(h));
    let p = "model.layers.0";
    for (name, t) in [
        ("self_attn.q_proj.weight", random(&[h, h])),
        ("self_attn.k_proj.weight", random(&[h / 2, h])),
        ("self_attn.v_proj.weight", random(&[h / 2, h])),
        ("self_attn.o_proj.weight", zeros(&[h, h])),
        ("mlp.gate_proj.weight", random(&[i, h])),
        ("mlp.up_proj.weight", random(&[i, h])),
        ("mlp.down_proj.weight", zeros(&[h, i])),
        ("input_layernorm.weight", ones(h)),
        ("post_attention_layernorm.weight", ones(h)),
    ] {
        w.insert(format!("{p}.{name}"), t);
    }
    candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("tokenizer.json"),
        tokenizer.to_string(false).unwrap(),
    )
    .unwrap();
    let tc = serde_json::json!({
        "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    });
    std::fs::write(dir.join("tokenizer_config.json"), tc.to_string()).unwrap();
}

/// `maporl verifier generate` end to end: one-token answers "1" or "2" sampled by the coin
/// model to GSM8K-format questions whose references are 1, 2 or 7, labelled by gsm8k.wasm.
/// Every kept question has k right and k wrong answers, labels agree with the references,
/// a question nobody can answer (7) is dropped and counted, and a seed gives the same file.
#[test]
fn verifier_generate_writes_k_right_and_k_wrong_answers_per_kept_question() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("coin");
    std::fs::create_dir_all(&model).unwrap();
    write_coin_model(&model);
    let refs = ["1", "2", "7", "1", "2", "1"];
    let questions = dir.path().join("questions.jsonl");
    let lines: Vec<String> = refs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            serde_json::json!({
                "question": format!("Question {}: pick a number.", i + 1),
                "answer": format!("Work.\n#### {r}"),
            })
            .to_string()
        })
        .collect();
    std::fs::write(&questions, lines.join("\n") + "\n").unwrap();
    let k = 2;
    let generate = |out: &std::path::Path, seed: u64| {
        let output = verifier_cmd("generate", &model, &["--out", out.to_str().unwrap()])
            .args(["--set", "data.source=gsm8k"])
            .args(["--set", &format!("data.path={}", questions.display())])
            .args(["--set", "data.count=0", "--set", "debate.batch_size=4"])
            .args(["--set", "generation.max_new_tokens=1"])
            .args(["--set", "verifier.generate.samples_per_question=10"])
            .args(["--set", &format!("verifier.generate.per_class={k}")])
            .args(["--set", &format!("seed={seed}")])
            .output()
            .unwrap();
        let text = output_text(&output);
        assert!(output.status.success(), "{text}");
        let samples = maporl::verifier::data::read_jsonl(out).unwrap();
        (samples, std::fs::read(out).unwrap(), text)
    };

    let (samples, bytes, text) = generate(&dir.path().join("a.jsonl"), 5);
    assert!(text.contains("60 answers to 6 questions"), "{text}");
    let mut kept: Vec<&str> = samples.iter().map(|s| s.task_id.as_str()).collect();
    kept.dedup();
    assert!(!kept.is_empty(), "{text}");
    assert!(
        text.contains(&format!(
            "kept {} questions x ({k} right + {k} wrong) = {} answers, dropped {} that could \
             not be balanced",
            kept.len(),
            samples.len(),
            refs.len() - kept.len()
        )),
        "{text}"
    );
    assert!(
        !kept.contains(&"gsm8k-3"),
        "no \"7\" was ever answered: {kept:?}"
    );
    for id in &kept {
        let of: Vec<_> = samples.iter().filter(|s| s.task_id == *id).collect();
        assert_eq!(of.len(), 2 * k, "{id}");
        assert_eq!(of.iter().filter(|s| s.correct).count(), k, "{id}");
    }
    for s in &samples {
        // Task ids are `gsm8k-LINE`, LINE from 1.
        let n: usize = s.task_id.strip_prefix("gsm8k-").unwrap().parse().unwrap();
        assert_eq!(s.reference, refs[n - 1], "{s:?}");
        assert_eq!(s.question, format!("Question {n}: pick a number."));
        assert!(["1", "2"].contains(&s.response.trim()), "{s:?}");
        assert_eq!(s.answer.as_deref(), Some(s.response.trim()), "{s:?}");
        assert_eq!(s.correct, s.response.trim() == s.reference, "{s:?}");
    }

    // The summary line counts what was sampled: "60 answers to 6 questions (N right, ...".
    let summary = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("60 answers"))
            .unwrap()
            .split("; wrote")
            .next()
            .unwrap()
            .to_string()
    };
    let (_, again, again_text) = generate(&dir.path().join("b.jsonl"), 5);
    assert_eq!(again, bytes, "the same seed, the same file");
    assert_eq!(summary(&again_text), summary(&text));
    // Another seed samples other answers. (The files may still agree: every kept question
    // is "1", "2", "1", "2" or "2", "1", "2", "1" whatever was sampled.)
    let (_, _, other_text) = generate(&dir.path().join("c.jsonl"), 6);
    assert_ne!(
        summary(&other_text),
        summary(&text),
        "another seed, other samples"
    );
}

/// Ctrl-C (SIGINT) during `maporl verifier train`: the run checkpoints after the step in
/// progress and exits successfully, and `--resume` ends exactly where an uninterrupted run
/// does.
#[cfg(unix)]
#[test]
fn verifier_train_interrupted_by_ctrl_c_checkpoints_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let data = dir.path().join("answers.jsonl");
    write_jsonl(&data, &synthetic(8, 2, 4)).unwrap();
    // 600 steps of a few ms: the run is still going, for a second or more, when the first
    // epoch's line appears.
    let epochs = ["--set", "verifier.train.epochs=100"];

    let run = dir.path().join("interrupted");
    let out = interrupt_after_first_metrics_line(
        &mut verifier_cmd(
            "train",
            &model,
            &[
                &[
                    "--data",
                    data.to_str().unwrap(),
                    "--out",
                    run.to_str().unwrap(),
                ],
                &epochs[..],
            ]
            .concat(),
        ),
        &run.join("metrics.jsonl"),
    );
    let text = output_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("interrupted: checkpointing after this step"),
        "{text}"
    );
    assert!(
        text.contains("--resume continues"),
        "the run should have stopped early (did it end before the signal?): {text}"
    );
    assert!(!run.join("checkpoints/final").exists());
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert!(run.join("checkpoints").join(&latest).is_dir(), "{latest}");

    let text = verifier_train(&model, &data, &run, &[&["--resume"], &epochs[..]].concat());
    assert!(text.contains("verifier trained: 600 steps"), "{text}");
    let whole = dir.path().join("whole");
    verifier_train(&model, &data, &whole, &epochs);
    assert_eq!(verifier_metrics(&run), verifier_metrics(&whole));
    assert_eq!(
        files(&run.join("checkpoints/final")),
        files(&whole.join("checkpoints/final"))
    );
}
