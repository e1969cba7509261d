//! The model paths on a non-CPU device against the CPU: logits, generation, and one PPO
//! micro-batch's loss and LoRA gradients, on a random-weights model made here (a GPU machine
//! may have no network and no model files).
//!
//! Needs a CUDA build and a GPU: `MAPORL_TEST_DEVICE=cuda:0 cargo test --release --features
//! cuda --test device -- --include-ignored` (scripts/gpu-check.sh runs it).

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use maporl::model::{
    generate, random, Agent, Config, GenerateOptions, Lora, LoraConfig, Pass, Sampler,
    SamplingParams, ValueHead,
};

mod support;

const IGNORED: &str = "needs MAPORL_TEST_DEVICE=cuda:N and a CUDA build (scripts/gpu-check.sh)";

fn device() -> Device {
    let name = std::env::var("MAPORL_TEST_DEVICE").expect(IGNORED);
    let choice = maporl::config::DeviceChoice::try_from(name.clone())
        .unwrap_or_else(|e| panic!("MAPORL_TEST_DEVICE={name}: {e}"));
    // `cpu` runs the comparisons against the CPU itself: a check of this file, not of a device.
    choice.open().unwrap_or_else(|e| panic!("{name}: {e:#}"))
}

fn config() -> Config {
    Config::from_hf_json(
        r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":128,"intermediate_size":256,
        "num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":512,
        "rms_norm_eps":1e-6,"rope_theta":10000.0,"max_position_embeddings":256,
        "tie_word_embeddings":true}"#,
    )
    .unwrap()
}

fn agent(dtype: DType, dev: &Device) -> Agent {
    let base = Arc::new(random(&config(), dtype, dev, 7).unwrap());
    let mut agent = Agent::new(base.clone());
    let lora = LoraConfig {
        r: 4,
        alpha: 8.0,
        target_modules: ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
            .map(String::from)
            .to_vec(),
    };
    agent.lora = Some(Lora::new(&base, lora, 3).unwrap());
    for (name, var) in agent.lora.as_ref().unwrap().named_vars() {
        if name.ends_with("lora_B.weight") {
            let (o, r) = var.as_tensor().dims2().unwrap();
            let v: Vec<f32> = (0..o * r).map(|k| ((k % 5) as f32 - 2.0) * 0.01).collect();
            var.set(&Tensor::from_vec(v, (o, r), dev).unwrap()).unwrap();
        }
    }
    agent.value_head = Some(ValueHead::new(128, DType::F32, dev, 4).unwrap());
    agent
}

fn pairs() -> Vec<(Vec<u32>, Vec<u32>)> {
    (0..3u32)
        .map(|k| {
            (
                (0..20 + 3 * k).map(|i| (i * 7 + k) % 512).collect(),
                (0..12 + 2 * k).map(|i| (i * 13 + 5 * k) % 512).collect(),
            )
        })
        .collect()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let cpu = Device::Cpu;
    let a = a.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap();
    let b = b.to_device(&cpu).unwrap().to_dtype(DType::F32).unwrap();
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
#[ignore = "needs MAPORL_TEST_DEVICE=cuda:N and a CUDA build (scripts/gpu-check.sh)"]
fn logits_and_scores_match_the_cpu() {
    let dev = device();
    let (cpu, gpu) = (agent(DType::F32, &Device::Cpu), agent(DType::F32, &dev));
    let ids = Tensor::new(&[[1u32, 5, 9, 200, 17, 3]], &Device::Cpu).unwrap();
    let logits = |a: &Agent, d: &Device| {
        let h = a
            .forward(&ids.to_device(d).unwrap(), &[0], None, Pass::Inference)
            .unwrap();
        a.base.logits(&h).unwrap()
    };
    let d = max_abs_diff(&logits(&cpu, &Device::Cpu), &logits(&gpu, &dev));
    eprintln!("f32 logits: max |cpu - device| = {d}");
    assert!(d < 1e-3, "f32 logits differ by {d}");
    for pass in [Pass::Inference, Pass::Training] {
        let (a, b) = (
            maporl::model::score(&cpu, &pairs(), pass, 8).unwrap(),
            maporl::model::score(&gpu, &pairs(), pass, 8).unwrap(),
        );
        let d = max_abs_diff(&a.logprobs, &b.logprobs);
        assert!(d < 1e-3, "{pass:?}: log-probs differ by {d}");
        let d = max_abs_diff(a.values.as_ref().unwrap(), b.values.as_ref().unwrap());
        assert!(d < 1e-3, "{pass:?}: values differ by {d}");
    }
}

#[test]
#[ignore = "needs MAPORL_TEST_DEVICE=cuda:N and a CUDA build (scripts/gpu-check.sh)"]
fn generation_matches_the_cpu() {
    let dev = device();
    let prompts: Vec<Vec<u32>> = pairs().into_iter().map(|(p, _)| p).collect();
    let run = |d: &Device| {
        let mut sampler = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                top_p: 0.95,
                top_k: 0,
            },
            9,
        );
        let opts = GenerateOptions {
            max_new_tokens: 16,
            stop_tokens: vec![],
            pad_token: 0,
        };
        generate(&agent(DType::F32, d), &prompts, &mut sampler, &opts).unwrap()
    };
    let (want, got) = (run(&Device::Cpu), run(&dev));
    for (w, g) in want.iter().zip(&got) {
        let same = w
            .tokens
            .iter()
            .zip(&g.tokens)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(same >= 4, "the device's sampled tokens diverge at {same}");
        for k in 0..same {
            assert!((w.logprobs[k] - g.logprobs[k]).abs() < 1e-3);
        }
    }
}

#[test]
#[ignore = "needs MAPORL_TEST_DEVICE=cuda:N and a CUDA build (scripts/gpu-check.sh)"]
fn a_ppo_step_matches_the_cpu_in_f32_and_stays_close_in_bf16() {
    let dev = device();
    let (loss_cpu, g_cpu) =
        support::ppo_loss_and_lora_grads(&agent(DType::F32, &Device::Cpu), &pairs());
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    for (dtype, loss_tol, cos_tol) in [(DType::F32, 1e-4, 0.9999), (DType::BF16, 2e-2, 0.98)] {
        let (loss, g) = support::ppo_loss_and_lora_grads(&agent(dtype, &dev), &pairs());
        let dot: f64 = g
            .iter()
            .zip(&g_cpu)
            .map(|(a, b)| f64::from(*a) * f64::from(*b))
            .sum();
        let cos = dot / (norm(&g) * norm(&g_cpu));
        let rel = (loss - loss_cpu).abs() / loss_cpu.abs();
        eprintln!("{dtype:?} on the device: loss rel {rel:.2e}, gradient cosine {cos:.6}");
        assert!(rel < loss_tol, "{dtype:?}: loss {loss} vs cpu {loss_cpu}");
        assert!(cos > cos_tol, "{dtype:?}: gradient cosine {cos}");
    }
}
