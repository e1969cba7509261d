//! An agent: a shared frozen base plus its own adapter and value head (or, fully fine-tuned,
//! its own trainable copy of the base).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use candle_core::{Tensor, Var};

use super::decoder::{Adapter, Base, KvCache, Pass};
use super::lora::{Lora, ValueHead};

/// One agent: a shared frozen base plus its own adapter and value head.
pub struct Agent {
    pub base: Arc<Base>,
    pub lora: Option<Lora>,
    pub value_head: Option<ValueHead>,
    /// For full fine-tuning: `base` is the agent's own trainable copy, and these are its
    /// weights by Hugging Face name (see [`Agent::train_all_weights`]).
    pub weights: Vec<(String, Var)>,
}

impl Agent {
    pub fn new(base: Arc<Base>) -> Agent {
        Agent {
            base,
            lora: None,
            value_head: None,
            weights: Vec::new(),
        }
    }

    /// Gives the agent its own trainable copy of its base (full fine-tuning); the shared
    /// original, which other agents and the KL reference use, is untouched.
    pub fn train_all_weights(&mut self) -> Result<()> {
        let (base, weights) = self.base.trainable_copy()?;
        self.base = Arc::new(base);
        self.weights = weights;
        Ok(())
    }

    /// Writes the fully fine-tuned weights as `model.safetensors` (HF names).
    pub fn save_weights(&self, path: &Path) -> Result<()> {
        let t: HashMap<String, Tensor> = self
            .weights
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        candle_core::safetensors::save(&t, path)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Loads weights [`save_weights`](Self::save_weights) wrote into the trainable copy.
    pub fn load_weights(&mut self, path: &Path) -> Result<()> {
        let f = candle_core::safetensors::load(path, self.base.device())
            .with_context(|| format!("reading {}", path.display()))?;
        for (name, var) in &self.weights {
            let t = f
                .get(name)
                .ok_or_else(|| anyhow!("{}: tensor `{name}` is missing", path.display()))?;
            if t.dims() != var.dims() {
                bail!(
                    "{}: tensor `{name}` has shape {:?}, the model has {:?}",
                    path.display(),
                    t.dims(),
                    var.dims()
                );
            }
            var.set(&t.to_dtype(var.dtype())?)?;
        }
        Ok(())
    }

    /// Hidden states for `ids` with this agent's adapter.
    pub fn forward(
        &self,
        ids: &Tensor,
        pads: &[usize],
        cache: Option<&mut KvCache>,
        pass: Pass,
    ) -> Result<Tensor> {
        self.forward_tail(ids, pads, cache, pass, ids.dim(1)?)
    }

    /// The hidden states of the last `tail` positions alone, with this agent's adapter
    /// ([`Base::forward_tail`](super::Base::forward_tail)).
    pub fn forward_tail(
        &self,
        ids: &Tensor,
        pads: &[usize],
        cache: Option<&mut KvCache>,
        pass: Pass,
        tail: usize,
    ) -> Result<Tensor> {
        self.base.forward_tail(
            ids,
            pads,
            cache,
            self.lora.as_ref().map(|l| l as &dyn Adapter),
            pass,
            tail,
        )
    }

    /// Everything this agent trains (adapter and value head), by name (PEFT's adapter keys,
    /// `v_head.summary.*`), in name order.
    pub fn named_trainable_vars(&self) -> Vec<(String, Var)> {
        let mut v = self.weights.clone();
        v.extend(self.lora.as_ref().map(Lora::named_vars).unwrap_or_default());
        v.extend(
            self.value_head
                .as_ref()
                .map(ValueHead::named_vars)
                .unwrap_or_default(),
        );
        v
    }

    /// Everything this agent trains (adapter and value head, and its weights when fully
    /// fine-tuned).
    pub fn trainable_vars(&self) -> Vec<Var> {
        let mut v: Vec<Var> = self.weights.iter().map(|(_, v)| v.clone()).collect();
        v.extend(self.lora.as_ref().map(Lora::vars).unwrap_or_default());
        v.extend(
            self.value_head
                .as_ref()
                .map(ValueHead::vars)
                .unwrap_or_default(),
        );
        v
    }
}
