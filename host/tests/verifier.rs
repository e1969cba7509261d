//! The learned verifier: labelled data, training to separate right from wrong answers, and
//! serving through the host function `judge` to wasm verifier plugins.

mod support;

use std::sync::atomic::AtomicBool;

use candle_core::DType;
use maporl::config::VerifierTrainConfig;
use maporl::verifier::data::{write_jsonl, Sample};
use maporl::verifier::train::{train, TrainOptions};
use rand::{Rng, SeedableRng};
use support::write_tiny_qwen2;

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
