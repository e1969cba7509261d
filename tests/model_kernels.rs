//! The CPU training kernels give the same outputs and gradients as candle's elementary ops:
//! the frozen-weight matmul (backward without a weight gradient for frozen linears and the
//! lm_head) and the fused ops (RMS norm, rope, attention, SiLU gating, token
//! log-probs and entropies), for LoRA + value head and for full fine-tuning. One test, as the
//! switches are process-wide.

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use maporl::model::Pass;
use maporl::model::{score, Agent, Base, Config, Lora, LoraConfig, ValueHead};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":120,
  "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":128,"tie_word_embeddings":false}"#;
const QWEN2: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":120,
  "rms_norm_eps":1e-6,"rope_theta":1000000.0,"max_position_embeddings":128,"sliding_window":128,
  "max_window_layers":2,"use_sliding_window":false,"tie_word_embeddings":true,"hidden_act":"silu"}"#;
const PHI3: &str = r#"{"architectures":["Phi3ForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":120,
  "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":128,"hidden_act":"silu",
  "partial_rotary_factor":0.5,"tie_word_embeddings":false,"rope_scaling":null}"#;

/// A frozen base (plain tensors, as a loaded checkpoint) with seeded random weights.
fn frozen_base(json: &str, seed: u64) -> Base {
    let cfg = Config::from_hf_json(json).unwrap();
    let varmap = VarMap::new();
    Base::new(
        &cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut ts = std::collections::HashMap::new();
    for name in names {
        let v = &data[name];
        let dims = v.dims().to_vec();
        let n = v.elem_count();
        let vals: Vec<f32> = if name.contains("norm") {
            (0..n).map(|_| 1.0 + rng.random_range(-0.3..0.3)).collect()
        } else if name.contains("embed") {
            (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
        } else {
            let s = 1.5 / (*dims.last().unwrap() as f32).sqrt();
            (0..n).map(|_| rng.random_range(-s..s)).collect()
        };
        ts.insert(
            name.clone(),
            Tensor::from_vec(vals, dims, &Device::Cpu).unwrap(),
        );
    }
    Base::new(&cfg, VarBuilder::from_tensors(ts, DType::F32, &Device::Cpu)).unwrap()
}

/// How the differentiable path runs.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// candle's elementary ops and plain matmul.
    Plain,
    /// The frozen-weight matmul only.
    Frozen,
    /// The frozen-weight matmul and the fused ops (the default).
    All,
}

/// The scored outputs (log-probs, entropies, values) and the gradients of a PPO-shaped loss
/// with an entropy bonus for every trainable var, by name.
fn grads(agent: &Agent, vars: &[(String, candle_core::Var)], k: Path) -> Vec<(String, Vec<f32>)> {
    // The same agent (the same vars) on a base that computes with these kernels.
    let mut base = (*agent.base).clone();
    base.set_kernels(maporl::model::Kernels {
        frozen_matmul: !matches!(k, Path::Plain),
        fused_ops: matches!(k, Path::All),
    });
    let agent = &Agent {
        base: std::sync::Arc::new(base),
        lora: agent.lora.clone(),
        value_head: agent.value_head.clone(),
        weights: agent.weights.clone(),
    };
    let pairs = vec![
        (vec![1, 2, 3], vec![4, 5]),
        (vec![6], vec![7, 8, 9, 10]),
        (vec![11, 12, 13, 14, 15], vec![16, 17, 18]),
    ];
    let s = score(agent, &pairs, Pass::Training, 2).unwrap();
    let old = (s.logprobs.detach() - 0.1).unwrap();
    let ratio = (s.logprobs.clone() - &old).unwrap().exp().unwrap();
    let adv = Tensor::new(&[[1f32, -0.5, 2.0, 0.3]; 3], &Device::Cpu).unwrap();
    let pg = (ratio.clone() * &adv)
        .unwrap()
        .minimum(&(ratio.clamp(0.8f32, 1.2f32).unwrap() * &adv).unwrap())
        .unwrap();
    let mut loss = (pg.neg().unwrap() - (&s.entropy * 0.05).unwrap()).unwrap();
    if let Some(v) = &s.values {
        loss = (loss + ((v - &adv).unwrap().sqr().unwrap() * 0.5).unwrap()).unwrap();
    }
    let loss = (loss * &s.mask).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap();
    let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let mut out = vec![
        ("logprobs".to_string(), flat(&s.logprobs)),
        ("entropy".to_string(), flat(&s.entropy)),
    ];
    if let Some(v) = &s.values {
        out.push(("values".to_string(), flat(v)));
    }
    for (n, v) in vars {
        let t = g
            .get(v.as_tensor())
            .unwrap_or_else(|| panic!("{n}: trainable var without gradient"));
        out.push((n.clone(), flat(t)));
    }
    out
}

/// The largest difference between two runs, relative to the larger magnitude of each entry.
fn compare(what: &str, a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)], tol: f32) {
    assert_eq!(a.len(), b.len());
    let mut worst = (0f32, String::new());
    for ((n1, g1), (n2, g2)) in a.iter().zip(b) {
        assert_eq!(n1, n2);
        assert!(g2.iter().any(|x| *x != 0.0), "{what}, {n1}: all zero");
        let scale = g2.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-3);
        for (x, y) in g1.iter().zip(g2) {
            let d = (x - y).abs() / scale;
            if d > worst.0 {
                worst = (d, n1.clone());
            }
        }
    }
    println!(
        "{what}: max relative difference over {} tensors: {:e} ({})",
        a.len(),
        worst.0,
        worst.1
    );
    assert!(worst.0 <= tol, "{what}: {} differs by {}", worst.1, worst.0);
}

#[test]
fn training_kernels_match_candles_elementary_ops() {
    for (json, targets) in [
        (
            LLAMA,
            &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ][..],
        ),
        (
            QWEN2,
            &[
                "q_proj",
                "k_proj",
                "v_proj",
                "o_proj",
                "gate_proj",
                "up_proj",
                "down_proj",
            ][..],
        ),
        (
            PHI3,
            &["qkv_proj", "o_proj", "gate_up_proj", "down_proj"][..],
        ),
    ] {
        let base = Arc::new(frozen_base(json, 3));
        let mut agent = Agent::new(base.clone());
        let lora = Lora::new(
            &base,
            LoraConfig {
                r: 4,
                alpha: 8.0,
                target_modules: targets.iter().map(|s| s.to_string()).collect(),
            },
            5,
        )
        .unwrap();
        // Non-zero B, so that A receives a gradient too.
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for (_, v) in lora.named_vars() {
            let vals: Vec<f32> = (0..v.elem_count())
                .map(|_| rng.random_range(-0.2..0.2))
                .collect();
            v.set(&Tensor::from_vec(vals, v.dims(), &Device::Cpu).unwrap())
                .unwrap();
        }
        agent.lora = Some(lora);
        agent.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 7).unwrap());
        let mut vars = agent.lora.as_ref().unwrap().named_vars();
        for (i, v) in agent
            .value_head
            .as_ref()
            .unwrap()
            .vars()
            .into_iter()
            .enumerate()
        {
            vars.push((format!("value_head.{i}"), v));
        }
        let plain = grads(&agent, &vars, Path::Plain);
        for k in [Path::Frozen, Path::All] {
            compare(
                &format!("LoRA, {k:?}"),
                &grads(&agent, &vars, k),
                &plain,
                1e-4,
            );
        }
        // Full fine-tuning: every weight (norms included) is a var, no LoRA.
        let (full, vars) = base.trainable_copy().unwrap();
        let agent = Agent::new(Arc::new(full));
        let plain = grads(&agent, &vars, Path::Plain);
        compare(
            "full fine-tuning, All",
            &grads(&agent, &vars, Path::All),
            &plain,
            1e-4,
        );
    }
}
