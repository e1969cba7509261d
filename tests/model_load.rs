//! Loading tiny Hugging Face folders written here: sharded bf16 / single-file f16 safetensors,
//! transformers 4.x and 5.x configs, tied and untied embeddings, tokenizer files, and the
//! errors for what can go wrong.

use candle_core::{DType, Device, IndexOp, Tensor};
use candle_nn::VarBuilder;
use maporl::model::Pass;
use maporl::model::{load, Base, ChatMessage, Config};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;

const H: usize = 32;
const I: usize = 48;
const V: usize = 50;
const LAYERS: usize = 2;

/// transformers 5.x layout: rope_theta inside rope_parameters, sliding_window null.
fn llama_config_v5(tie: bool) -> String {
    format!(
        r#"{{"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":{H},"intermediate_size":{I},
        "num_hidden_layers":{LAYERS},"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":{V},
        "rms_norm_eps":1e-5,"rope_parameters":{{"rope_theta":50000.0,"rope_type":"default"}},
        "sliding_window":null,"max_position_embeddings":64,"tie_word_embeddings":{tie},
        "eos_token_id":3,"dtype":"bfloat16","transformers_version":"5.0.0"}}"#
    )
}

/// transformers 4.x layout for Qwen2.
fn qwen2_config_v4(tie: bool) -> String {
    format!(
        r#"{{"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":{H},"intermediate_size":{I},
        "num_hidden_layers":{LAYERS},"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":{V},
        "rms_norm_eps":1e-6,"rope_theta":1000000.0,"sliding_window":4096,"use_sliding_window":false,
        "max_window_layers":2,"max_position_embeddings":64,"tie_word_embeddings":{tie},"hidden_act":"silu",
        "torch_dtype":"float16","transformers_version":"4.45.0"}}"#
    )
}

/// Random f32 weights under HF names for the tiny configs above.
fn weights(qwen: bool, lm_head: bool, seed: u64) -> Vec<(String, Tensor)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = |dims: &[usize], scale: f32, offset: f32| -> Tensor {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| offset + rng.random_range(-scale..scale))
            .collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    };
    let kv = H / 4 * 2;
    let mut w = vec![(
        "model.embed_tokens.weight".to_string(),
        t(&[V, H], 1.0, 0.0),
    )];
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        for (name, dims) in [
            ("self_attn.q_proj.weight", vec![H, H]),
            ("self_attn.k_proj.weight", vec![kv, H]),
            ("self_attn.v_proj.weight", vec![kv, H]),
            ("self_attn.o_proj.weight", vec![H, H]),
            ("mlp.gate_proj.weight", vec![I, H]),
            ("mlp.up_proj.weight", vec![I, H]),
            ("mlp.down_proj.weight", vec![H, I]),
        ] {
            let s = 1.5 / (dims[1] as f32).sqrt();
            w.push((format!("{p}.{name}"), t(&dims, s, 0.0)));
        }
        if qwen {
            w.push((format!("{p}.self_attn.q_proj.bias"), t(&[H], 0.1, 0.0)));
            w.push((format!("{p}.self_attn.k_proj.bias"), t(&[kv], 0.1, 0.0)));
            w.push((format!("{p}.self_attn.v_proj.bias"), t(&[kv], 0.1, 0.0)));
        }
        w.push((format!("{p}.input_layernorm.weight"), t(&[H], 0.3, 1.0)));
        w.push((
            format!("{p}.post_attention_layernorm.weight"),
            t(&[H], 0.3, 1.0),
        ));
    }
    w.push(("model.norm.weight".to_string(), t(&[H], 0.3, 1.0)));
    if lm_head {
        w.push(("lm_head.weight".to_string(), t(&[V, H], 0.3, 0.0)));
    }
    w
}

fn save(path: &Path, ts: &[(String, Tensor)], dtype: DType) {
    let m: HashMap<String, Tensor> = ts
        .iter()
        .map(|(k, v)| (k.clone(), v.to_dtype(dtype).unwrap()))
        .collect();
    candle_core::safetensors::save(&m, path).unwrap();
}

/// Writes `ts` in `dtype` as two shards plus model.safetensors.index.json.
fn save_sharded(dir: &Path, ts: &[(String, Tensor)], dtype: DType) {
    let (a, b): (Vec<_>, Vec<_>) = ts
        .iter()
        .cloned()
        .partition(|(k, _)| k.starts_with("model.layers.0."));
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    save(&dir.join(names[0]), &a, dtype);
    save(&dir.join(names[1]), &b, dtype);
    let map: serde_json::Map<String, serde_json::Value> = a
        .iter()
        .map(|(k, _)| (k.clone(), names[0].into()))
        .chain(b.iter().map(|(k, _)| (k.clone(), names[1].into())))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// The expected model: the same weights rounded through `dtype`, built in memory.
fn reference(cfg_json: &str, ts: &[(String, Tensor)], dtype: DType) -> Base {
    let m: HashMap<String, Tensor> = ts
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.to_dtype(dtype).unwrap().to_dtype(DType::F32).unwrap(),
            )
        })
        .collect();
    let cfg = Config::from_hf_json(cfg_json).unwrap();
    Base::new(&cfg, VarBuilder::from_tensors(m, DType::F32, &Device::Cpu)).unwrap()
}

fn logits(base: &Base) -> Tensor {
    let ids = Tensor::new(&[[1u32, 7, 9, 22, 41, 3]], &Device::Cpu).unwrap();
    let h = base
        .forward(&ids, &[0], None, None, Pass::Inference)
        .unwrap();
    base.logits(&h).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

fn err(path: &Path) -> String {
    match load(path, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("loading {} should fail", path.display()),
        Err(e) => {
            let s = format!("{e:#}");
            println!("error: {s}");
            s
        }
    }
}

#[test]
fn sharded_bf16_untied_llama_with_a_transformers_5_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = llama_config_v5(false);
    std::fs::write(dir.path().join("config.json"), &cfg).unwrap();
    let ts = weights(false, true, 1);
    save_sharded(dir.path(), &ts, DType::BF16);
    let loaded = load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(loaded.base.dtype(), DType::F32);
    assert_eq!(loaded.base.config().rope_theta, 50000.0);
    assert!(!loaded.base.config().tie_word_embeddings);
    let want = reference(&cfg, &ts, DType::BF16);
    assert_eq!(max_diff(&logits(&loaded.base), &logits(&want)), 0.0);
    // The untied lm_head is really used: tying it would change the logits.
    let tied_cfg = llama_config_v5(true);
    let tied = reference(&tied_cfg, &ts, DType::BF16);
    assert!(max_diff(&logits(&tied), &logits(&want)) > 0.1);
    // Loading into bf16 keeps the dtype and stays close to the f32 run.
    let bf = load(dir.path(), DType::BF16, &Device::Cpu).unwrap();
    assert_eq!(bf.base.dtype(), DType::BF16);
    let d = max_diff(&logits(&bf.base), &logits(&want));
    assert!(d < 0.25, "bf16 vs f32 logits differ by {d}");
}

#[test]
fn single_file_f16_tied_qwen2_with_a_transformers_4_config_and_tokenizer_files() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = qwen2_config_v4(true);
    std::fs::write(dir.path().join("config.json"), &cfg).unwrap();
    let ts = weights(true, false, 2);
    save(&dir.path().join("model.safetensors"), &ts, DType::F16);
    // A tiny byte-level BPE tokenizer and a ChatML template.
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 3, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": {"a": 0, "b": 1, "ab": 2, "<|im_end|>": 3}, "merges": ["a b"]}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let tc = serde_json::json!({
        "eos_token": "<|im_end|>",
        "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), tc.to_string()).unwrap();

    let loaded = load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert!(loaded.base.config().tie_word_embeddings && loaded.base.config().qkv_bias);
    let want = reference(&cfg, &ts, DType::F16);
    assert_eq!(max_diff(&logits(&loaded.base), &logits(&want)), 0.0);
    let tok = loaded.tokenizer.as_ref().unwrap();
    assert_eq!(
        tok.encode("abab<|im_end|>", false).unwrap().get_ids(),
        &[2, 2, 3]
    );
    assert_eq!(loaded.eos_token_ids, vec![3]);
    let text = loaded
        .chat_template
        .as_ref()
        .unwrap()
        .render(&[ChatMessage::new("user", " ab ")], true)
        .unwrap();
    assert_eq!(
        text,
        "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
    );
    // Tied: the output layer is the embedding matrix.
    let h = loaded
        .base
        .forward(
            &Tensor::new(&[[2u32]], &Device::Cpu).unwrap(),
            &[0],
            None,
            None,
            Pass::Inference,
        )
        .unwrap();
    let emb = want.logits(&h).unwrap();
    assert_eq!(max_diff(&loaded.base.logits(&h).unwrap(), &emb), 0.0);
    let _ = emb.i(0).unwrap();
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let nowhere = dir.path().join("no-such-model");
    assert!(err(&nowhere).contains("no-such-model"), "{}", err(&nowhere));

    let e = err(dir.path());
    assert!(
        e.contains(&dir.path().join("config.json").display().to_string()),
        "{e}"
    );

    std::fs::write(dir.path().join("config.json"), llama_config_v5(false)).unwrap();
    let e = err(dir.path());
    assert!(e.contains("model.safetensors"), "{e}");

    save_sharded(dir.path(), &weights(false, true, 3), DType::F32);
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = err(dir.path());
    assert!(
        e.contains(
            &dir.path()
                .join("model-00002-of-00002.safetensors")
                .display()
                .to_string()
        ),
        "{e}"
    );
}

#[test]
fn an_unknown_architecture_is_named_with_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = llama_config_v5(false).replace("LlamaForCausalLM", "GemmaForCausalLM");
    std::fs::write(dir.path().join("config.json"), cfg).unwrap();
    save(
        &dir.path().join("model.safetensors"),
        &weights(false, true, 4),
        DType::F32,
    );
    let e = err(dir.path());
    assert!(e.contains("GemmaForCausalLM"), "{e}");
    for known in [
        "LlamaForCausalLM",
        "Qwen2ForCausalLM",
        "Phi3ForCausalLM",
        "MistralForCausalLM",
    ] {
        assert!(e.contains(known), "{e}");
    }
}

#[test]
fn a_shape_mismatch_names_the_tensor_and_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = llama_config_v5(false).replace(
        &format!("\"intermediate_size\":{I}"),
        "\"intermediate_size\":40",
    );
    std::fs::write(dir.path().join("config.json"), cfg).unwrap();
    save(
        &dir.path().join("model.safetensors"),
        &weights(false, true, 5),
        DType::F32,
    );
    let e = err(dir.path());
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight"), "{e}");
    assert!(e.contains("[40, 32]") && e.contains("[48, 32]"), "{e}");
}

#[test]
fn an_untied_model_without_lm_head_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), llama_config_v5(false)).unwrap();
    save(
        &dir.path().join("model.safetensors"),
        &weights(false, false, 6),
        DType::F32,
    );
    let e = err(dir.path());
    assert!(e.contains("lm_head.weight"), "{e}");
}
