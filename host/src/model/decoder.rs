//! One decoder for the llama family (Llama, Qwen2, Phi-3, Mistral, SmolLM2).
//!
//! Two paths share the weights, chosen by [`Pass`]: inference uses candle's fused softmax /
//! rms_norm / rope kernels and the KV cache (fast, but they have no backward); training uses
//! differentiable ops (with the CPU's own backward where [`Kernels`] allow). The forward pass returns final (normed) hidden states; `logits` applies lm_head.
//! Batches are left padded: `pads[b]` leading positions of row b are padding, masked out by one
//! additive causal + padding (+ sliding window) mask with a finite value.

use super::config::{Act, Arch, Config, RopeScaling};
use super::fused;
use anyhow::{anyhow, Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{VarBuilder, VarMap};
use std::sync::Arc;

/// A linear layer a LoRA adapter can attach to, by its PEFT module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Qkv,
    Gate,
    Up,
    GateUp,
    Down,
}

impl Target {
    pub const ALL: [Target; 9] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Qkv,
        Target::Gate,
        Target::Up,
        Target::GateUp,
        Target::Down,
    ];

    /// The PEFT `target_modules` name.
    pub fn peft_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Qkv => "qkv_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::GateUp => "gate_up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The module path inside a decoder layer (`self_attn.q_proj`).
    pub fn path(self) -> String {
        let parent = match self {
            Target::Q | Target::K | Target::V | Target::O | Target::Qkv => "self_attn",
            _ => "mlp",
        };
        format!("{parent}.{}", self.peft_name())
    }

    pub fn from_peft_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.peft_name() == name)
    }
}

/// Loads one tensor, with an error naming the tensor and both shapes.
pub(crate) fn get(vb: &VarBuilder, shape: &[usize], name: &str) -> Result<Tensor> {
    let full = if vb.prefix().is_empty() {
        name.to_string()
    } else {
        format!("{}.{name}", vb.prefix())
    };
    vb.get(shape, name).map_err(|e| {
        let mut inner = &e;
        while let candle_core::Error::WithBacktrace { inner: i, .. }
        | candle_core::Error::Context { inner: i, .. } = inner
        {
            inner = i;
        }
        match inner {
            candle_core::Error::UnexpectedShape { got, .. } => {
                anyhow!(
                    "tensor `{full}`: expected shape {shape:?}, found {:?}",
                    got.dims()
                )
            }
            candle_core::Error::CannotFindTensor { .. } => {
                anyhow!("tensor `{full}` (shape {shape:?}) is missing from the weights")
            }
            other => anyhow!("tensor `{full}` (expected shape {shape:?}): {other}"),
        }
    })
}

#[derive(Debug, Clone)]
pub(crate) struct Lin {
    pub(crate) inner: candle_nn::Linear,
}

impl Lin {
    fn load(vb: &VarBuilder, out_dim: usize, in_dim: usize, bias: bool, name: &str) -> Result<Lin> {
        let vb = vb.pp(name);
        let w = get(&vb, &[out_dim, in_dim], "weight")?;
        let b = if bias {
            Some(get(&vb, &[out_dim], "bias")?)
        } else {
            None
        };
        Ok(Lin {
            inner: candle_nn::Linear::new(w, b),
        })
    }

    pub(crate) fn weight(&self) -> &Tensor {
        self.inner.weight()
    }

    /// `train`: the differentiable path (off it, nothing needs the base's gradient).
    fn fwd(
        &self,
        x: &Tensor,
        layer: usize,
        t: Target,
        lora: Option<&dyn Adapter>,
        train: bool,
        kernels: Kernels,
    ) -> Result<Tensor> {
        // On the training path an adapted layer is one node of the graph.
        if let Some((a, b, scale)) = lora.and_then(|l| l.factors(layer, t)) {
            if train && fused::applies(kernels.fused_ops, &[x, self.weight(), a, b]) {
                return Ok(fused::lora_linear(&self.inner, x, a, b, scale)?);
            }
        }
        // Off the training path an adapter's vars upstream would make the input track a
        // gradient: the detached input takes the no-gradient matmul, the same as a run without
        // the adapter.
        let base_in = if train { x.clone() } else { x.detach() };
        let y = super::frozen::linear(&self.inner, &base_in, kernels.frozen_matmul)?;
        match lora.map(|a| a.delta(layer, t, x)).transpose()?.flatten() {
            Some(delta) => Ok((y + delta)?),
            None => Ok(y),
        }
    }
}

/// What adapts the base's linear layers (a LoRA adapter): the term added to the output of
/// linear `target` of layer `layer` for its input `x`, or `None` where it adapts nothing.
pub trait Adapter {
    fn delta(&self, layer: usize, target: Target, x: &Tensor) -> Result<Option<Tensor>>;

    /// The factors (A, B, scale) of linear `target` of layer `layer` when its delta is exactly
    /// `scale · x Aᵀ Bᵀ` for every input (no dropout, one adapter for every row), so that
    /// the training path can take the layer and its adapter as one op; `None` otherwise.
    fn factors(&self, _layer: usize, _target: Target) -> Option<(&Tensor, &Tensor, f64)> {
        None
    }
}

#[derive(Debug, Clone)]
enum Qkv {
    Split { q: Lin, k: Lin, v: Lin },
    Fused(Lin),
}

#[derive(Debug, Clone)]
enum GateUp {
    Split { gate: Lin, up: Lin },
    Fused(Lin),
}

#[derive(Debug, Clone)]
pub(crate) struct Layer {
    qkv: Qkv,
    o: Lin,
    gate_up: GateUp,
    down: Lin,
    ln1: Tensor,
    ln2: Tensor,
}

/// Which path a forward pass takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// No gradient: candle's fused kernels and the KV cache (generation, scoring before an
    /// update, evaluation). The result carries no graph.
    Inference,
    /// Differentiable: ops with a backward, for a loss to be minimised.
    Training,
}

/// Which of the CPU's own kernels a base's forward and backward passes use. Both are on by
/// default; off, candle's elementary ops take their place (same numbers within float
/// rounding: tests and benchmarks compare the two). Other devices always take candle's ops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kernels {
    /// The matmul whose backward skips a frozen weight's gradient (and the small-batch
    /// product for decoding).
    pub frozen_matmul: bool,
    /// The ops with their own backward on the training path: RMS norm, rope, attention,
    /// SiLU gating, token log-probs, a linear layer with its LoRA adapter; and, without a
    /// graph and rounded as on the training path, attention (prefill and scoring) and SiLU
    /// gating.
    pub fused_ops: bool,
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels {
            frozen_matmul: true,
            fused_ops: true,
        }
    }
}

impl Kernels {
    /// candle's elementary ops and plain matmul only.
    pub const PLAIN: Kernels = Kernels {
        frozen_matmul: false,
        fused_ops: false,
    };
}

/// The frozen weights of a llama-family decoder. Cheap to share behind an `Arc`.
#[derive(Debug, Clone)]
pub struct Base {
    cfg: Config,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: candle_nn::Linear,
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    device: Device,
    kernels: Kernels,
}

/// What every layer of one forward pass shares: the attention mask, the rotary tables for
/// its positions, and the adapter.
struct Around<'a> {
    mask: Option<&'a Tensor>,
    cos: &'a Tensor,
    sin: &'a Tensor,
    lora: Option<&'a dyn Adapter>,
}

/// What [`Base::forward_checkpointed`] kept to carry a gradient through the layers later.
pub struct Checkpoint {
    base: Arc<Base>,
    /// The adapter as each layer met it: with dropout on, each copy draws the masks that
    /// layer drew in the forward ([`Lora::replay`](super::lora::Lora::replay)).
    loras: Vec<Option<super::lora::Lora>>,
    ids: Tensor,
    mask: Option<Tensor>,
    cos: Tensor,
    sin: Tensor,
    /// Each layer's input, without a graph.
    inputs: Vec<Tensor>,
    /// The last layer's output, the leaf the loss's graph starts from.
    top: Var,
    /// The positions the last layer computed (see [`Base::forward_tail`]).
    tail: usize,
}

impl Checkpoint {
    /// Completes `grads` (the loss's backward, which stopped at the last layer's output)
    /// with the gradients of every trainable tensor in `vars` below it: each layer runs
    /// again from its kept input, from the last to the first, and the backward of
    /// sum(output * gradient of the output) gives its weights' gradients and its input's,
    /// the next layer down's output gradient. The first layer's input is embedded again with
    /// its graph, so a trainable embedding gets its gradient too.
    pub fn backward(
        self,
        mut grads: candle_core::backprop::GradStore,
        vars: &[Var],
    ) -> Result<candle_core::backprop::GradStore> {
        let Some(mut g) = grads.remove(self.top.as_tensor()) else {
            // The loss does not depend on the layers: nothing below gets a gradient.
            return Ok(grads);
        };
        for li in (0..self.inputs.len()).rev() {
            let around = Around {
                mask: self.mask.as_ref(),
                cos: &self.cos,
                sin: &self.sin,
                lora: self.loras[li].as_ref().map(|l| l as &dyn Adapter),
            };
            let leaf;
            let x = if li == 0 {
                self.base.embed(&self.ids)?
            } else {
                leaf = Var::from_tensor(&self.inputs[li])?;
                leaf.as_tensor().clone()
            };
            let keep = self.base.kept(li, self.ids.dim(1)?, self.tail);
            let y = self.base.block(li, &x, None, &around, false, keep)?;
            let mut layer = (y * &g)?.sum_all()?.backward()?;
            if li > 0 {
                g = layer
                    .remove(&x)
                    .ok_or_else(|| anyhow::anyhow!("layer {li}: no gradient reached its input"))?;
            }
            for v in vars {
                if let Some(d) = layer.remove(v.as_tensor()) {
                    let sum = match grads.remove(v.as_tensor()) {
                        Some(before) => (before + d)?,
                        None => d,
                    };
                    grads.insert(v.as_tensor(), sum);
                }
            }
        }
        Ok(grads)
    }
}

/// Per-layer keys and values of a batch being generated, in buffers of (batch, kv heads,
/// capacity, head dim) that grow 128 positions at a time: a decoding step writes its one new
/// position in place instead of copying the whole cache. Cached keys and values carry no
/// gradient (the cache is for the inference path).
#[derive(Debug)]
pub struct KvCache {
    kvs: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    pub fn new(num_layers: usize) -> KvCache {
        KvCache {
            kvs: (0..num_layers).map(|_| None).collect(),
            len: 0,
        }
    }

    /// Number of positions cached so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every position from `len` on, keeping the first `len` (a shared prefix) for
    /// the next forward to continue from. Positions beyond `len()` are refused.
    pub(crate) fn truncate(&mut self, len: usize) -> Result<()> {
        if len > self.len {
            anyhow::bail!("KV cache: cannot keep {len} positions of {}", self.len);
        }
        self.len = len;
        if len == 0 {
            // Nothing kept: the next forward may have another batch size.
            self.kvs.iter_mut().for_each(|slot| *slot = None);
        }
        Ok(())
    }

    /// A one-row cache holding `kvs` ((1, kv heads, positions, head dim) per layer, each
    /// `len` positions) as its first positions; empty `kvs` is an empty cache.
    pub(crate) fn from_prefix(kvs: Vec<(Tensor, Tensor)>, len: usize) -> KvCache {
        let layers = kvs.len();
        KvCache {
            kvs: kvs.into_iter().map(Some).collect(),
            len: if layers == 0 { 0 } else { len },
        }
    }

    /// Batch row `row`'s keys and values at positions `from..len()`, per layer, each
    /// (1, kv heads, len() - from, head dim).
    pub(crate) fn row(&self, row: usize, from: usize) -> Result<Vec<(Tensor, Tensor)>> {
        let n = self
            .len
            .checked_sub(from)
            .ok_or_else(|| anyhow::anyhow!("KV cache: position {from} is past its {}", self.len))?;
        self.kvs
            .iter()
            .map(|slot| {
                let (k, v) = slot
                    .as_ref()
                    .ok_or_else(|| anyhow::anyhow!("KV cache: a layer holds nothing"))?;
                Ok((
                    k.narrow(0, row, 1)?.narrow(2, from, n)?,
                    v.narrow(0, row, 1)?.narrow(2, from, n)?,
                ))
            })
            .collect()
    }

    /// Keeps only the batch rows `rows` (a u32 index vector), in that order: the rows of a
    /// batched generation that are still generating.
    pub(crate) fn retain_rows(&mut self, rows: &Tensor) -> Result<()> {
        for slot in self.kvs.iter_mut() {
            if let Some((k, v)) = slot.take() {
                *slot = Some((k.index_select(rows, 0)?, v.index_select(rows, 0)?));
            }
        }
        Ok(())
    }
}

/// Appends `k` and `v` (batch, kv heads, t, head dim) to one layer's buffers after the `len`
/// positions already there, and returns views of all `len + t` positions.
fn append_kv(
    slot: &mut Option<(Tensor, Tensor)>,
    len: usize,
    k: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const STEP: usize = 128;
    let (k, v) = (k.detach().contiguous()?, v.detach().contiguous()?);
    let (b, h, t, d) = k.dims4()?;
    let need = len + t;
    if slot.as_ref().map_or(0, |(kb, _)| kb.dim(2).unwrap_or(0)) < need {
        let cap = need.next_multiple_of(STEP);
        let kb = Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?;
        let vb = Tensor::zeros((b, h, cap, d), v.dtype(), v.device())?;
        if let Some((ok, ov)) = slot.take() {
            if len > 0 {
                kb.slice_set(&ok.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
                vb.slice_set(&ov.narrow(2, 0, len)?.contiguous()?, 2, 0)?;
            }
        }
        *slot = Some((kb, vb));
    }
    let (kb, vb) = slot.as_ref().expect("allocated above");
    kb.slice_set(&k, 2, len)?;
    vb.slice_set(&v, 2, len)?;
    Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
}

/// Refuses a tail ([`Base::forward_tail`]) that is not some of a sequence's `t` positions.
fn check_tail(tail: usize, t: usize) -> Result<()> {
    if tail > t || (tail == 0 && t > 0) {
        anyhow::bail!("the last {tail} positions of a sequence of {t} were asked for");
    }
    Ok(())
}

/// The finite additive mask value: large enough to zero a softmax weight, small enough to stay
/// finite in the dtype (a fully masked padding row must not turn into NaN).
pub(crate) fn mask_value(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => -65504.0,
        _ => -1e9,
    }
}

impl Base {
    /// Builds the decoder from weights under Hugging Face names (`model.layers.0...`).
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Base> {
        cfg.validate()?;
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let (nh, nkv, hd) = (
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let vm = vb.pp("model");
        let embed = get(&vm, &[cfg.vocab_size, h], "embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let vl = vm.pp(format!("layers.{l}"));
            let va = vl.pp("self_attn");
            let vmlp = vl.pp("mlp");
            let qkv = match cfg.arch {
                Arch::Phi3 => Qkv::Fused(Lin::load(
                    &va,
                    (nh + 2 * nkv) * hd,
                    h,
                    cfg.qkv_bias,
                    "qkv_proj",
                )?),
                _ => Qkv::Split {
                    q: Lin::load(&va, nh * hd, h, cfg.qkv_bias, "q_proj")?,
                    k: Lin::load(&va, nkv * hd, h, cfg.qkv_bias, "k_proj")?,
                    v: Lin::load(&va, nkv * hd, h, cfg.qkv_bias, "v_proj")?,
                },
            };
            let o = Lin::load(&va, h, nh * hd, cfg.o_bias, "o_proj")?;
            let gate_up = match cfg.arch {
                Arch::Phi3 => {
                    GateUp::Fused(Lin::load(&vmlp, 2 * i, h, cfg.mlp_bias, "gate_up_proj")?)
                }
                _ => GateUp::Split {
                    gate: Lin::load(&vmlp, i, h, cfg.mlp_bias, "gate_proj")?,
                    up: Lin::load(&vmlp, i, h, cfg.mlp_bias, "up_proj")?,
                },
            };
            let down = Lin::load(&vmlp, h, i, cfg.mlp_bias, "down_proj")?;
            let ln1 = get(&vl, &[h], "input_layernorm.weight")?;
            let ln2 = get(&vl, &[h], "post_attention_layernorm.weight")?;
            layers.push(Layer {
                qkv,
                o,
                gate_up,
                down,
                ln1,
                ln2,
            });
        }
        let norm = get(&vm, &[h], "norm.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get(&vb, &[cfg.vocab_size, h], "lm_head.weight")?
        };
        let (cos, sin) = rope_tables(cfg, vb.device())?;
        Ok(Base {
            cfg: cfg.clone(),
            embed,
            layers,
            norm,
            lm_head: candle_nn::Linear::new(lm_head, None),
            cos: cos.to_dtype(vb.dtype())?,
            sin: sin.to_dtype(vb.dtype())?,
            dtype: vb.dtype(),
            device: vb.device().clone(),
            kernels: Kernels::default(),
        })
    }

    /// The kernels this base computes with.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// Computes with `kernels` from now on (set before sharing the base).
    pub fn set_kernels(&mut self, kernels: Kernels) {
        self.kernels = kernels;
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Every weight under its Hugging Face name (`lm_head.weight` only when untied).
    pub fn named_weights(&self) -> Vec<(String, Tensor)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), self.embed.clone())];
        let lin = |out: &mut Vec<(String, Tensor)>, prefix: String, l: &Lin| {
            out.push((format!("{prefix}.weight"), l.inner.weight().clone()));
            if let Some(b) = l.inner.bias() {
                out.push((format!("{prefix}.bias"), b.clone()));
            }
        };
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            match &l.qkv {
                Qkv::Split { q, k, v } => {
                    lin(&mut out, format!("{p}.self_attn.q_proj"), q);
                    lin(&mut out, format!("{p}.self_attn.k_proj"), k);
                    lin(&mut out, format!("{p}.self_attn.v_proj"), v);
                }
                Qkv::Fused(x) => lin(&mut out, format!("{p}.self_attn.qkv_proj"), x),
            }
            lin(&mut out, format!("{p}.self_attn.o_proj"), &l.o);
            match &l.gate_up {
                GateUp::Split { gate, up } => {
                    lin(&mut out, format!("{p}.mlp.gate_proj"), gate);
                    lin(&mut out, format!("{p}.mlp.up_proj"), up);
                }
                GateUp::Fused(x) => lin(&mut out, format!("{p}.mlp.gate_up_proj"), x),
            }
            lin(&mut out, format!("{p}.mlp.down_proj"), &l.down);
            out.push((format!("{p}.input_layernorm.weight"), l.ln1.clone()));
            out.push((
                format!("{p}.post_attention_layernorm.weight"),
                l.ln2.clone(),
            ));
        }
        out.push(("model.norm.weight".to_string(), self.norm.clone()));
        if !self.cfg.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), self.lm_head.weight().clone()));
        }
        out
    }

    /// A copy of this base whose weights are trainable `Var`s (full fine-tuning), with
    /// those vars by name. The copy owns its memory; `self` is untouched.
    pub fn trainable_copy(&self) -> Result<(Base, Vec<(String, Var)>)> {
        let varmap = VarMap::new();
        let mut named = Vec::new();
        {
            let mut data = varmap.data().lock().unwrap();
            for (name, t) in self.named_weights() {
                let var = Var::from_tensor(&t.copy()?)?;
                data.insert(name.clone(), var.clone());
                named.push((name, var));
            }
        }
        let vb = VarBuilder::from_varmap(&varmap, self.dtype, &self.device);
        let mut base = Base::new(&self.cfg, vb).context("building the trainable copy")?;
        base.kernels = self.kernels;
        // A name `Base::new` asked for that `named_weights` did not list would have been
        // created with random values: refuse rather than train a half-random model.
        let made = varmap.all_vars().len();
        if made != named.len() {
            anyhow::bail!(
                "internal: the trainable copy has {made} weights, {} were copied",
                named.len()
            );
        }
        Ok((base, named))
    }

    pub(crate) fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The weight of one LoRA-able linear layer.
    pub(crate) fn linear_weight(&self, layer: usize, t: Target) -> Option<&Tensor> {
        let l = self.layers.get(layer)?;
        let lin = match (t, &l.qkv, &l.gate_up) {
            (Target::Q, Qkv::Split { q, .. }, _) => q,
            (Target::K, Qkv::Split { k, .. }, _) => k,
            (Target::V, Qkv::Split { v, .. }, _) => v,
            (Target::Qkv, Qkv::Fused(x), _) => x,
            (Target::O, _, _) => &l.o,
            (Target::Gate, _, GateUp::Split { gate, .. }) => gate,
            (Target::Up, _, GateUp::Split { up, .. }) => up,
            (Target::GateUp, _, GateUp::Fused(x)) => x,
            (Target::Down, _, _) => &l.down,
            _ => return None,
        };
        Some(lin.weight())
    }

    /// A copy of this base with `w` replaced for one linear layer (used by LoRA merge).
    pub(crate) fn with_linear_weight(&mut self, layer: usize, t: Target, w: Tensor) -> Result<()> {
        let l = &mut self.layers[layer];
        let lin = match (t, &mut l.qkv, &mut l.gate_up) {
            (Target::Q, Qkv::Split { q, .. }, _) => q,
            (Target::K, Qkv::Split { k, .. }, _) => k,
            (Target::V, Qkv::Split { v, .. }, _) => v,
            (Target::Qkv, Qkv::Fused(x), _) => x,
            (Target::O, _, _) => &mut l.o,
            (Target::Gate, _, GateUp::Split { gate, .. }) => gate,
            (Target::Up, _, GateUp::Split { up, .. }) => up,
            (Target::GateUp, _, GateUp::Fused(x)) => x,
            (Target::Down, _, _) => &mut l.down,
            _ => {
                return Err(anyhow!(
                    "this architecture has no `{}` layer",
                    t.peft_name()
                ))
            }
        };
        let bias = lin.inner.bias().cloned();
        lin.inner = candle_nn::Linear::new(w, bias);
        Ok(())
    }

    /// A left-padded batch cache of `len` positions from each row's keys and values
    /// (`rows[b]`: per layer, (1, kv heads, n_b, head dim), at positions counted from the
    /// row's first token): row b's positions are placed after `len - n_b` padding positions,
    /// its keys rotated there (RoPE rotations compose), as a padded prefill would have put
    /// them. Returns the cache and each row's padding.
    pub(crate) fn batch_cache(
        &self,
        rows: Vec<Vec<(Tensor, Tensor)>>,
        len: usize,
    ) -> Result<(KvCache, Vec<usize>)> {
        let layers = self.layers.len();
        let mut pads = Vec::with_capacity(rows.len());
        let mut per_layer: Vec<(Vec<Tensor>, Vec<Tensor>)> =
            (0..layers).map(|_| (Vec::new(), Vec::new())).collect();
        for row in rows {
            anyhow::ensure!(
                row.len() == layers,
                "a row with {} layers of {layers}",
                row.len()
            );
            let n = row[0].0.dim(2)?;
            anyhow::ensure!(n <= len, "a row of {n} positions in a batch of {len}");
            let pad = len - n;
            pads.push(pad);
            for ((k, v), (ks, vs)) in row.into_iter().zip(per_layer.iter_mut()) {
                let k = self.shift_keys(&k, pad as isize)?;
                let (_, h, _, d) = k.dims4()?;
                let (k, v) = if pad > 0 {
                    let zeros = Tensor::zeros((1, h, pad, d), k.dtype(), k.device())?;
                    (
                        Tensor::cat(&[&zeros, &k], 2)?,
                        Tensor::cat(&[&zeros, &v], 2)?,
                    )
                } else {
                    (k, v)
                };
                ks.push(k);
                vs.push(v);
            }
        }
        let kvs = per_layer
            .into_iter()
            .map(|(ks, vs)| Ok(Some((Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?))))
            .collect::<Result<_>>()?;
        Ok((KvCache { kvs, len }, pads))
    }

    /// Batch row `row`'s keys and values in `cache` after its `pad` padding positions, at
    /// positions counted from its first token: the inverse of
    /// [`batch_cache`](Self::batch_cache)'s placing of a row.
    pub(crate) fn unpadded_row(
        &self,
        cache: &KvCache,
        row: usize,
        pad: usize,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        cache
            .row(row, pad)?
            .into_iter()
            .map(|(k, v)| Ok((self.shift_keys(&k, -(pad as isize))?, v)))
            .collect()
    }

    /// Keys (1, kv heads, n, head dim) computed at positions p.. as they would be at
    /// p + delta.. : each rotary pair turned by delta positions' angle (RoPE rotations
    /// compose; the dims past the rotary ones are untouched).
    pub(crate) fn shift_keys(&self, k: &Tensor, delta: isize) -> Result<Tensor> {
        if delta == 0 {
            return Ok(k.clone());
        }
        let n = k.dim(2)?;
        let steps = delta.unsigned_abs();
        let half = self.cos.dim(1)?;
        // Turned in f32 whatever the model's dtype: one rounding, at the end.
        let table = |t: &Tensor| -> Result<Tensor> {
            Ok(t.narrow(0, steps, 1)?
                .to_dtype(DType::F32)?
                .broadcast_as((n, half))?
                .contiguous()?)
        };
        let (cos, mut sin) = (table(&self.cos)?, table(&self.sin)?);
        if delta < 0 {
            sin = sin.neg()?;
        }
        let rot = self.cfg.rotary_dim();
        let hd = self.cfg.head_dim;
        let turn = |x: &Tensor| -> Result<Tensor> {
            Ok(
                candle_nn::rotary_emb::rope(&x.to_dtype(DType::F32)?.contiguous()?, &cos, &sin)?
                    .to_dtype(x.dtype())?,
            )
        };
        if rot == hd {
            turn(k)
        } else {
            let r = turn(&k.narrow(D::Minus1, 0, rot)?)?;
            Ok(Tensor::cat(
                &[&r, &k.narrow(D::Minus1, rot, hd - rot)?],
                D::Minus1,
            )?)
        }
    }

    /// Runs the decoder over `ids` (batch, seq) and returns the final normed hidden states
    /// (batch, seq, hidden). `pads[b]` is the number of left-padding positions of row b
    /// (counted from the start of the whole sequence, cache included). With a cache the new
    /// positions follow the cached ones and are appended to it.
    pub fn forward(
        &self,
        ids: &Tensor,
        pads: &[usize],
        cache: Option<&mut KvCache>,
        lora: Option<&dyn Adapter>,
        pass: Pass,
    ) -> Result<Tensor> {
        self.forward_tail(ids, pads, cache, lora, pass, ids.dim(1)?)
    }

    /// [`forward`](Self::forward)'s hidden states of the last `tail` positions alone
    /// (batch, tail, hidden), for a caller that reads no others (the next token's logits
    /// after a prompt, a response's log-probs): the last layer computes its queries,
    /// attention, output and MLP for those positions only. Every layer still writes every
    /// position's keys and values to the cache.
    pub fn forward_tail(
        &self,
        ids: &Tensor,
        pads: &[usize],
        cache: Option<&mut KvCache>,
        lora: Option<&dyn Adapter>,
        pass: Pass,
        tail: usize,
    ) -> Result<Tensor> {
        let inference = pass == Pass::Inference;
        if cache.is_some() && !inference {
            anyhow::bail!("the KV cache is for the inference path; cached keys carry no gradient");
        }
        let offset = cache.as_ref().map_or(0, |c| c.len);
        let (mask, cos, sin) = self.positions(ids, pads, offset)?;
        let t = ids.dim(1)?;
        check_tail(tail, t)?;
        let mut x = self.embed(ids)?;
        let mut cache = cache;
        let around = Around {
            mask: mask.as_ref(),
            cos: &cos,
            sin: &sin,
            lora,
        };
        for li in 0..self.layers.len() {
            let kv = cache.as_deref_mut().map(|c| (&mut c.kvs[li], offset));
            let keep = self.kept(li, t, tail);
            x = self.block(li, &x, kv, &around, inference, keep)?;
            if inference {
                // The inference path needs no gradient: without this, ops on trainable tensors
                // (LoRA, fully fine-tuned weights) keep every layer's activations alive
                // through the autograd graph until the forward ends.
                x = x.detach();
            }
        }
        if let Some(c) = cache {
            c.len += t;
        }
        let out = self.rms_norm(&x, &self.norm, inference)?;
        Ok(if inference { out.detach() } else { out })
    }

    /// How many of `t` positions layer `li` computes when the forward's caller reads the
    /// last `tail`: all of them below the last layer.
    fn kept(&self, li: usize, t: usize, tail: usize) -> usize {
        if li + 1 == self.layers.len() {
            tail
        } else {
            t
        }
    }

    /// Decoder layer `li` over `x` (batch, seq, hidden): attention and MLP with their
    /// residuals, for the last `keep` positions (batch, keep, hidden); the attention's keys
    /// and values cover every position.
    fn block(
        &self,
        li: usize,
        x: &Tensor,
        kv: Option<(&mut Option<(Tensor, Tensor)>, usize)>,
        around: &Around<'_>,
        inference: bool,
        keep: usize,
    ) -> Result<Tensor> {
        let layer = &self.layers[li];
        let h = self.rms_norm(x, &layer.ln1, inference)?;
        let a = self.attention(&h, li, layer, kv, around, inference, keep)?;
        let t = x.dim(1)?;
        let x = if keep < t {
            (x.narrow(1, t - keep, keep)? + a)?
        } else {
            (x + a)?
        };
        let h = self.rms_norm(&x, &layer.ln2, inference)?;
        let m = self.mlp(&h, li, layer, around.lora, !inference)?;
        Ok((x + m)?)
    }

    /// [`forward`](Self::forward) on the differentiable path with activation checkpointing:
    /// the layers run without a graph, each layer's input is kept, and the result's graph
    /// starts at the last layer's output (a leaf). After the loss's backward,
    /// [`Checkpoint::backward`] runs the layers again, one at a time from the last, each
    /// with its graph, to carry the gradient down: memory for one layer's activations
    /// instead of all of them, for one more forward pass. An adapter's dropout drops the
    /// same elements in the recomputation as in this forward.
    pub(crate) fn forward_checkpointed(
        self: &Arc<Self>,
        ids: &Tensor,
        pads: &[usize],
        lora: Option<&super::lora::Lora>,
        tail: usize,
    ) -> Result<(Tensor, Checkpoint)> {
        let (mask, cos, sin) = self.positions(ids, pads, 0)?;
        let t = ids.dim(1)?;
        check_tail(tail, t)?;
        let around = Around {
            mask: mask.as_ref(),
            cos: &cos,
            sin: &sin,
            lora: lora.map(|l| l as &dyn Adapter),
        };
        // Each layer runs on an input that carries a gradient exactly when the plain
        // forward's does (a leaf copy of the kept input, its graph dropped with the layer's
        // output), so that every op takes the plain forward's path: some choose by it (the
        // frozen products), and on detached inputs a whole SmolLM2 SFT run ended with
        // adapters other than the plain run's by rounding (BENCHMARKS.md).
        let mut x = self.embed(ids)?;
        let mut inputs = Vec::with_capacity(self.layers.len());
        let mut loras = Vec::with_capacity(self.layers.len());
        for li in 0..self.layers.len() {
            loras.push(lora.map(super::lora::Lora::replay));
            let y = self.block(li, &x, None, &around, false, self.kept(li, t, tail))?;
            inputs.push(x.detach());
            x = if y.track_op() {
                Var::from_tensor(&y.detach())?.as_tensor().clone()
            } else {
                y
            };
        }
        let top = Var::from_tensor(&x)?;
        let out = self.rms_norm(top.as_tensor(), &self.norm, false)?;
        Ok((
            out,
            Checkpoint {
                base: self.clone(),
                loras,
                ids: ids.clone(),
                mask,
                cos,
                sin,
                inputs,
                top,
                tail,
            },
        ))
    }

    /// What every layer of a forward over `ids` (batch, seq) after `offset` cached
    /// positions needs of the positions: the attention mask and the rotary tables. Refuses
    /// a padding list of another length than the batch and a sequence past the model's
    /// positions.
    fn positions(
        &self,
        ids: &Tensor,
        pads: &[usize],
        offset: usize,
    ) -> Result<(Option<Tensor>, Tensor, Tensor)> {
        let (b, t) = ids.dims2()?;
        if pads.len() != b {
            anyhow::bail!("{} padding lengths for a batch of {b}", pads.len());
        }
        if offset + t > self.cfg.max_position_embeddings {
            anyhow::bail!(
                "sequence of {} positions exceeds max_position_embeddings {}",
                offset + t,
                self.cfg.max_position_embeddings
            );
        }
        if offset + t > ROPE_POSITIONS {
            anyhow::bail!(
                "sequence of {} positions exceeds the {ROPE_POSITIONS} positions this host \
                 supports",
                offset + t
            );
        }
        Ok((
            self.mask(pads, t, offset)?,
            self.cos.narrow(0, offset, t)?,
            self.sin.narrow(0, offset, t)?,
        ))
    }

    /// The token embeddings of `ids` (batch, seq): (batch, seq, hidden).
    fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        Ok(self.embed.index_select(&ids.flatten_all()?, 0)?.reshape((
            b,
            t,
            self.cfg.hidden_size,
        ))?)
    }

    /// lm_head over hidden states (..., hidden) -> (..., vocab), in f32.
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(
            super::frozen::linear(&self.lm_head, hidden, self.kernels.frozen_matmul)?
                .to_dtype(DType::F32)?,
        )
    }

    fn rms_norm(&self, x: &Tensor, w: &Tensor, inference: bool) -> Result<Tensor> {
        let eps = self.cfg.rms_norm_eps as f32;
        Ok(if inference {
            candle_nn::ops::rms_norm(&x.contiguous()?, w, eps)?
        } else if fused::applies(self.kernels.fused_ops, &[x, w]) {
            fused::rms_norm(x, w, eps)?
        } else {
            candle_nn::ops::rms_norm_slow(x, w, eps)?
        })
    }

    /// The additive (batch, 1, t, offset + t) mask, or None when nothing is masked.
    fn mask(&self, pads: &[usize], t: usize, offset: usize) -> Result<Option<Tensor>> {
        let kv = offset + t;
        let window = self.cfg.sliding_window;
        let windowed = window.is_some_and(|w| kv > w);
        if t == 1 && pads.iter().all(|&p| p == 0) && !windowed {
            return Ok(None);
        }
        let neg = mask_value(self.dtype) as f32;
        let mut m = Vec::with_capacity(pads.len() * t * kv);
        for &pad in pads {
            for i in 0..t {
                let p = offset + i;
                for j in 0..kv {
                    let masked = j > p || j < pad || window.is_some_and(|w| p - j.min(p) >= w);
                    m.push(if masked { neg } else { 0.0 });
                }
            }
        }
        let m = Tensor::from_vec(m, (pads.len(), 1, t, kv), &self.device)?.to_dtype(self.dtype)?;
        Ok(Some(m))
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor, inference: bool) -> Result<Tensor> {
        let rot = self.cfg.rotary_dim();
        let hd = self.cfg.head_dim;
        let apply = |x: &Tensor| -> Result<Tensor> {
            Ok(if inference {
                candle_nn::rotary_emb::rope(&x.contiguous()?, cos, sin)?
            } else if fused::applies(self.kernels.fused_ops, &[x, cos, sin]) {
                fused::rope(x, cos, sin)?
            } else {
                candle_nn::rotary_emb::rope_slow(x, cos, sin)?
            })
        };
        if rot == hd {
            apply(x)
        } else {
            let xr = apply(&x.narrow(D::Minus1, 0, rot)?)?;
            let xp = x.narrow(D::Minus1, rot, hd - rot)?;
            Ok(Tensor::cat(&[&xr, &xp], D::Minus1)?)
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        x: &Tensor,
        li: usize,
        layer: &Layer,
        kv: Option<(&mut Option<(Tensor, Tensor)>, usize)>,
        around: &Around<'_>,
        inference: bool,
        keep: usize,
    ) -> Result<Tensor> {
        let Around {
            mask,
            cos,
            sin,
            lora,
        } = *around;
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        // Queries for the last `keep` positions; keys and values for all of them.
        let last = |x: &Tensor| -> Result<Tensor> {
            Ok(if keep < t {
                x.narrow(1, t - keep, keep)?
            } else {
                x.clone()
            })
        };
        let (q, k, v) = match &layer.qkv {
            Qkv::Split { q, k, v } => (
                q.fwd(
                    &last(x)?.contiguous()?,
                    li,
                    Target::Q,
                    lora,
                    !inference,
                    self.kernels,
                )?,
                k.fwd(x, li, Target::K, lora, !inference, self.kernels)?,
                v.fwd(x, li, Target::V, lora, !inference, self.kernels)?,
            ),
            Qkv::Fused(qkv) => {
                let y = qkv.fwd(x, li, Target::Qkv, lora, !inference, self.kernels)?;
                (
                    last(&y.narrow(D::Minus1, 0, nh * hd)?)?,
                    y.narrow(D::Minus1, nh * hd, nkv * hd)?,
                    y.narrow(D::Minus1, (nh + nkv) * hd, nkv * hd)?,
                )
            }
        };
        let q = q.reshape((b, keep, nh, hd))?.transpose(1, 2)?;
        let k = k.reshape((b, t, nkv, hd))?.transpose(1, 2)?;
        let v = v.reshape((b, t, nkv, hd))?.transpose(1, 2)?;
        let (mask, q) = if keep < t {
            let (cq, sq) = (
                cos.narrow(0, t - keep, keep)?,
                sin.narrow(0, t - keep, keep)?,
            );
            let mask = mask.map(|m| m.narrow(2, t - keep, keep)).transpose()?;
            (mask, self.rope(&q, &cq, &sq, inference)?)
        } else {
            (mask.cloned(), self.rope(&q, cos, sin, inference)?)
        };
        // From here on, t counts the query positions (the mask's rows).
        let (mask, t) = (mask.as_ref(), keep);
        let k = self.rope(&k, cos, sin, inference)?;
        let (k, v) = match kv {
            Some((slot, len)) => append_kv(slot, len, &k, &v)?,
            None => (k.contiguous()?, v.contiguous()?),
        };
        let n_rep = nh / nkv;
        let s = k.dim(2)?;
        let scale = 1.0 / (hd as f64).sqrt();
        // Decoding: a few new positions against the cache in one kernel (rows.rs); the batched
        // matmuls below spent more time packing operands than multiplying.
        if inference && t <= 4 {
            let q = q.contiguous()?;
            if let Some(y) = super::rows::decode_attention(&q, &k, &v, mask, scale as f32)? {
                let y = y.transpose(1, 2)?.reshape((b, t, nh * hd))?;
                return layer.o.fwd(&y, li, Target::O, lora, false, self.kernels);
            }
        }
        // Grouped-query attention without repeating K and V: the n_rep query heads that share
        // a KV head are adjacent, so (b, nh, t, hd) reshapes for free to (b, nkv, n_rep * t, hd)
        // and multiplies that head's keys and values once.
        let q = q.contiguous()?.reshape((b, nkv, n_rep * t, hd))?;
        let y = if fused::applies(self.kernels.fused_ops, &[&q, &k, &v]) {
            // The scores are turned into weights in place; on the training path the whole
            // product is one node of the graph.
            if inference {
                fused::attention_inference(&q, &k, &v, t, scale, mask)?
            } else {
                fused::attention(&q, &k, &v, t, scale, mask)?
            }
        } else {
            let scores = q.matmul(&k.t()?)?.reshape((b, nh, t, s))?;
            let mut att = (scores * scale)?;
            if let Some(m) = mask {
                att = att.broadcast_add(m)?;
            }
            let att32 = att.to_dtype(DType::F32)?;
            let p = if inference {
                candle_nn::ops::softmax_last_dim(&att32)?
            } else {
                candle_nn::ops::softmax(&att32, D::Minus1)?
            };
            let p = p.to_dtype(q.dtype())?.reshape((b, nkv, n_rep * t, s))?;
            p.matmul(&v)?
        };
        let y = y.reshape((b, nh, t, hd))?;
        let y = y.transpose(1, 2)?.reshape((b, t, nh * hd))?;
        layer
            .o
            .fwd(&y, li, Target::O, lora, !inference, self.kernels)
    }

    fn mlp(
        &self,
        x: &Tensor,
        li: usize,
        layer: &Layer,
        lora: Option<&dyn Adapter>,
        train: bool,
    ) -> Result<Tensor> {
        let (g, u) = match &layer.gate_up {
            GateUp::Split { gate, up } => (
                gate.fwd(x, li, Target::Gate, lora, train, self.kernels)?,
                up.fwd(x, li, Target::Up, lora, train, self.kernels)?,
            ),
            GateUp::Fused(gu) => {
                let y = gu.fwd(x, li, Target::GateUp, lora, train, self.kernels)?;
                let i = self.cfg.intermediate_size;
                (y.narrow(D::Minus1, 0, i)?, y.narrow(D::Minus1, i, i)?)
            }
        };
        let gated = match self.cfg.hidden_act {
            // One pass, rounded alike with or without a graph (training, prefill, decoding).
            Act::Silu if fused::applies(self.kernels.fused_ops, &[&g, &u]) => {
                fused::silu_mul(&g, &u)?
            }
            Act::Silu => (g.silu()? * u)?,
            Act::GeluTanh => (g.gelu()? * u)?,
            Act::Gelu => (g.gelu_erf()? * u)?,
        };
        layer
            .down
            .fwd(&gated, li, Target::Down, lora, train, self.kernels)
    }
}

/// cos and sin tables (max_positions, rotary_dim / 2) in f32.
/// The most positions one sequence may span on this host (the rope tables' rows).
pub const ROPE_POSITIONS: usize = 1 << 17;

fn rope_tables(cfg: &Config, dev: &Device) -> Result<(Tensor, Tensor)> {
    let dim = cfg.rotary_dim();
    let base: Vec<f32> = (0..dim)
        .step_by(2)
        .map(|i| 1f32 / (cfg.rope_theta as f32).powf(i as f32 / dim as f32))
        .collect();
    let inv_freq: Vec<f32> = match &cfg.rope_scaling {
        RopeScaling::None => base,
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let orig = *original_max_position_embeddings as f32;
            let low_wavelen = orig / low_freq_factor;
            let high_wavelen = orig / high_freq_factor;
            base.into_iter()
                .map(|freq| {
                    let wavelen = 2.0 * std::f32::consts::PI / freq;
                    if wavelen < high_wavelen {
                        freq
                    } else if wavelen > low_wavelen {
                        freq / factor
                    } else {
                        let smooth = (orig / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * freq / factor + smooth * freq
                    }
                })
                .collect()
        }
    };
    // The tables cover the positions a sequence here can reach: the model's context, up to
    // ROPE_POSITIONS (64 MiB of tables at head_dim 128), not whatever the config claims.
    let n = cfg.max_position_embeddings.min(ROPE_POSITIONS);
    let inv = Tensor::from_vec(inv_freq, (1, dim / 2), dev)?;
    let t = Tensor::arange(0u32, n as u32, dev)?
        .to_dtype(DType::F32)?
        .reshape((n, 1))?;
    let freqs = t.matmul(&inv).context("rope tables")?;
    Ok((freqs.cos()?, freqs.sin()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cached step must not hold the autograd graph of the steps before it: over trainable
    /// weights that graph grows with every generated token.
    #[test]
    fn the_kv_cache_holds_no_graph_over_trainable_weights() {
        let cfg = Config::from_hf_json(
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":16,"intermediate_size":32,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,
            "vocab_size":32,"rms_norm_eps":1e-5,"max_position_embeddings":64}"#,
        )
        .unwrap();
        let varmap = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let base = Base::new(&cfg, vb).unwrap();
        let mut cache = KvCache::new(2);
        let ids = Tensor::new(&[[1u32, 2, 3]], &Device::Cpu).unwrap();
        base.forward(&ids, &[0], Some(&mut cache), None, Pass::Inference)
            .unwrap();
        let vars = varmap.all_vars();
        for (k, v) in cache.kvs.iter().flatten() {
            for t in [k, v] {
                let grads = t.sum_all().unwrap().backward().unwrap();
                let reached = vars.iter().filter(|v| grads.get(v.as_tensor()).is_some());
                assert_eq!(reached.count(), 0, "the cache reaches trainable weights");
            }
        }
    }

    /// A row's keys computed after 7 padding positions equal its keys computed alone and
    /// turned by 7 positions (and back): what a prefix cache does to place a row in a batch.
    /// Every rotary layout: Llama 3 scaling, partial rotary, a head_dim of its own.
    #[test]
    fn turned_keys_equal_keys_computed_at_the_other_positions() {
        for json in [
            r#"{"architectures":["LlamaForCausalLM"],"hidden_size":32,"intermediate_size":32,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,
            "vocab_size":32,"rms_norm_eps":1e-5,"max_position_embeddings":64,
            "rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
            "original_max_position_embeddings":16,"rope_type":"llama3"}}"#,
            r#"{"architectures":["Phi3ForCausalLM"],"hidden_size":32,"intermediate_size":32,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":2,
            "vocab_size":32,"rms_norm_eps":1e-5,"max_position_embeddings":64,
            "partial_rotary_factor":0.5,"rope_scaling":null}"#,
            r#"{"architectures":["MistralForCausalLM"],"hidden_size":32,"intermediate_size":32,
            "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":24,
            "vocab_size":32,"rms_norm_eps":1e-5,"max_position_embeddings":64}"#,
        ] {
            let cfg = Config::from_hf_json(json).unwrap();
            let varmap = VarMap::new();
            let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let base = Base::new(&cfg, vb).unwrap();
            for (i, var) in varmap.all_vars().iter().enumerate() {
                let t = Tensor::randn(0f32, 1.0, var.dims(), &Device::Cpu).unwrap();
                var.set(&(t * (0.5 + i as f64 * 1e-3)).unwrap()).unwrap();
            }
            let row: Vec<u32> = (3..15).collect();
            let padded = [vec![0; 7], row.clone()].concat();
            let run = |ids: Vec<u32>, pad: usize| {
                let mut cache = KvCache::new(2);
                let n = ids.len();
                let ids = Tensor::from_vec(ids, (1, n), &Device::Cpu).unwrap();
                base.forward(&ids, &[pad], Some(&mut cache), None, Pass::Inference)
                    .unwrap();
                cache.row(0, pad).unwrap().remove(1)
            };
            let diff = |a: &Tensor, b: &Tensor| -> f32 {
                (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            let (k_alone, v_alone) = run(row.clone(), 0);
            let (k_after, v_after) = run(padded, 7);
            let turned = base.shift_keys(&k_alone, 7).unwrap();
            assert!(diff(&turned, &k_after) < 1e-4, "{json}");
            assert!(diff(&k_alone, &k_after) > 1e-3, "the rotation matters");
            let back = base.shift_keys(&k_after, -7).unwrap();
            assert!(diff(&back, &k_alone) < 1e-4);
            assert!(diff(&v_alone, &v_after) < 1e-4);
        }
    }
}
