//! One PPO update of one agent on a batch of its responses (CleanRL's loop, for LLM
//! responses): score with the old policy and the reference, shape token rewards, GAE,
//! whiten, then epochs × minibatches of clipped policy and value losses with AdamW.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::adamw::{AdamW, AdamWConfig};
use super::{gae, policy_loss, token_rewards, value_loss, whiten, KlController, KlEstimator};
use crate::model::{score, Agent};

/// One response to learn from: its prompt and response tokens, the debate turn it was said
/// at (1-based), and its shaped reward.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    pub turn: u32,
    pub reward: f32,
}

/// Agent `agent`'s rewarded utterances in `debates` (those that failed are left out), with
/// their token ids, in debate then turn order.
pub fn samples_of(debates: &[crate::debate::Debate], agent: u32) -> Vec<Sample> {
    let mut out = Vec::new();
    for d in debates.iter().filter(|d| d.error.is_none()) {
        for (u, s) in d.transcript.utterances.iter().zip(&d.speeches) {
            if u.agent != agent || s.ids.response.is_empty() || s.ids.prompt.is_empty() {
                continue;
            }
            if let Some(r) = d
                .rewards
                .iter()
                .find(|r| r.turn == u.turn && r.agent == agent)
            {
                out.push(Sample {
                    prompt: s.ids.prompt.clone(),
                    response: s.ids.response.clone(),
                    turn: u.turn,
                    reward: r.total,
                });
            }
        }
    }
    out
}

/// PPO settings; the defaults are PAPER.md §5's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    pub epochs: usize,
    pub minibatches: usize,
    /// Micro-batches per minibatch whose gradients are summed before one optimizer step
    /// (same update, less memory).
    pub grad_accum: usize,
    /// ε of the clipped policy objective.
    pub clip: f64,
    /// ε of the clipped value loss.
    pub value_clip: f64,
    pub vf_coef: f64,
    /// Weight of the entropy bonus (0: entropy is only measured).
    pub ent_coef: f64,
    /// γ and λ of GAE inside a response.
    pub gamma: f32,
    pub lambda: f32,
    pub whiten_advantages: bool,
    pub max_grad_norm: f64,
    pub lr: f64,
    /// AdamW's decoupled weight decay, on weight matrices only (never norms or biases).
    pub weight_decay: f64,
    pub kl_estimator: KlEstimator,
    /// Positions per lm_head chunk when scoring.
    pub chunk: usize,
}

impl Default for PpoConfig {
    fn default() -> Self {
        PpoConfig {
            epochs: 4,
            minibatches: 8,
            grad_accum: 1,
            clip: 0.2,
            value_clip: 0.2,
            vf_coef: 0.1,
            ent_coef: 0.0,
            gamma: 1.0,
            lambda: 0.95,
            whiten_advantages: true,
            max_grad_norm: 1.0,
            lr: 1e-5,
            weight_decay: 0.0,
            kl_estimator: KlEstimator::K1,
            chunk: 64,
        }
    }
}

/// What one update measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    pub reward_mean: f32,
    /// Mean over responses of the summed per-token KL to the reference, before the update.
    pub kl: f32,
    pub kl_coef: f64,
    pub policy_loss: f32,
    pub value_loss: f32,
    pub approx_kl: f32,
    pub clip_fraction: f32,
    /// Mean entropy of the policy over response tokens.
    pub entropy: f32,
    /// Global gradient norm before clipping, averaged over minibatches.
    pub grad_norm: f32,
    pub tokens: usize,
    /// Wall time of scoring the batch before the update, without gradients: the policy's
    /// log-probs and values, and the reference's log-probs. Like the other timings, it is
    /// not serialized here (these statistics must match between a run and its resume); the
    /// training metrics line carries the sums over agents.
    #[serde(skip)]
    pub score_seconds: f64,
    /// Wall time of the epochs × minibatches: forward passes with gradients and losses,
    /// backward passes and AdamW steps.
    #[serde(skip)]
    pub optimize_seconds: f64,
    /// The part of `optimize_seconds` spent in backward passes and AdamW steps.
    #[serde(skip)]
    pub backward_seconds: f64,
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

    /// Backpropagates `loss`, clips to `max_norm` and steps (a plain supervised update, e.g.
    /// SFT); returns the gradient norm before clipping.
    pub fn minimize(&mut self, loss: &Tensor, max_norm: f64) -> anyhow::Result<f64> {
        self.adamw.accumulate(&loss.backward()?)?;
        self.adamw.step(max_norm)
    }
}

fn rows(t: &Tensor) -> anyhow::Result<Vec<Vec<f32>>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?)
}

/// The last `n` columns of the rows `idx` (rows are right-aligned responses).
fn select(
    x: &[Vec<f32>],
    idx: &[usize],
    n: usize,
    dev: &candle_core::Device,
) -> anyhow::Result<Tensor> {
    let width = x[0].len();
    let data: Vec<f32> = idx
        .iter()
        .flat_map(|&i| x[i][width - n..].iter().copied())
        .collect();
    Ok(Tensor::from_vec(data, (idx.len(), n), dev)?)
}

/// The learning rate at `step` of `steps`: linear warmup over `warmup` steps, then linear
/// decay to `final_fraction` of `base` at the last step (PAPER.md §5: decay to 0.1×).
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

/// Appends one JSON line describing an update's work to `path`: each sample's prompt and
/// response lengths, the micro-batches of each optimizer step, and the phases' wall times
/// (scripts/bench_iteration_torch.py replays the shapes; it scores the whole batch at once).
fn record_batches(
    path: &std::ffi::OsStr,
    samples: &[Sample],
    optimizer_steps: &[Vec<Vec<usize>>],
    stats: &StepStats,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let line = serde_json::json!({
        "prompt_lens": samples.iter().map(|s| s.prompt.len()).collect::<Vec<_>>(),
        "response_lens": samples.iter().map(|s| s.response.len()).collect::<Vec<_>>(),
        "optimizer_steps": optimizer_steps,
        "score_seconds": stats.score_seconds,
        "optimize_seconds": stats.optimize_seconds,
        "backward_seconds": stats.backward_seconds,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// One PPO update of `agent` on `samples`. `reference` is the frozen base (no adapter).
pub fn ppo_step(
    agent: &Agent,
    reference: &Agent,
    optimizer: &mut AgentOptimizer,
    samples: &[Sample],
    kl_control: &mut KlController,
    cfg: &PpoConfig,
    seed: u64,
) -> anyhow::Result<StepStats> {
    if samples.is_empty() {
        bail!("ppo_step: no samples");
    }
    if agent.value_head.is_none() {
        bail!("ppo_step: the agent needs a value head");
    }
    let dev = agent.base.device().clone();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = samples
        .iter()
        .map(|s| (s.prompt.clone(), s.response.clone()))
        .collect();

    // The old policy and the reference, without gradients.
    let scoring = Instant::now();
    let old = score(agent, &pairs, true, cfg.chunk).context("scoring with the current policy")?;
    let reference =
        score(reference, &pairs, true, cfg.chunk).context("scoring with the reference")?;
    let (old_lp, ref_lp) = (rows(&old.logprobs)?, rows(&reference.logprobs)?);
    let old_values = rows(old.values.as_ref().expect("checked above"))?;
    let mask = rows(&old.mask)?;
    let score_seconds = scoring.elapsed().as_secs_f64();

    let kl: Vec<Vec<f32>> = old_lp
        .iter()
        .zip(&ref_lp)
        .zip(&mask)
        .map(|((lp, rf), m)| {
            lp.iter()
                .zip(rf)
                .zip(m)
                .map(|((a, b), m)| cfg.kl_estimator.estimate(*a, *b) * m)
                .collect()
        })
        .collect();
    let kl_per_response: f32 =
        kl.iter().map(|r| r.iter().sum::<f32>()).sum::<f32>() / samples.len() as f32;
    let scores: Vec<f32> = samples.iter().map(|s| s.reward).collect();
    let kl_coef = kl_control.value();
    let rewards = token_rewards(&kl, &mask, &scores, kl_coef as f32);
    let (advantages, returns) = gae(&rewards, &old_values, &mask, cfg.gamma, cfg.lambda);
    let advantages = if cfg.whiten_advantages {
        whiten(&advantages, &mask)
    } else {
        advantages
    };

    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..samples.len()).collect();
    let minibatches = cfg.minibatches.clamp(1, samples.len());
    let mut stats = StepStats {
        reward_mean: scores.iter().sum::<f32>() / scores.len() as f32,
        kl: kl_per_response,
        kl_coef,
        tokens: samples.iter().map(|s| s.response.len()).sum(),
        score_seconds,
        ..StepStats::default()
    };
    let mut n = 0.0f32;
    let optimizing = Instant::now();
    let mut backward = Duration::ZERO;
    // For scripts/bench-iteration.sh: the optimizer steps' micro-batches (sample indices).
    let shapes_to = std::env::var_os("MAPORL_BENCH_PPO_BATCHES");
    let mut optimizer_steps: Vec<Vec<Vec<usize>>> = Vec::new();
    for epoch in 0..cfg.epochs {
        order.shuffle(&mut rng);
        for mb in order.chunks(samples.len().div_ceil(minibatches)) {
            // Token-mean losses over the minibatch: each micro-batch's mean is weighted by its
            // share of the minibatch's tokens, so the summed gradient is the minibatch's.
            let mb_tokens: usize = mb.iter().map(|&i| samples[i].response.len()).sum();
            let micro = mb.len().div_ceil(cfg.grad_accum.clamp(1, mb.len()));
            if shapes_to.is_some() {
                optimizer_steps.push(mb.chunks(micro).map(<[usize]>::to_vec).collect());
            }
            for part in mb.chunks(micro) {
                let share = part
                    .iter()
                    .map(|&i| samples[i].response.len())
                    .sum::<usize>() as f64
                    / mb_tokens as f64;
                let part_pairs: Vec<(Vec<u32>, Vec<u32>)> =
                    part.iter().map(|&i| pairs[i].clone()).collect();
                let width = part
                    .iter()
                    .map(|&i| samples[i].response.len())
                    .max()
                    .unwrap_or(0);
                let new = score(agent, &part_pairs, false, cfg.chunk)?;
                let m = select(&mask, part, width, &dev)?;
                let (pg, loss_stats) = policy_loss(
                    &new.logprobs,
                    &select(&old_lp, part, width, &dev)?,
                    &select(&advantages, part, width, &dev)?,
                    &m,
                    cfg.clip,
                )?;
                let vf = value_loss(
                    new.values.as_ref().expect("checked above"),
                    &select(&old_values, part, width, &dev)?,
                    &select(&returns, part, width, &dev)?,
                    &m,
                    cfg.value_clip,
                )?;
                let entropy = ((&new.entropy * &m)?.sum_all()?
                    / m.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64)?;
                let loss = ((&pg + (&vf * cfg.vf_coef)?)? - (&entropy * cfg.ent_coef)?)?;
                let value = loss.to_scalar::<f32>()?;
                if !value.is_finite() {
                    bail!(
                        "the PPO loss is {value} in epoch {} (policy {}, value {}, entropy {}); \
                         the rewards' magnitude or the learning rate may be to blame",
                        epoch + 1,
                        pg.to_scalar::<f32>()?,
                        vf.to_scalar::<f32>()?,
                        entropy.to_scalar::<f32>()?
                    );
                }
                let started = Instant::now();
                optimizer.adamw.accumulate(&(loss * share)?.backward()?)?;
                backward += started.elapsed();
                let share = share as f32;
                stats.policy_loss += share * pg.to_scalar::<f32>()?;
                stats.value_loss += share * vf.to_scalar::<f32>()?;
                stats.entropy += share * entropy.to_scalar::<f32>()?;
                stats.approx_kl += share * loss_stats.approx_kl;
                stats.clip_fraction += share * loss_stats.clip_fraction;
            }
            let started = Instant::now();
            stats.grad_norm += optimizer.adamw.step(cfg.max_grad_norm)? as f32;
            backward += started.elapsed();
            n += 1.0;
        }
    }
    stats.optimize_seconds = optimizing.elapsed().as_secs_f64();
    stats.backward_seconds = backward.as_secs_f64();
    if let Some(path) = shapes_to {
        record_batches(&path, samples, &optimizer_steps, &stats)
            .context("writing MAPORL_BENCH_PPO_BATCHES")?;
    }
    for x in [
        &mut stats.policy_loss,
        &mut stats.value_loss,
        &mut stats.approx_kl,
        &mut stats.clip_fraction,
        &mut stats.entropy,
        &mut stats.grad_norm,
    ] {
        *x /= n;
    }
    kl_control.update(f64::from(kl_per_response), samples.len());
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::learning_rate;

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
}
