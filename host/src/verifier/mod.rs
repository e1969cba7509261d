//! The learned verifier (arXiv 2502.18439): an LM with a LoRA adapter and a linear head whose
//! sigmoid, on the hidden state of a response's last token, is the probability that the
//! response answers the question correctly. It sees only the question and one response.
//!
//! - [`data`]: labelled answers (`maporl verifier generate`), balanced per question;
//! - [`train`]: BCE training with validation AUC and calibration (`maporl verifier train`);
//! - [`LearnedVerifier`]: serving, as the host's [`Judge`] behind the WIT function `judge`.
//!
//! The judge prompt is the same at training and serving ([`Prompter`]): the question as the
//! one user message, rendered with the model's chat template and its generation prompt, then
//! the response's tokens.
//!
//! A checkpoint directory holds `adapter_model.safetensors` + `adapter_config.json` (PEFT
//! layout), `head.safetensors` (`v_head.summary.{weight,bias}`) and `verifier.json`; its
//! identity is [`checkpoint_sha256`], recorded by every run it scores.

pub mod data;
pub mod metrics;
pub mod train;

use crate::model::Pass;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, bail, Context};
use candle_core::{DType, Device, IndexOp, Tensor};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::files::expand_home;
use crate::model::{Agent, ChatMessage, ChatTemplate, Checkpoint, Lora, ValueHead};
use crate::plugin::Judge;

/// The head's weights inside a checkpoint.
pub const HEAD_FILE: &str = "head.safetensors";
/// What the checkpoint is (base model, loss, validation metrics).
pub const META_FILE: &str = "verifier.json";
/// The files whose bytes make a checkpoint's identity, in hashing order.
pub const IDENTITY_FILES: [&str; 3] = [
    "adapter_config.json",
    "adapter_model.safetensors",
    HEAD_FILE,
];

/// `verifier.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Meta {
    /// The base model it was trained on, as the config named it.
    pub base_model: String,
    pub hidden_size: usize,
    /// "all-tokens" or "last-token".
    pub loss: String,
    pub max_response_tokens: usize,
    /// Optimizer steps taken.
    pub steps: usize,
    /// The validation metrics at this checkpoint, when there was a validation set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<metrics::Validation>,
}

/// sha256 over the checkpoint's weights and adapter config: for each of
/// [`IDENTITY_FILES`], its name, its length (u64 LE) and its bytes. Hex.
pub fn checkpoint_sha256(dir: &Path) -> anyhow::Result<String> {
    let mut h = Sha256::new();
    for name in IDENTITY_FILES {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "verifier checkpoint {}: missing file {}",
                dir.display(),
                path.display()
            )
        })?;
        h.update(name.as_bytes());
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex::encode(h.finalize()))
}

/// Turns (question, response) into the verifier's (prompt ids, response ids).
pub struct Prompter {
    tokenizer: tokenizers::Tokenizer,
    template: ChatTemplate,
    max_response_tokens: usize,
    /// The longest text one token stands for, in bytes.
    max_token_bytes: usize,
}

/// The last `max` bytes of `text`, cut at a character boundary (a little less then).
fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl Prompter {
    pub fn new(
        tokenizer: tokenizers::Tokenizer,
        template: ChatTemplate,
        max_response_tokens: usize,
    ) -> Prompter {
        // The longest token's text (in the vocabulary's own alphabet, which for byte-level
        // BPE spends at least one character per byte: never shorter than the bytes it
        // stands for).
        let max_token_bytes = tokenizer
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(4);
        Prompter {
            tokenizer,
            template,
            max_response_tokens: max_response_tokens.max(1),
            max_token_bytes,
        }
    }

    /// The most bytes of a response's end that can hold its last `max_response_tokens`
    /// tokens: a token's text is at most `max_token_bytes` long, and one token more of
    /// margin lets the cut fall inside a token that is dropped anyway.
    fn response_window(&self) -> usize {
        // Twice that: a normalizer may map a few bytes of text to fewer of a token's.
        (self.max_response_tokens + 1)
            .saturating_mul(self.max_token_bytes)
            .saturating_mul(2)
    }

    /// The question as the only user message with the generation prompt, then the response
    /// (at most `max_response_tokens`, its end kept). An empty response is one space. Only
    /// the response's end that can hold those tokens is tokenized ([`Self::response_window`]),
    /// so that a long response costs no more than a short one.
    pub fn ids(&self, question: &str, response: &str) -> anyhow::Result<(Vec<u32>, Vec<u32>)> {
        let response = tail(response, self.response_window());
        let text = self
            .template
            .render(&[ChatMessage::new("user", question)], true)?;
        let encode = |s: &str| -> anyhow::Result<Vec<u32>> {
            Ok(self
                .tokenizer
                .encode(s, false)
                .map_err(|e| anyhow!("tokenizing the verifier's input: {e}"))?
                .get_ids()
                .to_vec())
        };
        let prompt = encode(&text)?;
        let mut resp = encode(if response.trim().is_empty() {
            " "
        } else {
            response
        })?;
        if resp.len() > self.max_response_tokens {
            resp.drain(..resp.len() - self.max_response_tokens);
        }
        if prompt.is_empty() || resp.is_empty() {
            bail!("the verifier's prompt or response tokenized to nothing");
        }
        Ok((prompt, resp))
    }
}

/// The verifier network: a base with a LoRA adapter (an [`Agent`]) and a linear head (the
/// agent's value head), plus its prompt format.
pub struct VerifierModel {
    pub agent: Agent,
    pub prompter: Prompter,
}

/// The head's logits on the response positions of a batch.
pub struct ResponseLogits {
    /// (batch, R): logit of each response token, right aligned (row b's tokens are its last
    /// `len_b` columns; the last column is every row's last token).
    pub logits: Tensor,
    /// (batch, R): 1.0 on real response tokens.
    pub mask: Tensor,
}

impl VerifierModel {
    /// Loads the base model `path` (with its tokenizer and chat template).
    pub fn base(
        path: &Path,
        dtype: DType,
        device: &Device,
        max_response_tokens: usize,
    ) -> anyhow::Result<(Agent, Prompter)> {
        let loaded = crate::model::load(path, dtype, device)
            .with_context(|| format!("loading the verifier's base model {}", path.display()))?;
        let tokenizer = loaded
            .tokenizer
            .with_context(|| format!("{}: the verifier needs a tokenizer", path.display()))?;
        let template = loaded
            .chat_template
            .with_context(|| format!("{}: the verifier needs a chat template", path.display()))?;
        Ok((
            Agent::new(Arc::new(loaded.base)),
            Prompter::new(tokenizer, template, max_response_tokens),
        ))
    }

    /// A trained verifier: base `model` plus the adapter and head in `checkpoint`; responses
    /// are cut to the length it was trained with (`verifier.json`).
    pub fn load(
        model: &Path,
        checkpoint: &Path,
        dtype: DType,
        device: &Device,
    ) -> anyhow::Result<VerifierModel> {
        if !checkpoint.is_dir() {
            bail!(
                "verifier.checkpoint: {} is not a directory (expected a `maporl verifier \
                 train` checkpoint, e.g. RUN/checkpoints/final)",
                checkpoint.display()
            );
        }
        let meta = read_meta(checkpoint)?;
        // Responses are cut as in training, or the scores would mean something else.
        let (mut agent, prompter) = Self::base(model, dtype, device, meta.max_response_tokens)?;
        let hidden = agent.base.config().hidden_size;
        if meta.hidden_size != hidden {
            bail!(
                "verifier checkpoint {} was trained on a model with hidden size {} ({}), but \
                 verifier.model {} has {hidden}",
                checkpoint.display(),
                meta.hidden_size,
                meta.base_model,
                model.display()
            );
        }
        agent.lora = Some(
            Lora::load(checkpoint, &agent.base)
                .with_context(|| format!("verifier checkpoint {}", checkpoint.display()))?,
        );
        agent.value_head = Some(
            ValueHead::load(&checkpoint.join(HEAD_FILE), hidden, DType::F32, device)
                .with_context(|| format!("verifier checkpoint {}", checkpoint.display()))?,
        );
        Ok(VerifierModel { agent, prompter })
    }

    /// Head logits on the response positions of `pairs` (prompt ids, response ids). Use
    /// [`Pass::Training`] for a differentiable result.
    pub fn response_logits(
        &self,
        pairs: &[(Vec<u32>, Vec<u32>)],
        pass: Pass,
    ) -> anyhow::Result<ResponseLogits> {
        let (ids, pads) = self.padded(pairs)?;
        let tail = response_tail(pairs);
        let hidden = self.agent.forward_tail(&ids, &pads, None, pass, tail)?;
        self.head_logits(pairs, &hidden)
    }

    /// [`response_logits`](Self::response_logits) on the differentiable path with activation
    /// checkpointing: the result's backward stops at the last decoder layer, and
    /// [`Checkpoint::backward`] completes it (see
    /// [`score_checkpointed`](crate::model::score_checkpointed)).
    pub fn response_logits_checkpointed(
        &self,
        pairs: &[(Vec<u32>, Vec<u32>)],
    ) -> anyhow::Result<(ResponseLogits, Checkpoint)> {
        let (ids, pads) = self.padded(pairs)?;
        let (hidden, checkpoint) = self.agent.base.forward_checkpointed(
            &ids,
            &pads,
            self.agent.lora.as_ref(),
            response_tail(pairs),
        )?;
        Ok((self.head_logits(pairs, &hidden)?, checkpoint))
    }

    /// The left-padded (prompt, response) sequences of `pairs` and their padding.
    fn padded(&self, pairs: &[(Vec<u32>, Vec<u32>)]) -> anyhow::Result<(Tensor, Vec<usize>)> {
        let seqs: Vec<Vec<u32>> = pairs
            .iter()
            .map(|(p, r)| [p.as_slice(), r.as_slice()].concat())
            .collect();
        left_pad(&seqs, self.agent.base.device())
    }

    /// The head's logits on the response positions of `pairs`, from their padded sequences'
    /// final hidden states (all positions, or the last [`response_tail`]).
    fn head_logits(
        &self,
        pairs: &[(Vec<u32>, Vec<u32>)],
        hidden: &Tensor,
    ) -> anyhow::Result<ResponseLogits> {
        let head = self
            .agent
            .value_head
            .as_ref()
            .context("internal: the verifier has no head")?;
        let len = hidden.dim(1)?;
        let r_max = pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(1);
        let logits = head.forward(&hidden.narrow(1, len - r_max, r_max)?.contiguous()?)?;
        let mask: Vec<f32> = pairs
            .iter()
            .flat_map(|(_, r)| (0..r_max).map(move |k| f32::from(u8::from(k >= r_max - r.len()))))
            .collect();
        let mask = Tensor::from_vec(mask, (pairs.len(), r_max), self.agent.base.device())?;
        Ok(ResponseLogits { logits, mask })
    }

    /// P(correct) of each (prompt ids, response ids): the sigmoid of the head on the last
    /// token, in batches of `batch_size`.
    pub fn probabilities_of_ids(
        &self,
        pairs: &[(Vec<u32>, Vec<u32>)],
        batch_size: usize,
    ) -> anyhow::Result<Vec<f32>> {
        self.probabilities_of_ids_until(pairs, batch_size, None)
    }

    /// [`probabilities_of_ids`](Self::probabilities_of_ids), refused once `deadline` has
    /// passed (checked before each batch).
    fn probabilities_of_ids_until(
        &self,
        pairs: &[(Vec<u32>, Vec<u32>)],
        batch_size: usize,
        deadline: Option<std::time::Instant>,
    ) -> anyhow::Result<Vec<f32>> {
        let head = self
            .agent
            .value_head
            .as_ref()
            .context("internal: the verifier has no head")?;
        // Similar lengths batch together (less padding); results go back in order.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by_key(|&i| pairs[i].0.len() + pairs[i].1.len());
        let mut out = vec![0f32; pairs.len()];
        for (k, chunk) in order.chunks(batch_size.max(1)).enumerate() {
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                bail!(
                    "the call's deadline passed with {} of {} responses scored",
                    k * batch_size.max(1),
                    pairs.len()
                );
            }
            let seqs: Vec<Vec<u32>> = chunk
                .iter()
                .map(|&i| [pairs[i].0.as_slice(), pairs[i].1.as_slice()].concat())
                .collect();
            let (ids, pads) = left_pad(&seqs, self.agent.base.device())?;
            let hidden = self
                .agent
                .forward_tail(&ids, &pads, None, Pass::Inference, 1)?;
            let last = hidden.i((.., 0, ..))?.contiguous()?;
            let p = candle_nn::ops::sigmoid(&head.forward(&last)?)?.to_vec1::<f32>()?;
            for (&i, p) in chunk.iter().zip(p) {
                out[i] = p;
            }
        }
        Ok(out)
    }

    /// P(correct) of each (question, response).
    pub fn probabilities(
        &self,
        pairs: &[(&str, &str)],
        batch_size: usize,
    ) -> anyhow::Result<Vec<f32>> {
        self.probabilities_until(pairs, batch_size, None)
    }

    /// [`probabilities`](Self::probabilities), refused once `deadline` has passed (checked
    /// before each pair is tokenized and before each batch).
    pub fn probabilities_until(
        &self,
        pairs: &[(&str, &str)],
        batch_size: usize,
        deadline: Option<std::time::Instant>,
    ) -> anyhow::Result<Vec<f32>> {
        let late = || deadline.is_some_and(|d| std::time::Instant::now() >= d);
        let mut ids = Vec::with_capacity(pairs.len());
        for (q, r) in pairs {
            if late() {
                bail!(
                    "the call's deadline passed with {} of {} responses tokenized",
                    ids.len(),
                    pairs.len()
                );
            }
            ids.push(self.prompter.ids(q, r)?);
        }
        self.probabilities_of_ids_until(&ids, batch_size, deadline)
    }
}

/// The positions whose hidden states the head reads: the longest response's (at least one).
fn response_tail(pairs: &[(Vec<u32>, Vec<u32>)]) -> usize {
    pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(0).max(1)
}

fn left_pad(seqs: &[Vec<u32>], dev: &Device) -> anyhow::Result<(Tensor, Vec<usize>)> {
    let len = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * len);
    let mut pads = Vec::with_capacity(seqs.len());
    for s in seqs {
        pads.push(len - s.len());
        ids.extend(std::iter::repeat_n(0, len - s.len()));
        ids.extend_from_slice(s);
    }
    Ok((Tensor::from_vec(ids, (seqs.len(), len), dev)?, pads))
}

pub fn read_meta(dir: &Path) -> anyhow::Result<Meta> {
    let path = dir.join(META_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "verifier checkpoint {}: missing file {}",
            dir.display(),
            path.display()
        )
    })?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a maporl verifier description", path.display()))
}

/// A trained verifier served to plugins: the host's [`Judge`]. Scores are cached per
/// (question, response) between [`Judge::prefetch`] calls, so a verifier plugin that calls
/// `judge` per task after the host prefetched the whole turn costs no extra forward pass.
pub struct LearnedVerifier {
    /// Shared by the views [`with_own_cache`](Self::with_own_cache) makes.
    model: Arc<Mutex<VerifierModel>>,
    batch_size: usize,
    checkpoint: PathBuf,
    sha256: String,
    /// Scores by the sha256 of (question, response), so that what the cache keeps does not
    /// grow with what plugins send: 36 bytes a pair.
    cache: Mutex<HashMap<PairKey, f32>>,
}

/// sha256 of a (question, response) pair, each length-prefixed.
type PairKey = [u8; 32];

fn pair_key(question: &str, response: &str) -> PairKey {
    let mut h = Sha256::new();
    h.update((question.len() as u64).to_le_bytes());
    h.update(question.as_bytes());
    h.update(response.as_bytes());
    h.finalize().into()
}

impl LearnedVerifier {
    pub fn load(
        model: &Path,
        checkpoint: &Path,
        dtype: DType,
        device: &Device,
        batch_size: usize,
    ) -> anyhow::Result<LearnedVerifier> {
        let sha256 = checkpoint_sha256(checkpoint)?;
        let model = VerifierModel::load(model, checkpoint, dtype, device)?;
        Ok(LearnedVerifier {
            model: Arc::new(Mutex::new(model)),
            batch_size,
            checkpoint: checkpoint.to_path_buf(),
            sha256,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The verifier a run config names (`[verifier] checkpoint`), if any.
    pub fn from_config(config: &Config) -> anyhow::Result<Option<LearnedVerifier>> {
        let v = &config.verifier;
        if v.checkpoint.is_empty() {
            return Ok(None);
        }
        let model = if v.model.is_empty() {
            &config.model.path
        } else {
            &v.model
        };
        let dtype = config.model.candle_dtype();
        let device = v
            .device
            .unwrap_or(config.device)
            .open()
            .context("verifier.device")?;
        Self::load(
            &crate::model::resolve_model(model)?,
            &expand_home(&v.checkpoint),
            dtype,
            &device,
            v.batch_size,
        )
        .context("in the config's [verifier] section")
        .map(Some)
    }

    pub fn checkpoint(&self) -> &Path {
        &self.checkpoint
    }

    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The same model (shared, not copied) with a score cache of its own: for debates run at
    /// the same time (a server's workers), so that one's prefetch does not empty the cache of
    /// another, whose scores would then be computed again in other batches.
    pub fn with_own_cache(&self) -> LearnedVerifier {
        LearnedVerifier {
            model: self.model.clone(),
            batch_size: self.batch_size,
            checkpoint: self.checkpoint.clone(),
            sha256: self.sha256.clone(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The model, even after a panic while another caller held it (its weights are only
    /// read, so a panic cannot leave them half-written).
    fn model(&self) -> std::sync::MutexGuard<'_, VerifierModel> {
        self.model
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<PairKey, f32>> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// P(correct) of each (question, response), in batches of the configured size.
    pub fn probabilities(&self, pairs: &[(&str, &str)]) -> anyhow::Result<Vec<f32>> {
        self.model().probabilities(pairs, self.batch_size)
    }

    /// Scores the pairs not in the cache, adds them to it, and returns every pair's score.
    /// The cache stays locked throughout, so a concurrent prefetch cannot empty it between.
    /// With a `deadline`, the forward passes stop once it has passed (between batches),
    /// and the pairs scored so far stay in the cache.
    fn fill(
        &self,
        pairs: &[(&str, &str)],
        deadline: Option<std::time::Instant>,
    ) -> anyhow::Result<Vec<f32>> {
        let mut cache = self.cache();
        let keys: Vec<PairKey> = pairs.iter().map(|(q, r)| pair_key(q, r)).collect();
        let mut seen = std::collections::HashSet::new();
        let missing: Vec<usize> = (0..pairs.len())
            .filter(|&i| !cache.contains_key(&keys[i]) && seen.insert(keys[i]))
            .collect();
        if !missing.is_empty() {
            let batch: Vec<(&str, &str)> = missing.iter().map(|&i| pairs[i]).collect();
            let probs = self
                .model()
                .probabilities_until(&batch, self.batch_size, deadline)?;
            for (&i, p) in missing.iter().zip(probs) {
                cache.insert(keys[i], p);
            }
        }
        Ok(keys.iter().map(|k| cache[k]).collect())
    }
}

impl Judge for LearnedVerifier {
    fn judge(&self, question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
        let pairs: Vec<(&str, &str)> = responses.iter().map(|r| (question, r.as_str())).collect();
        self.fill(&pairs, None)
            .map_err(|e| format!("the learned verifier failed: {e:#}"))
    }

    fn judge_until(
        &self,
        question: &str,
        responses: &[String],
        deadline: std::time::Instant,
    ) -> Result<Vec<f32>, String> {
        let pairs: Vec<(&str, &str)> = responses.iter().map(|r| (question, r.as_str())).collect();
        self.fill(&pairs, Some(deadline))
            .map_err(|e| format!("the learned verifier stopped: {e:#}"))
    }

    fn prefetch(&self, pairs: &[(&str, &str)]) -> Result<(), String> {
        self.cache().clear();
        self.fill(pairs, None)
            .map(|_| ())
            .map_err(|e| format!("the learned verifier failed: {e:#}"))
    }

    fn checkpoint_sha256(&self) -> Option<String> {
        Some(self.sha256.clone())
    }
}
