//! GRPO for the agents (Shao et al. 2024, arXiv 2402.03300), multi-agent and critic-free:
//! each question is debated by a group of G debates, and an agent's reward at a turn is
//! compared with that agent's rewards at that turn in the group's other debates; the
//! difference (divided by the group's standard deviation, unless `scale_rewards` is off)
//! is the advantage of every token of the response. The update is PPO's clipped ratio with
//! the KL to the reference (k3, per token) as a term of the loss instead of a penalty in the
//! reward, and no value head. The optimisation around it is [`Epochs`], as PPO's.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{bail, Context};

use super::epochs::Epochs;
use super::ppo::{
    masked_mean, per_response, policy_loss, recorded_logprobs, right_aligned, score_sharded,
    select, token_kl, Batch, KlController, PpoConfig, StepStats,
};
use crate::distributed::World;
use crate::model::Agent;
use crate::optim::AgentOptimizer;

/// The advantage of each reward within its group (`groups[i]`: any key shared by the
/// rewards compared with each other): its difference from the group's mean, divided by the
/// group's standard deviation (unbiased, as TRL's GRPO) plus 1e-4 when `scale`. Also the
/// share of the rewards whose group's rewards are all equal (a group of one included): their
/// advantage is 0. Sums run in the rewards' order, in f64.
pub fn group_advantages<K: Ord + Copy>(
    rewards: &[f32],
    groups: &[K],
    scale: bool,
) -> (Vec<f32>, f32) {
    assert_eq!(rewards.len(), groups.len(), "one group key per reward");
    let mut members: BTreeMap<K, Vec<usize>> = BTreeMap::new();
    for (i, &g) in groups.iter().enumerate() {
        members.entry(g).or_default().push(i);
    }
    let mut advantages = vec![0.0f32; rewards.len()];
    let mut flat = 0usize;
    for idx in members.values() {
        let n = idx.len() as f64;
        let mean = idx.iter().map(|&i| f64::from(rewards[i])).sum::<f64>() / n;
        if idx.iter().all(|&i| rewards[i] == rewards[idx[0]]) {
            flat += idx.len();
            continue;
        }
        let var = idx
            .iter()
            .map(|&i| (f64::from(rewards[i]) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        let divisor = if scale { var.sqrt() + 1e-4 } else { 1.0 };
        for &i in idx {
            advantages[i] = ((f64::from(rewards[i]) - mean) / divisor) as f32;
        }
    }
    (advantages, flat as f32 / rewards.len().max(1) as f32)
}

/// One GRPO update of `agent` on `batch`, as one of `world`'s ranks (every rank passes the
/// same whole batch; see [`Epochs::optimize`]). `advantages[i]` is sample i's (from
/// [`group_advantages`]), `zero_spread` the share of samples whose group was flat;
/// `reference` is the frozen base. The KL coefficient β is `kl_control`'s.
#[allow(clippy::too_many_arguments)]
pub fn grpo_step_in(
    world: &dyn World,
    agent: &Agent,
    reference: &Agent,
    optimizer: &mut AgentOptimizer,
    batch: Batch,
    (advantages, zero_spread): (&[f32], f32),
    kl_control: &mut KlController,
    cfg: &PpoConfig,
    seed: u64,
) -> anyhow::Result<StepStats> {
    let Batch {
        samples,
        temperature,
    } = batch;
    if samples.is_empty() {
        bail!("grpo_step: no samples");
    }
    if advantages.len() != samples.len() {
        bail!(
            "grpo_step: {} advantages for {} samples",
            advantages.len(),
            samples.len()
        );
    }
    let dev = agent.base.device().clone();
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = samples
        .iter()
        .map(|s| (s.prompt.clone(), s.response.clone()))
        .collect();
    // The old policy (recorded by generation where it could be) and the reference, without
    // gradients, at the temperature that sampled the responses.
    let scoring = Instant::now();
    let width = samples.iter().map(|s| s.response.len()).max().unwrap_or(0);
    let aligned = |rows: Vec<&[f32]>| -> Vec<Vec<f32>> {
        rows.into_iter().map(|r| right_aligned(r, width)).collect()
    };
    let old_lp = match recorded_logprobs(samples, temperature) {
        Some(traces) => aligned(traces.iter().map(|t| &t.logprobs[..]).collect()),
        None => {
            let old = score_sharded(world, agent, &pairs, cfg.chunk, temperature, false)
                .context("scoring with the current policy")?;
            aligned(old.logprobs.iter().map(Vec::as_slice).collect())
        }
    };
    let reference = score_sharded(world, reference, &pairs, cfg.chunk, temperature, false)
        .context("scoring with the reference")?;
    let ref_lp = aligned(reference.logprobs.iter().map(Vec::as_slice).collect());
    let ones: Vec<Vec<f32>> = samples
        .iter()
        .map(|s| vec![1.0; s.response.len()])
        .collect();
    let mask = aligned(ones.iter().map(Vec::as_slice).collect());
    let score_seconds = scoring.elapsed().as_secs_f64();
    // The KL before the update, per response, as PPO logs it (and its controller reads).
    let kl_per_response = per_response(&token_kl(&old_lp, &ref_lp, &mask, cfg.kl_estimator));
    // Each response's advantage on each of its tokens.
    let token_advantages: Vec<Vec<f32>> = mask
        .iter()
        .zip(advantages)
        .map(|(m, a)| m.iter().map(|m| m * a).collect())
        .collect();
    let beta = kl_control.value();
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
    let names = ("GRPO", ["policy", "KL", "entropy"]);
    let done = epochs.optimize(optimizer, names, |part, new, width| {
        let m = select(&mask, part, width, &dev)?;
        let (pg, loss_stats) = policy_loss(
            &new.logprobs,
            &select(&old_lp, part, width, &dev)?,
            &select(&token_advantages, part, width, &dev)?,
            &m,
            cfg.clip,
        )?;
        // k3 = exp(ref − new) − (ref − new) − 1 per token: never negative, unbiased.
        let d = (select(&ref_lp, part, width, &dev)? - &new.logprobs)?;
        let kl = masked_mean(&((d.exp()? - &d)? - 1.0)?, &m)?;
        let entropy = masked_mean(&new.entropy, &m)?;
        let loss = ((&pg + (&kl * beta)?)? - (&entropy * cfg.ent_coef)?)?;
        Ok((
            loss,
            [
                pg.to_scalar::<f32>()?,
                kl.to_scalar::<f32>()?,
                entropy.to_scalar::<f32>()?,
                loss_stats.approx_kl,
                loss_stats.clip_fraction,
            ],
        ))
    })?;
    let [policy_loss, kl_loss, entropy, approx_kl, clip_fraction] = done.means;
    kl_control.update(f64::from(kl_per_response), samples.len());
    Ok(StepStats {
        reward_mean: samples.iter().map(|s| s.reward).sum::<f32>() / samples.len() as f32,
        kl: kl_per_response,
        kl_coef: beta,
        policy_loss,
        value_loss: None,
        kl_loss: Some(kl_loss),
        zero_spread: Some(zero_spread),
        approx_kl,
        clip_fraction,
        entropy,
        grad_norm: done.grad_norm,
        tokens: samples.iter().map(|s| s.response.len()).sum(),
        reference_prefix_hit_rate: reference.hit_rate() as f32,
        score_seconds,
        optimize_seconds: done.optimize_seconds,
        backward_seconds: done.backward_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::group_advantages;

    #[test]
    fn advantages_compare_within_a_group_only() {
        // Two groups interleaved: (0, turn 2) and (1, turn 2), and a flat one.
        let rewards = [1.0, 0.0, 3.0, 5.0, 0.5, 2.0, 0.5];
        let groups = [(0, 2), (1, 2), (0, 2), (1, 2), (2, 3), (0, 3), (2, 3)];
        let (a, flat) = group_advantages(&rewards, &groups, false);
        assert_eq!(a, vec![-1.0, -2.5, 1.0, 2.5, 0.0, 0.0, 0.0]);
        // The flat group (2, 3) and the group of one (0, 3): 3 of 7.
        assert_eq!(flat, 3.0 / 7.0);
        let (a, _) = group_advantages(&rewards, &groups, true);
        // Group (0, 2): mean 2, unbiased std √2.
        let s = 2f64.sqrt() + 1e-4;
        assert_eq!(a[0], (-1.0 / s) as f32);
        assert_eq!(a[2], (1.0 / s) as f32);
        // Group (1, 2): mean 2.5, std 2.5·√2.
        let s = 2.5 * 2f64.sqrt() + 1e-4;
        assert_eq!(a[3], (2.5 / s) as f32);
        // A group's scaled advantages add up to 0 and have a sample deviation of about 1.
        let g: Vec<f32> = (0..4).map(|k| [1.0, 2.0, 4.0, 9.0][k]).collect();
        let (a, _) = group_advantages(&g, &[7; 4], true);
        let sum: f32 = a.iter().sum();
        assert!(sum.abs() < 1e-6, "{a:?}");
        let var: f32 = a.iter().map(|x| x * x).sum::<f32>() / 3.0;
        assert!((var - 1.0).abs() < 1e-3, "{var}");
    }
}
