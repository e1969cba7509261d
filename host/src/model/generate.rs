//! Seeded sampling, batched generation with a KV cache, and log-probs / values on response
//! positions.

use super::agent::Agent;
use super::decoder::KvCache;
use super::decoder::Pass;
use anyhow::{bail, Result};
use candle_core::{DType, IndexOp, Tensor, D};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f64,
    /// Nucleus sampling threshold in (0, 1]; 1 disables it.
    pub top_p: f64,
    /// Keep only the k most likely tokens; 0 disables it.
    pub top_k: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
        }
    }
}

/// The position of a ChaCha8 random stream (seed, stream, word position), as saved in
/// checkpoints.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RngState {
    pub seed: String,
    pub stream: u64,
    /// A u128, as a decimal string (JSON numbers are doubles).
    pub word_pos: String,
}

/// A seeded sampler: the same seed and logits give the same tokens.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams, seed: u64) -> Sampler {
        Sampler {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    pub fn params(&self) -> SamplingParams {
        self.params
    }

    /// Where the sampler's random stream stands, for a checkpoint.
    pub fn state(&self) -> RngState {
        RngState {
            seed: hex::encode(self.rng.get_seed()),
            stream: self.rng.get_stream(),
            word_pos: self.rng.get_word_pos().to_string(),
        }
    }

    /// Puts the random stream where [`state`](Self::state) found it.
    pub fn restore(&mut self, state: &RngState) -> Result<()> {
        let seed: [u8; 32] = hex::decode(&state.seed)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| anyhow::anyhow!("sampler state: `seed` is not 32 hex bytes"))?;
        let pos: u128 = state
            .word_pos
            .parse()
            .map_err(|_| anyhow::anyhow!("sampler state: `word_pos` is not a number"))?;
        let mut rng = ChaCha8Rng::from_seed(seed);
        rng.set_stream(state.stream);
        rng.set_word_pos(pos);
        self.rng = rng;
        Ok(())
    }

    /// Samples one token per row of `logits` (batch, vocab). Returns (token, log-prob) where
    /// the log-prob is taken under the distribution sampled from (tempered, top-k / top-p
    /// filtered, renormalised). Greedy decoding returns the model's own (temperature 1,
    /// unfiltered) log-prob of the argmax, since its sampling distribution is a point mass.
    pub fn sample(&mut self, logits: &Tensor) -> Result<Vec<(u32, f32)>> {
        let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        Ok(rows.iter().map(|r| self.sample_row(r)).collect())
    }

    /// Samples for the rows where `active` is true (others get no draw and return None).
    pub fn sample_masked(
        &mut self,
        logits: &Tensor,
        active: &[bool],
    ) -> Result<Vec<Option<(u32, f32)>>> {
        let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
        Ok(rows
            .iter()
            .zip(active)
            .map(|(r, &a)| a.then(|| self.sample_row(r)))
            .collect())
    }

    fn sample_row(&mut self, row: &[f32]) -> (u32, f32) {
        let p = self.params;
        if p.temperature <= 0.0 {
            let (best, _) =
                row.iter()
                    .enumerate()
                    .fold((0usize, f32::NEG_INFINITY), |acc, (i, &x)| {
                        if x > acc.1 {
                            (i, x)
                        } else {
                            acc
                        }
                    });
            return (best as u32, row[best] - super::rows::logsumexp(row));
        }
        let t = p.temperature as f32;
        let scaled: Vec<f32> = row.iter().map(|&x| x / t).collect();
        // Candidate set in descending order when filtering, else the whole vocabulary.
        let filtering = p.top_k > 0 || p.top_p < 1.0;
        let mut idx: Vec<usize> = (0..scaled.len()).collect();
        if filtering {
            idx.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
            if p.top_k > 0 && p.top_k < idx.len() {
                idx.truncate(p.top_k);
            }
            if p.top_p < 1.0 {
                let lse = logsumexp(idx.iter().map(|&i| scaled[i]));
                let mut cum = 0.0f64;
                let mut keep = idx.len();
                for (n, &i) in idx.iter().enumerate() {
                    cum += ((scaled[i] - lse) as f64).exp();
                    if cum >= p.top_p {
                        keep = n + 1;
                        break;
                    }
                }
                idx.truncate(keep);
            }
        }
        let lse = if filtering {
            logsumexp(idx.iter().map(|&i| scaled[i]))
        } else {
            super::rows::logsumexp(&scaled)
        };
        let u: f64 = self.rng.random::<f64>();
        let mut cum = 0.0f64;
        let mut chosen = *idx.last().unwrap();
        for &i in &idx {
            cum += (scaled[i] - lse).exp() as f64;
            if u < cum {
                chosen = i;
                break;
            }
        }
        (chosen as u32, scaled[chosen] - lse)
    }
}

fn logsumexp(xs: impl Iterator<Item = f32> + Clone) -> f32 {
    let m = xs.clone().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    m + xs.map(|x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32
}

/// Limits and stop conditions for [`generate`].
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// Generation of a row ends after any of these (it is kept in the output).
    pub stop_tokens: Vec<u32>,
    /// Token used for left padding and for rows that have already stopped (never attended).
    pub pad_token: u32,
}

/// One generated continuation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// Log-prob of each token under the distribution it was sampled from.
    pub logprobs: Vec<f32>,
    /// True when a stop token ended it (the stop token is the last token).
    pub stopped: bool,
}

/// Left pads `seqs` to one length; returns the (batch, len) ids and each row's pad count.
pub(crate) fn left_pad(
    seqs: &[Vec<u32>],
    pad: u32,
    dev: &candle_core::Device,
) -> Result<(Tensor, Vec<usize>)> {
    let len = seqs.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(seqs.len() * len);
    let mut pads = Vec::with_capacity(seqs.len());
    for s in seqs {
        pads.push(len - s.len());
        ids.extend(std::iter::repeat_n(pad, len - s.len()));
        ids.extend_from_slice(s);
    }
    Ok((Tensor::from_vec(ids, (seqs.len(), len), dev)?, pads))
}

/// Batched generation (left padding, KV cache, fused kernels) with `agent`'s adapter.
pub fn generate(
    agent: &Agent,
    prompts: &[Vec<u32>],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
) -> Result<Vec<Generation>> {
    generate_observed(agent, prompts, sampler, opts, &mut |_, _| true)
}

/// [`generate`], telling `observe` of each token as it is sampled (row, token); a row ends
/// (as if it had met a stop token, `stopped` false) when `observe` returns false for it. The
/// observer sees exactly what [`generate`] would produce up to that point: streaming,
/// stop strings and cancellation cost nothing when they do not cut a row short.
pub fn generate_observed(
    agent: &Agent,
    prompts: &[Vec<u32>],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    observe: &mut dyn FnMut(usize, u32) -> bool,
) -> Result<Vec<Generation>> {
    if prompts.is_empty() {
        return Ok(vec![]);
    }
    if prompts.iter().any(Vec::is_empty) {
        bail!("generate: empty prompt");
    }
    let base = &agent.base;
    let (ids, pads) = left_pad(prompts, opts.pad_token, base.device())?;
    let mut cache = KvCache::new(base.config().num_hidden_layers);
    let mut out: Vec<Generation> = prompts
        .iter()
        .map(|_| Generation {
            tokens: vec![],
            logprobs: vec![],
            stopped: false,
        })
        .collect();
    let mut input = ids;
    // Rows the observer ended: no more tokens, though not stopped by a stop token.
    let mut cut = vec![false; out.len()];
    for _ in 0..opts.max_new_tokens {
        let active: Vec<bool> = out
            .iter()
            .zip(&cut)
            .map(|(g, c)| !g.stopped && !c)
            .collect();
        if !active.iter().any(|&a| a) {
            break;
        }
        let hidden = agent.forward(&input, &pads, Some(&mut cache), Pass::Inference)?;
        let t = hidden.dim(1)?;
        let last = hidden.i((.., t - 1, ..))?.contiguous()?;
        let logits = base.logits(&last)?;
        let picks = sampler.sample_masked(&logits, &active)?;
        let mut next = Vec::with_capacity(out.len());
        for (row, (g, pick)) in out.iter_mut().zip(picks).enumerate() {
            match pick {
                Some((tok, lp)) => {
                    g.tokens.push(tok);
                    g.logprobs.push(lp);
                    g.stopped = opts.stop_tokens.contains(&tok);
                    cut[row] = !observe(row, tok);
                    next.push(tok);
                }
                None => next.push(opts.pad_token),
            }
        }
        input = Tensor::from_vec(next, (out.len(), 1), base.device())?;
    }
    Ok(out)
}

/// Per-token log-probs (and values) of responses given prompts, on response positions only.
#[derive(Debug, Clone)]
pub struct Scored {
    /// (batch, R) log-probs of each response token; R is the longest response. Responses are
    /// right aligned: row b's tokens are its last `len_b` entries.
    pub logprobs: Tensor,
    /// (batch, R) values from the agent's value head at the position predicting each token.
    pub values: Option<Tensor>,
    /// (batch, R) 1.0 on real response tokens, 0.0 elsewhere.
    pub mask: Tensor,
    /// (batch, R) entropy of the policy's next-token distribution at each position.
    pub entropy: Tensor,
}

/// Scores `(prompt, response)` pairs with `agent`: lm_head runs only over response positions, in
/// chunks of `chunk` positions, so vocab-sized logits never cover whole sequences. Use
/// [`Pass::Training`] for a differentiable result. The log-probs are the model's own
/// (temperature 1); [`score_at_temperature`] scores the distribution a sampler drew from.
pub fn score(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    pass: Pass,
    chunk: usize,
) -> Result<Scored> {
    score_at_temperature(agent, pairs, pass, chunk, 1.0)
}

/// [`score`] with the logits divided by `temperature` first, as TRL's PPO does in its rollout
/// and its update (for the policy and the reference alike): the log-probs, and the entropy,
/// are those of the tempered distribution that sampled the responses, so PPO optimises the
/// policy that acted and the KL to the reference compares like with like. A temperature of 0
/// (greedy decoding) or below scores at 1.
pub fn score_at_temperature(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    pass: Pass,
    chunk: usize,
    temperature: f64,
) -> Result<Scored> {
    if !temperature.is_finite() {
        bail!("score: temperature {temperature} is not finite");
    }
    let temperature = if temperature > 0.0 { temperature } else { 1.0 };
    if pairs.is_empty() {
        bail!("score: empty batch");
    }
    if pairs.iter().any(|(p, r)| p.is_empty() || r.is_empty()) {
        bail!("score: every pair needs a non-empty prompt and response");
    }
    let base = &agent.base;
    let dev = base.device();
    let seqs: Vec<Vec<u32>> = pairs
        .iter()
        .map(|(p, r)| [p.as_slice(), r.as_slice()].concat())
        .collect();
    let (ids, pads) = left_pad(&seqs, 0, dev)?;
    let len = ids.dim(1)?;
    let r_max = pairs.iter().map(|(_, r)| r.len()).max().unwrap();
    let hidden = agent.forward(&ids, &pads, None, pass)?;
    // Hidden state at position j predicts token j + 1.
    let pred = hidden.narrow(1, len - 1 - r_max, r_max)?;
    let targets = ids.narrow(1, len - r_max, r_max)?;
    let chunk = chunk.max(1);
    let mut parts = Vec::new();
    let mut entropy_parts = Vec::new();
    let mut c0 = 0;
    while c0 < r_max {
        let n = chunk.min(r_max - c0);
        // Contiguous, so lm_head is one 2-D matmul: a broadcast matmul would make backward
        // materialise a (batch, vocab, hidden) gradient for the frozen lm_head weight.
        let logits = base.logits(&pred.narrow(1, c0, n)?.contiguous()?)?;
        let logits = if temperature == 1.0 {
            logits
        } else {
            (logits / temperature)?
        };
        let tgt = targets.narrow(1, c0, n)?.contiguous()?;
        if super::fused::applies(agent.base.kernels().fused_ops, &[&logits]) {
            // One op: the log-softmax over the vocabulary is never materialised.
            let (b, _, vocab) = logits.dims3()?;
            let lp_h = super::fused::token_logprobs(
                &logits.reshape((b * n, vocab))?,
                tgt.flatten_all()?.to_vec1::<u32>()?,
            )?
            .reshape((b, n, 2))?;
            parts.push(lp_h.narrow(2, 0, 1)?.squeeze(2)?);
            entropy_parts.push(lp_h.narrow(2, 1, 1)?.squeeze(2)?);
        } else {
            // In f32 whatever the model's dtype (as TRL does with `logits.float()`): bf16
            // log-probs are off by up to ~0.03 nats a token, and PPO's ratios and KL sum them.
            let lsm = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
            parts.push(lsm.gather(&tgt.unsqueeze(2)?, 2)?.squeeze(2)?);
            entropy_parts.push((lsm.exp()? * &lsm)?.sum(D::Minus1)?.neg()?);
        }
        c0 += n;
    }
    let logprobs = Tensor::cat(&parts, 1)?;
    let mask: Vec<f32> = pairs
        .iter()
        .flat_map(|(_, r)| (0..r_max).map(move |k| if k >= r_max - r.len() { 1.0 } else { 0.0 }))
        .collect();
    let mask = Tensor::from_vec(mask, (pairs.len(), r_max), dev)?;
    let values = match &agent.value_head {
        Some(vh) => Some(vh.forward(&pred.contiguous()?)?),
        None => None,
    };
    Ok(Scored {
        logprobs,
        values,
        mask,
        entropy: Tensor::cat(&entropy_parts, 1)?,
    })
}
