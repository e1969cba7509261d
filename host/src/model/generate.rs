//! Seeded sampling, batched generation with a KV cache, and log-probs / values on response
//! positions.

use std::sync::Arc;

use super::agent::Agent;
use super::decoder::{Adapter, Checkpoint, KvCache, Pass, Target};
use super::lora::Lora;
use super::prefix::{speaker_key, PrefixCache};
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
    /// What PPO needs of the generating policy, when [`generate_traced`] was asked for it.
    pub trace: Option<PolicyTrace>,
}

/// The generating policy's view of its own tokens, taken while it generated them: what a
/// separate [`score_at_temperature`] pass over the prompt and response would compute for
/// the old policy (the same weights; the same positions up to the batch's padding), so PPO
/// need not score the responses again.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyTrace {
    /// The sampling temperature the log-probs were taken at ([`score_at_temperature`]'s
    /// rule: 0 or below scores at 1).
    pub temperature: f64,
    /// Per token: its log-prob under the tempered, unfiltered distribution (top-k / top-p
    /// do not apply, as in PPO's scoring).
    pub logprobs: Vec<f32>,
    /// Per token: the agent's value head at the position that predicted the token; empty
    /// for an agent without one (a learner with no critic, as GRPO's).
    pub values: Vec<f32>,
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

/// [`generate`], also recording each token's [`PolicyTrace`] at `temperature` (the
/// temperature the update will score at), with the agent's value head's values if it has
/// one.
pub fn generate_traced(
    agent: &Agent,
    prompts: &[Vec<u32>],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    temperature: f64,
) -> Result<Vec<Generation>> {
    let mut speakers = [Speaker {
        agent,
        prompts,
        sampler,
        trace_at: Some(temperature),
    }];
    Ok(generate_together(&mut speakers, opts)?.remove(0))
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
    let mut speakers = [Speaker {
        agent,
        prompts,
        sampler,
        trace_at: None,
    }];
    Ok(decode(&mut speakers, opts, observe, None)?.remove(0))
}

/// One agent's share of a batch that several agents on one base generate together: its
/// prompts, its sampler (drawn from for its rows only, in row order, as if it generated
/// alone) and, for a learner, the temperature to record its [`PolicyTrace`] at.
pub struct Speaker<'a> {
    pub agent: &'a Agent,
    pub prompts: &'a [Vec<u32>],
    pub sampler: &'a mut Sampler,
    pub trace_at: Option<f64>,
}

/// Agents on one base, each with its own adapter (or none), generate in one batch: the
/// base's weights are read once per step for every agent's rows, and each row's adapter
/// applies to its own rows only (the batched multi-LoRA of S-LoRA / Punica: the rows are
/// grouped by agent, and each group's LoRA delta is computed on its rows). Returns each
/// speaker's generations. The agents must share one base (the same `Arc`).
pub fn generate_together(
    speakers: &mut [Speaker<'_>],
    opts: &GenerateOptions,
) -> Result<Vec<Vec<Generation>>> {
    decode(speakers, opts, &mut |_, _| true, None)
}

/// [`generate_together`] with a [`PrefixCache`]: each prompt's longest prefix held for its
/// speaker's weights is not computed again, and every prompt and conversation is kept for
/// the prompts that extend it. The prompts' forward then runs row by row (no padding), so
/// the numbers differ from [`generate_together`]'s by rounding; the same inputs and cache
/// give the same tokens.
pub fn generate_sharing(
    speakers: &mut [Speaker<'_>],
    opts: &GenerateOptions,
    prefixes: &mut PrefixCache,
) -> Result<Vec<Vec<Generation>>> {
    decode(speakers, opts, &mut |_, _| true, Some(prefixes))
}

/// The rows of a batch grouped by agent: `(first row, rows, adapter)` in row order.
struct RowAdapters<'a> {
    groups: Vec<(usize, usize, Option<&'a Lora>)>,
}

impl Adapter for RowAdapters<'_> {
    fn delta(&self, layer: usize, target: Target, x: &Tensor) -> Result<Option<Tensor>> {
        if let [(_, _, lora)] = self.groups[..] {
            return match lora {
                Some(l) => l.delta(layer, target, x),
                None => Ok(None),
            };
        }
        let mut parts: Vec<Option<Tensor>> = Vec::with_capacity(self.groups.len());
        for &(start, rows, lora) in &self.groups {
            parts.push(match lora {
                Some(l) => l.delta(layer, target, &x.narrow(0, start, rows)?)?,
                None => None,
            });
        }
        let Some(like) = parts.iter().flatten().next() else {
            return Ok(None);
        };
        let mut shape = like.dims().to_vec();
        let mut whole = Vec::with_capacity(parts.len());
        for (part, &(_, rows, _)) in parts.iter().zip(&self.groups) {
            whole.push(match part {
                Some(t) => t.clone(),
                None => {
                    shape[0] = rows;
                    Tensor::zeros(shape.as_slice(), like.dtype(), like.device())?
                }
            });
        }
        Ok(Some(Tensor::cat(&whole, 0)?))
    }
}

/// The decoding loop behind every `generate`. Rows that have finished leave the batch (and
/// the KV cache) at once, so the steps after them cost only the rows still generating;
/// each speaker's sampler draws for its live rows in row order, as it would with the
/// finished rows kept and the other speakers absent.
fn decode(
    speakers: &mut [Speaker<'_>],
    opts: &GenerateOptions,
    observe: &mut dyn FnMut(usize, u32) -> bool,
    mut prefixes: Option<&mut PrefixCache>,
) -> Result<Vec<Vec<Generation>>> {
    let Some(first) = speakers.first() else {
        return Ok(vec![]);
    };
    let base = first.agent.base.clone();
    for (i, s) in speakers.iter().enumerate() {
        if !Arc::ptr_eq(&s.agent.base, &base) {
            bail!("generate: speaker {i} is on another base than speaker 0");
        }
        if s.prompts.iter().any(Vec::is_empty) {
            bail!("generate: empty prompt");
        }
        if let Some(t) = s.trace_at {
            if !t.is_finite() {
                bail!("generate: temperature {t} is not finite");
            }
        }
    }
    // Every row: its speaker and its index among that speaker's prompts.
    let rows: Vec<(usize, usize)> = speakers
        .iter()
        .enumerate()
        .flat_map(|(k, s)| (0..s.prompts.len()).map(move |i| (k, i)))
        .collect();
    let mut out: Vec<Vec<Generation>> = speakers
        .iter()
        .map(|s| {
            s.prompts
                .iter()
                .map(|_| Generation {
                    tokens: vec![],
                    logprobs: vec![],
                    stopped: false,
                    trace: s.trace_at.map(|temperature| PolicyTrace {
                        temperature,
                        logprobs: vec![],
                        values: vec![],
                    }),
                })
                .collect()
        })
        .collect();
    if rows.is_empty() {
        return Ok(out);
    }
    if opts.max_new_tokens == 0 {
        return Ok(out);
    }
    let dev = base.device();
    // The prompts' forward: each row alone from its longest cached prefix, or the whole
    // batch left padded. Either way: the cache, each row's padding, and each row's hidden
    // state at its last prompt position.
    let keys = match prefixes {
        Some(_) => speakers
            .iter()
            .map(|s| speaker_key(s.agent))
            .collect::<Result<Vec<_>>>()?,
        None => vec![],
    };
    let (mut cache, mut pads, mut last) = match prefixes.as_deref_mut() {
        Some(prefixes) => prefill_sharing(speakers, &keys, &rows, prefixes)?,
        None => {
            let prompts: Vec<Vec<u32>> = rows
                .iter()
                .map(|&(k, i)| speakers[k].prompts[i].clone())
                .collect();
            let (ids, pads) = left_pad(&prompts, opts.pad_token, dev)?;
            let mut cache = KvCache::new(base.config().num_hidden_layers);
            let live: Vec<usize> = (0..rows.len()).collect();
            let adapters = row_adapters(speakers, &live, &rows);
            // Only the last position's hidden state is read (the next token's logits).
            let hidden = base.forward_tail(
                &ids,
                &pads,
                Some(&mut cache),
                Some(&adapters as &dyn Adapter),
                Pass::Inference,
                1,
            )?;
            (cache, pads, hidden.i((.., 0, ..))?.contiguous()?)
        }
    };
    // `live[j]`: the row (index into `rows`) at batch position j; grouped by speaker, since
    // rows only ever leave.
    let mut live: Vec<usize> = (0..rows.len()).collect();
    for step in 0..opts.max_new_tokens {
        let groups = speaker_groups(&live, &rows);
        let logits = base.logits(&last)?;
        let mut keep = Vec::with_capacity(live.len());
        let mut next = Vec::with_capacity(live.len());
        let mut ended = Vec::new();
        for &(k, start, n) in &groups {
            let speaker = &mut speakers[k];
            let group_logits = logits.narrow(0, start, n)?;
            let picks = speaker.sampler.sample(&group_logits)?;
            let traced = match speaker.trace_at {
                Some(temperature) => {
                    let tokens = picks.iter().map(|&(tok, _)| tok).collect();
                    let (lp, _) =
                        tempered_logprobs(speaker.agent, &group_logits, tokens, temperature)?;
                    // A learner without a critic records its log-probs alone.
                    let values = match speaker.agent.value_head.as_ref() {
                        Some(vh) => vh.forward(&last.narrow(0, start, n)?)?.to_vec1::<f32>()?,
                        None => Vec::new(),
                    };
                    Some((lp.to_vec1::<f32>()?, values))
                }
                None => None,
            };
            for (j, &(tok, lp)) in picks.iter().enumerate() {
                let row = live[start + j];
                let g = &mut out[k][rows[row].1];
                g.tokens.push(tok);
                g.logprobs.push(lp);
                if let (Some(tr), Some((lps, values))) = (g.trace.as_mut(), traced.as_ref()) {
                    tr.logprobs.push(lps[j]);
                    if let Some(&v) = values.get(j) {
                        tr.values.push(v);
                    }
                }
                g.stopped = opts.stop_tokens.contains(&tok);
                let cut = !observe(rows[row].1, tok);
                if !g.stopped && !cut {
                    keep.push(start + j);
                    next.push(tok);
                } else {
                    ended.push(start + j);
                }
            }
        }
        let last_step = step + 1 == opts.max_new_tokens;
        if let Some(prefixes) = prefixes.as_deref_mut() {
            // Rows that end keep their conversation for the turns that extend it.
            let done = if last_step || keep.is_empty() {
                (0..live.len()).collect()
            } else {
                ended
            };
            for j in done {
                let (k, i) = rows[live[j]];
                if let Some(key) = keys[k] {
                    let generated = &out[k][i].tokens;
                    let mut tokens = speakers[k].prompts[i].clone();
                    // The last token is not in the cache: no forward has read it yet.
                    tokens.extend_from_slice(&generated[..generated.len() - 1]);
                    prefixes.insert(key, tokens, base.unpadded_row(&cache, j, pads[j])?)?;
                }
            }
        }
        if keep.is_empty() || last_step {
            break;
        }
        if keep.len() < live.len() {
            let kept = Tensor::from_vec(
                keep.iter().map(|&j| j as u32).collect::<Vec<_>>(),
                keep.len(),
                dev,
            )?;
            cache.retain_rows(&kept)?;
            pads = keep.iter().map(|&j| pads[j]).collect();
            live = keep.iter().map(|&j| live[j]).collect();
        }
        let input = Tensor::from_vec(next, (live.len(), 1), dev)?;
        let adapters = row_adapters(speakers, &live, &rows);
        let hidden = base.forward(
            &input,
            &pads,
            Some(&mut cache),
            Some(&adapters as &dyn Adapter),
            Pass::Inference,
        )?;
        last = hidden.i((.., 0, ..))?.contiguous()?;
    }
    Ok(out)
}

/// The adapters of the live rows: each speaker's share with its own adapter, neighbouring
/// speakers with the same adapter (or none) in one LoRA pass.
fn row_adapters<'a>(
    speakers: &[Speaker<'a>],
    live: &[usize],
    rows: &[(usize, usize)],
) -> RowAdapters<'a> {
    let mut adapters = RowAdapters { groups: Vec::new() };
    for (k, start, n) in speaker_groups(live, rows) {
        let lora = speakers[k].agent.lora.as_ref();
        match adapters.groups.last_mut() {
            Some((_, rows, last)) if same_adapter(*last, lora) => *rows += n,
            _ => adapters.groups.push((start, n, lora)),
        }
    }
    adapters
}

/// The prompts' forward with a prefix cache: each row alone, continuing from the longest
/// prefix the cache holds for its speaker's weights, and kept in the cache for the rows
/// after it (identical prompts of one batch are computed once). Returns the left-padded
/// batch cache, each row's padding and each row's last hidden state.
fn prefill_sharing(
    speakers: &[Speaker<'_>],
    keys: &[Option<u64>],
    rows: &[(usize, usize)],
    prefixes: &mut PrefixCache,
) -> Result<(KvCache, Vec<usize>, Tensor)> {
    let base = &speakers[0].agent.base;
    let dev = base.device();
    let mut kvs = Vec::with_capacity(rows.len());
    let mut lasts = Vec::with_capacity(rows.len());
    for &(k, i) in rows {
        let prompt = &speakers[k].prompts[i];
        let (reused, mut cache) = match keys[k].and_then(|key| prefixes.lookup(key, prompt)) {
            Some((n, kv)) => (n, KvCache::from_prefix(kv, n)),
            None => (0, KvCache::new(base.config().num_hidden_layers)),
        };
        let rest = &prompt[reused..];
        let ids = Tensor::from_vec(rest.to_vec(), (1, rest.len()), dev)?;
        let adapters = RowAdapters {
            groups: vec![(0, 1, speakers[k].agent.lora.as_ref())],
        };
        let hidden = base.forward_tail(
            &ids,
            &[0],
            Some(&mut cache),
            Some(&adapters as &dyn Adapter),
            Pass::Inference,
            1,
        )?;
        lasts.push(hidden.i((.., 0, ..))?);
        let kv = cache.row(0, 0)?;
        prefixes.count(reused, rest.len());
        if let Some(key) = keys[k] {
            prefixes.insert(key, prompt.clone(), kv.clone())?;
        }
        kvs.push(kv);
    }
    let len = rows
        .iter()
        .map(|&(k, i)| speakers[k].prompts[i].len())
        .max()
        .unwrap_or(0);
    let (cache, pads) = base.batch_cache(kvs, len)?;
    Ok((cache, pads, Tensor::cat(&lasts, 0)?.contiguous()?))
}

fn same_adapter(a: Option<&Lora>, b: Option<&Lora>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => std::ptr::eq(a, b),
        _ => false,
    }
}

/// The live rows' speakers as `(speaker, first batch position, rows)`, in batch order.
fn speaker_groups(live: &[usize], rows: &[(usize, usize)]) -> Vec<(usize, usize, usize)> {
    let mut groups: Vec<(usize, usize, usize)> = Vec::new();
    for (j, &row) in live.iter().enumerate() {
        let k = rows[row].0;
        match groups.last_mut() {
            Some((last, _, n)) if *last == k => *n += 1,
            _ => groups.push((k, j, 1)),
        }
    }
    groups
}

/// Each row's log-prob of its target, and its entropy, under `logits` (rows, vocab) divided
/// by `temperature` (0 or below: 1), in f32 whatever the model's dtype; differentiable in
/// the logits. The one computation behind [`score_at_temperature`] and [`PolicyTrace`].
fn tempered_logprobs(
    agent: &Agent,
    logits: &Tensor,
    targets: Vec<u32>,
    temperature: f64,
) -> Result<(Tensor, Tensor)> {
    let temperature = if temperature > 0.0 { temperature } else { 1.0 };
    let logits = if temperature == 1.0 {
        logits.clone()
    } else {
        (logits / temperature)?
    };
    if super::fused::applies(agent.base.kernels().fused_ops, &[&logits]) {
        // One op: the log-softmax over the vocabulary is never materialised.
        let lp_h = super::fused::token_logprobs(&logits, targets)?;
        Ok((
            lp_h.narrow(1, 0, 1)?.squeeze(1)?,
            lp_h.narrow(1, 1, 1)?.squeeze(1)?,
        ))
    } else {
        // In f32 whatever the model's dtype (as TRL does with `logits.float()`): bf16
        // log-probs are off by up to ~0.03 nats a token, and PPO's ratios and KL sum them.
        let lsm = candle_nn::ops::log_softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
        let n = targets.len();
        let tgt = Tensor::from_vec(targets, (n, 1), logits.device())?;
        Ok((
            lsm.gather(&tgt, 1)?.squeeze(1)?,
            (lsm.exp()? * &lsm)?.sum(D::Minus1)?.neg()?,
        ))
    }
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

/// What every scoring entry point refuses: a temperature that is not finite, and a pair with
/// an empty prompt or response.
fn check_scoring(pairs: &[(Vec<u32>, Vec<u32>)], temperature: f64) -> Result<()> {
    if !temperature.is_finite() {
        bail!("score: temperature {temperature} is not finite");
    }
    if pairs.iter().any(|(p, r)| p.is_empty() || r.is_empty()) {
        bail!("score: every pair needs a non-empty prompt and response");
    }
    Ok(())
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
    let (ids, pads) = scoring_batch(agent, pairs, temperature)?;
    let hidden = agent.forward_tail(&ids, &pads, None, pass, scored_tail(pairs))?;
    score_hidden(agent, pairs, &ids, &hidden, chunk, temperature)
}

/// [`score_at_temperature`] on the differentiable path ([`Pass::Training`]) with
/// activation checkpointing: the same result, whose backward stops at the last decoder
/// layer; [`Checkpoint::backward`] then recomputes the layers one at a time to finish it.
/// For long sequences: one layer's activations are held at a time instead of every
/// layer's, for about one more forward pass.
pub fn score_checkpointed(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    chunk: usize,
    temperature: f64,
) -> Result<(Scored, Checkpoint)> {
    let (ids, pads) = scoring_batch(agent, pairs, temperature)?;
    let (hidden, checkpoint) =
        agent
            .base
            .forward_checkpointed(&ids, &pads, agent.lora.as_ref(), scored_tail(pairs))?;
    let scored = score_hidden(agent, pairs, &ids, &hidden, chunk, temperature)?;
    Ok((scored, checkpoint))
}

/// The positions whose hidden states score `pairs` (checked non-empty): the longest
/// response's, and the one before it, which predicts its first token.
fn scored_tail(pairs: &[(Vec<u32>, Vec<u32>)]) -> usize {
    pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(0) + 1
}

/// The left-padded (prompt, response) sequences of a scoring batch and their padding.
fn scoring_batch(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    temperature: f64,
) -> Result<(Tensor, Vec<usize>)> {
    check_scoring(pairs, temperature)?;
    if pairs.is_empty() {
        bail!("score: empty batch");
    }
    let seqs: Vec<Vec<u32>> = pairs
        .iter()
        .map(|(p, r)| [p.as_slice(), r.as_slice()].concat())
        .collect();
    left_pad(&seqs, 0, agent.base.device())
}

/// The scores of `pairs` from their sequences' final hidden states (all positions, or
/// the last [`scored_tail`]).
fn score_hidden(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    ids: &Tensor,
    hidden: &Tensor,
    chunk: usize,
    temperature: f64,
) -> Result<Scored> {
    let temperature = if temperature > 0.0 { temperature } else { 1.0 };
    let base = &agent.base;
    let dev = base.device();
    let len = ids.dim(1)?;
    let r_max = pairs.iter().map(|(_, r)| r.len()).max().unwrap();
    // Hidden state at position j predicts token j + 1.
    let pred = hidden.narrow(1, hidden.dim(1)? - 1 - r_max, r_max)?;
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
        let b = logits.dim(0)?;
        let vocab = logits.dim(2)?;
        let tgt = targets.narrow(1, c0, n)?.flatten_all()?.to_vec1::<u32>()?;
        let (lp, h) = tempered_logprobs(agent, &logits.reshape((b * n, vocab))?, tgt, temperature)?;
        parts.push(lp.reshape((b, n))?);
        entropy_parts.push(h.reshape((b, n))?);
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

/// Log-probs (and values) of many responses, each shared token prefix computed once.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixScored {
    /// Per pair, in the pairs' order: the log-prob of each response token.
    pub logprobs: Vec<Vec<f32>>,
    /// Per pair, when asked for: the value head's value at the position predicting each
    /// response token.
    pub values: Option<Vec<Vec<f32>>>,
    /// Positions run through the model.
    pub computed: usize,
    /// Positions of all the sequences together (computed + reused).
    pub positions: usize,
}

impl PrefixScored {
    /// The share of positions taken from a shared prefix instead of computed.
    pub fn hit_rate(&self) -> f64 {
        if self.positions == 0 {
            return 0.0;
        }
        1.0 - self.computed as f64 / self.positions as f64
    }
}

/// [`score_at_temperature`] without gradients for `(prompt, response)` pairs that share
/// prefixes (a debate's turn-t conversation holds its turn t-1 conversation; every agent's
/// turn-1 prompt for a task is the same): each position a sequence shares with another is
/// computed once, in the manner of a radix cache. The sequences are taken in lexicographic
/// order of their tokens, a depth-first walk of their prefix tree, so the sequence before
/// each one shares the longest prefix with it of all earlier ones, and one sequence's KV
/// cache is all that is kept: each forward continues that cache from the shared prefix.
/// Rows run one at a time (batch 1), so no position is padding. With `values`, the agent's
/// value head is applied too (it must have one).
pub fn score_shared_prefixes(
    agent: &Agent,
    pairs: &[(Vec<u32>, Vec<u32>)],
    chunk: usize,
    temperature: f64,
    values: bool,
) -> Result<PrefixScored> {
    check_scoring(pairs, temperature)?;
    let head = match (values, &agent.value_head) {
        (true, None) => bail!("score: values asked for, but the agent has no value head"),
        (true, Some(h)) => Some(h),
        (false, _) => None,
    };
    let base = &agent.base;
    let dev = base.device();
    let seqs: Vec<Vec<u32>> = pairs
        .iter()
        .map(|(p, r)| [p.as_slice(), r.as_slice()].concat())
        .collect();
    let mut order: Vec<usize> = (0..pairs.len()).collect();
    order.sort_by(|&a, &b| seqs[a].cmp(&seqs[b]).then(a.cmp(&b)));
    let mut out = PrefixScored {
        logprobs: vec![Vec::new(); pairs.len()],
        values: head.map(|_| vec![Vec::new(); pairs.len()]),
        computed: 0,
        positions: 0,
    };
    let mut cache = KvCache::new(base.config().num_hidden_layers);
    let mut previous: &[u32] = &[];
    let chunk = chunk.max(1);
    for i in order {
        let (seq, p, r) = (&seqs[i], pairs[i].0.len(), pairs[i].1.len());
        let shared = previous.iter().zip(seq).take_while(|(a, b)| a == b).count();
        // The position before the response must be computed: its hidden state predicts the
        // response's first token.
        let keep = shared.min(p - 1);
        cache.truncate(keep)?;
        let ids = Tensor::from_slice(&seq[keep..], (1, seq.len() - keep), dev)?;
        // Hidden state at position j predicts token j + 1: only the last r + 1 are read.
        let hidden = agent.forward_tail(&ids, &[0], Some(&mut cache), Pass::Inference, r + 1)?;
        let pred = hidden.narrow(1, 0, r)?.squeeze(0)?.contiguous()?;
        let mut lps = Vec::with_capacity(r);
        let mut c0 = 0;
        while c0 < r {
            let n = chunk.min(r - c0);
            let logits = base.logits(&pred.narrow(0, c0, n)?)?;
            let (lp, _) = tempered_logprobs(
                agent,
                &logits,
                seq[p + c0..p + c0 + n].to_vec(),
                temperature,
            )?;
            lps.extend(lp.to_vec1::<f32>()?);
            c0 += n;
        }
        out.logprobs[i] = lps;
        if let (Some(h), Some(v)) = (head, out.values.as_mut()) {
            v[i] = h.forward(&pred)?.to_vec1::<f32>()?;
        }
        out.computed += seq.len() - keep;
        out.positions += seq.len();
        previous = seq;
    }
    Ok(out)
}
