//! Model benchmark (not a test): generation tokens/s at batch 1 and 8, a PPO-shaped LoRA train
//! step at 8 x 128 tokens, peak RSS, and batch-1 decoding against weight bytes / bandwidth.
//!
//!   scripts/fetch-smollm2.sh && cargo bench -p maporl --bench model
//!   MAPORL_BENCH_MODEL=/path/to/hf-folder-or.gguf cargo bench -p maporl --bench model
//!
//! scripts/bench-vs-torch.sh runs it beside HF transformers on PyTorch (BENCHMARKS.md).

use candle_core::{DType, Device, Tensor};
use candle_nn::Optimizer;
use maporl::model::Pass;
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

/// Per-call time of one linear layer's matmul in three layouts, at 1 and 8 rows.
fn gemm_layouts(dev: &Device) -> anyhow::Result<()> {
    for (out_dim, in_dim) in [(1536usize, 576usize), (576, 1536), (49152, 576)] {
        let w = Tensor::randn(0f32, 0.02, (out_dim, in_dim), dev)?;
        let wt = w.t()?.contiguous()?;
        for m in [1usize, 8, 16, 32, 64] {
            let x = Tensor::randn(0f32, 1.0, (m, in_dim), dev)?;
            let n = 20;
            let time = |f: &dyn Fn() -> candle_core::Result<Tensor>| -> anyhow::Result<f64> {
                f()?;
                let t = Instant::now();
                for _ in 0..n {
                    std::hint::black_box(f()?);
                }
                Ok(t.elapsed().as_secs_f64() / n as f64 * 1e6)
            };
            let a = time(&|| x.matmul(&w.t()?))?;
            let b = time(&|| x.matmul(&wt))?;
            let c = time(&|| w.matmul(&x.t()?)?.t()?.contiguous())?;
            println!("{out_dim}x{in_dim} m={m}: x·Wᵀ(view) {a:.0} us, x·(Wᵀ contiguous) {b:.0} us, (W·xᵀ)ᵀ {c:.0} us");
        }
    }
    Ok(())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    // As the maporl binary does (a user's MALLOC_* settings win).
    maporl::model::keep_freed_memory();
    maporl::model::elementwise_ops_inline();
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
    // Options (environment): MAPORL_BENCH_NEW_TOKENS (64), MAPORL_BENCH_STEPS (3 train steps, 0 skips training,
    // the first one a warm-up), MAPORL_BENCH_LOGITS (write the f32 logits of the 32-token
    // prompt there, little-endian, (32, vocab)), MAPORL_BENCH_JSON (print one `JSON {...}`
    // line with every number, for scripts/bench-vs-torch.sh).
    let new_tokens = env_usize("MAPORL_BENCH_NEW_TOKENS", 64);
    let steps = env_usize("MAPORL_BENCH_STEPS", 3);
    let json = std::env::var_os("MAPORL_BENCH_JSON").is_some();
    // MAPORL_BENCH_PLAIN_MATMUL: candle's own matmul backward for frozen linears (computes the
    // unused weight gradients), to compare with the frozen-weight matmul.
    // MAPORL_BENCH_NO_FUSED: candle's elementary ops on the training path instead of the fused
    // ones (LoRA linear, RMS norm, rope, masked softmax, SiLU gating, token log-probs).
    let kernels = maporl::model::Kernels {
        frozen_matmul: std::env::var_os("MAPORL_BENCH_PLAIN_MATMUL").is_none(),
        fused_ops: std::env::var_os("MAPORL_BENCH_NO_FUSED").is_none(),
    };
    let dev = Device::Cpu;
    if std::env::var_os("MAPORL_BENCH_GEMM").is_some() {
        return gemm_layouts(&dev);
    }
    let t_load = Instant::now();
    let loaded = load(&path, DType::F32, &dev)?;
    let load_s = t_load.elapsed().as_secs_f64();
    let cfg = loaded.base.config().clone();
    let mut base = loaded.base;
    base.set_kernels(kernels);
    let base = Arc::new(base);
    let params = cfg.parameters();
    let threads = candle_core::utils::get_num_threads();
    println!(
        "model {} ({:.1}M params, f32), threads {threads}, loaded in {load_s:.2} s",
        path.display(),
        params as f64 / 1e6,
    );
    let agent = Agent::new(base.clone());
    let prompt: Vec<u32> = (0..32).map(|i| 100 + i).collect();
    if let Some(out) = std::env::var_os("MAPORL_BENCH_LOGITS") {
        let ids = Tensor::new(prompt.as_slice(), &dev)?.unsqueeze(0)?;
        let hidden = agent.forward(&ids, &[0], None, Pass::Inference)?;
        let logits = base.logits(&hidden)?.flatten_all()?.to_vec1::<f32>()?;
        let bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(&out, bytes)?;
    }
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let mut gen_tps = Vec::new();
    let mut gen_tokens = Vec::new();
    // MAPORL_BENCH_BATCHES: the generation batch sizes ("1,8"; empty skips generation).
    let batches: Vec<usize> = std::env::var("MAPORL_BENCH_BATCHES")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .collect();
    for &b in &batches {
        let prompts = vec![prompt.clone(); b];
        let _ = generate(
            &agent,
            &prompts,
            &mut Sampler::new(SamplingParams::greedy(), 0),
            &GenerateOptions {
                max_new_tokens: 4,
                ..opts.clone()
            },
        )?;
        let t = Instant::now();
        let out = generate(
            &agent,
            &prompts,
            &mut Sampler::new(SamplingParams::greedy(), 0),
            &opts,
        )?;
        let s = t.elapsed().as_secs_f64();
        let n: usize = out.iter().map(|g| g.tokens.len()).sum();
        println!(
            "generation b={b} (greedy): {:.1} tok/s ({n} tokens, 32-token prompts, {s:.2} s)",
            n as f64 / s
        );
        gen_tps.push(n as f64 / s);
        gen_tokens.push(out[0].tokens.clone());
    }
    let rss_gen = status_mb("VmHWM:");
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
    let mut best = [f64::MAX; 4];
    for step in 0..steps {
        let t = Instant::now();
        let s = score(&a, &pairs, Pass::Training, 16)?;
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
        if step > 0 || steps == 1 {
            for (b, v) in best
                .iter_mut()
                .zip([total, t_fwd, t_bwd - t_fwd, total - t_bwd])
            {
                *b = b.min(v);
            }
        }
    }
    let rss = status_mb("VmHWM:");
    println!("peak RSS (VmHWM) {rss} MB (after generation {rss_gen} MB)");
    if json {
        let toks = |v: &Vec<u32>| {
            v.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        println!(
            "JSON {{\"impl\":\"{}\",\"threads\":{threads},\"params\":{params},\"load_s\":{load_s},\
             \"gen_b1_tps\":{},\"gen_b8_tps\":{},\"gen_b1_tokens\":[{}],\"gen_b8_tokens\":[{}],\
             \"bandwidth_gbs\":{bw},\"weight_bytes\":{weight_bytes},\"train_s\":{},\"train_fwd_s\":{},\
             \"train_bwd_s\":{},\"train_opt_s\":{},\"rss_gen_mb\":{rss_gen},\"rss_peak_mb\":{rss}}}",
            if kernels.frozen_matmul { "candle" } else { "candle-plain" },
            gen_tps.first().copied().unwrap_or(0.0),
            gen_tps.get(1).copied().unwrap_or(0.0),
            toks(gen_tokens.first().unwrap_or(&Vec::new())),
            toks(gen_tokens.get(1).unwrap_or(&Vec::new())),
            best[0],
            best[1],
            best[2],
            best[3]
        );
    }
    Ok(())
}
