//! The `[train.ppo]` settings.

use serde::{Deserialize, Serialize};

/// PPO settings; the defaults are the paper's (arXiv 2502.18439, §5; the authors' code).
/// With `train.algorithm = "grpo"` the optimisation keys (`epochs`, `minibatches`,
/// `grad_accum`, `clip`, `max_grad_norm`, `lr`, `weight_decay`, `ent_coef`, `chunk`,
/// `activation_checkpointing`, `agents_in_parallel`, and `kl_estimator` for the logged KL)
/// apply to GRPO too; the value, GAE and whitening keys do not.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PpoConfig {
    /// Passes over a step's samples.
    pub epochs: usize,
    /// Minibatches per epoch (one optimizer step each).
    pub minibatches: usize,
    /// Micro-batches per minibatch whose gradients are summed before one optimizer step
    /// (same update, less memory).
    pub grad_accum: usize,
    /// ε of the clipped policy objective.
    pub clip: f64,
    /// ε of the clipped value loss.
    pub value_clip: f64,
    /// Weight of the value loss.
    pub vf_coef: f64,
    /// Weight of the entropy bonus (0: entropy is only measured).
    pub ent_coef: f64,
    /// γ of GAE inside a response (and `lambda`, its λ).
    pub gamma: f32,
    /// λ of GAE (see `gamma`).
    pub lambda: f32,
    /// Whiten the advantages over each agent's samples of a step.
    pub whiten_advantages: bool,
    /// Global gradient-norm clipping (the norm is logged before clipping).
    pub max_grad_norm: f64,
    /// AdamW's peak learning rate (see `train.warmup_steps`, `train.final_lr_fraction`).
    pub lr: f64,
    /// AdamW's decoupled weight decay, on weight matrices only (never norms or biases).
    pub weight_decay: f64,
    /// How the per-token KL to the reference is estimated.
    pub kl_estimator: KlEstimator,
    /// Positions per lm_head chunk when scoring.
    pub chunk: usize,
    /// Activation checkpointing in the update: each micro-batch's forward keeps only every
    /// layer's input, and the backward runs the layers again one at a time (less memory
    /// for long sequences, about one more forward pass of time).
    pub activation_checkpointing: bool,
    /// Update the learning agents at the same time, sharing the threads, in one process
    /// (the same updates, bit for bit; the update's peak memory becomes the agents' sum).
    pub agents_in_parallel: bool,
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
            activation_checkpointing: false,
            agents_in_parallel: true,
        }
    }
}

/// How the per-token KL between the policy and the reference is estimated from the sampled
/// token's log-probs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// log π − log π_ref: unbiased, can be negative.
    K1,
    /// (r − 1) − log r with r = π_ref / π: unbiased, never negative, lower variance.
    K3,
}
