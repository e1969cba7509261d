//! PPO for the agents (arXiv 2502.18439), the math in one place: one update of one agent on a
//! batch of its responses (CleanRL's loop, for LLM responses): score with the old policy and
//! the reference, token rewards with a KL penalty against the frozen base, GAE inside each
//! response, advantage whitening, then epochs × minibatches of the clipped policy and value
//! losses with AdamW; and the KL coefficient's controller.
//!
//! It meets the debate only through [`Sample`]s: per-utterance rewards and token ids.
//! Responses are rows of a (batch, R) layout, right-aligned as `model::score` returns them,
//! with a 0/1 mask on real tokens. Cross-turn credit comes only from the shaped reward: GAE
//! never crosses from one response into another.

use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::epochs::Epochs;
pub use crate::config::{KlEstimator, PpoConfig};
use crate::distributed::{Single, World};
use crate::model::{score_shared_prefixes, Agent, PolicyTrace, PrefixScored};
use crate::optim::AgentOptimizer;

/// One response to learn from: its prompt and response tokens, the debate turn it was said
/// at (1-based), and its shaped reward.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub prompt: Vec<u32>,
    pub response: Vec<u32>,
    pub turn: u32,
    pub reward: f32,
    /// The old policy's log-probs and values of `response`, recorded by generation with
    /// the weights and value head this update starts from; `None`: score them here.
    pub policy: Option<PolicyTrace>,
}

/// What one update measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    pub reward_mean: f32,
    /// Mean over responses of the summed per-token KL to the reference, before the update.
    pub kl: f32,
    pub kl_coef: f64,
    pub policy_loss: f32,
    /// PPO's value loss (an algorithm without a critic has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_loss: Option<f32>,
    /// GRPO's KL term of the loss before β: the mean over response tokens of the k3
    /// estimate of the KL to the reference, as the update went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_loss: Option<f32>,
    /// GRPO: the share of the samples whose group's rewards were all equal (no learning
    /// signal but the KL term).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_spread: Option<f32>,
    pub approx_kl: f32,
    pub clip_fraction: f32,
    /// Mean entropy of the policy over response tokens.
    pub entropy: f32,
    /// Global gradient norm before clipping, averaged over minibatches.
    pub grad_norm: f32,
    pub tokens: usize,
    /// The share of the reference's scoring positions taken from a prefix another of the
    /// batch's sequences shares (computed once, not again).
    #[serde(default)]
    pub reference_prefix_hit_rate: f32,
    /// Wall time of scoring the batch before the update, without gradients: the reference's
    /// log-probs, and the policy's log-probs and values where generation did not record
    /// them. Like the other timings, it is
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

/// The samples' recorded old-policy traces, when every sample has one taken at
/// `temperature` and covering its whole response; otherwise the update scores them itself.
pub(super) fn recorded(samples: &[Sample], temperature: f64) -> Option<Vec<&PolicyTrace>> {
    samples
        .iter()
        .map(|s| {
            s.policy.as_ref().filter(|t| {
                t.temperature == temperature
                    && t.logprobs.len() == s.response.len()
                    && t.values.len() == s.response.len()
            })
        })
        .collect()
}

/// The samples' recorded old-policy log-probs, when every sample has a trace taken at
/// `temperature` covering its whole response (values or not: for an update with no critic).
pub(super) fn recorded_logprobs(samples: &[Sample], temperature: f64) -> Option<Vec<&PolicyTrace>> {
    samples
        .iter()
        .map(|s| {
            s.policy
                .as_ref()
                .filter(|t| t.temperature == temperature && t.logprobs.len() == s.response.len())
        })
        .collect()
}

/// `x` right-aligned in a row of `width` (zeros before it), as `model::score` lays out
/// responses.
pub(super) fn right_aligned(x: &[f32], width: usize) -> Vec<f32> {
    let mut row = vec![0.0; width - x.len()];
    row.extend_from_slice(x);
    row
}

/// The last `n` columns of the rows `idx` (rows are right-aligned responses).
pub(super) fn select(
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

/// What one update learns from: an agent's samples and the temperature that sampled them.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub samples: &'a [Sample],
    /// The sampling temperature the responses were drawn at; every log-prob is taken there.
    pub temperature: f64,
}

/// One PPO update of `agent` on `batch`. `reference` is the frozen base (no adapter).
pub fn ppo_step(
    agent: &Agent,
    reference: &Agent,
    optimizer: &mut AgentOptimizer,
    batch: Batch,
    kl_control: &mut KlController,
    cfg: &PpoConfig,
    seed: u64,
) -> anyhow::Result<StepStats> {
    ppo_step_in(
        &Single, agent, reference, optimizer, batch, kl_control, cfg, seed,
    )
}

/// [`ppo_step`] as one of `world`'s ranks (data-parallel; a world of one is `ppo_step`).
/// Every rank passes the same whole batch; each computes the losses and gradients of the
/// micro-batches it owns (the j-th of a minibatch belongs to rank j mod size); before each
/// AdamW step the ranks exchange them and every rank adds them in the micro-batches' order,
/// as one process adds its own, so every rank makes the update one process would make on
/// the whole batch, to the bit, and the agents stay identical across ranks.
#[allow(clippy::too_many_arguments)]
pub fn ppo_step_in(
    world: &dyn World,
    agent: &Agent,
    reference: &Agent,
    optimizer: &mut AgentOptimizer,
    batch: Batch,
    kl_control: &mut KlController,
    cfg: &PpoConfig,
    seed: u64,
) -> anyhow::Result<StepStats> {
    let Batch {
        samples,
        temperature,
    } = batch;
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

    // The old policy and the reference, without gradients. Every log-prob is taken at the
    // temperature the responses were sampled at (TRL's PPO does the same): the policy that
    // acted is the one optimised, and the KL compares like with like.
    let scoring = Instant::now();
    let width = samples.iter().map(|s| s.response.len()).max().unwrap_or(0);
    let aligned = |rows: &[&[f32]]| -> Vec<Vec<f32>> {
        rows.iter().map(|r| right_aligned(r, width)).collect()
    };
    let (old_lp, old_values) = match recorded(samples, temperature) {
        // Generation recorded the old policy's log-probs and values: nothing to score twice.
        Some(traces) => (
            aligned(&traces.iter().map(|t| &t.logprobs[..]).collect::<Vec<_>>()),
            aligned(&traces.iter().map(|t| &t.values[..]).collect::<Vec<_>>()),
        ),
        None => {
            let old = score_sharded(world, agent, &pairs, cfg.chunk, temperature, true)
                .context("scoring with the current policy")?;
            let values = old.values.expect("asked for");
            (
                aligned(&old.logprobs.iter().map(Vec::as_slice).collect::<Vec<_>>()),
                aligned(&values.iter().map(Vec::as_slice).collect::<Vec<_>>()),
            )
        }
    };
    let mask = aligned(
        &samples
            .iter()
            .map(|s| vec![1.0; s.response.len()])
            .collect::<Vec<_>>()
            .iter()
            .map(Vec::as_slice)
            .collect::<Vec<_>>(),
    );
    // The reference once per sequence, each prefix the sequences share computed once.
    let reference = score_sharded(world, reference, &pairs, cfg.chunk, temperature, false)
        .context("scoring with the reference")?;
    let ref_lp = aligned(
        &reference
            .logprobs
            .iter()
            .map(Vec::as_slice)
            .collect::<Vec<_>>(),
    );
    let score_seconds = scoring.elapsed().as_secs_f64();

    let kl = token_kl(&old_lp, &ref_lp, &mask, cfg.kl_estimator);
    let kl_per_response = per_response(&kl);
    let scores: Vec<f32> = samples.iter().map(|s| s.reward).collect();
    let kl_coef = kl_control.value();
    let rewards = token_rewards(&kl, &mask, &scores, kl_coef as f32);
    let (advantages, returns) = gae(&rewards, &old_values, &mask, cfg.gamma, cfg.lambda);
    let advantages = if cfg.whiten_advantages {
        whiten(&advantages, &mask)
    } else {
        advantages
    };

    let mut stats = StepStats {
        reward_mean: scores.iter().sum::<f32>() / scores.len() as f32,
        kl: kl_per_response,
        kl_coef,
        tokens: samples.iter().map(|s| s.response.len()).sum(),
        score_seconds,
        reference_prefix_hit_rate: reference.hit_rate() as f32,
        ..StepStats::default()
    };
    let epochs = Epochs {
        world,
        agent,
        samples,
        pairs: &pairs,
        cfg,
        temperature,
        seed,
        score_seconds,
    };
    let names = ("PPO", ["policy", "value", "entropy"]);
    let done = epochs.optimize(optimizer, names, |part, new, width| {
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
        let entropy = masked_mean(&new.entropy, &m)?;
        let loss = ((&pg + (&vf * cfg.vf_coef)?)? - (&entropy * cfg.ent_coef)?)?;
        Ok((
            loss,
            [
                pg.to_scalar::<f32>()?,
                vf.to_scalar::<f32>()?,
                entropy.to_scalar::<f32>()?,
                loss_stats.approx_kl,
                loss_stats.clip_fraction,
            ],
        ))
    })?;
    let [policy, value, entropy, approx_kl, clip_fraction] = done.means;
    stats.policy_loss = policy;
    stats.value_loss = Some(value);
    stats.entropy = entropy;
    stats.approx_kl = approx_kl;
    stats.clip_fraction = clip_fraction;
    stats.grad_norm = done.grad_norm;
    stats.optimize_seconds = done.optimize_seconds;
    stats.backward_seconds = done.backward_seconds;
    kl_control.update(f64::from(kl_per_response), samples.len());
    Ok(stats)
}

/// [`score_shared_prefixes`] of `pairs` as one of `world`'s ranks: each rank scores its
/// contiguous share of the pairs and every rank receives everyone's rows, in order (the
/// prefixes shared across shares are computed once per rank that holds them).
pub(super) fn score_sharded(
    world: &dyn World,
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    chunk: usize,
    temperature: f64,
    values: bool,
) -> anyhow::Result<PrefixScored> {
    if world.size() == 1 {
        return score_shared_prefixes(agent, pairs, chunk, temperature, values);
    }
    let mine = &pairs[crate::distributed::shard(pairs.len(), world.rank(), world.size())];
    type Rows = Vec<Vec<u32>>;
    let scored: (Rows, Option<Rows>, usize, usize) = if mine.is_empty() {
        (Vec::new(), values.then(Vec::new), 0, 0)
    } else {
        let s = score_shared_prefixes(agent, mine, chunk, temperature, values)?;
        let bits = |rows: Vec<Vec<f32>>| -> Rows {
            rows.into_iter()
                .map(|r| r.into_iter().map(f32::to_bits).collect())
                .collect()
        };
        (
            bits(s.logprobs),
            s.values.map(bits),
            s.computed,
            s.positions,
        )
    };
    let mut out = PrefixScored {
        logprobs: Vec::with_capacity(pairs.len()),
        values: values.then(|| Vec::with_capacity(pairs.len())),
        computed: 0,
        positions: 0,
    };
    let floats = |rows: Rows| -> Vec<Vec<f32>> {
        rows.into_iter()
            .map(|r| r.into_iter().map(f32::from_bits).collect())
            .collect()
    };
    for (r, bytes) in world
        .all_gather_bytes(&serde_json::to_vec(&scored)?)
        .context("exchanging the scored shares of the batch")?
        .iter()
        .enumerate()
    {
        let (lp, v, computed, positions): (Rows, Option<Rows>, usize, usize) =
            serde_json::from_slice(bytes)
                .with_context(|| format!("rank {r}'s scores are not readable"))?;
        out.logprobs.extend(floats(lp));
        if let (Some(all), Some(v)) = (&mut out.values, v) {
            all.extend(floats(v));
        }
        out.computed += computed;
        out.positions += positions;
    }
    if out.logprobs.len() != pairs.len()
        || out.values.as_ref().is_some_and(|v| v.len() != pairs.len())
    {
        bail!(
            "the ranks scored {} of the batch's {} responses: they are not training on the \
             same batch",
            out.logprobs.len(),
            pairs.len()
        );
    }
    Ok(out)
}

// ---- Token rewards, advantages, whitening.

/// The per-token KL to the reference of right-aligned responses (0 off the mask), by
/// `estimator`, from the policy's and the reference's log-probs.
pub(super) fn token_kl(
    logprobs: &[Vec<f32>],
    reference: &[Vec<f32>],
    mask: &[Vec<f32>],
    estimator: KlEstimator,
) -> Vec<Vec<f32>> {
    logprobs
        .iter()
        .zip(reference)
        .zip(mask)
        .map(|((lp, rf), m)| {
            lp.iter()
                .zip(rf)
                .zip(m)
                .map(|((a, b), m)| estimator.estimate(*a, *b) * m)
                .collect()
        })
        .collect()
}

/// The mean over responses of each response's summed per-token `kl`.
pub(super) fn per_response(kl: &[Vec<f32>]) -> f32 {
    kl.iter().map(|r| r.iter().sum::<f32>()).sum::<f32>() / kl.len() as f32
}

/// Token rewards of one batch: `-kl_coef * kl[b][k]` on every real token, plus the shaped
/// scalar `score[b]` on the response's last real token.
pub fn token_rewards(
    kl: &[Vec<f32>],
    mask: &[Vec<f32>],
    score: &[f32],
    kl_coef: f32,
) -> Vec<Vec<f32>> {
    kl.iter()
        .zip(mask)
        .zip(score)
        .map(|((kl, mask), &score)| {
            let mut r: Vec<f32> = kl.iter().zip(mask).map(|(k, m)| -kl_coef * k * m).collect();
            if let Some(last) = mask.iter().rposition(|&m| m > 0.0) {
                r[last] += score;
            }
            r
        })
        .collect()
}

/// GAE(γ, λ) within each response; returns (advantages, returns = advantages + values).
/// The value after a response's last token is 0: the response is an episode.
pub fn gae(
    rewards: &[Vec<f32>],
    values: &[Vec<f32>],
    mask: &[Vec<f32>],
    gamma: f32,
    lambda: f32,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let mut advantages = Vec::with_capacity(rewards.len());
    let mut returns = Vec::with_capacity(rewards.len());
    for ((r, v), m) in rewards.iter().zip(values).zip(mask) {
        let n = r.len();
        let mut adv = vec![0.0f32; n];
        let (mut next_value, mut next_adv) = (0.0f32, 0.0f32);
        for k in (0..n).rev() {
            if m[k] == 0.0 {
                continue;
            }
            let delta = r[k] + gamma * next_value - v[k];
            next_adv = delta + gamma * lambda * next_adv;
            adv[k] = next_adv;
            next_value = v[k];
        }
        returns.push(
            adv.iter()
                .zip(v)
                .zip(m)
                .map(|((a, v), m)| (a + v) * m)
                .collect(),
        );
        advantages.push(adv);
    }
    (advantages, returns)
}

/// Shifts and scales `x` to mean 0 and standard deviation 1 over the masked positions;
/// masked-out positions stay 0.
pub fn whiten(x: &[Vec<f32>], mask: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let (mut n, mut sum) = (0.0f64, 0.0f64);
    for (row, m) in x.iter().zip(mask) {
        for (v, m) in row.iter().zip(m) {
            n += f64::from(*m);
            sum += f64::from(v * m);
        }
    }
    if n == 0.0 {
        return x.to_vec();
    }
    let mean = sum / n;
    let mut var = 0.0f64;
    for (row, m) in x.iter().zip(mask) {
        for (v, m) in row.iter().zip(m) {
            var += f64::from(*m) * (f64::from(*v) - mean).powi(2);
        }
    }
    // Unbiased variance, as TRL's masked_whiten.
    let var = if n > 1.0 { var / (n - 1.0) } else { var };
    let scale = 1.0 / (var.sqrt() + 1e-8);
    x.iter()
        .zip(mask)
        .map(|(row, m)| {
            row.iter()
                .zip(m)
                .map(|(v, m)| ((f64::from(*v) - mean) * scale) as f32 * m)
                .collect()
        })
        .collect()
}

// ---- The KL penalty: per-token estimators and the coefficient's controller.

impl KlEstimator {
    pub fn estimate(self, logprob: f32, ref_logprob: f32) -> f32 {
        let log_ratio = logprob - ref_logprob;
        match self {
            KlEstimator::K1 => log_ratio,
            KlEstimator::K3 => (-log_ratio).exp() - 1.0 + log_ratio,
        }
    }
}

/// The KL coefficient: fixed, or adapted towards a target KL (Ziegler et al. 2019, as TRL's
/// `AdaptiveKLController`). Its state is part of every checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum KlController {
    Fixed {
        value: f64,
    },
    Adaptive {
        value: f64,
        target: f64,
        horizon: f64,
    },
}

impl KlController {
    /// The coefficient to use now.
    pub fn value(&self) -> f64 {
        match self {
            KlController::Fixed { value } | KlController::Adaptive { value, .. } => *value,
        }
    }

    /// After a step that measured `kl` (mean per-response KL) over `n_steps` samples.
    pub fn update(&mut self, kl: f64, n_steps: usize) {
        if let KlController::Adaptive {
            value,
            target,
            horizon,
        } = self
        {
            let error = (kl / *target - 1.0).clamp(-0.2, 0.2);
            *value *= 1.0 + error * n_steps as f64 / *horizon;
        }
    }
}

// ---- The clipped losses on (batch, R) tensors, averaged over real response tokens.

/// Diagnostics of one minibatch's losses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossStats {
    /// Fraction of tokens whose ratio was clipped.
    pub clip_fraction: f32,
    /// ½ · mean (log π_new − log π_old)², an estimate of the KL the update moved.
    pub approx_kl: f32,
}

pub(super) fn masked_mean(x: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
    (x * mask)?.sum_all()? / mask.sum_all()?.to_scalar::<f32>()?.max(1.0) as f64
}

/// The clipped surrogate objective as a loss: mean over tokens of
/// max(−A·ρ, −A·clip(ρ, 1 − ε, 1 + ε)), with ρ = exp(log π_new − log π_old).
pub fn policy_loss(
    logprobs: &Tensor,
    old_logprobs: &Tensor,
    advantages: &Tensor,
    mask: &Tensor,
    clip: f64,
) -> candle_core::Result<(Tensor, LossStats)> {
    let log_ratio = (logprobs - old_logprobs)?;
    let ratio = log_ratio.exp()?;
    let unclipped = (advantages.neg()? * &ratio)?;
    let clipped = (advantages.neg()? * ratio.clamp(1.0 - clip, 1.0 + clip)?)?;
    let loss = masked_mean(&unclipped.maximum(&clipped)?, mask)?;
    let clip_fraction =
        masked_mean(&clipped.gt(&unclipped)?.to_dtype(mask.dtype())?, mask)?.to_scalar::<f32>()?;
    let approx_kl = (masked_mean(&log_ratio.sqr()?, mask)?.to_scalar::<f32>()? * 0.5).abs();
    Ok((
        loss,
        LossStats {
            clip_fraction,
            approx_kl,
        },
    ))
}

/// The clipped value loss: ½ · mean over tokens of max((V − R)², (V_clipped − R)²), with
/// V_clipped = V_old + clip(V − V_old, −ε, ε).
pub fn value_loss(
    values: &Tensor,
    old_values: &Tensor,
    returns: &Tensor,
    mask: &Tensor,
    clip: f64,
) -> candle_core::Result<Tensor> {
    let clipped = (old_values + (values - old_values)?.clamp(-clip, clip)?)?;
    let a = (values - returns)?.sqr()?;
    let b = (clipped - returns)?.sqr()?;
    masked_mean(&a.maximum(&b)?, mask)? * 0.5
}

#[cfg(test)]
mod advantage_tests {
    use super::super::epochs::micro_batches;
    use super::*;

    #[test]
    fn the_shaped_reward_lands_on_the_last_real_token() {
        // Right-aligned rows: the first response has 2 tokens, the second 3.
        let mask = vec![vec![0.0, 1.0, 1.0], vec![1.0, 1.0, 1.0]];
        let kl = vec![vec![9.0, 0.5, -0.5], vec![1.0, 0.0, 2.0]];
        let r = token_rewards(&kl, &mask, &[1.0, -1.0], 0.1);
        assert_eq!(r[0], vec![0.0, -0.05, 1.05]);
        assert_eq!(r[1], vec![-0.1, 0.0, -1.2]);
    }

    #[test]
    fn micro_batches_group_by_length_within_the_configured_padding() {
        // Lengths of turn-1, turn-2 and turn-3 conversations, shuffled; responses of 60
        // tokens each, or of 60 (turn 1, long answers) against 20 later (short ones).
        let lengths = [100, 420, 250, 100, 420, 250, 100, 420, 250, 100, 420, 250];
        let even = [60; 12];
        let uneven: Vec<usize> = lengths
            .iter()
            .map(|&l| if l == 100 { 60 } else { 20 })
            .collect();
        let mb: Vec<usize> = (0..12).collect();
        for responses in [&even[..], &uneven[..]] {
            for grad_accum in [1, 2, 3, 6, 12, 50] {
                let parts = micro_batches(&mb, &lengths, responses, grad_accum);
                let mut seen: Vec<usize> = parts.concat();
                seen.sort();
                assert_eq!(seen, mb, "every sample once");
                let rows = 12usize.div_ceil(grad_accum.min(12));
                let longest = |p: &[usize], of: &[usize]| p.iter().map(|&i| of[i]).max().unwrap();
                for p in &parts {
                    // Neither the sequences' nor the responses' padded size is above the
                    // configured split's.
                    assert!(p.len() * longest(p, &lengths) <= rows * 420, "{parts:?}");
                    assert!(p.len() * longest(p, responses) <= rows * 60, "{parts:?}");
                    assert!(p.windows(2).all(|w| lengths[w[0]] <= lengths[w[1]]));
                }
                // Greedy: no part could have taken the next one's first sample.
                for w in parts.windows(2) {
                    let mut joined = w[0].clone();
                    joined.push(w[1][0]);
                    assert!(
                        joined.len() * longest(&joined, &lengths) > rows * 420
                            || joined.len() * longest(&joined, responses) > rows * 60,
                        "{grad_accum}: {parts:?}"
                    );
                }
            }
        }
        // One part holds everything when one pass may (grad_accum 1); with 2 the short
        // conversations share a pass instead of being padded to 420.
        assert_eq!(micro_batches(&mb, &lengths, &even, 1).len(), 1);
        let two = micro_batches(&mb, &lengths, &even, 2);
        let padded: usize = two
            .iter()
            .map(|p| p.len() * p.iter().map(|&i| lengths[i]).max().unwrap())
            .sum();
        assert!(padded < 12 * 420, "{padded}");
        // With one row a pass configured, the 60-token responses of turn 1 stay one a pass
        // (two would keep twice the logits), while the 20-token ones may share.
        let one = micro_batches(&mb, &lengths, &uneven, 12);
        for p in &one {
            assert!(
                p.len() == 1 || p.iter().all(|&i| uneven[i] == 20),
                "{one:?}"
            );
        }
        assert_eq!(
            micro_batches(&[], &lengths, &even, 2),
            Vec::<Vec<usize>>::new()
        );
    }

    #[test]
    fn gae_matches_a_hand_computation() {
        let mask = vec![vec![0.0, 1.0, 1.0, 1.0]];
        let rewards = vec![vec![0.0, 0.0, 0.0, 1.0]];
        let values = vec![vec![5.0, 0.5, 0.6, 0.7]];
        let (adv, ret) = gae(&rewards, &values, &mask, 1.0, 0.95);
        // δ3 = 1 - 0.7 = 0.3; δ2 = 0 + 0.7 - 0.6 = 0.1; δ1 = 0 + 0.6 - 0.5 = 0.1.
        let a3 = 0.3f32;
        let a2 = 0.1 + 0.95 * a3;
        let a1 = 0.1 + 0.95 * a2;
        let want = [0.0, a1, a2, a3];
        for (got, want) in adv[0].iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{adv:?}");
        }
        assert!((ret[0][1] - (a1 + 0.5)).abs() < 1e-6);
        assert_eq!(ret[0][0], 0.0, "padding has no return");
        // With γ = λ = 1 and zero values, every token's advantage is the reward-to-go.
        let (adv, _) = gae(&rewards, &[vec![0.0; 4]], &mask, 1.0, 1.0);
        assert_eq!(adv[0], vec![0.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn whitening_uses_only_real_tokens() {
        let mask = vec![vec![0.0, 1.0, 1.0], vec![1.0, 1.0, 0.0]];
        let x = vec![vec![100.0, 1.0, 2.0], vec![3.0, 4.0, -100.0]];
        let w = whiten(&x, &mask);
        let real: Vec<f32> = [w[0][1], w[0][2], w[1][0], w[1][1]].to_vec();
        let mean: f32 = real.iter().sum::<f32>() / 4.0;
        let var: f32 = real.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 3.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{w:?}");
        assert_eq!((w[0][0], w[1][2]), (0.0, 0.0));
    }
}

#[cfg(test)]
mod kl_tests {
    use super::*;

    #[test]
    fn estimators() {
        assert_eq!(KlEstimator::K1.estimate(-1.0, -1.5), 0.5);
        assert_eq!(KlEstimator::K3.estimate(-1.0, -1.0), 0.0);
        // k3 is never negative, and close to k1²/2 for small differences.
        for d in [-2.0f32, -0.1, 0.1, 2.0] {
            assert!(KlEstimator::K3.estimate(d, 0.0) >= 0.0);
        }
        let k3 = KlEstimator::K3.estimate(0.01, 0.0);
        assert!((k3 - 0.00005).abs() < 1e-6, "{k3}");
    }

    #[test]
    fn the_adaptive_coefficient_moves_towards_the_target() {
        let mut c = KlController::Adaptive {
            value: 0.1,
            target: 6.0,
            horizon: 10_000.0,
        };
        c.update(12.0, 256); // KL too high: the error is clipped to +0.2.
        assert!((c.value() - 0.1 * (1.0 + 0.2 * 256.0 / 10_000.0)).abs() < 1e-12);
        let up = c.value();
        c.update(3.0, 256); // KL too low: the coefficient shrinks.
        assert!(c.value() < up);
        let mut f = KlController::Fixed { value: 0.002 };
        f.update(100.0, 256);
        assert_eq!(f.value(), 0.002);
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            serde_json::from_str::<KlController>(&json).unwrap(),
            c,
            "checkpointable"
        );
    }
}

#[cfg(test)]
mod loss_tests {
    use super::*;
    use candle_core::{Device, Var};

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_slice(v, (1, v.len()), &Device::Cpu).unwrap()
    }

    #[test]
    fn policy_loss_clips_and_its_gradient_stops_past_the_clip() {
        let old = t(&[0.0, 0.0, 0.0]);
        let adv = t(&[1.0, 1.0, -1.0]);
        let mask = t(&[1.0, 1.0, 0.0]);
        // Token 0: ratio e^0.1 (inside the clip); token 1: e^0.5 (clipped at 1.2 for A > 0).
        let new = Var::from_tensor(&t(&[0.1, 0.5, 3.0])).unwrap();
        let (loss, stats) = policy_loss(new.as_tensor(), &old, &adv, &mask, 0.2).unwrap();
        let want = -(0.1f32.exp() + 1.2) / 2.0;
        assert!((loss.to_scalar::<f32>().unwrap() - want).abs() < 1e-6);
        assert_eq!(stats.clip_fraction, 0.5);
        assert!((stats.approx_kl - 0.5 * (0.01 + 0.25) / 2.0).abs() < 1e-6);
        let grads = loss.backward().unwrap();
        let g = grads.get(&new).unwrap().to_vec2::<f32>().unwrap()[0].clone();
        assert!((g[0] - (-0.1f32.exp() / 2.0)).abs() < 1e-6, "{g:?}");
        assert_eq!(g[1], 0.0, "no gradient through a clipped ratio");
        assert_eq!(g[2], 0.0, "no gradient from padding");
    }

    #[test]
    fn value_loss_takes_the_worse_of_clipped_and_unclipped() {
        let old = t(&[0.0, 0.0]);
        let ret = t(&[1.0, 1.0]);
        let mask = t(&[1.0, 1.0]);
        let v = t(&[0.5, 2.0]);
        // Token 0: (0.5-1)² = 0.25 vs clipped (0.2-1)² = 0.64 -> 0.64;
        // token 1: (2-1)² = 1 vs clipped (0.2-1)² = 0.64 -> 1.
        let loss = value_loss(&v, &old, &ret, &mask, 0.2)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!((loss - 0.5 * (0.64 + 1.0) / 2.0).abs() < 1e-6, "{loss}");
    }
}
