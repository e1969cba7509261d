//! LoRA adapters (PEFT-compatible files) and value heads.

use super::decoder::{Adapter, Base, Target};
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Which layers get an adapter and how large it is.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    pub r: usize,
    pub alpha: f64,
    /// PEFT module names: q_proj, k_proj, v_proj, o_proj, qkv_proj, gate_proj, up_proj,
    /// gate_up_proj, down_proj.
    pub target_modules: Vec<String>,
}

impl LoraConfig {
    pub fn scale(&self) -> f64 {
        self.alpha / self.r as f64
    }
}

/// One adapted linear layer: y = W x + scale * B (A x).
#[derive(Debug, Clone)]
pub(crate) struct LoraModule {
    a: Tensor,
    b: Tensor,
    scale: f64,
}

impl LoraModule {
    pub(crate) fn delta(&self, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let in_dim = *dims.last().unwrap();
        let rows: usize = dims[..dims.len() - 1].iter().product();
        // The adapter is f32 whatever the base's dtype (PEFT's `autocast_adapter_dtype`):
        // bf16 weights would round AdamW's small updates away. The delta goes back in the
        // activations' dtype.
        let x2 = x.reshape((rows, in_dim))?.to_dtype(self.a.dtype())?;
        let y = x2.matmul(&self.a.t()?)?.matmul(&self.b.t()?)?;
        let mut out = dims;
        *out.last_mut().unwrap() = self.b.dim(0)?;
        Ok((y * self.scale)?.reshape(out)?.to_dtype(x.dtype())?)
    }
}

/// A LoRA adapter over a base's linear layers. Its tensors are `Var`s (trainable); a clone
/// shares them.
#[derive(Clone)]
pub struct Lora {
    cfg: LoraConfig,
    varmap: VarMap,
    modules: BTreeMap<(usize, Target), LoraModule>,
    /// Dropout on every adapted layer's input while fine-tuning (PEFT's `lora_dropout`);
    /// none unless [`Lora::set_dropout`] set it.
    dropout: Option<Arc<Dropout>>,
    /// The dropout it was last trained with, for `adapter_config.json`.
    trained_dropout: f64,
}

/// Inverted dropout with masks from a seeded stream: each element kept with probability
/// 1 - p and scaled by 1 / (1 - p), so the same seed drops the same elements.
struct Dropout {
    p: f64,
    rng: Mutex<ChaCha8Rng>,
}

impl Dropout {
    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let keep = 1.0 - self.p;
        let scale = (1.0 / keep) as f32;
        let mask: Vec<f32> = {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            (0..x.elem_count())
                .map(|_| if rng.random_bool(keep) { scale } else { 0.0 })
                .collect()
        };
        let mask = Tensor::from_vec(mask, x.dims(), x.device())?.to_dtype(x.dtype())?;
        Ok(x.mul(&mask)?)
    }
}

fn peft_key(layer: usize, t: Target, ab: &str) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.lora_{ab}.weight",
        t.path()
    )
}

fn targets(cfg: &LoraConfig) -> Result<Vec<Target>> {
    cfg.target_modules
        .iter()
        .map(|n| {
            Target::from_peft_name(n).ok_or_else(|| {
                let known: Vec<&str> = Target::ALL.iter().map(|t| t.peft_name()).collect();
                anyhow!(
                    "unknown LoRA target module `{n}`; known: {}",
                    known.join(", ")
                )
            })
        })
        .collect()
}

impl Lora {
    /// Drops each element of every adapted layer's input with probability `p` (scaling the
    /// rest by 1 / (1 - p)) from now on, with masks drawn from a stream seeded by `seed`:
    /// PEFT's `lora_dropout`, for fine-tuning. `p = 0` switches it off again; evaluation and
    /// generation must run without it. A clone made while it is on shares its stream.
    pub fn set_dropout(&mut self, p: f64, seed: u64) -> Result<()> {
        if !(0.0..1.0).contains(&p) {
            bail!("LoRA dropout {p}: expected a probability in [0, 1)");
        }
        self.dropout = (p > 0.0).then(|| {
            Arc::new(Dropout {
                p,
                rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
            })
        });
        if p > 0.0 {
            self.trained_dropout = p;
        }
        Ok(())
    }

    /// A copy (the same weights) whose dropout draws, from now on, the masks this one draws
    /// next, without advancing this one's stream: a forward replayed from here drops what
    /// it dropped (activation checkpointing's recomputation).
    pub(crate) fn replay(&self) -> Lora {
        let mut copy = self.clone();
        if let Some(d) = &self.dropout {
            let rng = d.rng.lock().unwrap_or_else(|e| e.into_inner()).clone();
            copy.dropout = Some(Arc::new(Dropout {
                p: d.p,
                rng: Mutex::new(rng),
            }));
        }
        copy
    }

    /// Whether dropout is on (its output then is not a function of its weights alone).
    pub fn dropout_on(&self) -> bool {
        self.dropout.is_some()
    }

    /// A fresh adapter: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's default), B = 0, so the adapted
    /// model starts equal to the base. Seeded.
    pub fn new(base: &Base, cfg: LoraConfig, seed: u64) -> Result<Lora> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let ts = targets(&cfg)?;
        let varmap = VarMap::new();
        let mut modules = BTreeMap::new();
        for t in &ts {
            let mut found = false;
            for l in 0..base.layers().len() {
                let Some(w) = base.linear_weight(l, *t) else {
                    continue;
                };
                found = true;
                let (out_dim, in_dim) = w.dims2()?;
                let bound = 1.0 / (in_dim as f32).sqrt();
                let a: Vec<f32> = (0..cfg.r * in_dim)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (cfg.r, in_dim), base.device())?;
                let b = Tensor::zeros((out_dim, cfg.r), DType::F32, base.device())?;
                let m = Self::register(&varmap, l, *t, a, b, cfg.scale())?;
                modules.insert((l, *t), m);
            }
            if !found {
                bail!(
                    "LoRA target `{}` matches no layer of this {:?} model",
                    t.peft_name(),
                    base.config().arch
                );
            }
        }
        Ok(Lora {
            dropout: None,
            trained_dropout: 0.0,
            cfg,
            varmap,
            modules,
        })
    }

    fn register(
        varmap: &VarMap,
        l: usize,
        t: Target,
        a: Tensor,
        b: Tensor,
        scale: f64,
    ) -> Result<LoraModule> {
        let va = Var::from_tensor(&a)?;
        let vb = Var::from_tensor(&b)?;
        let mut data = varmap.data().lock().unwrap();
        data.insert(peft_key(l, t, "A"), va.clone());
        data.insert(peft_key(l, t, "B"), vb.clone());
        Ok(LoraModule {
            a: va.as_tensor().clone(),
            b: vb.as_tensor().clone(),
            scale,
        })
    }

    pub fn config(&self) -> &LoraConfig {
        &self.cfg
    }

    pub(crate) fn module(&self, layer: usize, t: Target) -> Option<&LoraModule> {
        self.modules.get(&(layer, t))
    }

    /// The trainable tensors.
    pub fn vars(&self) -> Vec<Var> {
        self.varmap.all_vars()
    }

    /// Named trainable tensors (PEFT key names).
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().unwrap();
        let mut v: Vec<_> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Writes `adapter_model.safetensors` and `adapter_config.json` into `dir` (PEFT layout).
    pub fn save(&self, dir: &Path, base_model_name: &str) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tensors: HashMap<String, Tensor> = self
            .named_vars()
            .into_iter()
            .map(|(k, v)| (k, v.as_tensor().clone()))
            .collect();
        let st = dir.join("adapter_model.safetensors");
        candle_core::safetensors::save(&tensors, &st)
            .with_context(|| format!("writing {}", st.display()))?;
        let conf = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model_name,
            "r": self.cfg.r,
            "lora_alpha": self.cfg.alpha,
            "lora_dropout": self.trained_dropout,
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "use_rslora": false,
            "target_modules": self.cfg.target_modules,
        });
        let cp = dir.join("adapter_config.json");
        std::fs::write(&cp, serde_json::to_string_pretty(&conf)?)
            .with_context(|| format!("writing {}", cp.display()))?;
        Ok(())
    }

    /// Reads a PEFT adapter folder for `base`; the adapter's tensors are kept in f32.
    pub fn load(dir: &Path, base: &Base) -> Result<Lora> {
        let cp = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&cp)
            .with_context(|| format!("missing file {}", cp.display()))?;
        let v: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", cp.display()))?;
        let r = v
            .get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| anyhow!("{}: missing `r`", cp.display()))? as usize;
        let alpha = v
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .unwrap_or(r as f64);
        let target_modules: Vec<String> = match v.get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            Some(Value::String(s)) => bail!(
                "{}: target_modules as a regex (`{s}`) is not supported; list the modules",
                cp.display()
            ),
            _ => bail!("{}: missing `target_modules`", cp.display()),
        };
        let rslora = v
            .get("use_rslora")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let scale = if rslora {
            alpha / (r as f64).sqrt()
        } else {
            alpha / r as f64
        };
        let cfg = LoraConfig {
            r,
            alpha,
            target_modules,
        };
        let ts = targets(&cfg)?;
        let st = dir.join("adapter_model.safetensors");
        if !st.exists() {
            bail!("missing file {}", st.display());
        }
        let file = candle_core::safetensors::load(&st, base.device())
            .with_context(|| format!("reading {}", st.display()))?;
        let varmap = VarMap::new();
        let mut modules = BTreeMap::new();
        for t in ts {
            for l in 0..base.layers().len() {
                let Some(w) = base.linear_weight(l, t) else {
                    continue;
                };
                let (out_dim, in_dim) = w.dims2()?;
                let fetch = |ab: &str, shape: [usize; 2]| -> Result<Tensor> {
                    let key = peft_key(l, t, ab);
                    let x = file
                        .get(&key)
                        .ok_or_else(|| anyhow!("tensor `{key}` not found in {}", st.display()))?;
                    if x.dims() != shape {
                        bail!(
                            "tensor `{key}`: expected shape {shape:?}, found {:?}",
                            x.dims()
                        );
                    }
                    Ok(x.to_dtype(DType::F32)?)
                };
                let a = fetch("A", [r, in_dim])?;
                let b = fetch("B", [out_dim, r])?;
                modules.insert((l, t), Self::register(&varmap, l, t, a, b, scale)?);
            }
        }
        Ok(Lora {
            dropout: None,
            trained_dropout: 0.0,
            cfg,
            varmap,
            modules,
        })
    }

    /// A new base with every adapted weight replaced by W + scale * B A.
    pub fn merge(&self, base: &Base) -> Result<Base> {
        let mut merged = base.clone();
        for ((l, t), m) in &self.modules {
            let w = base
                .linear_weight(*l, *t)
                .ok_or_else(|| anyhow!("no `{}` in layer {l}", t.peft_name()))?;
            let delta = (m.b.matmul(&m.a)? * m.scale)?;
            merged.with_linear_weight(*l, *t, (w + delta.to_dtype(w.dtype())?)?)?;
        }
        Ok(merged)
    }
}

/// A scalar value estimate per position: Linear(hidden -> 1) on the final hidden states. A
/// clone shares its trainable tensors.
#[derive(Clone)]
pub struct ValueHead {
    varmap: VarMap,
    weight: Tensor,
    bias: Tensor,
}

const VH_W: &str = "v_head.summary.weight";
const VH_B: &str = "v_head.summary.bias";

impl ValueHead {
    /// A fresh head, weights ~ N(0, 1/hidden) approximated by a seeded uniform, bias 0.
    pub fn new(hidden: usize, dtype: DType, dev: &Device, seed: u64) -> Result<ValueHead> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let bound = (3.0 / hidden as f32).sqrt() * 0.1;
        let w: Vec<f32> = (0..hidden)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let w = Tensor::from_vec(w, (1, hidden), dev)?.to_dtype(dtype)?;
        let b = Tensor::zeros(1, dtype, dev)?;
        Self::from_tensors(w, b)
    }

    fn from_tensors(w: Tensor, b: Tensor) -> Result<ValueHead> {
        let varmap = VarMap::new();
        let vw = Var::from_tensor(&w)?;
        let vb = Var::from_tensor(&b)?;
        {
            let mut d = varmap.data().lock().unwrap();
            d.insert(VH_W.into(), vw.clone());
            d.insert(VH_B.into(), vb.clone());
        }
        Ok(ValueHead {
            varmap,
            weight: vw.as_tensor().clone(),
            bias: vb.as_tensor().clone(),
        })
    }

    /// hidden (..., h) -> values (...), in f32. The hidden states are cast to the head's
    /// dtype (f32 in training), so a bf16 or f16 model's values and value loss are f32.
    pub fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let lin = candle_nn::Linear::new(self.weight.clone(), Some(self.bias.clone()));
        let y = candle_nn::Module::forward(&lin, &hidden.to_dtype(self.weight.dtype())?)?;
        Ok(y.squeeze(candle_core::D::Minus1)?.to_dtype(DType::F32)?)
    }

    pub fn vars(&self) -> Vec<Var> {
        self.varmap.all_vars()
    }

    /// `v_head.summary.weight` and `v_head.summary.bias`.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().unwrap();
        [VH_W, VH_B]
            .iter()
            .map(|k| (k.to_string(), data[*k].clone()))
            .collect()
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let t: HashMap<String, Tensor> = [
            (VH_W.to_string(), self.weight.clone()),
            (VH_B.to_string(), self.bias.clone()),
        ]
        .into();
        candle_core::safetensors::save(&t, path)
            .with_context(|| format!("writing {}", path.display()))
    }

    pub fn load(path: &Path, hidden: usize, dtype: DType, dev: &Device) -> Result<ValueHead> {
        if !path.exists() {
            bail!("missing file {}", path.display());
        }
        let f = candle_core::safetensors::load(path, dev)
            .with_context(|| format!("reading {}", path.display()))?;
        let get = |k: &str, shape: &[usize]| -> Result<Tensor> {
            let x = f
                .get(k)
                .ok_or_else(|| anyhow!("tensor `{k}` not found in {}", path.display()))?;
            if x.dims() != shape {
                bail!(
                    "tensor `{k}`: expected shape {shape:?}, found {:?}",
                    x.dims()
                );
            }
            Ok(x.to_dtype(dtype)?)
        };
        Self::from_tensors(get(VH_W, &[1, hidden])?, get(VH_B, &[1])?)
    }
}

impl Adapter for Lora {
    fn delta(&self, layer: usize, target: Target, x: &Tensor) -> Result<Option<Tensor>> {
        let Some(m) = self.module(layer, target) else {
            return Ok(None);
        };
        match &self.dropout {
            Some(d) => Ok(Some(m.delta(&d.apply(x)?)?)),
            None => Ok(Some(m.delta(x)?)),
        }
    }

    fn factors(&self, layer: usize, target: Target) -> Option<(&Tensor, &Tensor, f64)> {
        match &self.dropout {
            Some(_) => None,
            None => self.module(layer, target).map(|m| (&m.a, &m.b, m.scale)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inverted dropout: about p of the elements are zero, the rest scaled by 1 / (1 - p),
    /// so the mean is kept; the same seed gives the same mask, the next call another.
    #[test]
    fn dropout_keeps_the_mean_and_is_seeded() {
        let dropout = |seed| Dropout {
            p: 0.25,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)),
        };
        let x = Tensor::ones((200, 100), DType::F32, &Device::Cpu).unwrap();
        let apply = |d: &Dropout| -> Vec<f32> {
            d.apply(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let d = dropout(5);
        let first = apply(&d);
        let zeros = first.iter().filter(|&&v| v == 0.0).count() as f64 / first.len() as f64;
        assert!((zeros - 0.25).abs() < 0.02, "dropped {zeros}");
        assert!(first
            .iter()
            .all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        let mean = first.iter().sum::<f32>() / first.len() as f32;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
        assert_ne!(first, apply(&d), "each call draws a fresh mask");
        let again = apply(&dropout(5));
        assert_eq!(first, again, "the same seed drops the same elements");
    }
}
