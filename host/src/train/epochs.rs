//! The optimisation every RL algorithm shares: epochs × minibatches × micro-batches of one
//! agent's samples, each micro-batch scored with gradients and its loss given by the
//! algorithm, the gradients summed over the micro-batches of a minibatch (on several ranks,
//! exchanged and added in the micro-batches' order) before one AdamW step. PPO and GRPO
//! differ only in the loss they hand it.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use candle_core::Tensor;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::ppo::{PpoConfig, Sample};
use crate::distributed::World;
use crate::model::{score_at_temperature, score_checkpointed, Agent, Pass, Scored};
use crate::optim::{gather_parts, AgentOptimizer, Loss, Part};

/// One agent's optimisation on a step's samples.
pub(super) struct Epochs<'a> {
    pub world: &'a dyn World,
    pub agent: &'a Agent,
    pub samples: &'a [Sample],
    /// Each sample's (prompt, response) tokens, as the caller scored them before.
    pub pairs: &'a [(Vec<u32>, Vec<u32>)],
    /// Epochs, minibatches, micro-batching, gradient clipping, scoring chunk and
    /// checkpointing.
    pub cfg: &'a PpoConfig,
    /// The temperature every log-prob is taken at (the one that sampled the responses).
    pub temperature: f64,
    /// The minibatches' shuffle.
    pub seed: u64,
    /// The scoring before the update, for the benchmark's record of it.
    pub score_seconds: f64,
}

/// What [`Epochs::optimize`] measured.
pub(super) struct Optimized {
    /// The loss's five statistics, each micro-batch's weighted by its share of its
    /// minibatch's response tokens, averaged over optimizer steps.
    pub means: [f32; 5],
    /// The gradient norm before clipping, averaged over optimizer steps.
    pub grad_norm: f32,
    pub optimize_seconds: f64,
    pub backward_seconds: f64,
}

/// Splits minibatch `mb` (sample indices) into micro-batches by sequence length, so that a
/// short turn-1 conversation is not padded to a long turn-3 one: the indices sorted by
/// `lengths` (prompt + response tokens), then cut greedily wherever the next one would make a
/// micro-batch's padded size exceed what the configured split into `grad_accum` parts would
/// pad to (rows per part × the minibatch's longest), both in whole sequences (activations)
/// and in responses (`responses`: the logits kept for the backward pass, rows × response ×
/// vocabulary). So no forward pass is larger than before on either count, and the passes
/// are often fewer; the summed gradient is the minibatch's either way.
pub(super) fn micro_batches(
    mb: &[usize],
    lengths: &[usize],
    responses: &[usize],
    grad_accum: usize,
) -> Vec<Vec<usize>> {
    let mut sorted = mb.to_vec();
    sorted.sort_by_key(|&i| (lengths[i], i));
    let rows = mb.len().div_ceil(grad_accum.clamp(1, mb.len().max(1)));
    let budget = rows * sorted.last().map_or(0, |&i| lengths[i]);
    let response_budget = rows * mb.iter().map(|&i| responses[i]).max().unwrap_or(0);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut part: Vec<usize> = Vec::new();
    let mut longest_response = 0;
    for i in sorted {
        // Sorted ascending, so `i` is the longest sequence of the part it joins.
        let response = longest_response.max(responses[i]);
        if !part.is_empty()
            && ((part.len() + 1) * lengths[i] > budget
                || (part.len() + 1) * response > response_budget)
        {
            out.push(std::mem::take(&mut part));
            longest_response = 0;
        }
        longest_response = longest_response.max(responses[i]);
        part.push(i);
    }
    if !part.is_empty() {
        out.push(part);
    }
    out
}

impl Epochs<'_> {
    /// Runs the epochs. `loss(part, scored, width)` is the algorithm's loss on one
    /// micro-batch (`part`: sample indices; `scored`: the policy's differentiable log-probs,
    /// values and entropies of those samples, right-aligned in rows of `width`), a token
    /// mean over the micro-batch, and its five statistics; this weighs both by the
    /// micro-batch's share of its minibatch's tokens, so that the summed gradient is the
    /// minibatch's token mean. Every rank of `world` passes the same samples; each computes
    /// the micro-batches it owns (the j-th of a minibatch belongs to rank j mod size), and
    /// before each AdamW step the ranks exchange them and every rank adds them in the
    /// micro-batches' order, as one process adds its own: every rank makes the update one
    /// process would make on the whole batch, to the bit. A loss that is not finite stops
    /// the update, naming the algorithm and the first three statistics (`names`).
    pub fn optimize(
        &self,
        optimizer: &mut AgentOptimizer,
        names: (&str, [&str; 3]),
        mut loss: impl FnMut(&[usize], &Scored, usize) -> anyhow::Result<(Tensor, [f32; 5])>,
    ) -> anyhow::Result<Optimized> {
        let Epochs {
            world,
            agent,
            samples,
            pairs,
            cfg,
            temperature,
            seed,
            ..
        } = *self;
        let (rank, size) = (world.rank(), world.size());
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..samples.len()).collect();
        let lengths: Vec<usize> = pairs.iter().map(|(p, r)| p.len() + r.len()).collect();
        let responses: Vec<usize> = pairs.iter().map(|(_, r)| r.len()).collect();
        let minibatches = cfg.minibatches.clamp(1, samples.len());
        let mut sums = [0.0f32; 5];
        let mut grad_norm = 0.0f32;
        let mut n = 0.0f32;
        let optimizing = Instant::now();
        let mut backward = Duration::ZERO;
        // For scripts/bench-iteration.sh: the optimizer steps' micro-batches (sample indices).
        let shapes_to = bench_batches_path();
        let mut optimizer_steps: Vec<Vec<Vec<usize>>> = Vec::new();
        // What a checkpointed backward completes the gradients of.
        let trainable = agent.trainable_vars();
        for epoch in 0..cfg.epochs {
            order.shuffle(&mut rng);
            for mb in order.chunks(samples.len().div_ceil(minibatches)) {
                // Token-mean losses over the minibatch: each micro-batch's mean is weighted
                // by its share of the minibatch's tokens.
                let mb_tokens: usize = mb.iter().map(|&i| samples[i].response.len()).sum();
                let parts = micro_batches(mb, &lengths, &responses, cfg.grad_accum);
                if shapes_to.is_some() {
                    optimizer_steps.push(parts.clone());
                }
                let mut mine: Vec<Part> = Vec::new();
                for (j, part) in parts.iter().enumerate() {
                    if size > 1 && j % size != rank {
                        continue;
                    }
                    let share = part
                        .iter()
                        .map(|&i| samples[i].response.len())
                        .sum::<usize>() as f64
                        / mb_tokens as f64;
                    let part_pairs: Vec<(Vec<u32>, Vec<u32>)> =
                        part.iter().map(|&i| pairs[i].clone()).collect();
                    let width = part
                        .iter()
                        .map(|&i| samples[i].response.len())
                        .max()
                        .unwrap_or(0);
                    let (new, checkpoint) = if cfg.activation_checkpointing {
                        let (s, c) =
                            score_checkpointed(agent, &part_pairs, cfg.chunk, temperature)?;
                        (s, Some(c))
                    } else {
                        let s = score_at_temperature(
                            agent,
                            &part_pairs,
                            Pass::Training,
                            cfg.chunk,
                            temperature,
                        )?;
                        (s, None)
                    };
                    let (value, stats) = loss(part, &new, width)?;
                    let total = value.to_scalar::<f32>()?;
                    if !total.is_finite() {
                        let (algorithm, [a, b, c]) = names;
                        bail!(
                            "the {algorithm} loss is {total} in epoch {} ({a} {}, {b} {}, {c} \
                             {}); the rewards' magnitude or the learning rate may be to blame",
                            epoch + 1,
                            stats[0],
                            stats[1],
                            stats[2]
                        );
                    }
                    let started = Instant::now();
                    let grads = Loss {
                        value: (value * share)?,
                        checkpoint: checkpoint.map(|c| (c, trainable.clone())),
                    }
                    .gradients()?;
                    let share = share as f32;
                    let part_stats = stats.map(|s| share * s);
                    if size == 1 {
                        optimizer.accumulate(&grads)?;
                        add(&mut sums, &part_stats);
                    } else {
                        let (present, grads) = optimizer.flatten(&grads)?;
                        mine.push(Part {
                            index: j as u32,
                            stats: part_stats,
                            present,
                            grads,
                        });
                    }
                    backward += started.elapsed();
                }
                if size > 1 {
                    // Every rank's micro-batches, added in the minibatch's order.
                    let started = Instant::now();
                    let all = gather_parts(world, &mine, parts.len())
                        .context("exchanging the micro-batches' gradients")?;
                    for p in &all {
                        optimizer.accumulate_flat(&p.present, &p.grads)?;
                        add(&mut sums, &p.stats);
                    }
                    backward += started.elapsed();
                }
                let started = Instant::now();
                grad_norm += optimizer.step(cfg.max_grad_norm)? as f32;
                backward += started.elapsed();
                n += 1.0;
            }
        }
        if n == 0.0 {
            bail!("no optimizer step: no samples");
        }
        let done = Optimized {
            means: sums.map(|s| s / n),
            grad_norm: grad_norm / n,
            optimize_seconds: optimizing.elapsed().as_secs_f64(),
            backward_seconds: backward.as_secs_f64(),
        };
        if let Some(path) = shapes_to {
            record_batches(&path, samples, &optimizer_steps, self.score_seconds, &done)
                .context("writing MAPORL_BENCH_PPO_BATCHES")?;
        }
        Ok(done)
    }
}

/// Adds one micro-batch's weighted statistics to the sums.
fn add(sums: &mut [f32; 5], s: &[f32; 5]) {
    for (sum, v) in sums.iter_mut().zip(s) {
        *sum += v;
    }
}

/// Where scripts/bench-iteration.sh wants each update's shapes (`MAPORL_BENCH_PPO_BATCHES`,
/// read only in a build with the `test-hooks` feature).
fn bench_batches_path() -> Option<std::ffi::OsString> {
    if cfg!(feature = "test-hooks") {
        std::env::var_os("MAPORL_BENCH_PPO_BATCHES")
    } else {
        None
    }
}

/// Appends one JSON line describing an update's work to `path`: each sample's prompt and
/// response lengths, the micro-batches of each optimizer step, and the phases' wall times
/// (scripts/bench_iteration_torch.py replays the shapes; it scores the whole batch at once).
fn record_batches(
    path: &std::ffi::OsStr,
    samples: &[Sample],
    optimizer_steps: &[Vec<Vec<usize>>],
    score_seconds: f64,
    done: &Optimized,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let line = serde_json::json!({
        "prompt_lens": samples.iter().map(|s| s.prompt.len()).collect::<Vec<_>>(),
        "response_lens": samples.iter().map(|s| s.response.len()).collect::<Vec<_>>(),
        "optimizer_steps": optimizer_steps,
        "score_seconds": score_seconds,
        "optimize_seconds": done.optimize_seconds,
        "backward_seconds": done.backward_seconds,
    });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    writeln!(f, "{line}")?;
    Ok(())
}
