//! Loading a base model: a Hugging Face folder (config.json, safetensors, tokenizer files) or a
//! GGUF file (dequantized).

use super::chat::{tokenizer_from_gguf, ChatTemplate, GgufVocab};
use super::config::{Act, Arch, Config, RopeScaling};
use super::decoder::Base;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A loaded checkpoint: the frozen decoder plus what it needs to talk.
pub struct Loaded {
    pub base: Base,
    pub tokenizer: Option<tokenizers::Tokenizer>,
    pub chat_template: Option<ChatTemplate>,
    /// Token ids that end an assistant turn (config eos ids plus the template's eos token).
    pub eos_token_ids: Vec<u32>,
}

/// Loads from an HF folder or a `.gguf` file, converting weights to `dtype` on `device`.
pub fn load(path: &Path, dtype: DType, device: &Device) -> Result<Loaded> {
    if path.is_dir() {
        load_hf(path, dtype, device)
    } else if path.is_file() {
        load_gguf(path, dtype, device)
    } else {
        bail!(
            "missing file {}: no model folder or GGUF file there",
            path.display()
        )
    }
}

fn need(path: PathBuf) -> Result<PathBuf> {
    if path.is_file() {
        Ok(path)
    } else {
        bail!("missing file {}", path.display())
    }
}

/// The safetensors files of an HF folder: the shards named by model.safetensors.index.json, or
/// model.safetensors.
fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index)?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| anyhow!("{}: no `weight_map`", index.display()))?;
        let files: BTreeSet<&str> = map.values().filter_map(Value::as_str).collect();
        return files.into_iter().map(|f| need(dir.join(f))).collect();
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    bail!(
        "missing file {} (nor {} for sharded weights)",
        single.display(),
        index.display()
    )
}

fn load_hf(dir: &Path, dtype: DType, device: &Device) -> Result<Loaded> {
    let cfg_path = need(dir.join("config.json"))?;
    let text = crate::files::read_regular_text(&cfg_path, crate::files::TEXT_MAX, "model config")?;
    let cfg = Config::from_hf_json(&text)
        .and_then(|c| c.validate().map(|()| c))
        .with_context(|| format!("reading {}", cfg_path.display()))?;
    let files = safetensors_files(dir)?;
    // SAFETY: the files are memory-mapped read-only; tensors are copied out (and converted to
    // `dtype`) as they are read, so later changes to the files cannot alias live tensors.
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, dtype, device) }
        .with_context(|| format!("reading safetensors in {}", dir.display()))?;
    let base =
        Base::new(&cfg, vb).with_context(|| format!("loading weights from {}", dir.display()))?;

    let tok_path = dir.join("tokenizer.json");
    let tokenizer = if tok_path.is_file() {
        let text =
            crate::files::read_regular_text(&tok_path, crate::files::TOKENIZER_MAX, "tokenizer")?;
        Some(
            text.parse::<tokenizers::Tokenizer>()
                .map_err(|e| anyhow!("reading {}: {e}", tok_path.display()))?,
        )
    } else {
        None
    };
    let tc_path = dir.join("tokenizer_config.json");
    let (chat_template, eos_text) = if tc_path.is_file() {
        let text =
            crate::files::read_regular_text(&tc_path, crate::files::TEXT_MAX, "tokenizer config")?;
        let tmpl = ChatTemplate::from_tokenizer_config(&text)
            .with_context(|| format!("reading {}", tc_path.display()))?;
        let v: Value = serde_json::from_str(&text)?;
        let eos = match v.get("eos_token") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(o) => o.get("content").and_then(Value::as_str).map(String::from),
            None => None,
        };
        (tmpl, eos)
    } else {
        (None, None)
    };
    let mut eos_token_ids = cfg.eos_token_ids.clone();
    if let (Some(t), Some(e)) = (&tokenizer, eos_text) {
        if let Some(id) = t.token_to_id(&e) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    Ok(Loaded {
        base,
        tokenizer,
        chat_template,
        eos_token_ids,
    })
}

struct Meta<'a> {
    md: &'a HashMap<String, gguf_file::Value>,
    path: &'a Path,
}

impl Meta<'_> {
    fn get(&self, k: &str) -> Result<&gguf_file::Value> {
        self.md
            .get(k)
            .ok_or_else(|| anyhow!("{}: GGUF metadata has no `{k}`", self.path.display()))
    }
    fn usize(&self, k: &str) -> Result<usize> {
        Ok(self.get(k)?.to_u64()? as usize)
    }
    fn opt_usize(&self, k: &str) -> Option<usize> {
        self.usize(k).ok()
    }
    fn opt_f64(&self, k: &str) -> Option<f64> {
        let v = self.md.get(k)?;
        v.to_f32().map(f64::from).or_else(|_| v.to_f64()).ok()
    }
    fn str(&self, k: &str) -> Option<&str> {
        self.md.get(k)?.to_string().ok().map(String::as_str)
    }
    fn strings(&self, k: &str) -> Result<Vec<String>> {
        self.get(k)?
            .to_vec()?
            .iter()
            .map(|x| Ok(x.to_string()?.clone()))
            .collect()
    }
}

/// Undoes llama.cpp's row permutation of attn_q / attn_k (done for its interleaved rope), so
/// the weight matches the HF layout: rows (heads, d/2, 2) -> (heads, 2, d/2).
fn unpermute(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    Ok(w.reshape((heads, rows / heads / 2, 2, cols))?
        .transpose(1, 2)?
        .reshape((rows, cols))?)
}

fn hf_name(gguf: &str, arch: Arch) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, kind) = rest.rsplit_once('.')?;
    let hf = match module {
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_qkv" => "self_attn.qkv_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if arch == Arch::Phi3 => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

fn load_gguf(path: &Path, dtype: DType, device: &Device) -> Result<Loaded> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("missing file {}", path.display()))?;
    let content = gguf_file::Content::read(&mut f)
        .with_context(|| format!("{} is not a readable GGUF file", path.display()))?;
    let m = Meta {
        md: &content.metadata,
        path,
    };
    let arch_name = m.str("general.architecture").unwrap_or("");
    let arch = Arch::from_name(arch_name)?;
    let p = arch_name;
    let heads = m.usize(&format!("{p}.attention.head_count"))?;
    let kv_heads = m
        .opt_usize(&format!("{p}.attention.head_count_kv"))
        .unwrap_or(heads);
    let hidden = m.usize(&format!("{p}.embedding_length"))?;
    let embd = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| anyhow!("{}: no tensor `token_embd.weight`", path.display()))?;
    let vocab_size = embd.shape.dims()[0];
    let head_dim = m
        .opt_usize(&format!("{p}.attention.key_length"))
        .unwrap_or(hidden / heads);
    let rot = m
        .opt_usize(&format!("{p}.rope.dimension_count"))
        .unwrap_or(head_dim);
    let eos = m.opt_usize("tokenizer.ggml.eos_token_id").map(|x| x as u32);
    let cfg = Config {
        arch,
        vocab_size,
        hidden_size: hidden,
        intermediate_size: m.usize(&format!("{p}.feed_forward_length"))?,
        num_hidden_layers: m.usize(&format!("{p}.block_count"))?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: m
            .opt_f64(&format!("{p}.attention.layer_norm_rms_epsilon"))
            .unwrap_or(1e-5),
        rope_theta: m
            .opt_f64(&format!("{p}.rope.freq_base"))
            .unwrap_or(10_000.0),
        rope_scaling: RopeScaling::None,
        partial_rotary_factor: rot as f64 / head_dim as f64,
        max_position_embeddings: m.opt_usize(&format!("{p}.context_length")).unwrap_or(4096),
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        o_bias: content.tensor_infos.contains_key("blk.0.attn_output.bias"),
        mlp_bias: false,
        hidden_act: Act::Silu,
        sliding_window: None,
        bos_token_id: m.opt_usize("tokenizer.ggml.bos_token_id").map(|x| x as u32),
        eos_token_ids: eos.into_iter().collect(),
    };
    let mut tensors = HashMap::new();
    for name in content.tensor_infos.keys() {
        let Some(hf) = hf_name(name, arch) else {
            continue;
        };
        let q = content
            .tensor(&mut f, name, device)
            .with_context(|| format!("{}: reading tensor `{name}`", path.display()))?;
        let mut t = q.dequantize(device)?;
        // llama.cpp permutes Q/K rows only for the llama architecture (interleaved rope).
        if arch == Arch::Llama || arch == Arch::Mistral {
            if name.ends_with("attn_q.weight") {
                t = unpermute(&t, heads)?;
            } else if name.ends_with("attn_k.weight") {
                t = unpermute(&t, kv_heads)?;
            }
        }
        tensors.insert(hf, t.to_dtype(dtype)?);
    }
    let vb = VarBuilder::from_tensors(tensors, dtype, device);
    let base =
        Base::new(&cfg, vb).with_context(|| format!("loading weights from {}", path.display()))?;

    let tokenizer = match m.str("tokenizer.ggml.model") {
        Some(model) => {
            let types = match m.md.get("tokenizer.ggml.token_type") {
                Some(v) => v
                    .to_vec()?
                    .iter()
                    .map(|x| x.to_i32().unwrap_or(1))
                    .collect(),
                None => vec![],
            };
            let vocab = GgufVocab {
                model,
                pre: m.str("tokenizer.ggml.pre").unwrap_or("default"),
                tokens: m.strings("tokenizer.ggml.tokens")?,
                token_types: types,
                merges: m.strings("tokenizer.ggml.merges").unwrap_or_default(),
            };
            Some(
                tokenizer_from_gguf(&vocab)
                    .with_context(|| format!("reading the tokenizer of {}", path.display()))?,
            )
        }
        None => None,
    };
    let token_text = |k: &str| -> String {
        match (&tokenizer, m.opt_usize(k)) {
            (Some(t), Some(id)) => t.id_to_token(id as u32).unwrap_or_default(),
            _ => String::new(),
        }
    };
    let chat_template = match m.str("tokenizer.chat_template") {
        Some(src) => Some(ChatTemplate::new(
            src,
            &token_text("tokenizer.ggml.bos_token_id"),
            &token_text("tokenizer.ggml.eos_token_id"),
        )?),
        None => None,
    };
    Ok(Loaded {
        base,
        tokenizer,
        chat_template,
        eos_token_ids: cfg.eos_token_ids.clone(),
    })
}

/// A base with random weights for `config`, the same for the same seed on every device and in
/// every dtype: drawn in f32 on the CPU, then converted and moved. Linear weights are uniform
/// in ±1/√fan_in, embeddings in ±1, norm weights 1 ± 0.1, biases ±0.1. For tests and
/// benchmarks on machines that cannot download a model (scripts/gpu-check.sh).
pub fn random(config: &Config, dtype: DType, device: &Device, seed: u64) -> Result<Base> {
    Base::new(
        config,
        VarBuilder::from_backend(Box::new(RandomWeights { seed }), dtype, device.clone()),
    )
}

struct RandomWeights {
    seed: u64,
}

impl candle_nn::var_builder::SimpleBackend for RandomWeights {
    fn get(
        &self,
        s: candle_core::Shape,
        name: &str,
        _: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        use rand::{Rng, SeedableRng};
        // Each tensor's stream depends on the seed and its name only, not on load order.
        let stream = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ stream);
        let dims = s.dims();
        let (offset, scale) = if name.ends_with("norm.weight") {
            (1.0, 0.1)
        } else if name.ends_with(".bias") {
            (0.0, 0.1)
        } else if name.contains("embed_tokens") {
            (0.0, 1.0)
        } else {
            (0.0, 1.0 / (*dims.last().unwrap_or(&1) as f32).sqrt())
        };
        let v: Vec<f32> = (0..s.elem_count())
            .map(|_| offset + rng.random_range(-scale..=scale))
            .collect();
        Tensor::from_vec(v, s, &Device::Cpu)?
            .to_dtype(dtype)?
            .to_device(dev)
    }

    fn get_unchecked(&self, name: &str, _: DType, _: &Device) -> candle_core::Result<Tensor> {
        Err(candle_core::Error::CannotFindTensor {
            path: name.to_string(),
        })
    }

    fn contains_tensor(&self, _: &str) -> bool {
        true
    }
}
