//! `[verifier]`: the learned verifier (arXiv 2502.18439) a run serves to plugins through the host
//! function `judge`, and how `maporl verifier generate` / `maporl verifier train` make one.

use anyhow::bail;
use serde::{Deserialize, Serialize};

use super::all_projections;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VerifierConfig {
    /// The verifier's base model (HF folder or GGUF); empty: `model.path`.
    pub model: String,
    /// A trained verifier (`maporl verifier train`'s `RUN/checkpoints/final`, or any
    /// `step-N`); empty: the run has no learned verifier, and `judge` fails.
    pub checkpoint: String,
    /// Responses scored per forward pass.
    pub batch_size: usize,
    /// Where the verifier's tensors live; none: the run's `device`.
    pub device: Option<super::DeviceChoice>,
    /// The most response tokens the verifier reads; longer responses keep their end (where
    /// the answer is).
    pub max_response_tokens: usize,
    /// `maporl verifier generate`.
    pub generate: VerifierGenerateConfig,
    /// `maporl verifier train`.
    pub train: VerifierTrainConfig,
}

impl Default for VerifierConfig {
    fn default() -> Self {
        VerifierConfig {
            model: String::new(),
            checkpoint: String::new(),
            batch_size: 16,
            device: None,
            max_response_tokens: 512,
            generate: VerifierGenerateConfig::default(),
            train: VerifierTrainConfig::default(),
        }
    }
}

/// Sampling the labelled answers a verifier learns from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VerifierGenerateConfig {
    /// Answers sampled per question.
    pub samples_per_question: usize,
    /// Kept per question and class: k right + k wrong (the paper: 10 + 10); questions
    /// with fewer than k of either are dropped.
    pub per_class: usize,
    /// Which answers: every turn's utterances of the run's debates (the verifier then
    /// learns from the answers it scores, later turns' included), or only turn-1 answers
    /// of agent 0 to the protocol's first prompt.
    pub turns: AnswerTurns,
}

/// Which debate turns the verifier's training answers come from (`verifier.generate.turns`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum AnswerTurns {
    /// Every utterance of whole debates, every agent and turn.
    #[default]
    Every,
    /// Agent 0's answers to the protocol's turn-1 prompt.
    First,
}

impl Default for VerifierGenerateConfig {
    fn default() -> Self {
        VerifierGenerateConfig {
            samples_per_question: 32,
            per_class: 10,
            turns: AnswerTurns::default(),
        }
    }
}

/// Training the verifier: LoRA + a linear head with a sigmoid, BCE.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct VerifierTrainConfig {
    /// "all-tokens" (BCE on every response token, as the paper's code) or "last-token".
    pub loss: String,
    /// Passes over the training answers.
    pub epochs: usize,
    /// Answers per optimizer step.
    pub batch_size: usize,
    /// AdamW's learning rate.
    pub lr: f64,
    /// AdamW's decoupled weight decay (weight matrices only).
    pub weight_decay: f64,
    /// Global gradient-norm clipping.
    pub max_grad_norm: f64,
    /// LoRA rank of the verifier's adapter.
    pub lora_r: usize,
    /// LoRA scaling (`lora_alpha / lora_r`).
    pub lora_alpha: f64,
    /// The PEFT module names that get an adapter.
    pub lora_targets: Vec<String>,
    /// Fraction of the questions held out for validation (AUC, ECE); split by question.
    pub val_fraction: f64,
    /// A checkpoint every this many steps (0: only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// How many of the newest checkpoints are kept (0: all).
    pub keep_checkpoints: usize,
    /// Activation checkpointing, as `train.ppo.activation_checkpointing`: each batch's
    /// forward keeps only every layer's input and its backward runs the layers again.
    pub activation_checkpointing: bool,
}

impl Default for VerifierTrainConfig {
    fn default() -> Self {
        // the paper (arXiv 2502.18439): LoRA r16 and a linear head on the hidden state.
        VerifierTrainConfig {
            loss: "all-tokens".into(),
            epochs: 2,
            batch_size: 8,
            lr: 1e-4,
            weight_decay: 0.0,
            max_grad_norm: 1.0,
            lora_r: 16,
            lora_alpha: 32.0,
            lora_targets: all_projections(),
            val_fraction: 0.1,
            checkpoint_every: 100,
            keep_checkpoints: 3,
            activation_checkpointing: false,
        }
    }
}

impl VerifierConfig {
    pub(crate) fn validate(&self) -> anyhow::Result<()> {
        let t = &self.train;
        if !["all-tokens", "last-token"].contains(&t.loss.as_str()) {
            bail!(
                "verifier.train.loss = {:?}: expected \"all-tokens\" or \"last-token\"",
                t.loss
            );
        }
        if !(0.0..1.0).contains(&t.val_fraction) {
            bail!(
                "verifier.train.val_fraction = {}: expected a fraction in [0, 1)",
                t.val_fraction
            );
        }
        if self.batch_size == 0 || t.batch_size == 0 || self.max_response_tokens == 0 {
            bail!(
                "verifier.batch_size, verifier.max_response_tokens and verifier.train.batch_size \
                 must be at least 1"
            );
        }
        if self.generate.per_class == 0
            || self.generate.samples_per_question < 2 * self.generate.per_class
        {
            bail!(
                "verifier.generate: per_class must be at least 1 and samples_per_question at \
                 least 2 x per_class (got {} and {})",
                self.generate.per_class,
                self.generate.samples_per_question
            );
        }
        Ok(())
    }
}
