//! bf16 and f16 against f32, on the CPU: the dtype path a GPU run takes (`model.dtype =
//! "bf16"`), tested here without a GPU, on SmolLM2-135M's real weights.
//!
//! What stays f32 whatever the model's dtype (as PEFT and TRL keep it): the LoRA adapter's
//! weights, the value head and its loss, the log-softmax behind every log-prob, the
//! optimizer's moments. The model's weights, activations and KV cache are in the dtype.
//!
//! Stated tolerances, about twice what was measured here on 2026-12-03 (in brackets), over
//! two 24-token responses sampled at temperature 1 (low-probability tokens included):
//! - per-token log-probs: mean |Δ| ≤ 0.1 nats for bf16 [0.046], ≤ 0.015 for f16 [0.006];
//! - the summed log-prob of a response: |Δ| ≤ 1.5 nats for bf16 [0.64], ≤ 0.3 for f16 [0.12];
//! - generation in the dtype, where it sampled the same tokens as f32: |Δ| ≤ 0.35 a token for
//!   bf16 [0.17], ≤ 0.02 for f16 [0.007];
//! - one PPO micro-batch: the loss within 0.5% relative for bf16 [0.04%], 0.05% for f16
//!   [0.004%]; the LoRA gradient's cosine with f32's ≥ 0.99 for bf16 [0.9966], ≥ 0.9995 for
//!   f16 [0.9999], and its norm within 3% for bf16 [1.1%], 0.5% for f16 [0.11%].
//!
//! What must stay f32 is asserted directly, not through a tolerance: the log-probs, the
//! values, the adapter's weights and gradients.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use maporl::model::{
    generate, score, Agent, GenerateOptions, Lora, LoraConfig, Pass, Sampler, SamplingParams,
    ValueHead,
};

mod support;

struct Precision {
    dtype: DType,
    mean_token: f32,
    generation: f32,
    sum: f32,
    loss_rel: f32,
    grad_cos: f32,
    grad_norm_rel: f32,
}

const BF16: Precision = Precision {
    dtype: DType::BF16,
    mean_token: 0.1,
    generation: 0.35,
    sum: 1.5,
    loss_rel: 0.005,
    grad_cos: 0.99,
    // The gradient's norm is what bf16's rounding moves most, and by how much depends on
    // the machine (its products' summation order, rounded to bf16 at every layer): 0.048 on
    // a 2-core Xeon with AVX-512 (2026-12-05, the same at 3bc3ac0), under 0.03 where the
    // bound was first set; the direction stayed within cos 0.997 on both.
    grad_norm_rel: 0.06,
};

const F16: Precision = Precision {
    dtype: DType::F16,
    mean_token: 0.015,
    generation: 0.02,
    sum: 0.3,
    loss_rel: 0.0005,
    grad_cos: 0.9995,
    grad_norm_rel: 0.005,
};

fn agent(dtype: DType) -> (Agent, Vec<Vec<u32>>) {
    let loaded = maporl::model::load(&support::smollm2(), dtype, &Device::Cpu).unwrap();
    assert_eq!(loaded.base.dtype(), dtype);
    let tokenizer = loaded.tokenizer.unwrap();
    let prompts = [
        "<|im_start|>user\nWhat is 12 + 30? End with \\boxed{}.<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>user\nName the capital of France.<|im_end|>\n<|im_start|>assistant\n",
    ]
    .iter()
    .map(|p| tokenizer.encode(*p, false).unwrap().get_ids().to_vec())
    .collect();
    let base = Arc::new(loaded.base);
    let mut agent = Agent::new(base.clone());
    let lora = LoraConfig {
        r: 8,
        alpha: 16.0,
        target_modules: ["q_proj", "v_proj", "down_proj"].map(String::from).to_vec(),
    };
    agent.lora = Some(Lora::new(&base, lora, 11).unwrap());
    agent.value_head = Some(ValueHead::new(576, DType::F32, &Device::Cpu, 12).unwrap());
    // A non-zero B, so the adapter changes the logits and A gets gradients too.
    for (name, var) in agent.lora.as_ref().unwrap().named_vars() {
        if name.ends_with("lora_B.weight") {
            let (o, r) = var.as_tensor().dims2().unwrap();
            let v: Vec<f32> = (0..o * r).map(|k| ((k % 7) as f32 - 3.0) * 1e-3).collect();
            var.set(&Tensor::from_vec(v, (o, r), &Device::Cpu).unwrap())
                .unwrap();
        }
    }
    (agent, prompts)
}

/// 24 sampled tokens per prompt from the f32 model, with their generation log-probs.
fn responses(agent: &Agent, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, Vec<f32>)> {
    let mut sampler = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        },
        3,
    );
    let opts = GenerateOptions {
        max_new_tokens: 24,
        stop_tokens: vec![],
        pad_token: 0,
    };
    generate(agent, prompts, &mut sampler, &opts)
        .unwrap()
        .into_iter()
        .map(|g| (g.tokens, g.logprobs))
        .collect()
}

fn rows(t: &Tensor) -> Vec<Vec<f32>> {
    t.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
}

fn compare(p: &Precision) {
    let (reference, prompts) = agent(DType::F32);
    let sampled = responses(&reference, &prompts);
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = prompts
        .iter()
        .cloned()
        .zip(sampled.iter().map(|(t, _)| t.clone()))
        .collect();
    let want = rows(
        &score(&reference, &pairs, Pass::Inference, 64)
            .unwrap()
            .logprobs,
    );
    // Generation and scoring agree in f32 (the same numerics, batched the same way).
    for ((_, gen), lp) in sampled.iter().zip(&want) {
        for (g, s) in gen.iter().zip(lp) {
            assert!((g - s).abs() < 2e-3, "f32 generation {g} vs scoring {s}");
        }
    }

    let (low, _) = agent(p.dtype);
    let got = rows(&score(&low, &pairs, Pass::Inference, 64).unwrap().logprobs);
    let (mut abs, mut count) = (0.0f32, 0usize);
    for (w, g) in want.iter().zip(&got) {
        let sum_diff = (w.iter().sum::<f32>() - g.iter().sum::<f32>()).abs();
        assert!(
            sum_diff <= p.sum,
            "{:?}: a response's log-prob differs by {sum_diff} nats (tolerance {})",
            p.dtype,
            p.sum
        );
        for (a, b) in w.iter().zip(g) {
            assert!(b.is_finite());
            abs += (a - b).abs();
            count += 1;
        }
    }
    let mean = abs / count as f32;
    eprintln!("{:?}: mean |Δ log-prob| per token {mean:.5}", p.dtype);
    assert!(
        mean <= p.mean_token,
        "{:?}: mean |Δ log-prob| per token {mean} > {}",
        p.dtype,
        p.mean_token
    );

    // Generation runs in the dtype too (weights, activations and KV cache), and reports
    // log-probs close to f32's where it sampled the same tokens (same seed).
    let low_sampled = responses(&low, &prompts);
    for ((tokens, lps), (want_tokens, want_lps)) in low_sampled.iter().zip(&sampled) {
        let same = tokens
            .iter()
            .zip(want_tokens)
            .take_while(|(a, b)| a == b)
            .count();
        assert!(same >= 1, "{:?}: the first sampled token differs", p.dtype);
        for k in 0..same {
            assert!(
                (lps[k] - want_lps[k]).abs() <= p.generation,
                "{:?}: generation log-prob {} vs f32 {} at token {k}",
                p.dtype,
                lps[k],
                want_lps[k]
            );
        }
    }

    // One PPO micro-batch: loss and LoRA gradients.
    let (loss32, g32) = support::ppo_loss_and_lora_grads(&reference, &pairs);
    let (loss, g) = support::ppo_loss_and_lora_grads(&low, &pairs);
    let loss_rel = (loss - loss32).abs() / loss32.abs().max(1e-6);
    let dot: f64 = g
        .iter()
        .zip(&g32)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let (n, n32) = (norm(&g), norm(&g32));
    let cos = (dot / (n * n32)) as f32;
    let norm_rel = ((n - n32).abs() / n32) as f32;
    eprintln!(
        "{:?}: loss {loss} vs {loss32} (rel {loss_rel:.5}); grad cos {cos:.5}, norm rel {norm_rel:.5}",
        p.dtype
    );
    assert!(n32 > 0.0, "the f32 gradient is not zero");
    assert!(loss_rel <= p.loss_rel, "{:?}: loss rel {loss_rel}", p.dtype);
    assert!(cos >= p.grad_cos, "{:?}: gradient cosine {cos}", p.dtype);
    assert!(
        norm_rel <= p.grad_norm_rel,
        "{:?}: gradient norm rel {norm_rel}",
        p.dtype
    );
}

#[test]
fn bf16_log_probs_and_a_ppo_step_stay_close_to_f32() {
    compare(&BF16);
}

#[test]
fn f16_log_probs_and_a_ppo_step_stay_close_to_f32() {
    compare(&F16);
}
