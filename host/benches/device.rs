//! Device benchmark (not a test): generation tokens/s at batch 1, 8 and 64 and one PPO train
//! step (LoRA r 16 on every linear layer + value head, forward, backward, AdamW) on a
//! random-weights llama made here, in the dtype and on the device asked for. Made for a GPU
//! machine without network (scripts/gpu-check.sh); on the CPU use a small size.
//!
//!   cargo bench -p maporl --features cuda --bench device                  # 0.5b, bf16, auto
//!   MAPORL_BENCH_SIZE=tiny MAPORL_BENCH_DEVICE=cpu MAPORL_BENCH_DTYPE=f32 \
//!       cargo bench -p maporl --bench device                              # a smoke run
//!
//! Environment: MAPORL_BENCH_DEVICE (auto | cpu | cuda:N), MAPORL_BENCH_DTYPE (bf16 | f16 |
//! f32), MAPORL_BENCH_SIZE (0.5b: hidden 1024, 24 layers, MLP 4096, vocab 32000, ~0.47B
//! parameters; tiny: hidden 128, 2 layers), MAPORL_BENCH_NEW_TOKENS (64),
//! MAPORL_BENCH_TRAIN (the train step's batch x prompt x response, "8x256x256"),
//! MAPORL_BENCH_JSON (a file to write every number to as JSON).

use std::sync::Arc;
use std::time::Instant;

use candle_core::{DType, Device};
use maporl::config::DeviceChoice;
use maporl::model::{
    generate, random, score, Agent, Config, GenerateOptions, Lora, LoraConfig, Pass, Sampler,
    SamplingParams, ValueHead,
};
use maporl::optim::AgentOptimizer;
use serde_json::json;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn config(size: &str) -> anyhow::Result<Config> {
    let (h, i, layers, heads, kv, vocab) = match size {
        "0.5b" => (1024, 4096, 24, 16, 4, 32000),
        "tiny" => (128, 256, 2, 4, 2, 512),
        other => anyhow::bail!("MAPORL_BENCH_SIZE={other}: expected 0.5b or tiny"),
    };
    Config::from_hf_json(&format!(
        r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{h},"intermediate_size":{i},
        "num_hidden_layers":{layers},"num_attention_heads":{heads},"num_key_value_heads":{kv},
        "vocab_size":{vocab},"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "max_position_embeddings":4096,"tie_word_embeddings":false}}"#
    ))
}

fn main() -> anyhow::Result<()> {
    let device_name = env("MAPORL_BENCH_DEVICE", "auto");
    let dev = DeviceChoice::try_from(device_name.clone())
        .map_err(anyhow::Error::msg)?
        .open()?;
    let dtype = match env("MAPORL_BENCH_DTYPE", "bf16").as_str() {
        "bf16" => DType::BF16,
        "f16" => DType::F16,
        "f32" => DType::F32,
        other => anyhow::bail!("MAPORL_BENCH_DTYPE={other}: expected bf16, f16 or f32"),
    };
    let size = env("MAPORL_BENCH_SIZE", "0.5b");
    let new_tokens: usize = env("MAPORL_BENCH_NEW_TOKENS", "64").parse()?;
    let train: Vec<usize> = env("MAPORL_BENCH_TRAIN", "8x256x256")
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [batch, prompt_len, response_len] = train[..] else {
        anyhow::bail!("MAPORL_BENCH_TRAIN: expected BxPxR, e.g. 8x256x256");
    };
    let sync = |d: &Device| d.synchronize();

    let cfg = config(&size)?;
    let t = Instant::now();
    let base = Arc::new(random(&cfg, dtype, &dev, 1)?);
    sync(&dev)?;
    let params = cfg.parameters();
    println!(
        "device {device_name} ({dev:?}), {dtype:?}, random llama {size}: {:.1}M params, made in {:.1} s",
        params as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );

    let agent = Agent::new(base.clone());
    let prompt: Vec<u32> = (0..32).map(|i| 100 + i).collect();
    let opts = GenerateOptions {
        max_new_tokens: new_tokens,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let mut generation = serde_json::Map::new();
    for b in [1usize, 8, 64] {
        let prompts = vec![prompt.clone(); b];
        let mut sampler = Sampler::new(SamplingParams::greedy(), 0);
        let warm = GenerateOptions {
            max_new_tokens: 4,
            ..opts.clone()
        };
        generate(&agent, &prompts, &mut sampler, &warm)?;
        sync(&dev)?;
        let t = Instant::now();
        let out = generate(&agent, &prompts, &mut sampler, &opts)?;
        sync(&dev)?;
        let s = t.elapsed().as_secs_f64();
        let n: usize = out.iter().map(|g| g.tokens.len()).sum();
        println!(
            "generation b={b}: {:.1} tok/s ({n} tokens in {s:.2} s)",
            n as f64 / s
        );
        generation.insert(format!("b{b}_tokens_per_s"), json!(n as f64 / s));
    }

    let mut learner = Agent::new(base.clone());
    learner.lora = Some(Lora::new(
        &base,
        LoraConfig {
            r: 16,
            alpha: 32.0,
            target_modules: [
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ]
            .map(String::from)
            .to_vec(),
        },
        0,
    )?);
    learner.value_head = Some(ValueHead::new(cfg.hidden_size, DType::F32, &dev, 0)?);
    let mut optimizer = AgentOptimizer::new(learner.named_trainable_vars(), 1e-5, 0.0)?;
    let vocab = cfg.vocab_size as u32;
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..batch)
        .map(|k| {
            let k = k as u32;
            (
                (0..prompt_len as u32)
                    .map(|i| (200 + i * 7 + k) % vocab)
                    .collect(),
                (0..response_len as u32)
                    .map(|i| (900 + i * 3 + k) % vocab)
                    .collect(),
            )
        })
        .collect();
    // The step's parts, each timed to a device synchronisation: forward (log-probs, values
    // and the loss), backward, and the optimizer (accumulate and AdamW).
    let mut best = f64::MAX;
    let mut parts = [f64::MAX; 3];
    for step in 0..3 {
        sync(&dev)?;
        let t = Instant::now();
        let s = score(&learner, &pairs, Pass::Training, 64)?;
        let ratio = (&s.logprobs - s.logprobs.detach())?.exp()?;
        let values = s.values.as_ref().expect("the learner has a value head");
        let loss = ((values.sqr()? * 0.5)? - ratio)?;
        let loss = ((loss * &s.mask)?.sum_all()? / s.mask.sum_all()?.to_scalar::<f32>()? as f64)?;
        sync(&dev)?;
        let forward = t.elapsed().as_secs_f64();
        let grads = loss.backward()?;
        sync(&dev)?;
        let backward = t.elapsed().as_secs_f64() - forward;
        optimizer.accumulate(&grads)?;
        optimizer.step(1.0)?;
        sync(&dev)?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "train step {step} ({batch} x ({prompt_len} + {response_len}) tokens, LoRA r 16 + value head): {secs:.3} s \
             (forward {forward:.3}, backward {backward:.3}, optimizer {:.3})",
            secs - forward - backward
        );
        if step > 0 && secs < best {
            best = secs;
            parts = [forward, backward, secs - forward - backward];
        }
    }
    let train_tokens = batch * (prompt_len + response_len);
    println!(
        "train: {:.0} tokens/s (best of 2 after a warm-up)",
        train_tokens as f64 / best
    );
    if let Ok(path) = std::env::var("MAPORL_BENCH_JSON") {
        let report = json!({
            "device": device_name,
            "device_debug": format!("{dev:?}"),
            "dtype": format!("{dtype:?}"),
            "size": size,
            "params": params,
            "new_tokens": new_tokens,
            "generation": generation,
            "train": {
                "batch": batch, "prompt": prompt_len, "response": response_len,
                "step_s": best, "tokens_per_s": train_tokens as f64 / best,
                "forward_s": parts[0], "backward_s": parts[1], "optimizer_s": parts[2],
            },
        });
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
        println!("wrote {path}");
    }
    Ok(())
}
