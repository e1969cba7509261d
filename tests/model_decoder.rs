//! The decoder against candle-transformers' own implementations (same random weights), left
//! padding, gradients, LoRA, value heads, sampling and response scoring.

use candle_core::{DType, Device, IndexOp, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models as ct;
use maporl::model::Pass;
use maporl::model::{
    generate, generate_sharing, generate_together, generate_traced, score, score_at_temperature,
    score_checkpointed, score_shared_prefixes, Agent, Base, Config, GenerateOptions, Generation,
    Kernels, KvCache, Lora, LoraConfig, PrefixCache, Sampler, SamplingParams, Scored, Speaker,
    ValueHead,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":120,
  "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":128,"tie_word_embeddings":false,
  "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
                  "original_max_position_embeddings":16,"rope_type":"llama3"}}"#;
const QWEN2: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":120,
  "rms_norm_eps":1e-6,"rope_theta":1000000.0,"max_position_embeddings":128,"sliding_window":128,
  "max_window_layers":2,"use_sliding_window":false,"tie_word_embeddings":true,"hidden_act":"silu"}"#;
const PHI3: &str = r#"{"architectures":["Phi3ForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,"vocab_size":120,
  "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":128,"hidden_act":"silu",
  "partial_rotary_factor":0.5,"tie_word_embeddings":false,"rope_scaling":null}"#;
const MISTRAL: &str = r#"{"architectures":["MistralForCausalLM"],"hidden_size":64,"intermediate_size":96,
  "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":24,"vocab_size":120,
  "rms_norm_eps":1e-5,"rope_theta":10000.0,"max_position_embeddings":128,"sliding_window":null,
  "hidden_act":"silu","tie_word_embeddings":false}"#;

/// Overwrites every var with seeded random values of a sensible scale.
fn randomize(varmap: &VarMap, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for name in names {
        let var = &data[name];
        let n = var.elem_count();
        let dims = var.dims().to_vec();
        let vals: Vec<f32> = if name.contains("norm") {
            (0..n).map(|_| 1.0 + rng.random_range(-0.3..0.3)).collect()
        } else if name.contains("embed") {
            (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
        } else {
            let s = 1.5 / (*dims.last().unwrap() as f32).sqrt();
            (0..n).map(|_| rng.random_range(-s..s)).collect()
        };
        let t = Tensor::from_vec(vals, dims, &Device::Cpu)
            .unwrap()
            .to_dtype(var.dtype())
            .unwrap();
        var.set(&t).unwrap();
    }
}

fn ids(b: usize, t: usize, vocab: u32, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..b)
        .map(|_| (0..t).map(|_| rng.random_range(0..vocab)).collect())
        .collect()
}

fn to_tensor(rows: &[Vec<u32>]) -> Tensor {
    let t = rows[0].len();
    Tensor::from_vec(rows.concat(), (rows.len(), t), &Device::Cpu).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a.to_dtype(DType::F32).unwrap() - b.to_dtype(DType::F32).unwrap())
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

/// Our last-position logits for a prefill of `prompt` and `steps` single-token steps, with the
/// KV cache (fused) and by full recomputation (differentiable path).
fn ours(base: &Base, prompt: &[Vec<u32>], steps: &[Vec<u32>], fused: bool) -> Vec<Tensor> {
    let b = prompt.len();
    let pads = vec![0; b];
    let mut out = vec![];
    if fused {
        let mut cache = KvCache::new(base.config().num_hidden_layers);
        let h = base
            .forward(
                &to_tensor(prompt),
                &pads,
                Some(&mut cache),
                None,
                Pass::Inference,
            )
            .unwrap();
        let t = h.dim(1).unwrap();
        out.push(base.logits(&h.i((.., t - 1, ..)).unwrap()).unwrap());
        for s in steps {
            let x = Tensor::from_vec(s.clone(), (b, 1), &Device::Cpu).unwrap();
            let h = base
                .forward(&x, &pads, Some(&mut cache), None, Pass::Inference)
                .unwrap();
            out.push(base.logits(&h.i((.., 0, ..)).unwrap()).unwrap());
        }
    } else {
        let mut seq: Vec<Vec<u32>> = prompt.to_vec();
        for k in 0..=steps.len() {
            let h = base
                .forward(&to_tensor(&seq), &pads, None, None, Pass::Training)
                .unwrap();
            let t = h.dim(1).unwrap();
            out.push(base.logits(&h.i((.., t - 1, ..)).unwrap()).unwrap());
            if k < steps.len() {
                for (row, s) in seq.iter_mut().zip(&steps[k]) {
                    row.push(*s);
                }
            }
        }
    }
    out
}

/// Compares ours against a reference that returns (b, V) or (b, 1, V) last logits per call.
fn check_family(
    json: &str,
    mut reference: impl FnMut(&Tensor, usize) -> Tensor,
    base: &Base,
) -> f32 {
    let _ = json;
    let prompt = ids(2, 7, 120, 1);
    let steps: Vec<Vec<u32>> = ids(3, 2, 120, 2);
    let mut refs = vec![];
    refs.push(reference(&to_tensor(&prompt), 0));
    for (k, s) in steps.iter().enumerate() {
        refs.push(reference(
            &Tensor::from_vec(s.clone(), (2, 1), &Device::Cpu).unwrap(),
            7 + k,
        ));
    }
    let refs: Vec<Tensor> = refs
        .into_iter()
        .map(|r| r.reshape((2, 120)).unwrap())
        .collect();
    let mut worst = 0f32;
    for fused in [true, false] {
        let mine = ours(base, &prompt, &steps, fused);
        for (a, b) in mine.iter().zip(&refs) {
            worst = worst.max(max_diff(a, b));
        }
    }
    worst
}

fn build(json: &str, varmap: &VarMap) -> Base {
    let cfg = Config::from_hf_json(json).unwrap();
    Base::new(
        &cfg,
        VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu),
    )
    .unwrap()
}

#[test]
fn llama_logits_match_candle_transformers() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let lc: ct::llama::LlamaConfig = serde_json::from_str(LLAMA).unwrap();
    let lc = lc.into_config(false);
    let reference = ct::llama::Llama::load(vb, &lc).unwrap();
    randomize(&varmap, 11);
    let mut cache = ct::llama::Cache::new(true, DType::F32, &lc, &dev).unwrap();
    let base = build(LLAMA, &varmap);
    let d = check_family(
        LLAMA,
        |x, pos| reference.forward(x, pos, &mut cache).unwrap(),
        &base,
    );
    println!("llama max |logit diff| = {d:e}");
    assert!(d < 1e-4, "llama max logit diff {d}");
}

#[test]
fn qwen2_logits_match_candle_transformers() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let qc: ct::qwen2::Config = serde_json::from_str(QWEN2).unwrap();
    let mut reference = ct::qwen2::ModelForCausalLM::new(&qc, vb).unwrap();
    randomize(&varmap, 12);
    let base = build(QWEN2, &varmap);
    assert!(varmap
        .data()
        .lock()
        .unwrap()
        .keys()
        .any(|k| k.ends_with("q_proj.bias")));
    let d = check_family(QWEN2, |x, pos| reference.forward(x, pos).unwrap(), &base);
    println!("qwen2 max |logit diff| = {d:e}");
    assert!(d < 1e-4, "qwen2 max logit diff {d}");
}

#[test]
fn phi3_logits_match_candle_transformers() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let pc: ct::phi3::Config = serde_json::from_str(PHI3).unwrap();
    let mut reference = ct::phi3::Model::new(&pc, vb).unwrap();
    randomize(&varmap, 13);
    let base = build(PHI3, &varmap);
    let d = check_family(PHI3, |x, pos| reference.forward(x, pos).unwrap(), &base);
    println!("phi3 max |logit diff| = {d:e}");
    assert!(d < 1e-4, "phi3 max logit diff {d}");
}

#[test]
fn mistral_logits_match_candle_transformers() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let mc: ct::mistral::Config = serde_json::from_str(MISTRAL).unwrap();
    let mut reference = ct::mistral::Model::new(&mc, vb).unwrap();
    randomize(&varmap, 14);
    let base = build(MISTRAL, &varmap);
    let d = check_family(MISTRAL, |x, pos| reference.forward(x, pos).unwrap(), &base);
    println!("mistral max |logit diff| = {d:e}");
    assert!(d < 1e-4, "mistral max logit diff {d}");
}

fn random_base(json: &str, seed: u64) -> (VarMap, Base) {
    let varmap = VarMap::new();
    let cfg = Config::from_hf_json(json).unwrap();
    let _ = Base::new(
        &cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    randomize(&varmap, seed);
    let base = build(json, &varmap);
    (varmap, base)
}

/// A frozen base: the same weights as plain tensors (no Var), as a loaded checkpoint has.
fn frozen(json: &str, varmap: &VarMap) -> Base {
    let ts = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().copy().unwrap()))
        .collect();
    let cfg = Config::from_hf_json(json).unwrap();
    Base::new(&cfg, VarBuilder::from_tensors(ts, DType::F32, &Device::Cpu)).unwrap()
}

#[test]
fn left_padded_batch_equals_unbatched_runs() {
    for json in [LLAMA, QWEN2, PHI3] {
        let (_vm, base) = random_base(json, 21);
        let prompts: Vec<Vec<u32>> = [3usize, 7, 5]
            .iter()
            .enumerate()
            .map(|(i, &n)| ids(1, n, 120, 30 + i as u64)[0].clone())
            .collect();
        let len = 7;
        let pads: Vec<usize> = prompts.iter().map(|p| len - p.len()).collect();
        let padded: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| [vec![0; len - p.len()], p.clone()].concat())
            .collect();
        for pass in [Pass::Inference, Pass::Training] {
            let h = base
                .forward(&to_tensor(&padded), &pads, None, None, pass)
                .unwrap();
            for (b, p) in prompts.iter().enumerate() {
                let single = base
                    .forward(&to_tensor(std::slice::from_ref(p)), &[0], None, None, pass)
                    .unwrap();
                // Every real position of the row matches the unpadded run.
                let mine = h.i((b, pads[b].., ..)).unwrap();
                let d = max_diff(&mine, &single.i(0).unwrap());
                assert!(d < 1e-4, "row {b} {pass:?}: max diff {d}");
                let hd = h
                    .i((b, .., ..))
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                assert!(
                    hd.iter().all(|x| x.is_finite()),
                    "padding produced non-finite values"
                );
            }
        }
        // Batched greedy generation with the cache equals per-prompt generation.
        let agent = Agent::new(Arc::new(base));
        let opts = GenerateOptions {
            max_new_tokens: 6,
            stop_tokens: vec![],
            pad_token: 0,
        };
        let batched = generate(
            &agent,
            &prompts,
            &mut Sampler::new(SamplingParams::greedy(), 0),
            &opts,
        )
        .unwrap();
        for (p, g) in prompts.iter().zip(&batched) {
            let one = generate(
                &agent,
                std::slice::from_ref(p),
                &mut Sampler::new(SamplingParams::greedy(), 0),
                &opts,
            )
            .unwrap();
            assert_eq!(one[0].tokens, g.tokens);
            for (a, b) in one[0].logprobs.iter().zip(&g.logprobs) {
                assert!((a - b).abs() < 1e-4, "greedy logprob {a} vs {b}");
            }
        }
    }
}

#[test]
fn every_var_gets_a_gradient_on_the_differentiable_path() {
    for json in [LLAMA, QWEN2, PHI3, MISTRAL] {
        let (varmap, base) = random_base(json, 31);
        let prompts = ids(2, 6, 120, 5);
        let h = base
            .forward(&to_tensor(&prompts), &[0, 2], None, None, Pass::Training)
            .unwrap();
        let logits = base.logits(&h).unwrap();
        let w = Tensor::from_vec(
            (0..logits.elem_count())
                .map(|i| ((i * 7919) % 13) as f32 / 13.0 - 0.5)
                .collect::<Vec<_>>(),
            logits.dims(),
            &Device::Cpu,
        )
        .unwrap();
        let loss = (logits * w).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let data = varmap.data().lock().unwrap();
        let mut missing = vec![];
        for (name, var) in data.iter() {
            let ok = grads
                .get(var.as_tensor())
                .map(|g| {
                    g.abs()
                        .unwrap()
                        .sum_all()
                        .unwrap()
                        .to_scalar::<f32>()
                        .unwrap()
                        > 0.0
                })
                .unwrap_or(false);
            if !ok {
                missing.push(name.clone());
            }
        }
        println!(
            "{}: {} of {} vars have non-zero gradients",
            &json[19..40],
            data.len() - missing.len(),
            data.len()
        );
        assert!(missing.is_empty(), "no gradient for {missing:?}");
    }
}

/// Generation and no-gradient scoring must not build an autograd graph: one over trainable
/// weights would keep every layer's activations (and, through the KV cache, every step's)
/// alive, which ran a SmolLM2 training step out of 24 GiB.
#[test]
fn the_fused_path_carries_no_graph_even_over_trainable_weights() {
    let (varmap, base) = random_base(LLAMA, 31);
    let prompts = ids(2, 6, 120, 5);
    let grads_of = |h: &Tensor| {
        let loss = base.logits(h).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let data = varmap.data().lock().unwrap();
        data.values()
            .filter(|v| grads.get(v.as_tensor()).is_some())
            .count()
    };
    let mut cache = KvCache::new(base.config().num_hidden_layers);
    let h = base
        .forward(
            &to_tensor(&prompts),
            &[0, 2],
            Some(&mut cache),
            None,
            Pass::Inference,
        )
        .unwrap();
    let next = base
        .forward(
            &to_tensor(&ids(2, 1, 120, 6)),
            &[0, 2],
            Some(&mut cache),
            None,
            Pass::Inference,
        )
        .unwrap();
    // Only lm_head (outside the decoder) can be reached from the fused hidden states.
    assert!(grads_of(&h) <= 1, "{} vars reachable", grads_of(&h));
    assert!(grads_of(&next) <= 1);
    let h = base
        .forward(&to_tensor(&prompts), &[0, 2], None, None, Pass::Training)
        .unwrap();
    assert!(grads_of(&h) > 10, "the differentiable path is tracked");
}

fn lora_cfg(targets: &[&str]) -> LoraConfig {
    LoraConfig {
        r: 4,
        alpha: 8.0,
        target_modules: targets.iter().map(|s| s.to_string()).collect(),
    }
}

fn randomize_lora(lora: &Lora, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (_, v) in lora.named_vars() {
        let vals: Vec<f32> = (0..v.elem_count())
            .map(|_| rng.random_range(-0.2..0.2))
            .collect();
        v.set(&Tensor::from_vec(vals, v.dims(), &Device::Cpu).unwrap())
            .unwrap();
    }
}

#[test]
fn lora_zero_b_equals_base_and_merge_equals_lora_forward() {
    let all = [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ];
    for (json, targets) in [
        (LLAMA, &all[..]),
        (QWEN2, &all[..]),
        (
            PHI3,
            &["qkv_proj", "o_proj", "gate_up_proj", "down_proj"][..],
        ),
    ] {
        let (vm, _) = random_base(json, 41);
        let base = frozen(json, &vm);
        let x = to_tensor(&ids(2, 5, 120, 6));
        let plain = base
            .forward(&x, &[0, 1], None, None, Pass::Inference)
            .unwrap();
        let lora = Lora::new(&base, lora_cfg(targets), 1).unwrap();
        let with = base
            .forward(&x, &[0, 1], None, Some(&lora), Pass::Inference)
            .unwrap();
        assert_eq!(
            max_diff(&plain, &with),
            0.0,
            "B = 0 must leave the output unchanged"
        );
        randomize_lora(&lora, 2);
        let with = base
            .forward(&x, &[0, 1], None, Some(&lora), Pass::Inference)
            .unwrap();
        assert!(
            max_diff(&plain, &with) > 1e-3,
            "a non-zero adapter must change the output"
        );
        let merged = lora.merge(&base).unwrap();
        let m = merged
            .forward(&x, &[0, 1], None, None, Pass::Inference)
            .unwrap();
        let d = max_diff(&m, &with);
        println!("merge vs LoRA forward: max diff {d:e}");
        assert!(d < 1e-4, "merge differs from the LoRA forward by {d}");
        // The base itself is untouched by merge.
        assert_eq!(
            max_diff(
                &plain,
                &base
                    .forward(&x, &[0, 1], None, None, Pass::Inference)
                    .unwrap()
            ),
            0.0
        );
    }
}

/// LoRA dropout (`train.sft.lora_dropout`) changes the adapted forward, differently at
/// each call, reproducibly for a seed, and not at all once switched off; the base alone is
/// untouched by it.
#[test]
fn lora_dropout_is_seeded_and_switches_off() {
    let (vm, _) = random_base(LLAMA, 41);
    let base = frozen(LLAMA, &vm);
    let x = to_tensor(&ids(2, 5, 120, 6));
    let mut lora = Lora::new(&base, lora_cfg(&["q_proj", "down_proj"]), 1).unwrap();
    randomize_lora(&lora, 2);
    let run = |lora: &Lora| {
        base.forward(&x, &[0, 1], None, Some(lora), Pass::Training)
            .unwrap()
    };
    let plain = run(&lora);
    lora.set_dropout(0.3, 9).unwrap();
    let (first, second) = (run(&lora), run(&lora));
    assert!(max_diff(&plain, &first) > 1e-4, "dropout changed nothing");
    assert!(
        max_diff(&first, &second) > 1e-4,
        "two calls drew the same mask"
    );
    lora.set_dropout(0.3, 9).unwrap();
    assert_eq!(
        max_diff(&first, &run(&lora)),
        0.0,
        "the seed fixes the masks"
    );
    lora.set_dropout(0.0, 9).unwrap();
    assert_eq!(max_diff(&plain, &run(&lora)), 0.0, "off again");
    assert!(lora.set_dropout(1.0, 0).is_err() && lora.set_dropout(-0.1, 0).is_err());
}

#[test]
fn unknown_lora_target_is_refused() {
    let (vm, _) = random_base(PHI3, 1);
    let base = frozen(PHI3, &vm);
    let e = Lora::new(&base, lora_cfg(&["q_proj"]), 0)
        .err()
        .expect("q_proj is not a Phi-3 module");
    assert!(format!("{e:#}").contains("q_proj"), "{e:#}");
    let e = Lora::new(&base, lora_cfg(&["attn"]), 0)
        .err()
        .expect("unknown target");
    assert!(
        format!("{e:#}").contains("attn") && format!("{e:#}").contains("gate_up_proj"),
        "{e:#}"
    );
}

#[test]
fn lora_save_load_round_trip_with_peft_names() {
    let (vm, _) = random_base(LLAMA, 51);
    let base = frozen(LLAMA, &vm);
    let lora = Lora::new(&base, lora_cfg(&["q_proj", "v_proj", "down_proj"]), 3).unwrap();
    randomize_lora(&lora, 4);
    let dir = tempfile::tempdir().unwrap();
    lora.save(dir.path(), "tiny-llama").unwrap();
    let st =
        candle_core::safetensors::load(dir.path().join("adapter_model.safetensors"), &Device::Cpu)
            .unwrap();
    assert!(st.contains_key("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"));
    assert!(st.contains_key("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    assert_eq!(st.len(), 2 * 2 * 3);
    let conf: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(conf["peft_type"], "LORA");
    assert_eq!(conf["r"], 4);
    let back = Lora::load(dir.path(), &base).unwrap();
    let x = to_tensor(&ids(2, 5, 120, 8));
    let a = base
        .forward(&x, &[0, 0], None, Some(&lora), Pass::Inference)
        .unwrap();
    let b = base
        .forward(&x, &[0, 0], None, Some(&back), Pass::Inference)
        .unwrap();
    assert_eq!(max_diff(&a, &b), 0.0);
    // A missing file is named.
    std::fs::remove_file(dir.path().join("adapter_model.safetensors")).unwrap();
    let e = format!("{:#}", Lora::load(dir.path(), &base).err().unwrap());
    assert!(e.contains("adapter_model.safetensors"), "{e}");
}

#[test]
fn lora_and_value_head_train_while_the_base_stays_frozen() {
    let (vm, _) = random_base(QWEN2, 61);
    let base = Arc::new(frozen(QWEN2, &vm));
    let mut agent = Agent::new(base.clone());
    let lora = Lora::new(
        &base,
        lora_cfg(&[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]),
        5,
    )
    .unwrap();
    randomize_lora(&lora, 6);
    agent.lora = Some(lora);
    agent.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 7).unwrap());
    let pairs = vec![(vec![1, 2, 3], vec![4, 5]), (vec![6], vec![7, 8, 9, 10])];
    let s = score(&agent, &pairs, Pass::Training, 2).unwrap();
    let loss = ((s.logprobs.clone() * &s.mask).unwrap().sum_all().unwrap()
        + (s.values.clone().unwrap() * &s.mask)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap())
    .unwrap();
    let grads = loss.backward().unwrap();
    let vars = agent.trainable_vars();
    assert_eq!(vars.len(), 2 * 7 * 2 + 2);
    for v in &vars {
        let g = grads
            .get(v.as_tensor())
            .expect("trainable var without gradient");
        assert!(
            g.abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                > 0.0
        );
    }
}

#[test]
fn same_seed_same_tokens_and_logprobs_under_the_sampled_distribution() {
    let (vm, _) = random_base(LLAMA, 71);
    let agent = Agent::new(Arc::new(frozen(LLAMA, &vm)));
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8]];
    let opts = GenerateOptions {
        max_new_tokens: 8,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let p = SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
    };
    let a = generate(&agent, &prompts, &mut Sampler::new(p, 42), &opts).unwrap();
    let b = generate(&agent, &prompts, &mut Sampler::new(p, 42), &opts).unwrap();
    let c = generate(&agent, &prompts, &mut Sampler::new(p, 43), &opts).unwrap();
    assert_eq!(a, b);
    assert_ne!(
        a.iter().map(|g| &g.tokens).collect::<Vec<_>>(),
        c.iter().map(|g| &g.tokens).collect::<Vec<_>>()
    );
    assert!(a
        .iter()
        .all(|g| g.tokens.len() == 8 && g.logprobs.iter().all(|&l| l <= 0.0 && l.is_finite())));

    // Log-probs: top-k = 2 renormalises over the two best tokens.
    let logits = Tensor::new(&[[2.0f32, 1.0, 0.5, -1.0]], &Device::Cpu).unwrap();
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 2,
        },
        9,
    );
    let z = (2f32.exp() + 1f32.exp()).ln();
    for _ in 0..50 {
        let (tok, lp) = s.sample(&logits).unwrap()[0];
        assert!(tok < 2);
        let want = [2.0f32, 1.0][tok as usize] - z;
        assert!((lp - want).abs() < 1e-5, "{lp} vs {want}");
    }
    // Temperature 0.5 without filtering: the empirical frequencies follow softmax(logits / 0.5).
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 0.5,
            top_p: 1.0,
            top_k: 0,
        },
        10,
    );
    let probs = candle_nn::ops::softmax(&(logits.clone() / 0.5).unwrap(), D::Minus1)
        .unwrap()
        .i(0)
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    let mut counts = [0usize; 4];
    let n = 4000;
    for _ in 0..n {
        let (tok, lp) = s.sample(&logits).unwrap()[0];
        assert!((lp - probs[tok as usize].ln()).abs() < 1e-5);
        counts[tok as usize] += 1;
    }
    for k in 0..4 {
        assert!(
            (counts[k] as f32 / n as f32 - probs[k]).abs() < 0.03,
            "token {k}: {counts:?} vs {probs:?}"
        );
    }
    // Top-p = 0.5 keeps only the most likely token here (p = 0.84 at T = 0.5).
    let mut s = Sampler::new(
        SamplingParams {
            temperature: 0.5,
            top_p: 0.5,
            top_k: 0,
        },
        11,
    );
    for _ in 0..20 {
        assert_eq!(s.sample(&logits).unwrap()[0], (0, 0.0));
    }
}

#[test]
fn scoring_at_the_sampling_temperature_gives_the_sampled_log_probs() {
    // What PPO needs: the update's log-probs are those of the distribution that sampled.
    let (vm, _) = random_base(LLAMA, 72);
    let agent = Agent::new(Arc::new(frozen(LLAMA, &vm)));
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8]];
    let opts = GenerateOptions {
        max_new_tokens: 6,
        stop_tokens: vec![],
        pad_token: 0,
    };
    let p = SamplingParams {
        temperature: 0.7,
        top_p: 1.0,
        top_k: 0,
    };
    let generated = generate(&agent, &prompts, &mut Sampler::new(p, 5), &opts).unwrap();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = prompts
        .iter()
        .cloned()
        .zip(generated.iter().map(|g| g.tokens.clone()))
        .collect();
    let rows = |t: f64| {
        score_at_temperature(&agent, &pairs, Pass::Inference, 4, t)
            .unwrap()
            .logprobs
            .to_vec2::<f32>()
            .unwrap()
    };
    let (tempered, plain) = (rows(0.7), rows(1.0));
    let mut differs = 0.0f32;
    for ((g, t), u) in generated.iter().zip(&tempered).zip(&plain) {
        for k in 0..g.tokens.len() {
            assert!(
                (g.logprobs[k] - t[k]).abs() < 1e-4,
                "{} vs {}",
                g.logprobs[k],
                t[k]
            );
            differs = differs.max((g.logprobs[k] - u[k]).abs());
        }
    }
    assert!(differs > 1e-2, "temperature 1 scores another distribution");
    // Greedy decoding (temperature 0) scores at 1; a temperature that is not finite is refused.
    assert_eq!(rows(0.0), plain);
    assert!(score_at_temperature(&agent, &pairs, Pass::Inference, 4, f64::NAN).is_err());
}

/// The worst |difference| between each generation's traced log-probs / values and a
/// separate scoring pass over the same prompts and responses, at `t`.
fn trace_against_scoring(
    agent: &Agent,
    prompts: &[Vec<u32>],
    generated: &[maporl::model::Generation],
    t: f64,
) -> (f32, f32) {
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = prompts
        .iter()
        .cloned()
        .zip(generated.iter().map(|g| g.tokens.clone()))
        .collect();
    let scored = score_at_temperature(agent, &pairs, Pass::Inference, 4, t).unwrap();
    let lp = scored.logprobs.to_vec2::<f32>().unwrap();
    let values = scored.values.unwrap().to_vec2::<f32>().unwrap();
    let (mut dl, mut dv) = (0.0f32, 0.0f32);
    for ((g, lp), v) in generated.iter().zip(&lp).zip(&values) {
        let tr = g.trace.as_ref().expect("traced");
        assert_eq!(tr.logprobs.len(), g.tokens.len());
        assert_eq!(tr.values.len(), g.tokens.len());
        let skip = lp.len() - g.tokens.len();
        for k in 0..g.tokens.len() {
            dl = dl.max((tr.logprobs[k] - lp[skip + k]).abs());
            dv = dv.max((tr.values[k] - v[skip + k]).abs());
        }
    }
    (dl, dv)
}

#[test]
fn generation_traces_the_old_policy_as_a_scoring_pass_would() {
    // What PPO takes from generation instead of scoring the responses again: per token, the
    // log-prob under the tempered, unfiltered distribution and the value head's value, with
    // the adapter; rows that stop early leave the batch without changing the others.
    let (vm, _) = random_base(LLAMA, 73);
    let base = Arc::new(frozen(LLAMA, &vm));
    let mut agent = Agent::new(base.clone());
    let lora = Lora::new(&base, lora_cfg(&["q_proj", "v_proj", "down_proj"]), 3).unwrap();
    randomize_lora(&lora, 4);
    agent.lora = Some(lora);
    agent.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 5).unwrap());
    let prompts = vec![
        vec![1, 2, 3],
        vec![4, 5, 6, 7, 8, 9, 10],
        vec![11],
        vec![12, 13, 14, 15],
    ];
    let opts = GenerateOptions {
        max_new_tokens: 12,
        // Frequent enough that rows end at different steps.
        stop_tokens: (100..120).collect(),
        pad_token: 0,
    };
    let p = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        top_k: 20,
    };
    let traced = generate_traced(&agent, &prompts, &mut Sampler::new(p, 6), &opts, 0.7).unwrap();
    // Tracing changes nothing of what is generated.
    let plain = generate(&agent, &prompts, &mut Sampler::new(p, 6), &opts).unwrap();
    for (a, b) in traced.iter().zip(&plain) {
        assert_eq!(
            (&a.tokens, &a.logprobs, a.stopped),
            (&b.tokens, &b.logprobs, b.stopped)
        );
        assert!(b.trace.is_none());
    }
    let lengths: Vec<usize> = traced.iter().map(|g| g.tokens.len()).collect();
    assert!(
        lengths.iter().any(|&n| n < 12) && lengths.iter().any(|&n| n > 1),
        "rows should end at different steps: {lengths:?}"
    );
    let (dl, dv) = trace_against_scoring(&agent, &prompts, &traced, 0.7);
    eprintln!("trace vs scoring, T = 0.7: log-probs {dl:e}, values {dv:e}");
    assert!(dl < 1e-5 && dv < 1e-5, "log-probs {dl}, values {dv}");
    // The trace is unfiltered (PPO's scoring), the sampler's log-probs are renormalised over
    // top-k / top-p: they differ.
    let filtered = traced
        .iter()
        .flat_map(|g| g.logprobs.iter().zip(&g.trace.as_ref().unwrap().logprobs))
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(filtered > 1e-3, "{filtered}");
    // Greedy decoding traces at temperature 1, as scoring does.
    let greedy = generate_traced(
        &agent,
        &prompts,
        &mut Sampler::new(SamplingParams::greedy(), 0),
        &opts,
        0.0,
    )
    .unwrap();
    let (dl, dv) = trace_against_scoring(&agent, &prompts, &greedy, 0.0);
    assert!(
        dl < 1e-5 && dv < 1e-5,
        "greedy: log-probs {dl}, values {dv}"
    );
    // An agent without a value head (a critic-free learner) traces its log-probs alone, the
    // ones the agent with a head traced for the same draws (the head does not change them);
    // a temperature that is not finite is refused.
    let bare = Agent::new(base.clone());
    let plain = Agent {
        base: agent.base.clone(),
        lora: agent.lora.clone(),
        value_head: None,
        weights: agent.weights.clone(),
    };
    let alone = generate_traced(&plain, &prompts, &mut Sampler::new(p, 6), &opts, 0.7).unwrap();
    let with_head = generate_traced(&agent, &prompts, &mut Sampler::new(p, 6), &opts, 0.7).unwrap();
    for (a, h) in alone.iter().zip(&with_head) {
        let (ta, th) = (a.trace.as_ref().unwrap(), h.trace.as_ref().unwrap());
        assert_eq!(a.tokens, h.tokens);
        assert_eq!(ta.logprobs, th.logprobs);
        assert!(ta.values.is_empty() && th.values.len() == h.tokens.len());
    }
    assert!(generate_traced(&bare, &prompts, &mut Sampler::new(p, 6), &opts, 0.7).is_ok());
    assert!(generate_traced(
        &agent,
        &prompts,
        &mut Sampler::new(p, 6),
        &opts,
        f64::INFINITY
    )
    .is_err());
}

#[test]
fn scoring_with_shared_prefixes_equals_scoring_each_sequence() {
    // A debate's shapes: two agents' turn-1 sequences share the prompt; each agent's turn-2
    // prompt holds its turn-1 prompt and response; one pair is repeated; one shares nothing.
    let (vm, _) = random_base(QWEN2, 74);
    let base = Arc::new(frozen(QWEN2, &vm));
    let mut agent = Agent::new(base.clone());
    let lora = Lora::new(&base, lora_cfg(&["q_proj", "up_proj"]), 3).unwrap();
    randomize_lora(&lora, 8);
    agent.lora = Some(lora);
    agent.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 5).unwrap());
    let p1: Vec<u32> = (1..20).collect();
    let cat = |parts: &[&[u32]]| parts.concat();
    let (ra, rb) = (vec![30, 31, 32, 33], vec![40, 41]);
    let pairs = vec![
        (cat(&[&p1, &ra, &[50, 51, 52]]), vec![60, 61, 62]), // agent a, turn 2
        (p1.clone(), ra.clone()),                            // agent a, turn 1
        (p1.clone(), rb.clone()),                            // agent b, turn 1
        (cat(&[&p1, &rb, &[53]]), vec![63, 64, 65, 66, 67]), // agent b, turn 2
        (p1.clone(), ra.clone()),                            // a repeat
        (vec![90, 91], vec![92]),                            // nothing shared
        (cat(&[&p1, &ra]), vec![70]), // a prompt that is another pair's whole sequence
    ];
    for t in [0.7, 1.0] {
        let shared = score_shared_prefixes(&agent, &pairs, 2, t, true).unwrap();
        let each = score_at_temperature(&agent, &pairs, Pass::Inference, 3, t).unwrap();
        let lp = each.logprobs.to_vec2::<f32>().unwrap();
        let values = each.values.unwrap().to_vec2::<f32>().unwrap();
        let shared_values = shared.values.as_ref().unwrap();
        let mut worst = 0f32;
        for (i, (_, r)) in pairs.iter().enumerate() {
            let skip = lp[i].len() - r.len();
            assert_eq!(shared.logprobs[i].len(), r.len());
            for k in 0..r.len() {
                worst = worst.max((shared.logprobs[i][k] - lp[i][skip + k]).abs());
                worst = worst.max((shared_values[i][k] - values[i][skip + k]).abs());
            }
        }
        assert!(worst < 1e-4, "T = {t}: differs by up to {worst}");
        eprintln!("shared prefixes vs one batch, T = {t}: {worst:e}");
        // Positions: every sequence's, less those taken from the sequence before. Sorted,
        // the sequences run: p1+ra (computes all 23), the repeat (reuses 18: the position
        // before a response is always computed), p1+ra+[50..]+r (reuses 23), p1+ra+[70]
        // (reuses 22), p1+rb (reuses 18), p1+rb+[53]+r (reuses 21), [90..] (reuses none).
        let total: usize = pairs.iter().map(|(p, r)| p.len() + r.len()).sum();
        assert_eq!(total, 150);
        assert_eq!(shared.positions, total);
        assert_eq!(shared.computed, total - (18 + 23 + 22 + 18 + 21));
        assert!((shared.hit_rate() - 102.0 / 150.0).abs() < 1e-12);
    }
    // Without values the agent needs no head; with them it does.
    let bare = Agent::new(base.clone());
    let plain = score_shared_prefixes(&bare, &pairs, 4, 1.0, false).unwrap();
    assert!(plain.values.is_none());
    assert!(score_shared_prefixes(&bare, &pairs, 4, 1.0, true).is_err());
    assert!(score_shared_prefixes(&agent, &[(vec![], vec![1])], 4, 1.0, false).is_err());
}

#[test]
fn agents_on_one_base_generate_together_as_they_would_alone() {
    // Two learners with their own adapters and value heads, and a bare agent, on one base:
    // one batch, each row with its own adapter and its own agent's sampler.
    let (vm, _) = random_base(LLAMA, 75);
    let base = Arc::new(frozen(LLAMA, &vm));
    let learner = |seed: u64, targets: &[&str]| {
        let mut a = Agent::new(base.clone());
        let lora = Lora::new(&base, lora_cfg(targets), seed).unwrap();
        randomize_lora(&lora, seed + 1);
        a.lora = Some(lora);
        a.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, seed + 2).unwrap());
        a
    };
    let agents = [
        learner(10, &["q_proj", "v_proj", "down_proj"]),
        Agent::new(base.clone()),
        learner(20, &["k_proj", "o_proj", "up_proj", "gate_proj"]),
    ];
    let prompts: [Vec<Vec<u32>>; 3] = [
        vec![vec![1, 2, 3], vec![4, 5, 6, 7, 8]],
        vec![vec![9, 10]],
        vec![vec![11, 12, 13, 14], vec![15], vec![16, 17]],
    ];
    let opts = GenerateOptions {
        max_new_tokens: 10,
        stop_tokens: (100..115).collect(),
        pad_token: 0,
    };
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 1.0,
        top_k: 0,
    };
    let trace_at = |k: usize| (k != 1).then_some(0.8);
    let mut samplers: Vec<Sampler> = (0..3).map(|k| Sampler::new(p, 30 + k as u64)).collect();
    let mut speakers: Vec<Speaker> = samplers
        .iter_mut()
        .enumerate()
        .map(|(k, sampler)| Speaker {
            agent: &agents[k],
            prompts: &prompts[k],
            sampler,
            trace_at: trace_at(k),
        })
        .collect();
    let together = generate_together(&mut speakers, &opts).unwrap();
    let mut worst = 0f32;
    for k in 0..3 {
        let mut sampler = Sampler::new(p, 30 + k as u64);
        let alone = match trace_at(k) {
            Some(t) => generate_traced(&agents[k], &prompts[k], &mut sampler, &opts, t),
            None => generate(&agents[k], &prompts[k], &mut sampler, &opts),
        }
        .unwrap();
        assert_eq!(together[k].len(), prompts[k].len());
        for (a, b) in together[k].iter().zip(&alone) {
            assert_eq!(a.tokens, b.tokens, "agent {k}");
            assert_eq!(a.stopped, b.stopped);
            assert_eq!(a.trace.is_some(), trace_at(k).is_some());
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                worst = worst.max((x - y).abs());
            }
            if let (Some(x), Some(y)) = (&a.trace, &b.trace) {
                for (u, v) in x.logprobs.iter().zip(&y.logprobs) {
                    worst = worst.max((u - v).abs());
                }
                for (u, v) in x.values.iter().zip(&y.values) {
                    worst = worst.max((u - v).abs());
                }
            }
        }
    }
    eprintln!("together vs alone: {worst:e}");
    assert!(worst < 1e-4, "{worst}");
    // The adapters matter (else the test proves nothing): agent 0 alone differs from bare.
    let bare = generate(&agents[1], &prompts[0], &mut Sampler::new(p, 30), &opts).unwrap();
    assert_ne!(
        bare.iter().map(|g| &g.logprobs).collect::<Vec<_>>(),
        together[0].iter().map(|g| &g.logprobs).collect::<Vec<_>>()
    );
    // A speaker on another base is refused.
    let (vm2, _) = random_base(LLAMA, 76);
    let other = Agent::new(Arc::new(frozen(LLAMA, &vm2)));
    let (mut s0, mut s1) = (Sampler::new(p, 1), Sampler::new(p, 2));
    let err = generate_together(
        &mut [
            Speaker {
                agent: &agents[0],
                prompts: &prompts[0],
                sampler: &mut s0,
                trace_at: None,
            },
            Speaker {
                agent: &other,
                prompts: &prompts[1],
                sampler: &mut s1,
                trace_at: None,
            },
        ],
        &opts,
    )
    .unwrap_err();
    assert!(err.to_string().contains("another base"), "{err}");
}

#[test]
fn stop_tokens_end_rows_independently() {
    let (vm, _) = random_base(LLAMA, 81);
    let agent = Agent::new(Arc::new(frozen(LLAMA, &vm)));
    let prompts = vec![vec![1, 2, 3], vec![9, 8]];
    let free = generate(
        &agent,
        &prompts,
        &mut Sampler::new(SamplingParams::greedy(), 0),
        &GenerateOptions {
            max_new_tokens: 6,
            stop_tokens: vec![],
            pad_token: 0,
        },
    )
    .unwrap();
    // Stop row 0 at its third token.
    let stop = free[0].tokens[2];
    let opts = GenerateOptions {
        max_new_tokens: 6,
        stop_tokens: vec![stop],
        pad_token: 0,
    };
    let g = generate(
        &agent,
        &prompts,
        &mut Sampler::new(SamplingParams::greedy(), 0),
        &opts,
    )
    .unwrap();
    let first = free[0].tokens.iter().position(|&t| t == stop).unwrap();
    assert_eq!(g[0].tokens, free[0].tokens[..=first].to_vec());
    assert!(g[0].stopped);
    let second = free[1]
        .tokens
        .iter()
        .position(|&t| t == stop)
        .map_or(6, |p| p + 1);
    assert_eq!(g[1].tokens, free[1].tokens[..second].to_vec());
}

#[test]
fn response_logprobs_match_a_full_forward_and_do_not_depend_on_chunking() {
    let (vm, _) = random_base(QWEN2, 91);
    let base = Arc::new(frozen(QWEN2, &vm));
    let agent = Agent::new(base.clone());
    let pairs = vec![
        (vec![5, 6, 7], vec![8, 9]),
        (vec![1], vec![2, 3, 4, 10, 11]),
        (vec![12, 13, 14, 15], vec![16]),
    ];
    let s1 = score(&agent, &pairs, Pass::Inference, 1).unwrap();
    let s3 = score(&agent, &pairs, Pass::Training, 3).unwrap();
    assert!(max_diff(&s1.logprobs, &s3.logprobs) < 1e-4);
    let lp = s1.logprobs.to_vec2::<f32>().unwrap();
    let mask = s1.mask.to_vec2::<f32>().unwrap();
    assert_eq!(
        mask,
        vec![
            vec![0., 0., 0., 1., 1.],
            vec![1.; 5],
            vec![0., 0., 0., 0., 1.]
        ]
    );
    for (b, (p, r)) in pairs.iter().enumerate() {
        let seq = [p.clone(), r.clone()].concat();
        let h = base
            .forward(
                &to_tensor(std::slice::from_ref(&seq)),
                &[0],
                None,
                None,
                Pass::Inference,
            )
            .unwrap();
        let lsm = candle_nn::ops::log_softmax(&base.logits(&h).unwrap(), D::Minus1)
            .unwrap()
            .i(0)
            .unwrap();
        let lsm = lsm.to_vec2::<f32>().unwrap();
        for (k, &tok) in r.iter().enumerate() {
            let want = lsm[p.len() - 1 + k][tok as usize];
            let got = lp[b][5 - r.len() + k];
            assert!(
                (want - got).abs() < 1e-4,
                "row {b} token {k}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn f16_padded_batches_stay_finite_and_close_to_f32() {
    let (vm, base32) = random_base(LLAMA, 101);
    let ts = vm
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().to_dtype(DType::F16).unwrap()))
        .collect();
    let cfg = Config::from_hf_json(LLAMA).unwrap();
    let base16 = Base::new(&cfg, VarBuilder::from_tensors(ts, DType::F16, &Device::Cpu)).unwrap();
    let x = to_tensor(&ids(2, 6, 120, 3));
    // Row 1 has 4 padding positions, so its first query rows are fully masked.
    let pads = [0, 4];
    let h16 = base16
        .forward(&x, &pads, None, None, Pass::Inference)
        .unwrap();
    let l16 = base16.logits(&h16).unwrap();
    let all: Vec<f32> = l16.flatten_all().unwrap().to_vec1().unwrap();
    assert!(
        all.iter().all(|v| v.is_finite()),
        "f16 mask produced non-finite logits"
    );
    let l32 = base32
        .logits(
            &base32
                .forward(&x, &pads, None, None, Pass::Inference)
                .unwrap(),
        )
        .unwrap();
    let d = max_diff(
        &l16.i((.., 4.., ..)).unwrap(),
        &l32.i((.., 4.., ..)).unwrap(),
    );
    assert!(d < 0.1, "f16 vs f32 logits differ by {d}");
}

#[test]
fn sliding_window_attends_to_the_last_window_positions_only() {
    // One layer, window 3: the last position sees exactly the last 3 tokens (rope is relative),
    // so it equals a run on those 3 tokens alone.
    let json = MISTRAL
        .replace("\"num_hidden_layers\":2", "\"num_hidden_layers\":1")
        .replace("\"sliding_window\":null", "\"sliding_window\":3");
    let (_vm, base) = random_base(&json, 111);
    assert_eq!(base.config().sliding_window, Some(3));
    let seq = ids(1, 8, 120, 4);
    let full = base
        .forward(&to_tensor(&seq), &[0], None, None, Pass::Inference)
        .unwrap();
    let tail = vec![seq[0][5..].to_vec()];
    let short = base
        .forward(&to_tensor(&tail), &[0], None, None, Pass::Training)
        .unwrap();
    let d = max_diff(&full.i((0, 7, ..)).unwrap(), &short.i((0, 2, ..)).unwrap());
    assert!(
        d < 1e-4,
        "windowed last position differs from the 3-token run by {d}"
    );
    // And the window matters: without it the last position differs.
    let (_vm2, open) = random_base(
        &json.replace("\"sliding_window\":3", "\"sliding_window\":null"),
        111,
    );
    let full_open = open
        .forward(&to_tensor(&seq), &[0], None, None, Pass::Inference)
        .unwrap();
    assert!(
        max_diff(
            &full_open.i((0, 7, ..)).unwrap(),
            &short.i((0, 2, ..)).unwrap()
        ) > 1e-3
    );
    // With the KV cache, decoding step by step applies the same window.
    let mut cache = KvCache::new(1);
    let mut last = None;
    for &tok in &seq[0] {
        let x = Tensor::from_vec(vec![tok], (1, 1), &Device::Cpu).unwrap();
        last = Some(
            base.forward(&x, &[0], Some(&mut cache), None, Pass::Inference)
                .unwrap(),
        );
    }
    let d = max_diff(
        &last.unwrap().i((0, 0, ..)).unwrap(),
        &short.i((0, 2, ..)).unwrap(),
    );
    assert!(d < 1e-4, "cached windowed decoding differs by {d}");
}

/// Generations of `agents` (one base) on `prompts`, each agent drawing from its own seeded
/// sampler and the learners tracing at 0.8: with `cache`, through it.
fn speak(
    agents: &[Agent],
    prompts: &[Vec<Vec<u32>>],
    cache: Option<&mut PrefixCache>,
) -> Vec<Vec<Generation>> {
    let opts = GenerateOptions {
        max_new_tokens: 6,
        stop_tokens: (100..104).collect(),
        pad_token: 0,
    };
    let p = SamplingParams {
        temperature: 0.8,
        top_p: 1.0,
        top_k: 0,
    };
    let mut samplers: Vec<Sampler> = (0..agents.len())
        .map(|k| Sampler::new(p, 40 + k as u64))
        .collect();
    let mut speakers: Vec<Speaker> = samplers
        .iter_mut()
        .enumerate()
        .map(|(k, sampler)| Speaker {
            agent: &agents[k],
            prompts: &prompts[k],
            sampler,
            trace_at: agents[k].value_head.is_some().then_some(0.8),
        })
        .collect();
    match cache {
        Some(c) => generate_sharing(&mut speakers, &opts, c).unwrap(),
        None => generate_together(&mut speakers, &opts).unwrap(),
    }
}

/// The largest difference between two runs' log-probs, traces and values; their tokens
/// must be the same.
fn generation_diff(a: &[Vec<Generation>], b: &[Vec<Generation>]) -> f32 {
    let mut worst = 0f32;
    for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
        assert_eq!(x.tokens, y.tokens);
        assert_eq!(x.stopped, y.stopped);
        let mut pairs: Vec<(f32, f32)> =
            x.logprobs.iter().copied().zip(y.logprobs.clone()).collect();
        if let (Some(s), Some(t)) = (&x.trace, &y.trace) {
            pairs.extend(s.logprobs.iter().copied().zip(t.logprobs.clone()));
            pairs.extend(s.values.iter().copied().zip(t.values.clone()));
        }
        for (u, v) in pairs {
            worst = worst.max((u - v).abs());
        }
    }
    worst
}

#[test]
fn the_prefix_cache_changes_the_work_not_the_generations() {
    // Every rotary layout: Llama 3 scaling, partial rotary (Phi-3), a head_dim of its own
    // (Mistral), Qwen2's biases. A learner (adapter, value head) and two bare agents share a
    // base; prompts of several lengths (so rows sit after different paddings), the bare
    // agents' first prompts identical, then prompts that extend the first turn's
    // conversations, then the learner's adapter trained in place.
    for (name, json, targets) in [
        ("llama", LLAMA, &["q_proj", "v_proj", "down_proj"][..]),
        ("phi3", PHI3, &["qkv_proj", "o_proj", "gate_up_proj"][..]),
        ("mistral", MISTRAL, &["k_proj", "up_proj"][..]),
        ("qwen2", QWEN2, &["q_proj", "o_proj"][..]),
    ] {
        let (vm, _) = random_base(json, 81);
        let base = Arc::new(frozen(json, &vm));
        let mut learner = Agent::new(base.clone());
        let lora = Lora::new(&base, lora_cfg(targets), 5).unwrap();
        randomize_lora(&lora, 6);
        learner.lora = Some(lora);
        learner.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 7).unwrap());
        let agents = [learner, Agent::new(base.clone()), Agent::new(base.clone())];
        let turn1: Vec<Vec<Vec<u32>>> = vec![
            vec![(1..12).collect(), vec![20, 21, 22]],
            vec![(30..47).collect(), vec![50, 51, 52, 53, 54]],
            vec![(30..47).collect()],
        ];
        let mut cache = PrefixCache::new(64 << 20);
        let plain = speak(&agents, &turn1, None);
        let shared = speak(&agents, &turn1, Some(&mut cache));
        let d1 = generation_diff(&plain, &shared);
        let first = cache.take_stats();
        // Agent 2's prompt is agent 1's, and the bare agents share their weights: computed
        // once, but for its last token.
        assert_eq!(first.reused, 16, "{name}");
        assert_eq!(first.computed, 11 + 3 + 17 + 5 + 1, "{name}");
        // The same prompts again: only each one's last token is computed.
        let again = speak(&agents, &turn1, Some(&mut cache));
        let d2 = generation_diff(&plain, &again);
        let second = cache.take_stats();
        assert_eq!(second.computed, 5, "{name}");
        assert_eq!(second.reused, 10 + 2 + 16 + 4 + 16, "{name}");
        // Turn 2: each conversation (prompt and response) with new tokens after it.
        let turn2: Vec<Vec<Vec<u32>>> = turn1
            .iter()
            .zip(&plain)
            .map(|(prompts, gens)| {
                prompts
                    .iter()
                    .zip(gens)
                    .map(|(p, g)| [p.clone(), g.tokens.clone(), vec![60, 61, 62]].concat())
                    .collect()
            })
            .collect();
        let plain2 = speak(&agents, &turn2, None);
        let shared2 = speak(&agents, &turn2, Some(&mut cache));
        let d3 = generation_diff(&plain2, &shared2);
        let third = cache.take_stats();
        // Each conversation is held but for its last generated token, which no forward read.
        let held: usize = turn1
            .iter()
            .zip(&plain)
            .flat_map(|(ps, gs)| ps.iter().zip(gs).map(|(p, g)| p.len() + g.tokens.len() - 1))
            .sum();
        assert!(
            third.reused as usize >= held,
            "{name}: {third:?}, {held} held"
        );
        // The learner's adapter trains: what its old weights computed must not be used.
        randomize_lora(agents[0].lora.as_ref().unwrap(), 8);
        let plain3 = speak(&agents, &turn2, None);
        let shared3 = speak(&agents, &turn2, Some(&mut cache));
        let d4 = generation_diff(&plain3, &shared3);
        assert_ne!(
            plain2[0][0].logprobs, plain3[0][0].logprobs,
            "the training mattered"
        );
        let worst = d1.max(d2).max(d3).max(d4);
        eprintln!("{name}: prefix cache against none: {worst:e}");
        assert!(worst < 1e-4, "{name}: {worst}");
    }
}

/// A PPO-like loss of scores: log-probs, values and entropy, each weighted, on response
/// positions.
fn loss_of(s: &Scored) -> Tensor {
    let m = &s.mask;
    let lp = (&s.logprobs * m).unwrap().sum_all().unwrap();
    let v = match &s.values {
        Some(v) => ((v * m).unwrap().sqr().unwrap().sum_all().unwrap() * 0.5).unwrap(),
        None => Tensor::new(0f32, &Device::Cpu).unwrap(),
    };
    let h = ((&s.entropy * m).unwrap().sum_all().unwrap() * 0.1).unwrap();
    ((lp + v).unwrap() - h).unwrap()
}

#[test]
fn activation_checkpointing_gives_the_plain_backwards_gradients() {
    let pairs = vec![
        (vec![1u32, 2, 3, 4, 5], vec![6u32, 7, 8]),
        (vec![9, 10], vec![11, 12, 13, 14, 15, 16]),
        (vec![17, 18, 19], vec![20]),
    ];
    // LoRA and a value head over a frozen base (every rotary layout), then every weight of a
    // base trained (Qwen2's tied embedding: the gradient reaches it from both ends), then
    // LoRA with dropout (the recomputed layers must drop what the forward dropped).
    let mut cases: Vec<(&str, Agent)> = Vec::new();
    for (name, json, targets) in [
        ("llama", LLAMA, &["q_proj", "v_proj", "down_proj"][..]),
        ("phi3", PHI3, &["qkv_proj", "o_proj", "gate_up_proj"][..]),
        ("mistral", MISTRAL, &["k_proj", "up_proj"][..]),
    ] {
        let (vm, _) = random_base(json, 95);
        let mut agent = Agent::new(Arc::new(frozen(json, &vm)));
        let lora = Lora::new(&agent.base, lora_cfg(targets), 3).unwrap();
        randomize_lora(&lora, 4);
        agent.lora = Some(lora);
        agent.value_head = Some(ValueHead::new(64, DType::F32, &Device::Cpu, 5).unwrap());
        cases.push((name, agent));
    }
    let (vm, _) = random_base(QWEN2, 96);
    let mut full = Agent::new(Arc::new(frozen(QWEN2, &vm)));
    full.train_all_weights().unwrap();
    cases.push(("qwen2, every weight", full));
    for (name, json, targets) in [
        (
            "llama, dropout",
            LLAMA,
            &["q_proj", "o_proj", "up_proj", "down_proj"][..],
        ),
        ("phi3, dropout", PHI3, &["qkv_proj", "gate_up_proj"][..]),
    ] {
        let (vm, _) = random_base(json, 97);
        let mut agent = Agent::new(Arc::new(frozen(json, &vm)));
        let lora = Lora::new(&agent.base, lora_cfg(targets), 3).unwrap();
        randomize_lora(&lora, 4);
        agent.lora = Some(lora);
        cases.push((name, agent));
    }
    for (name, agent) in &mut cases {
        // Each pass starts the dropout stream afresh, so both draw the same masks.
        let restart = |agent: &mut Agent| {
            if name.ends_with("dropout") {
                agent.lora.as_mut().unwrap().set_dropout(0.4, 11).unwrap();
            }
        };
        restart(agent);
        let vars = agent.named_trainable_vars();
        let plain = score_at_temperature(agent, &pairs, Pass::Training, 2, 0.8).unwrap();
        let grads = loss_of(&plain).backward().unwrap();
        restart(agent);
        let (kept, checkpoint) = score_checkpointed(agent, &pairs, 2, 0.8).unwrap();
        assert_eq!(
            max_diff(&plain.logprobs, &kept.logprobs),
            0.0,
            "{name}: same forward"
        );
        let top = loss_of(&kept).backward().unwrap();
        let some_missing = vars.iter().any(|(_, v)| top.get(v.as_tensor()).is_none());
        assert!(
            some_missing,
            "{name}: the loss's own backward stops at the last layer"
        );
        let all: Vec<_> = vars.iter().map(|(_, v)| v.clone()).collect();
        let completed = checkpoint.backward(top, &all).unwrap();
        let mut worst = 0f32;
        for (n, v) in &vars {
            let want = grads
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{name}: {n}"));
            let got = completed
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient for {n}"));
            let scale = max_diff(want, &want.zeros_like().unwrap());
            worst = worst.max(max_diff(want, got) / scale.max(1e-3));
        }
        eprintln!("{name}: checkpointed gradients within {worst:e} (relative)");
        assert!(worst < 1e-4, "{name}: {worst}");
        if name.ends_with("dropout") {
            let again = score_at_temperature(agent, &pairs, Pass::Training, 2, 0.8).unwrap();
            assert!(
                max_diff(&plain.logprobs, &again.logprobs) > 1e-3,
                "{name}: the dropout masks matter"
            );
        }
    }
}

#[test]
fn the_last_positions_alone_are_the_whole_forwards_last_positions() {
    // Every family (fused q/k/v in phi3, a head dimension apart from the width in mistral),
    // candle's elementary ops as on other devices, a left-padded batch (one row padded past
    // the shortest tail), LoRA in the last layer.
    for (name, json, targets) in [
        (
            "llama",
            LLAMA,
            &["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"][..],
        ),
        ("qwen2", QWEN2, &["q_proj", "down_proj"][..]),
        ("phi3", PHI3, &["qkv_proj", "gate_up_proj"][..]),
        ("mistral", MISTRAL, &["q_proj", "v_proj"][..]),
        ("llama, candle's ops", LLAMA, &["q_proj", "o_proj"][..]),
    ] {
        let (vm, _) = random_base(json, 61);
        let mut base = frozen(json, &vm);
        if name.ends_with("candle's ops") {
            base.set_kernels(Kernels::PLAIN);
        }
        let adapter = Lora::new(&base, lora_cfg(targets), 3).unwrap();
        randomize_lora(&adapter, 62);
        let rows: Vec<Vec<u32>> = [9usize, 4, 7]
            .iter()
            .enumerate()
            .map(|(i, &n)| [vec![0; 9 - n], ids(1, n, 120, 70 + i as u64)[0].clone()].concat())
            .collect();
        let (ids, pads) = (to_tensor(&rows), [0usize, 5, 2]);
        for pass in [Pass::Inference, Pass::Training] {
            let whole = base
                .forward(&ids, &pads, None, Some(&adapter), pass)
                .unwrap();
            for tail in [1, 3, 9] {
                let part = base
                    .forward_tail(&ids, &pads, None, Some(&adapter), pass, tail)
                    .unwrap();
                assert_eq!(part.dims(), &[3, tail, 64], "{name} {pass:?} tail {tail}");
                let d = max_diff(&part, &whole.narrow(1, 9 - tail, tail).unwrap());
                assert!(d < 1e-5, "{name} {pass:?} tail {tail}: differs by {d}");
            }
        }
        // A loss on the last two positions gets the whole forward's gradients.
        let w: Vec<f32> = (0..3 * 2 * 64).map(|i| (i % 7) as f32 - 3.0).collect();
        let w = Tensor::from_vec(w, (3, 2, 64), &Device::Cpu).unwrap();
        let grads = |tail: usize| {
            let h = base
                .forward_tail(&ids, &pads, None, Some(&adapter), Pass::Training, tail)
                .unwrap();
            let h = h.narrow(1, tail - 2, 2).unwrap();
            (h * &w).unwrap().sum_all().unwrap().backward().unwrap()
        };
        let (part, whole) = (grads(2), grads(9));
        for (var, v) in adapter.named_vars() {
            let (a, b) = (part.get(v.as_tensor()), whole.get(v.as_tensor()));
            let (a, b) = (a.expect("a gradient"), b.expect("a gradient"));
            let d = max_diff(a, b);
            let scale = max_diff(b, &b.zeros_like().unwrap());
            assert!(d <= 1e-5 * scale.max(1.0), "{name}: {var} differs by {d}");
        }
        // With a cache: the prompt's last position alone, then a decoding step reads every
        // position's keys and values as after the whole forward.
        let step = to_tensor(&[vec![5], vec![6], vec![7]]);
        let mut next = Vec::new();
        for tail in [1, 9] {
            let mut cache = KvCache::new(2);
            let h = base
                .forward_tail(
                    &ids,
                    &pads,
                    Some(&mut cache),
                    Some(&adapter),
                    Pass::Inference,
                    tail,
                )
                .unwrap();
            let last = h.i((.., tail - 1, ..)).unwrap();
            let after = base
                .forward(
                    &step,
                    &pads,
                    Some(&mut cache),
                    Some(&adapter),
                    Pass::Inference,
                )
                .unwrap();
            next.push((last, after));
        }
        assert!(
            max_diff(&next[0].0, &next[1].0) < 1e-5,
            "{name}: the last position"
        );
        assert!(
            max_diff(&next[0].1, &next[1].1) < 1e-5,
            "{name}: the step after"
        );
        // Tails that are not some of the positions are refused.
        for tail in [0, 10] {
            let e = base
                .forward_tail(&ids, &pads, None, Some(&adapter), Pass::Inference, tail)
                .unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("the last {tail} positions of a sequence of 9")),
                "{e}"
            );
        }
    }
}
