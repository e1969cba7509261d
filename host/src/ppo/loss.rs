//! The clipped PPO losses on (batch, R) tensors, averaged over real response tokens.

use candle_core::{Result, Tensor};

/// Diagnostics of one minibatch's losses.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossStats {
    /// Fraction of tokens whose ratio was clipped.
    pub clip_fraction: f32,
    /// ½ · mean (log π_new − log π_old)², an estimate of the KL the update moved.
    pub approx_kl: f32,
}

fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
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
) -> Result<(Tensor, LossStats)> {
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
) -> Result<Tensor> {
    let clipped = (old_values + (values - old_values)?.clamp(-clip, clip)?)?;
    let a = (values - returns)?.sqr()?;
    let b = (clipped - returns)?.sqr()?;
    masked_mean(&a.maximum(&b)?, mask)? * 0.5
}

#[cfg(test)]
mod tests {
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
