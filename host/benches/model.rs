//! Model benchmark (not a test): generation tokens/s at batch 1 and 8, a PPO-shaped LoRA train
//! step at 8 x 128 tokens, peak RSS, and batch-1 decoding against weight bytes / bandwidth.
//!
//!   scripts/fetch-smollm2.sh && cargo bench -p maporl --bench model
//!   MAPORL_BENCH_MODEL=/path/to/hf-folder-or.gguf cargo bench -p maporl --bench model

use candle_core::{DType, Device, Tensor};
use candle_nn::Optimizer;
use maporl::model::{
    generate, load, score, Agent, GenerateOptions, Lora, LoraConfig, Sampler, SamplingParams,
    ValueHead,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn status_mb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// Copy bandwidth of a buffer much larger than the caches, in GB/s (read + write bytes).
fn bandwidth_gbs() -> f64 {
    let n = 256 << 20;
    let src = vec![1u8; n];
    let mut dst = vec![0u8; n];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * n as f64 / best / 1e9
}

fn main() -> anyhow::Result<()> {
    let path = std::env::var_os("MAPORL_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("MAPORL_SMOLLM2_GGUF")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_default())
                        .join(".cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf")
                })
        });
    let dev = Device::Cpu;
    let loaded = load(&path, DType::F32, &dev)?;
    let cfg = loaded.base.config().clone();
    let base = Arc::new(loaded.base);
    let params: usize = {
        let (h, i, l, v) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.num_hidden_layers,
            cfg.vocab_size,
        );
        let kv = cfg.num_key_value_heads * cfg.head_dim;
        let q = cfg.num_attention_heads * cfg.head_dim;
        l * (h * q * 2 + 2 * h * kv + 3 * h * i + 2 * h)
            + v * h * if cfg.tie_word_embeddings { 1 } else { 2 }
            + h
    };
    println!(
        "model {} ({:.1}M params, f32), threads {}",
        path.display(),
        params as f64 / 1e6,
        candle_core::utils::get_num_threads()
    );
    let agent = Agent::new(base.clone());
    let prompt: Vec<u32> = (0..32).map(|i| 100 + i).collect();
    let new_tokens = 64;
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
        pad_token: 0,
    };
    for b in [1usize, 8] {
        let prompts = vec![prompt.clone(); b];
        let _ = generate(
            &agent,
            &prompts,
            &mut Sampler::new(SamplingParams::default(), 0),
            &GenerateOptions {
                max_new_tokens: 4,
                ..opts.clone()
            },
        )?;
        let t = Instant::now();
        let out = generate(
            &agent,
            &prompts,
            &mut Sampler::new(SamplingParams::default(), 0),
            &opts,
        )?;
        let s = t.elapsed().as_secs_f64();
        let n: usize = out.iter().map(|g| g.tokens.len()).sum();
        println!(
            "generation b={b}: {:.1} tok/s ({n} tokens, 32-token prompts, {s:.2} s)",
            n as f64 / s
        );
    }
    let bw = bandwidth_gbs();
    let weight_bytes = params as f64 * 4.0;
    println!("memory copy bandwidth {bw:.1} GB/s -> batch-1 decode limit {:.1} tok/s (f32 weight bytes / bandwidth)", bw * 1e9 / weight_bytes);

    // PPO-shaped step: LoRA (r 8 on all linear layers) + value head, 8 x (64 prompt + 64 response).
    let targets = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    let mut a = Agent::new(base.clone());
    a.lora = Some(Lora::new(
        &base,
        LoraConfig {
            r: 8,
            alpha: 16.0,
            target_modules: targets.iter().map(|s| s.to_string()).collect(),
        },
        0,
    )?);
    a.value_head = Some(ValueHead::new(cfg.hidden_size, DType::F32, &dev, 0)?);
    let mut opt = candle_nn::AdamW::new(
        a.trainable_vars(),
        candle_nn::ParamsAdamW {
            lr: 1e-4,
            weight_decay: 0.0,
            ..Default::default()
        },
    )?;
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..8)
        .map(|k| {
            (
                (0..64).map(|i| 200 + i + k).collect(),
                (0..64).map(|i| 900 + i * 3 + k).collect(),
            )
        })
        .collect();
    for step in 0..3 {
        let t = Instant::now();
        let s = score(&a, &pairs, false, 16)?;
        let old = s.logprobs.detach();
        let adv = Tensor::ones_like(&old)?;
        let ratio = (s.logprobs.clone() - &old)?.exp()?;
        let pg = (ratio.clone() * &adv)?.minimum(&(ratio.clamp(0.8f32, 1.2f32)? * &adv)?)?;
        let vloss = (s.values.clone().unwrap() - &adv)?.sqr()?;
        let loss = (((vloss * 0.5)? - pg)? * &s.mask)?.sum_all()?;
        let t_fwd = t.elapsed().as_secs_f64();
        let grads = loss.backward()?;
        let t_bwd = t.elapsed().as_secs_f64();
        opt.step(&grads)?;
        let total = t.elapsed().as_secs_f64();
        println!("train step {step} (8 x 128, LoRA + value head): {total:.2} s (forward {t_fwd:.2}, backward {:.2}, AdamW {:.3})", t_bwd - t_fwd, total - t_bwd);
    }
    println!("peak RSS (VmHWM) {} MB", status_mb("VmHWM:"));
    Ok(())
}
