//! The decoder's configuration, parsed from a Hugging Face `config.json` (transformers 4.x and
//! 5.x layouts) or from GGUF metadata.

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// The model families the decoder covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, SmolLM/SmolLM2 and other `LlamaForCausalLM` checkpoints.
    Llama,
    /// Qwen2 / Qwen2.5 (bias on q, k, v).
    Qwen2,
    /// Phi-3 (fused `qkv_proj` and `gate_up_proj`).
    Phi3,
    /// Mistral (llama layout, optional sliding window, explicit head_dim).
    Mistral,
}

/// Names accepted for each family: `architectures[0]` or `model_type` in config.json,
/// `general.architecture` in GGUF.
const KNOWN: &[(&str, Arch)] = &[
    ("LlamaForCausalLM", Arch::Llama),
    ("llama", Arch::Llama),
    ("Qwen2ForCausalLM", Arch::Qwen2),
    ("qwen2", Arch::Qwen2),
    ("Phi3ForCausalLM", Arch::Phi3),
    ("phi3", Arch::Phi3),
    ("MistralForCausalLM", Arch::Mistral),
    ("mistral", Arch::Mistral),
];

impl Arch {
    /// Looks up an architecture name; the error lists the known ones.
    pub fn from_name(name: &str) -> Result<Arch> {
        KNOWN
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| {
                let known: Vec<&str> = KNOWN.iter().map(|(n, _)| *n).collect();
                anyhow!(
                    "unknown architecture `{name}`; known architectures: {}",
                    known.join(", ")
                )
            })
    }
}

/// Rotary embedding frequency scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain rope.
    None,
    /// Llama 3.x frequency-dependent scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: usize,
    },
}

/// Feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    Silu,
    GeluTanh,
    Gelu,
}

/// The largest sizes a checkpoint's config may claim (each several times the largest
/// model of the supported families): what a hostile or broken config.json is held to before
/// anything is allocated from it.
pub const MAX_VOCAB: usize = 1 << 21;
pub const MAX_WIDTH: usize = 1 << 16;
pub const MAX_LAYERS: usize = 1024;
pub const MAX_HEADS: usize = 1024;
pub const MAX_HEAD_DIM: usize = 1024;
pub const MAX_POSITIONS: usize = 1 << 24;

/// Everything the decoder needs to know about a checkpoint's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    /// Fraction of head_dim that is rotated (Phi-3 variants); 1.0 otherwise.
    pub partial_rotary_factor: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v (Qwen2 always; Llama when `attention_bias`).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama `attention_bias`).
    pub o_bias: bool,
    /// Bias on the MLP projections (Llama `mlp_bias`).
    pub mlp_bias: bool,
    pub hidden_act: Act,
    /// Attention window (keys with `query_pos - key_pos >= window` are masked), if enabled.
    pub sliding_window: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl Config {
    /// How many weights a model of this config has: embeddings, each layer's projections
    /// (and their biases) and norms, the final norm, and lm_head unless it is tied.
    pub fn parameters(&self) -> usize {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let biases = usize::from(self.qkv_bias) * (q + 2 * kv)
            + usize::from(self.o_bias) * h
            + usize::from(self.mlp_bias) * (2 * i + h);
        let layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h + biases;
        let lm_head = if self.tie_word_embeddings { 0 } else { v * h };
        self.num_hidden_layers * layer + v * h + lm_head + h
    }

    /// Parses a config.json document (transformers 4.x or 5.x).
    pub fn from_hf_json(text: &str) -> Result<Config> {
        let v: Value = serde_json::from_str(text).context("config.json is not valid JSON")?;
        Self::from_hf_value(&v)
    }

    fn from_hf_value(v: &Value) -> Result<Config> {
        let arch_name = v
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| v.get("model_type").and_then(Value::as_str))
            .ok_or_else(|| {
                anyhow!("config.json names no architecture (`architectures` or `model_type`)")
            })?;
        let arch = Arch::from_name(arch_name)?;
        let req = |k: &str| -> Result<usize> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| anyhow!("config.json: missing or invalid `{k}`"))
        };
        let opt_usize = |k: &str| v.get(k).and_then(Value::as_u64).map(|x| x as usize);
        let opt_f64 = |k: &str| v.get(k).and_then(Value::as_f64);
        let opt_bool = |k: &str| v.get(k).and_then(Value::as_bool);

        let hidden_size = req("hidden_size")?;
        let num_attention_heads = req("num_attention_heads")?;
        let num_key_value_heads = opt_usize("num_key_value_heads").unwrap_or(num_attention_heads);
        let head_dim = opt_usize("head_dim").unwrap_or(hidden_size / num_attention_heads);
        // transformers 5.x moves rope_theta (and the scaling) into `rope_parameters`.
        let rope_params = v.get("rope_parameters").filter(|p| p.is_object());
        let rope_theta = opt_f64("rope_theta")
            .or_else(|| {
                rope_params
                    .and_then(|p| p.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0);
        let scaling = v
            .get("rope_scaling")
            .filter(|s| s.is_object())
            .or(rope_params);
        let rope_scaling = parse_rope_scaling(scaling)?;
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        let hidden_act = match act {
            "silu" | "swish" => Act::Silu,
            "gelu_pytorch_tanh" | "gelu_new" => Act::GeluTanh,
            "gelu" => Act::Gelu,
            other => bail!(
                "config.json: unsupported hidden_act `{other}` (silu, gelu, gelu_pytorch_tanh)"
            ),
        };
        let attention_bias = opt_bool("attention_bias").unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            Arch::Llama => (attention_bias, attention_bias),
            _ => (false, false),
        };
        let mlp_bias = arch == Arch::Llama && opt_bool("mlp_bias").unwrap_or(false);
        // `sliding_window` may be null (5.x) or present but disabled (Qwen2's use_sliding_window).
        let sliding_window = match arch {
            Arch::Mistral => opt_usize("sliding_window"),
            Arch::Qwen2 if opt_bool("use_sliding_window").unwrap_or(false) => {
                opt_usize("sliding_window")
            }
            _ => None,
        };
        let eos_token_ids = match v.get("eos_token_id") {
            Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect(),
            _ => vec![],
        };
        Ok(Config {
            arch,
            vocab_size: req("vocab_size")?,
            hidden_size,
            intermediate_size: req("intermediate_size")?,
            num_hidden_layers: req("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: opt_f64("rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            partial_rotary_factor: opt_f64("partial_rotary_factor").unwrap_or(1.0),
            max_position_embeddings: opt_usize("max_position_embeddings").unwrap_or(4096),
            tie_word_embeddings: opt_bool("tie_word_embeddings").unwrap_or(false),
            qkv_bias,
            o_bias,
            mlp_bias,
            hidden_act,
            sliding_window,
            bos_token_id: opt_usize("bos_token_id").map(|x| x as u32),
            eos_token_ids,
        })
    }

    /// The number of dimensions of each head that rope rotates.
    pub fn rotary_dim(&self) -> usize {
        ((self.partial_rotary_factor * self.head_dim as f64) as usize) & !1
    }

    /// Checks the invariants the decoder relies on, and that every size is one a real
    /// checkpoint has, before anything is allocated from it: a file that claims a context
    /// of 3e9 positions or a vocabulary of 2^40 is refused, naming the key, rather than
    /// taken at its word.
    pub fn validate(&self) -> Result<()> {
        for (key, value, max) in [
            ("vocab_size", self.vocab_size, MAX_VOCAB),
            ("hidden_size", self.hidden_size, MAX_WIDTH),
            ("intermediate_size", self.intermediate_size, MAX_WIDTH * 8),
            ("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS),
            ("num_attention_heads", self.num_attention_heads, MAX_HEADS),
            ("num_key_value_heads", self.num_key_value_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                MAX_POSITIONS,
            ),
        ] {
            if value == 0 || value > max {
                bail!("{key} = {value}: expected 1 to {max}");
            }
        }
        for (key, value) in [
            ("rms_norm_eps", self.rms_norm_eps),
            ("rope_theta", self.rope_theta),
        ] {
            if !(value.is_finite() && value > 0.0) {
                bail!("{key} = {value}: expected a finite number above 0");
            }
        }
        if !(self.partial_rotary_factor > 0.0 && self.partial_rotary_factor <= 1.0) {
            bail!(
                "partial_rotary_factor = {}: expected a fraction in (0, 1]",
                self.partial_rotary_factor
            );
        }
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
        {
            bail!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads,
                self.num_key_value_heads
            );
        }
        if self.rotary_dim() == 0 {
            bail!(
                "rotary dimension is 0 (head_dim {}, partial_rotary_factor {})",
                self.head_dim,
                self.partial_rotary_factor
            );
        }
        Ok(())
    }
}

fn parse_rope_scaling(s: Option<&Value>) -> Result<RopeScaling> {
    let Some(s) = s else {
        return Ok(RopeScaling::None);
    };
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let f = |k: &str| s.get(k).and_then(Value::as_f64).map(|x| x as f32);
    match kind {
        "default" => Ok(RopeScaling::None),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: f("factor").unwrap_or(8.0),
            low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
            original_max_position_embeddings: s
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .unwrap_or(8192),
        }),
        other => bail!("unsupported rope scaling `{other}` (supported: default, llama3)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V4: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":128,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,
        "rms_norm_eps":1e-6,"rope_theta":1000000.0,"sliding_window":32768,"use_sliding_window":false,
        "max_position_embeddings":512,"tie_word_embeddings":true,"eos_token_id":[5,7]}"#;
    const V5: &str = r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":64,"intermediate_size":128,
        "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":100,
        "rms_norm_eps":1e-6,"rope_parameters":{"rope_theta":1000000.0,"rope_type":"default"},
        "sliding_window":null,"use_sliding_window":false,
        "max_position_embeddings":512,"tie_word_embeddings":true,"eos_token_id":[5,7]}"#;

    #[test]
    fn transformers_4_and_5_configs_parse_to_the_same_config() {
        let a = Config::from_hf_json(V4).unwrap();
        let b = Config::from_hf_json(V5).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.rope_theta, 1_000_000.0);
        assert_eq!(a.head_dim, 16);
        assert!(a.qkv_bias && !a.o_bias);
        assert_eq!(a.sliding_window, None);
        assert_eq!(a.eos_token_ids, vec![5, 7]);
    }

    #[test]
    fn parameter_counts_match_the_published_ones() {
        // SmolLM2-135M: 134,515,008 weights (tied embeddings, no biases).
        let smollm2 = Config::from_hf_json(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,"intermediate_size":1536,
            "num_hidden_layers":30,"num_attention_heads":9,"num_key_value_heads":3,
            "vocab_size":49152,"rms_norm_eps":1e-5,"rope_theta":100000.0,
            "max_position_embeddings":8192,"tie_word_embeddings":true}"#,
        )
        .unwrap();
        assert_eq!(smollm2.parameters(), 134_515_008);
        // Qwen2.5-0.5B: 494,032,768 (tied, q/k/v biases).
        let qwen = Config::from_hf_json(
            r#"{"architectures":["Qwen2ForCausalLM"],"hidden_size":896,"intermediate_size":4864,
            "num_hidden_layers":24,"num_attention_heads":14,"num_key_value_heads":2,
            "vocab_size":151936,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
            "max_position_embeddings":32768,"tie_word_embeddings":true}"#,
        )
        .unwrap();
        assert_eq!(qwen.parameters(), 494_032_768);
    }

    #[test]
    fn unknown_architecture_names_the_value_and_the_known_ones() {
        let text = V4.replace("Qwen2ForCausalLM", "GPTNeoXForCausalLM");
        let e = format!("{:#}", Config::from_hf_json(&text).unwrap_err());
        assert!(e.contains("GPTNeoXForCausalLM"), "{e}");
        assert!(
            e.contains("LlamaForCausalLM") && e.contains("Phi3ForCausalLM"),
            "{e}"
        );
    }

    /// Every size a config claims is held to a maximum before anything is allocated, and
    /// zero sizes and non-finite or negative scalars are refused, each naming its key.
    #[test]
    fn absurd_sizes_are_refused_naming_the_key() {
        for (key, value, needle) in [
            (
                "max_position_embeddings",
                "3000000000",
                "max_position_embeddings = 3000000000",
            ),
            ("vocab_size", "1099511627776", "vocab_size = 1099511627776"),
            ("hidden_size", "0", "hidden_size = 0"),
            (
                "intermediate_size",
                "100000000",
                "intermediate_size = 100000000",
            ),
            (
                "num_hidden_layers",
                "1000000",
                "num_hidden_layers = 1000000",
            ),
            ("rms_norm_eps", "-1.0", "rms_norm_eps = -1"),
            ("rope_theta", "0.0", "rope_theta = 0"),
        ] {
            let mut v: Value = serde_json::from_str(V4).unwrap();
            v[key] = serde_json::from_str(value).unwrap();
            let parsed = Config::from_hf_value(&v);
            let err = parsed.and_then(|c| c.validate()).unwrap_err().to_string();
            assert!(err.contains(needle), "{key}: {err}");
        }
        Config::from_hf_json(V4).unwrap().validate().unwrap();
    }

    #[test]
    fn llama3_rope_scaling_parses() {
        let text = V4.replace("Qwen2ForCausalLM", "LlamaForCausalLM").replace(
            "\"rope_theta\":1000000.0",
            "\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":32.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"}",
        );
        let c = Config::from_hf_json(&text).unwrap();
        assert_eq!(
            c.rope_scaling,
            RopeScaling::Llama3 {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192
            }
        );
    }
}
