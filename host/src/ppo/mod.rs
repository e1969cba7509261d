//! PPO for the agents (PAPER.md §5): token rewards with a KL penalty against the frozen
//! base, KL control, GAE inside each response, advantage whitening, and the clipped policy
//! and value losses.
//!
//! This module holds the math; it meets the debate only through per-utterance rewards and the
//! token log-probs and values of each response. Responses are rows of a (batch, R) layout,
//! right-aligned as `model::score` returns them, with a 0/1 mask on real tokens.

mod adamw;
mod advantage;
mod kl;
mod loss;
mod step;

pub use advantage::{gae, token_rewards, whiten};
pub use kl::{KlController, KlEstimator};
pub use loss::{policy_loss, value_loss, LossStats};
pub use step::{learning_rate, ppo_step, samples_of, AgentOptimizer, PpoConfig, Sample, StepStats};
