//! The KL penalty against the reference (frozen base) policy: per-token estimators and the
//! coefficient's controller, fixed or adaptive.

use serde::{Deserialize, Serialize};

/// How the per-token KL between the policy and the reference is estimated from the sampled
/// token's log-probs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// log π − log π_ref: unbiased, can be negative.
    K1,
    /// (r − 1) − log r with r = π_ref / π: unbiased, never negative, lower variance.
    K3,
}

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

#[cfg(test)]
mod tests {
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
