//! `train.algorithm` and the `[train.grpo]` settings.

use serde::{Deserialize, Serialize};

/// How the learning agents are updated (`train.algorithm`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// PPO with a value head per agent and GAE inside each response; the KL to the reference
    /// is a per-token penalty in the reward (the paper's).
    #[default]
    Ppo,
    /// GRPO (Shao et al. 2024, DeepSeekMath), multi-agent and critic-free: each question is
    /// debated `train.grpo.group_size` times, and each agent's reward at each turn is
    /// compared with its own rewards at that turn in the other debates of the question; the
    /// clipped ratio as PPO's, the KL to the reference (k3) a term of the loss; no value
    /// head.
    Grpo,
}

/// GRPO settings (`train.algorithm = "grpo"`). The optimisation itself (learning rate,
/// epochs, minibatches, clip ε, gradient clipping, micro-batching, scoring chunk) is
/// `train.ppo`'s, and the KL coefficient β is `train.kl_coef` (adaptive with
/// `train.kl_target`); `train.ppo`'s value, GAE and whitening settings do not apply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoConfig {
    /// Debates of each question per step (G). `debate.batch_size` counts debates, so a
    /// step debates `debate.batch_size / group_size` questions, each `group_size` times.
    pub group_size: usize,
    /// Divide each reward's difference from its group's mean by the group's standard
    /// deviation (DeepSeekMath's GRPO); false: the difference alone (Dr. GRPO, Liu et al.
    /// 2025), which does not weigh up groups whose rewards barely differ.
    pub scale_rewards: bool,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig {
            group_size: 4,
            scale_rewards: true,
        }
    }
}
