//! Per-token rewards, generalised advantage estimation inside each response, and whitening.
//!
//! Rows are responses; `mask[b][k]` is 1 on response b's real tokens. Rewards, values and
//! advantages live on the same positions. Cross-turn credit comes only from the shaped
//! reward: GAE never crosses from one response into another.

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

#[cfg(test)]
mod tests {
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
