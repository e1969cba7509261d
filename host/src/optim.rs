//! The optimizer and the learning-rate schedule every trainer uses (PPO, SFT, the learned
//! verifier, the warm start): AdamW with decoupled weight decay over named parameters, whose
//! state (moments and step) is saved in checkpoints so that a resumed run continues exactly,
//! and linear warmup then linear decay.
//!
//! candle-nn's `AdamW` keeps its moments private and applies one decay to every parameter;
//! this one exempts norms and biases from decay (the usual practice for full fine-tuning) and
//! accumulates gradients over micro-batches before a step.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context};
use candle_core::{backprop::GradStore, DType, Tensor, Var};

use crate::distributed::World;
use crate::model::Checkpoint;

/// AdamW's hyper-parameters (learning rate aside, which the schedule sets every step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled decay, applied to weight matrices only (see [`decays`]).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

/// Whether a parameter named `name` gets weight decay: not biases, norms or embeddings'
/// norms (`*.bias`, `*norm*`), nor the value head's bias.
pub fn decays(name: &str) -> bool {
    !(name.ends_with("bias") || name.contains("norm"))
}

struct Param {
    name: String,
    var: Var,
    m: Tensor,
    v: Tensor,
    decay: bool,
    /// Gradient summed over the micro-batches since the last step.
    grad: Option<Tensor>,
}

pub struct AdamW {
    params: Vec<Param>,
    cfg: AdamWConfig,
    lr: f64,
    step: u64,
}

impl AdamW {
    /// `named` must have unique names; the order is kept (it is the checkpoint's order).
    pub fn new(named: Vec<(String, Var)>, lr: f64, cfg: AdamWConfig) -> anyhow::Result<AdamW> {
        let mut params = Vec::with_capacity(named.len());
        let mut seen = std::collections::HashSet::new();
        for (name, var) in named {
            if !seen.insert(name.clone()) {
                bail!("AdamW: parameter `{name}` is listed twice");
            }
            let zeros = var.zeros_like()?.to_dtype(DType::F32)?;
            params.push(Param {
                decay: decays(&name),
                name,
                var,
                m: zeros.clone(),
                v: zeros,
                grad: None,
            });
        }
        Ok(AdamW {
            params,
            cfg,
            lr,
            step: 0,
        })
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    /// Optimizer steps taken.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Adds this backward pass's gradients to the pending ones.
    ///
    /// Detached first: candle leaves a parameter's gradient attached to the graph it was
    /// computed from (`dL/dW = gᵀ·x` keeps the activation `x` and everything `x` came from),
    /// and the moments are computed from the gradient, so an attached gradient would chain
    /// every step's forward pass to the next one through `m` and `v` and nothing would ever
    /// be freed (the warm start grew by ~170 MB a step and was OOM-killed).
    pub fn accumulate(&mut self, grads: &GradStore) -> anyhow::Result<()> {
        for p in &mut self.params {
            if let Some(g) = grads.get(p.var.as_tensor()) {
                let g = g.detach().to_dtype(DType::F32)?;
                p.grad = Some(match p.grad.take() {
                    Some(acc) => (acc + g)?,
                    None => g,
                });
            }
        }
        Ok(())
    }

    /// This backward pass's gradients as one flat f32 vector in parameter order, with one
    /// byte per parameter saying whether it has a gradient (absent ones take no room): what
    /// one rank sends the others in data-parallel training.
    pub fn flatten(&self, grads: &GradStore) -> anyhow::Result<(Vec<u8>, Vec<f32>)> {
        let (mut present, mut flat) = (Vec::with_capacity(self.params.len()), Vec::new());
        for p in &self.params {
            match grads.get(p.var.as_tensor()) {
                Some(g) => {
                    present.push(1);
                    flat.extend(
                        g.detach()
                            .to_dtype(DType::F32)?
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    );
                }
                None => present.push(0),
            }
        }
        Ok((present, flat))
    }

    /// Adds gradients [`flatten`](Self::flatten) made (on this rank or another) to the
    /// pending ones, exactly as [`accumulate`](Self::accumulate) adds a backward pass's.
    pub fn accumulate_flat(&mut self, present: &[u8], flat: &[f32]) -> anyhow::Result<()> {
        if present.len() != self.params.len() {
            bail!(
                "gradients of {} parameters, this optimizer has {}",
                present.len(),
                self.params.len()
            );
        }
        let mut at = 0;
        for (p, &has) in self.params.iter_mut().zip(present) {
            if has == 0 {
                continue;
            }
            let n = p.var.elem_count();
            let Some(values) = flat.get(at..at + n) else {
                bail!(
                    "gradients end before parameter `{}` ({} values for {n} more)",
                    p.name,
                    flat.len() - at.min(flat.len())
                );
            };
            at += n;
            let g = Tensor::from_slice(values, p.var.shape(), p.var.device())?;
            p.grad = Some(match p.grad.take() {
                Some(acc) => (acc + g)?,
                None => g,
            });
        }
        if at != flat.len() {
            bail!(
                "{} gradient values for parameters of {at} values",
                flat.len()
            );
        }
        Ok(())
    }

    /// Global L2 norm of the pending gradients.
    ///
    /// Each tensor's sum of squares is taken where the tensor lives and all of them are read
    /// back at once: on a GPU every read is a synchronisation, and an agent has hundreds of
    /// trainable tensors. They are added in f64, in parameter order.
    pub fn grad_norm(&self) -> anyhow::Result<f64> {
        let sums = self
            .params
            .iter()
            .filter_map(|p| p.grad.as_ref())
            .map(|g| g.sqr()?.sum_all()?.reshape(1))
            .collect::<candle_core::Result<Vec<_>>>()?;
        if sums.is_empty() {
            return Ok(0.0);
        }
        let sq: f64 = Tensor::cat(&sums, 0)?
            .to_vec1::<f32>()?
            .into_iter()
            .map(f64::from)
            .sum();
        Ok(sq.sqrt())
    }

    /// Clips the pending gradients to `max_norm` (global norm; `f64::INFINITY` for none),
    /// takes one AdamW step and clears them. Returns the norm before clipping.
    pub fn step(&mut self, max_norm: f64) -> anyhow::Result<f64> {
        let norm = self.grad_norm()?;
        if !norm.is_finite() {
            // A NaN or infinite gradient would write NaN into every weight and moment.
            for p in &mut self.params {
                p.grad = None;
            }
            bail!(
                "the gradient norm is {norm}: a loss or gradient is not finite; no weight or \
                 optimizer state was changed"
            );
        }
        let scale = if norm > max_norm {
            max_norm / (norm + 1e-6)
        } else {
            1.0
        };
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.cfg.beta1, self.cfg.beta2);
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        for p in &mut self.params {
            let Some(g) = p.grad.take() else { continue };
            let g = (g * scale)?;
            // Everything here is detached (see `accumulate`): the moments live across steps
            // and must hold values, never a graph.
            p.m = ((&p.m * b1)? + (&g * (1.0 - b1))?)?.detach();
            p.v = ((&p.v * b2)? + (g.sqr()? * (1.0 - b2))?)?.detach();
            let update = ((&p.m / c1)? / ((&p.v / c2)?.sqrt()? + self.cfg.eps)?)?;
            let theta = p.var.as_tensor().detach().to_dtype(DType::F32)?;
            let theta = if p.decay && self.cfg.weight_decay > 0.0 {
                (theta * (1.0 - self.lr * self.cfg.weight_decay))?
            } else {
                theta
            };
            let next = (theta - (update * self.lr)?)?;
            p.var.set(&next.to_dtype(p.var.dtype())?)?;
        }
        Ok(norm)
    }

    /// Writes the moments (`m.NAME`, `v.NAME`) and the step count (`step`) as safetensors.
    pub fn save(&self, path: &Path) -> anyhow::Result<()> {
        let dev = self
            .params
            .first()
            .map(|p| p.var.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let mut t: HashMap<String, Tensor> = HashMap::new();
        for p in &self.params {
            t.insert(format!("m.{}", p.name), p.m.clone());
            t.insert(format!("v.{}", p.name), p.v.clone());
        }
        t.insert(
            "step".into(),
            Tensor::new(&[self.step as i64], &dev)?.to_device(&candle_core::Device::Cpu)?,
        );
        candle_core::safetensors::save(&t, path)
            .with_context(|| format!("writing optimizer state {}", path.display()))
    }

    /// Reads the state [`save`](Self::save) wrote; every parameter must be there with its
    /// shape, and nothing else.
    pub fn load_state(&mut self, path: &Path) -> anyhow::Result<()> {
        let dev = self
            .params
            .first()
            .map(|p| p.var.device().clone())
            .unwrap_or(candle_core::Device::Cpu);
        let f = candle_core::safetensors::load(path, &dev)
            .with_context(|| format!("reading optimizer state {}", path.display()))?;
        let step = f
            .get("step")
            .ok_or_else(|| anyhow!("{}: no `step` tensor", path.display()))?
            .to_vec1::<i64>()?;
        let expected = 2 * self.params.len() + 1;
        if f.len() != expected {
            bail!(
                "{}: holds {} tensors, this optimizer has {} (is it another model or adapter \
                 config?)",
                path.display(),
                f.len(),
                expected
            );
        }
        for p in &mut self.params {
            for (kind, slot) in [("m", &mut p.m), ("v", &mut p.v)] {
                let key = format!("{kind}.{}", p.name);
                let x = f
                    .get(&key)
                    .ok_or_else(|| anyhow!("{}: tensor `{key}` is missing", path.display()))?;
                if x.dims() != p.var.dims() {
                    bail!(
                        "{}: tensor `{key}` has shape {:?}, the parameter has {:?}",
                        path.display(),
                        x.dims(),
                        p.var.dims()
                    );
                }
                *slot = x.to_dtype(DType::F32)?;
            }
            p.grad = None;
        }
        self.step = step.first().copied().unwrap_or(0).max(0) as u64;
        Ok(())
    }
}

/// An agent's optimizer: AdamW over its trainable parameters (adapter and value head, or
/// the whole model when fully fine-tuned), with state that checkpoints.
pub struct AgentOptimizer {
    adamw: AdamW,
}

impl AgentOptimizer {
    /// AdamW over an agent's named trainable parameters (e.g.
    /// [`Agent::named_trainable_vars`]); `weight_decay` skips norms and biases.
    pub fn new(
        named: Vec<(String, candle_core::Var)>,
        lr: f64,
        weight_decay: f64,
    ) -> anyhow::Result<AgentOptimizer> {
        if named.is_empty() {
            bail!("the agent has nothing to train: give it a LoRA adapter or a value head");
        }
        let adamw = AdamW::new(
            named,
            lr,
            AdamWConfig {
                weight_decay,
                ..AdamWConfig::default()
            },
        )?;
        Ok(AgentOptimizer { adamw })
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.adamw.set_lr(lr);
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.adamw.steps()
    }

    /// Writes AdamW's moments and step count.
    pub fn save(&self, path: &std::path::Path) -> anyhow::Result<()> {
        self.adamw.save(path)
    }

    /// Restores what [`save`](Self::save) wrote.
    pub fn load(&mut self, path: &std::path::Path) -> anyhow::Result<()> {
        self.adamw.load_state(path)
    }

    /// Adds `grads` (of one micro-batch's loss) to the gradients of the next step.
    pub fn accumulate(&mut self, grads: &GradStore) -> anyhow::Result<()> {
        self.adamw.accumulate(grads)
    }

    /// See [`AdamW::flatten`].
    pub fn flatten(&self, grads: &GradStore) -> anyhow::Result<(Vec<u8>, Vec<f32>)> {
        self.adamw.flatten(grads)
    }

    /// See [`AdamW::accumulate_flat`].
    pub fn accumulate_flat(&mut self, present: &[u8], flat: &[f32]) -> anyhow::Result<()> {
        self.adamw.accumulate_flat(present, flat)
    }

    /// One AdamW step on the accumulated gradients, clipped to `max_norm`; returns the
    /// gradient norm before clipping.
    pub fn step(&mut self, max_norm: f64) -> anyhow::Result<f64> {
        self.adamw.step(max_norm)
    }

    /// Backpropagates `loss`, clips to `max_norm` and steps (a plain supervised update, e.g.
    /// SFT); returns the gradient norm before clipping.
    pub fn minimize(&mut self, loss: &Tensor, max_norm: f64) -> anyhow::Result<f64> {
        self.adamw.accumulate(&loss.backward()?)?;
        self.adamw.step(max_norm)
    }
}

/// One rank's micro-batch of a data-parallel update: its place in the minibatch, its
/// weighted loss statistics (PPO: policy, value, entropy, approx. KL, clip fraction; SFT and
/// the verifier: the loss) and its gradients ([`AgentOptimizer::flatten`]).
pub(crate) struct Part {
    pub(crate) index: u32,
    pub(crate) stats: [f32; 5],
    pub(crate) present: Vec<u8>,
    pub(crate) grads: Vec<f32>,
}

impl Part {
    fn encode(parts: &[Part]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend((parts.len() as u32).to_le_bytes());
        for p in parts {
            out.extend(p.index.to_le_bytes());
            out.extend(p.stats.iter().flat_map(|v| v.to_le_bytes()));
            out.extend((p.present.len() as u32).to_le_bytes());
            out.extend(&p.present);
            out.extend((p.grads.len() as u64).to_le_bytes());
            out.extend(p.grads.iter().flat_map(|v| v.to_le_bytes()));
        }
        out
    }

    fn decode(bytes: &[u8], rank: usize) -> anyhow::Result<Vec<Part>> {
        let mut at = 0;
        let mut take = |n: usize| -> anyhow::Result<&[u8]> {
            let s = bytes.get(at..at + n).with_context(|| {
                format!("rank {rank}'s gradients end after {} bytes", bytes.len())
            })?;
            at += n;
            Ok(s)
        };
        let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let f32s = |b: &[u8]| -> Vec<f32> {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        let n = u32_of(take(4)?);
        let mut parts = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let index = u32_of(take(4)?);
            let s = f32s(take(20)?);
            let np = u32_of(take(4)?) as usize;
            let present = take(np)?.to_vec();
            let b = take(8)?;
            let ng = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            let grads = f32s(take(ng as usize * 4)?);
            parts.push(Part {
                index,
                stats: [s[0], s[1], s[2], s[3], s[4]],
                present,
                grads,
            });
        }
        Ok(parts)
    }
}

/// Every rank's [`Part`]s of one optimizer step, in the parts' order (their `index`), on
/// every rank; `expected` is how many the ranks compute between them, all told.
pub(crate) fn gather_parts(
    world: &dyn World,
    mine: &[Part],
    expected: usize,
) -> anyhow::Result<Vec<Part>> {
    let mut all = Vec::with_capacity(expected);
    for (r, bytes) in world
        .all_gather_bytes(&Part::encode(mine))?
        .iter()
        .enumerate()
    {
        all.extend(Part::decode(bytes, r)?);
    }
    all.sort_by_key(|p| p.index);
    if all.len() != expected {
        bail!(
            "the ranks computed {} micro-batches of a minibatch of {expected}: they are not \
             training on the same batch",
            all.len()
        );
    }
    Ok(all)
}

/// A loss to minimize, and, when its forward was checkpointed, what completes its backward
/// below the last layer for the tensors being trained.
pub(crate) struct Loss {
    pub(crate) value: Tensor,
    pub(crate) checkpoint: Option<(Checkpoint, Vec<Var>)>,
}

impl Loss {
    fn value(&self) -> anyhow::Result<f32> {
        Ok(self.value.to_scalar::<f32>()?)
    }

    /// The gradients of every tensor being trained.
    pub(crate) fn gradients(self) -> anyhow::Result<GradStore> {
        let grads = self.value.backward()?;
        Ok(match self.checkpoint {
            Some((checkpoint, vars)) => checkpoint.backward(grads, &vars)?,
            None => grads,
        })
    }
}

/// One optimizer step on a minibatch of `n` items shared between `world`'s ranks (a
/// supervised update: SFT, the learned verifier). Rank r computes `part(range)` over its
/// contiguous share of the items ([`shard`](crate::distributed::shard)): the loss of those
/// items, weighted so that the parts add up to the minibatch's loss, and that weighted
/// loss's value; the ranks exchange the gradients and every rank adds them in rank order
/// before the step, so every rank takes the same step, the one a single process takes on
/// the whole minibatch (up to the rounding of the sum). On one rank it is `part(0..n)`, its
/// gradients and a step, as without ranks. Returns the gradient norm before
/// clipping and the minibatch's loss (the parts' values summed in rank order).
pub(crate) fn shared_step(
    world: &dyn World,
    optimizer: &mut AgentOptimizer,
    n: usize,
    max_norm: f64,
    mut part: impl FnMut(std::ops::Range<usize>) -> anyhow::Result<Loss>,
) -> anyhow::Result<(f64, f32)> {
    let (rank, size) = (world.rank(), world.size());
    if size == 1 {
        let loss = part(0..n)?;
        let value = loss.value()?;
        optimizer.accumulate(&loss.gradients()?)?;
        return Ok((optimizer.step(max_norm)?, value));
    }
    let share = crate::distributed::shard(n, rank, size);
    let mine = if share.is_empty() {
        Vec::new()
    } else {
        let loss = part(share)?;
        let value = loss.value()?;
        let (present, grads) = optimizer.flatten(&loss.gradients()?)?;
        vec![Part {
            index: rank as u32,
            stats: [value, 0.0, 0.0, 0.0, 0.0],
            present,
            grads,
        }]
    };
    // The ranks with a share (all of them unless the minibatch has fewer items than ranks).
    let all =
        gather_parts(world, &mine, n.min(size)).context("exchanging the minibatch's gradients")?;
    let mut loss = 0.0f32;
    for p in &all {
        optimizer.accumulate_flat(&p.present, &p.grads)?;
        loss += p.stats[0];
    }
    Ok((optimizer.step(max_norm)?, loss))
}

/// The learning rate at `step` of `steps`: linear warmup over `warmup` steps, then linear
/// decay to `final_fraction` of `base` at the last step (the paper: decay to 0.1×).
pub fn learning_rate(
    step: usize,
    steps: usize,
    warmup: usize,
    base: f64,
    final_fraction: f64,
) -> f64 {
    if step < warmup {
        return base * (step + 1) as f64 / warmup as f64;
    }
    let span = steps.saturating_sub(warmup).saturating_sub(1).max(1);
    let progress = ((step - warmup) as f64 / span as f64).min(1.0);
    base * (1.0 - progress * (1.0 - final_fraction))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn var(x: &[f32]) -> Var {
        Var::new(x, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_gradient_norm_adds_every_tensors_squares_in_f64() {
        // Three tensors of different sizes with pending gradients and one without: the norm
        // is the square root of all the squares, those of the tensor without none.
        let (a, b, c, idle) = (
            var(&[0.3, -1.7, 2.1]),
            var(&[0.11, 0.5]),
            var(&[4.0]),
            var(&[9.0]),
        );
        let named = ["a", "b", "c", "idle"]
            .iter()
            .zip([&a, &b, &c, &idle])
            .map(|(n, v)| (n.to_string(), (*v).clone()))
            .collect();
        let mut opt = AdamW::new(named, 0.01, AdamWConfig::default()).unwrap();
        assert_eq!(opt.grad_norm().unwrap(), 0.0, "no gradient yet");
        // d/dx of sum(x^2) is 2x, of sum(3x) is 3.
        let loss = ((a.as_tensor().sqr().unwrap().sum_all().unwrap()
            + b.as_tensor().sqr().unwrap().sum_all().unwrap())
        .unwrap()
            + (c.as_tensor() * 3.0).unwrap().sum_all().unwrap())
        .unwrap();
        opt.accumulate(&loss.backward().unwrap()).unwrap();
        let want: f64 = [0.6f64, -3.4, 4.2, 0.22, 1.0, 3.0]
            .iter()
            .map(|g| g * g)
            .sum::<f64>()
            .sqrt();
        let got = opt.grad_norm().unwrap();
        assert!((got - want).abs() < 1e-6 * want, "{got} against {want}");
    }

    #[test]
    fn gradients_sent_flat_and_added_in_order_are_the_ones_added_directly() {
        // Two micro-batches' gradients, added directly on one optimizer and through
        // flatten/accumulate_flat (what data-parallel ranks exchange) on another: the same
        // bits, and a parameter no loss touched stays without a gradient.
        let make = || {
            let (a, b, idle) = (var(&[0.3, -1.7, 2.1]), var(&[0.11, 0.5]), var(&[4.0]));
            let named = vec![
                ("a".to_string(), a.clone()),
                ("b".to_string(), b.clone()),
                ("idle".to_string(), idle),
            ];
            (
                AdamW::new(named, 0.01, AdamWConfig::default()).unwrap(),
                a,
                b,
            )
        };
        let loss = |a: &Var, b: &Var, k: f64| {
            ((a.as_tensor().sqr().unwrap().sum_all().unwrap() * k).unwrap()
                + (b.as_tensor().exp().unwrap().sum_all().unwrap() * (1.0 / k)).unwrap())
            .unwrap()
        };
        let (mut direct, a, b) = make();
        let (mut sent, a2, b2) = make();
        for k in [0.37, 1.9] {
            direct
                .accumulate(&loss(&a, &b, k).backward().unwrap())
                .unwrap();
            let (present, flat) = sent
                .flatten(&loss(&a2, &b2, k).backward().unwrap())
                .unwrap();
            assert_eq!(present, vec![1, 1, 0]);
            assert_eq!(flat.len(), 5);
            sent.accumulate_flat(&present, &flat).unwrap();
        }
        let grads = |o: &AdamW| -> Vec<Option<Vec<f32>>> {
            o.params
                .iter()
                .map(|p| p.grad.as_ref().map(|g| g.to_vec1::<f32>().unwrap()))
                .collect()
        };
        assert_eq!(grads(&direct), grads(&sent));
        assert!(grads(&sent)[2].is_none());
        direct.step(1.0).unwrap();
        sent.step(1.0).unwrap();
        assert_eq!(
            a.as_tensor().to_vec1::<f32>().unwrap(),
            a2.as_tensor().to_vec1::<f32>().unwrap()
        );
        // Malformed gradients are refused, saying what is wrong.
        let err = sent.accumulate_flat(&[1, 1], &[0.0; 5]).unwrap_err();
        assert!(err
            .to_string()
            .contains("gradients of 2 parameters, this optimizer has 3"));
        let err = sent.accumulate_flat(&[1, 1, 0], &[0.0; 4]).unwrap_err();
        assert!(
            err.to_string()
                .contains("gradients end before parameter `b`"),
            "{err}"
        );
    }

    #[test]
    fn first_step_moves_each_weight_by_lr_against_its_gradient_sign() {
        // With bias correction, AdamW's first update is lr·g/(|g|+eps) = lr·sign(g).
        let w = var(&[1.0, -2.0, 3.0]);
        let mut opt =
            AdamW::new(vec![("w".into(), w.clone())], 0.1, AdamWConfig::default()).unwrap();
        let loss = (w.as_tensor() * Tensor::new(&[2.0f32, -1.0, 0.5], &Device::Cpu).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        opt.accumulate(&loss.backward().unwrap()).unwrap();
        let norm = opt.step(f64::INFINITY).unwrap();
        assert!((norm - (4.0f64 + 1.0 + 0.25).sqrt()).abs() < 1e-6);
        let got = w.as_tensor().to_vec1::<f32>().unwrap();
        for (g, e) in got.iter().zip([0.9f32, -1.9, 2.9]) {
            assert!((g - e).abs() < 1e-5, "{got:?}");
        }
    }

    #[test]
    fn the_moments_hold_values_not_the_graph_their_gradients_came_from() {
        // dL/dw = a, where `a` is an activation computed from another parameter: candle
        // hands back a gradient still attached to `a`'s graph.
        let (w, x) = (var(&[1.0, 2.0]), var(&[3.0, 4.0]));
        let mut opt =
            AdamW::new(vec![("w".into(), w.clone())], 0.1, AdamWConfig::default()).unwrap();
        for _ in 0..3 {
            let a = (x.as_tensor() * 2.0).unwrap();
            let loss = (w.as_tensor() * &a).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            assert!(
                grads.get(w.as_tensor()).unwrap().track_op(),
                "the premise: candle's gradient is attached"
            );
            opt.accumulate(&grads).unwrap();
            assert!(!opt.params[0].grad.as_ref().unwrap().track_op());
            opt.step(f64::INFINITY).unwrap();
            let p = &opt.params[0];
            assert!(!p.m.track_op() && !p.v.track_op(), "a moment kept a graph");
        }
    }

    #[test]
    fn a_non_finite_gradient_changes_nothing_and_says_so() {
        let w = var(&[1.0, 2.0]);
        let mut opt =
            AdamW::new(vec![("w".into(), w.clone())], 0.1, AdamWConfig::default()).unwrap();
        for bad in [f32::NAN, f32::INFINITY, 3e38] {
            // 3e38 is finite, its square is not: the norm overflows.
            let scale = Tensor::new(&[bad, 1.0], &Device::Cpu).unwrap();
            let loss = (w.as_tensor() * &scale).unwrap().sum_all().unwrap();
            opt.accumulate(&loss.backward().unwrap()).unwrap();
            let err = opt.step(1.0).unwrap_err().to_string();
            assert!(err.contains("not finite"), "{err}");
            assert_eq!(w.as_tensor().to_vec1::<f32>().unwrap(), vec![1.0, 2.0]);
            assert_eq!(opt.steps(), 0);
            assert_eq!(opt.params[0].m.to_vec1::<f32>().unwrap(), vec![0.0, 0.0]);
        }
        // The next finite step works.
        let loss = w.as_tensor().sum_all().unwrap();
        opt.accumulate(&loss.backward().unwrap()).unwrap();
        opt.step(1.0).unwrap();
        assert_eq!(opt.steps(), 1);
    }

    #[test]
    fn decay_skips_norms_and_biases() {
        assert!(decays("model.layers.0.mlp.up_proj.weight"));
        assert!(!decays("model.layers.0.input_layernorm.weight"));
        assert!(!decays("model.norm.weight"));
        assert!(!decays("v_head.summary.bias"));
        let (w, b) = (var(&[1.0]), var(&[1.0]));
        let cfg = AdamWConfig {
            weight_decay: 0.5,
            ..AdamWConfig::default()
        };
        let mut opt = AdamW::new(
            vec![("w".into(), w.clone()), ("b.bias".into(), b.clone())],
            0.1,
            cfg,
        )
        .unwrap();
        // A zero gradient: only decay moves a weight.
        // (Parameters without a gradient are skipped, as in PyTorch, so the graph must
        // reach both: (w + b - 2)^2 has a zero gradient at w = b = 1.)
        let loss = ((w.as_tensor() + b.as_tensor()).unwrap() - 2.0)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        opt.accumulate(&loss.backward().unwrap()).unwrap();
        opt.step(f64::INFINITY).unwrap();
        let got = w.as_tensor().to_vec1::<f32>().unwrap()[0];
        assert!((got - 0.95).abs() < 1e-6, "{got}");
        assert_eq!(b.as_tensor().to_vec1::<f32>().unwrap()[0], 1.0);
    }

    #[test]
    fn saved_state_resumes_the_same_trajectory() {
        let run = |split: bool| -> Vec<f32> {
            let w = var(&[0.5, -0.5]);
            let mut opt =
                AdamW::new(vec![("w".into(), w.clone())], 0.05, AdamWConfig::default()).unwrap();
            let dir = tempfile::tempdir().unwrap();
            for i in 0..6 {
                if split && i == 3 {
                    // Save, then continue with a fresh optimizer loaded from disk.
                    let p = dir.path().join("opt.safetensors");
                    opt.save(&p).unwrap();
                    opt = AdamW::new(vec![("w".into(), w.clone())], 0.05, AdamWConfig::default())
                        .unwrap();
                    opt.load_state(&p).unwrap();
                    assert_eq!(opt.steps(), 3);
                }
                let loss = w.as_tensor().sqr().unwrap().sum_all().unwrap();
                opt.accumulate(&loss.backward().unwrap()).unwrap();
                opt.step(1.0).unwrap();
            }
            w.as_tensor().to_vec1::<f32>().unwrap()
        };
        assert_eq!(run(false), run(true));
        // A state saved for other parameters is refused, naming the missing tensor.
        let w = var(&[0.5, -0.5]);
        let mut opt =
            AdamW::new(vec![("w".into(), w.clone())], 0.05, AdamWConfig::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o.safetensors");
        let other = AdamW::new(
            vec![("x".into(), var(&[1.0, 2.0]))],
            0.1,
            AdamWConfig::default(),
        )
        .unwrap();
        other.save(&p).unwrap();
        let err = opt.load_state(&p).unwrap_err().to_string();
        assert!(err.contains("`m.w` is missing"), "{err}");
    }

    #[test]
    fn warmup_then_linear_decay_to_the_final_fraction() {
        let lr = |s| learning_rate(s, 12, 2, 1.0, 0.1);
        assert_eq!((lr(0), lr(1)), (0.5, 1.0));
        assert_eq!(lr(2), 1.0);
        assert!((lr(11) - 0.1).abs() < 1e-12);
        assert!(lr(6) < lr(5) && lr(6) > 0.1);
        assert_eq!(
            learning_rate(0, 1, 0, 2.0, 0.1),
            2.0,
            "a single step keeps the base rate"
        );
    }

    /// Ranks as threads of one process: each all-gather puts every thread's bytes in a slot
    /// and hands all of them to everyone.
    struct Threads {
        rank: usize,
        size: usize,
        slots: std::sync::Arc<(std::sync::Mutex<Vec<Vec<u8>>>, std::sync::Barrier)>,
    }

    impl World for Threads {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn all_gather_bytes(&self, mine: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
            let (slots, barrier) = &*self.slots;
            slots.lock().unwrap()[self.rank] = mine.to_vec();
            barrier.wait();
            let all = slots.lock().unwrap().clone();
            barrier.wait();
            Ok(all)
        }
        fn broadcast_bytes(&self, root: usize, data: &mut Vec<u8>) -> anyhow::Result<()> {
            let mut all = self.all_gather_bytes(data)?;
            *data = all.swap_remove(root);
            Ok(())
        }
        fn barrier(&self) -> anyhow::Result<()> {
            self.slots.1.wait();
            Ok(())
        }
        fn abort(&self, _code: i32) -> ! {
            panic!("abort")
        }
    }

    /// Three steps of least squares over `n` items per minibatch on `world`: the weights after.
    fn least_squares(world: &dyn World, n: usize) -> Vec<f32> {
        let w = var(&[0.5, -0.25, 1.0]);
        let mut opt =
            AgentOptimizer::new(vec![("w.weight".into(), w.clone())], 0.05, 0.01).unwrap();
        let xs: Vec<[f32; 3]> = (0..n)
            .map(|i| {
                let i = i as f32;
                [1.0, 0.3 * i - 0.7, (0.9 * i).sin()]
            })
            .collect();
        let ys: Vec<f32> = (0..n).map(|i| (i as f32 * 1.3).cos()).collect();
        for _ in 0..3 {
            shared_step(world, &mut opt, n, 1.0, |share| {
                let x: Vec<f32> = xs[share.clone()].iter().flatten().copied().collect();
                let x = Tensor::from_vec(x, (share.len(), 3), &Device::Cpu)?;
                let y = Tensor::from_slice(&ys[share.clone()], share.len(), &Device::Cpu)?;
                let pred = x.matmul(&w.as_tensor().unsqueeze(1)?)?.squeeze(1)?;
                Ok(Loss {
                    value: ((pred - y)?.sqr()?.sum_all()? / n as f64)?,
                    checkpoint: None,
                })
            })
            .unwrap();
        }
        w.as_tensor().to_vec1().unwrap()
    }

    #[test]
    fn a_step_shared_between_ranks_is_the_step_one_process_takes() {
        // Five items over two ranks (three and two) and one item (rank 1 has no share): both
        // ranks end with the same weights, those one process reaches, to within rounding.
        for n in [5, 1] {
            let alone = least_squares(&crate::distributed::Single, n);
            let slots = std::sync::Arc::new((
                std::sync::Mutex::new(vec![Vec::new(); 2]),
                std::sync::Barrier::new(2),
            ));
            let ranks: Vec<Vec<f32>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..2)
                    .map(|rank| {
                        let world = Threads {
                            rank,
                            size: 2,
                            slots: slots.clone(),
                        };
                        s.spawn(move || least_squares(&world, n))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(ranks[0], ranks[1], "the ranks' weights, {n} items");
            for (a, b) in alone.iter().zip(&ranks[0]) {
                assert!(
                    (a - b).abs() < 1e-6,
                    "{n} items: {alone:?} against {:?}",
                    ranks[0]
                );
            }
            assert_ne!(alone, vec![0.5, -0.25, 1.0], "the steps moved the weights");
        }
    }
}
