//! `maporl verifier train`: LoRA + linear head + sigmoid, BCE against the labels on every
//! response token (the paper's code) or on the last token only; validation AUC and ECE per
//! epoch; checkpoints as the trainer's (`checkpoints/step-N`, atomic, `latest`, exact
//! resume), and the result in `checkpoints/final`.
//!
//! Under `mpirun -np N` it is one run over the ranks ([`crate::distributed`]): each rank
//! computes the loss and gradients of a contiguous share of every minibatch, the ranks add
//! the gradients in rank order, and every rank takes the same AdamW step, the one a single
//! process takes; rank 0 alone validates and writes the run directory, and a resume needs the
//! number of ranks the checkpoint was written with.

use crate::model::Pass;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context};
use candle_core::{DType, Device, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::data::{read_jsonl, Sample};
use super::metrics::Validation;
use super::{Meta, VerifierModel, HEAD_FILE, META_FILE};
use crate::checkpoint::{replace_dir, truncate_lines, Checkpoints, STATE_FILE};
use crate::config::VerifierTrainConfig;
use crate::distributed as dist;
use crate::files::write_atomic;
use crate::model::{Lora, LoraConfig, ValueHead};
use crate::optim::{learning_rate, shared_step, AgentOptimizer, Loss};
use crate::run_log::{RunLog, Start};

/// Bumped when the checkpoint layout changes (2: the epoch's running loss).
const FORMAT: u32 = 2;
const OPTIMIZER_FILE: &str = "optimizer.safetensors";

/// What `maporl verifier train` needs.
pub struct TrainOptions {
    /// The base model (HF folder or GGUF).
    pub model: PathBuf,
    /// The base model as the config names it (recorded in the checkpoint).
    pub model_name: String,
    /// Labelled answers (`maporl verifier generate`'s JSONL).
    pub data: PathBuf,
    pub run_dir: PathBuf,
    pub train: VerifierTrainConfig,
    pub max_response_tokens: usize,
    pub seed: u64,
    pub dtype: DType,
    /// Where the verifier's tensors live.
    pub device: Device,
    /// Continue from the run's latest checkpoint.
    pub resume: bool,
    /// Checkpoint and stop after this many steps (for tests and staged runs).
    pub stop_after: Option<usize>,
    /// Print progress lines.
    pub verbose: bool,
}

/// What a training run ended with.
#[derive(Debug)]
pub struct Outcome {
    pub steps: usize,
    /// Validation metrics at the end (None without a validation set).
    pub validation: Option<Validation>,
    /// `checkpoints/final`, when training finished (not when stopped early).
    pub final_dir: Option<PathBuf>,
}

/// `state.json` of a verifier checkpoint.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State {
    format: u32,
    step: usize,
    /// sha256 of the data file: a resume on other data is refused.
    data_sha256: String,
    metrics_lines: usize,
    /// The sum of the training losses of the epoch's steps so far, as `f64::to_bits` (exact
    /// through JSON), and how many steps: a resume mid-epoch reports the same epoch loss.
    epoch_loss_bits: u64,
    epoch_steps: usize,
    /// The number of ranks (processes) the run has (1 in checkpoints from before runs over
    /// several): a resume needs as many.
    #[serde(default = "one")]
    ranks: usize,
}

fn one() -> usize {
    1
}

/// One line of `metrics.jsonl`: the end of an epoch.
#[derive(Serialize)]
struct EpochMetrics<'a> {
    epoch: usize,
    step: usize,
    /// Mean training loss over the epoch's steps.
    train_loss: f64,
    lr: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    validation: Option<&'a Validation>,
    /// The process's resident memory at the end of the epoch and its peak so far (MiB;
    /// absent off Linux).
    #[serde(skip_serializing_if = "Option::is_none")]
    resident_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_resident_mib: Option<u64>,
}

/// Splits by question: a seeded shuffle of the distinct task ids, the first
/// `ceil(fraction * n)` of them (at least one when `fraction > 0` and there are two or
/// more questions) for validation.
pub fn split(samples: &[Sample], fraction: f64, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let mut ids: Vec<&str> = samples.iter().map(|s| s.task_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.shuffle(&mut ChaCha8Rng::seed_from_u64(seed ^ 0x05ee_d0f5_0117));
    let mut n_val = (fraction * ids.len() as f64).ceil() as usize;
    if fraction > 0.0 && ids.len() >= 2 {
        n_val = n_val.clamp(1, ids.len() - 1);
    } else {
        n_val = 0;
    }
    let val: std::collections::HashSet<&str> = ids[..n_val].iter().copied().collect();
    let (mut tr, mut va) = (Vec::new(), Vec::new());
    for (i, s) in samples.iter().enumerate() {
        if val.contains(s.task_id.as_str()) {
            va.push(i);
        } else {
            tr.push(i);
        }
    }
    (tr, va)
}

/// BCE with logits, stable: softplus(z) - y z = relu(z) - y z + log(1 + exp(-|z|)).
fn bce_with_logits(z: &Tensor, y: &Tensor) -> candle_core::Result<Tensor> {
    let softplus = (z.relu()? + (z.abs()?.neg()?.exp()? + 1.0)?.log()?)?;
    softplus - (y * z)?
}

pub fn train(opts: &TrainOptions, stop: &AtomicBool) -> anyhow::Result<Outcome> {
    let t = &opts.train;
    let samples = read_jsonl(&opts.data)?;
    if samples.is_empty() {
        bail!("verifier data {} holds no answers", opts.data.display());
    }
    let data_sha256 = hex::encode(Sha256::digest(crate::files::read_regular(
        &opts.data,
        crate::files::DATASET_MAX,
        "verifier data",
    )?));
    let world = dist::world();
    let leader = world.rank() == 0;
    dist::check_agreement(world, &[("verifier data (sha256)", data_sha256.clone())])
        .context("checking that every rank trains on the same data")?;
    let (train_idx, val_idx) = split(&samples, t.val_fraction, opts.seed);
    if train_idx.is_empty() {
        bail!(
            "verifier data {}: no training answers left after the validation split",
            opts.data.display()
        );
    }

    let (mut agent, prompter) = VerifierModel::base(
        &opts.model,
        opts.dtype,
        &opts.device,
        opts.max_response_tokens,
    )?;
    let hidden = agent.base.config().hidden_size;
    agent.lora = Some(Lora::new(
        &agent.base,
        LoraConfig {
            r: t.lora_r,
            alpha: t.lora_alpha,
            target_modules: t.lora_targets.clone(),
        },
        opts.seed,
    )?);
    // The head is f32 whatever the model's dtype (its loss needs the precision).
    agent.value_head = Some(ValueHead::new(
        hidden,
        DType::F32,
        &opts.device,
        opts.seed ^ 0xbead,
    )?);
    let model = VerifierModel { agent, prompter };
    let ids: Vec<(Vec<u32>, Vec<u32>)> = samples
        .iter()
        .map(|s| model.prompter.ids(&s.question, &s.response))
        .collect::<anyhow::Result<_>>()?;
    let labels: Vec<bool> = samples.iter().map(|s| s.correct).collect();
    let mut optimizer =
        AgentOptimizer::new(model.agent.named_trainable_vars(), t.lr, t.weight_decay)?;

    let checkpoints = Checkpoints::new(&opts.run_dir);
    let metrics_path = opts.run_dir.join("metrics.jsonl");
    let mut start = 0;
    let mut metrics_lines = 0;
    // (sum, steps) of the epoch in progress.
    let mut epoch_loss = (0.0f64, 0usize);
    match (checkpoints.latest()?, opts.resume) {
        (Some((_, dir)), true) => {
            let st = read_state(&dir)?;
            if st.data_sha256 != data_sha256 {
                bail!(
                    "cannot resume from {}: it was trained on other data (sha256 {}, {} is now \
                     {})",
                    dir.display(),
                    st.data_sha256.get(..12).unwrap_or(&st.data_sha256),
                    opts.data.display(),
                    data_sha256.get(..12).unwrap_or(&data_sha256)
                );
            }
            dist::check_resume_ranks(
                world,
                st.ranks,
                &dir,
                "the gradients' sum depends on the number of ranks",
            )?;
            restore(&model, &mut optimizer, &dir, hidden)?;
            start = st.step;
            metrics_lines = st.metrics_lines;
            epoch_loss = (f64::from_bits(st.epoch_loss_bits), st.epoch_steps);
            if leader {
                truncate_lines(&metrics_path, metrics_lines)?;
            }
            if opts.verbose {
                println!("resuming from {} (step {start})", dir.display());
            }
        }
        (None, true) => bail!(
            "cannot resume: {} holds no verifier checkpoint",
            checkpoints.dir().display()
        ),
        (Some(_), false) => bail!(
            "{} already holds a verifier training run; pass --resume to continue it or choose \
             another run dir",
            opts.run_dir.display()
        ),
        (None, false) => {}
    }
    // Rank 0 alone writes the run directory (every rank has looked at it by now: the data's
    // agreement above was a collective).
    if leader {
        std::fs::create_dir_all(&opts.run_dir)
            .with_context(|| format!("creating {}", opts.run_dir.display()))?;
    }
    let mut log = RunLog::open(
        &opts.run_dir,
        leader,
        match start {
            0 => Start::Fresh,
            _ => Start::Continue {
                resume_at: Some(start as i64 + 1),
            },
        },
    )?;

    let bs = t.batch_size.max(1);
    let per_epoch = train_idx.len().div_ceil(bs);
    let total = per_epoch * t.epochs;
    let meta = |steps: usize, validation: Option<Validation>| Meta {
        base_model: opts.model_name.clone(),
        hidden_size: hidden,
        loss: t.loss.clone(),
        max_response_tokens: opts.max_response_tokens,
        steps,
        validation,
    };
    // Rank 0 writes the checkpoint (every rank holds the same weights and moments); the
    // others wait until it is complete.
    let save = |step: usize,
                metrics_lines: usize,
                epoch_loss: (f64, usize),
                optimizer: &AgentOptimizer|
     -> anyhow::Result<()> {
        if !leader {
            return world.barrier();
        }
        checkpoints.save(step, t.keep_checkpoints, |dir| {
            write_weights(&model, dir, &meta(step, None))?;
            optimizer.save(&dir.join(OPTIMIZER_FILE))?;
            let st = State {
                format: FORMAT,
                step,
                data_sha256: data_sha256.clone(),
                metrics_lines,
                epoch_loss_bits: epoch_loss.0.to_bits(),
                epoch_steps: epoch_loss.1,
                ranks: world.size(),
            };
            write_atomic(
                &dir.join(STATE_FILE),
                serde_json::to_string_pretty(&st)?.as_bytes(),
            )
        })?;
        world.barrier()
    };
    // On rank 0 only: it alone reports and writes (the others go on to the next step's
    // exchange and wait there).
    let validate = |model: &VerifierModel| -> anyhow::Result<Option<Validation>> {
        if val_idx.is_empty() || !leader {
            return Ok(None);
        }
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = val_idx.iter().map(|&i| ids[i].clone()).collect();
        let probs = model.probabilities_of_ids(&pairs, bs.max(16))?;
        let y: Vec<bool> = val_idx.iter().map(|&i| labels[i]).collect();
        Ok(Some(Validation::of(&probs, &y)))
    };

    let mut last_validation = None;
    let mut step = start;
    while step < total {
        let epoch = step / per_epoch;
        let b = step % per_epoch;
        // The epoch's order depends only on the seed and the epoch: a resume is exact.
        let mut order = train_idx.clone();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(
            opts.seed ^ (epoch as u64 + 1),
        ));
        let batch: Vec<usize> = order[b * bs..((b + 1) * bs).min(order.len())].to_vec();
        let lr = learning_rate(step, total, 0, t.lr, 0.1);
        optimizer.set_lr(lr);
        // The loss of the whole minibatch, each rank's share weighted by the minibatch's
        // size (last token) or response tokens (every token), not its own.
        let tokens: usize = batch.iter().map(|&i| ids[i].1.len()).sum();
        let (_, loss) = shared_step(
            world,
            &mut optimizer,
            batch.len(),
            t.max_grad_norm,
            |share| {
                let part = &batch[share];
                let pairs: Vec<(Vec<u32>, Vec<u32>)> =
                    part.iter().map(|&i| ids[i].clone()).collect();
                let y: Vec<f32> = part
                    .iter()
                    .map(|&i| f32::from(u8::from(labels[i])))
                    .collect();
                let y = Tensor::from_vec(y, (part.len(), 1), model.agent.base.device())?;
                let (out, checkpoint) = if t.activation_checkpointing {
                    let (out, c) = model.response_logits_checkpointed(&pairs)?;
                    (out, Some((c, model.agent.trainable_vars())))
                } else {
                    (model.response_logits(&pairs, Pass::Training)?, None)
                };
                let z = out.logits.to_dtype(DType::F32)?;
                let value = if t.loss == "last-token" {
                    let r = z.dim(1)?;
                    (bce_with_logits(&z.narrow(1, r - 1, 1)?, &y)?.sum_all()? / batch.len() as f64)?
                } else {
                    let per_token = bce_with_logits(&z, &y.broadcast_as(z.shape())?.contiguous()?)?;
                    ((per_token * &out.mask)?.sum_all()? / tokens as f64)?
                };
                Ok(Loss { value, checkpoint })
            },
        )
        .with_context(|| format!("verifier training step {}", step + 1))?;
        let l = f64::from(loss);
        if b == 0 {
            epoch_loss = (0.0, 0);
        }
        epoch_loss.0 += l;
        epoch_loss.1 += 1;
        step += 1;
        if step % per_epoch == 0 {
            let v = validate(&model)?;
            let memory = crate::model::resident_mib();
            let line = EpochMetrics {
                epoch,
                step,
                train_loss: epoch_loss.0 / epoch_loss.1.max(1) as f64,
                lr,
                validation: v.as_ref(),
                resident_mib: memory.map(|m| m.now),
                peak_resident_mib: memory.map(|m| m.peak),
            };
            log.write(&line, step as i64, "", &["step"])?;
            metrics_lines += 1;
            if opts.verbose {
                match &v {
                    Some(v) => println!(
                        "epoch {epoch} (step {step}/{total}): train loss {:.4}; validation: \
                         AUC {}, ECE {:.3}, accuracy {:.3}, loss {:.4} over {} answers",
                        line.train_loss,
                        v.auc.map_or("n/a".into(), |a| format!("{a:.3}")),
                        v.ece,
                        v.accuracy,
                        v.loss,
                        v.answers
                    ),
                    None => println!(
                        "epoch {epoch} (step {step}/{total}): train loss {:.4}",
                        line.train_loss
                    ),
                }
            }
            last_validation = v;
        }
        let periodic = t.checkpoint_every > 0 && step % t.checkpoint_every == 0;
        // A stop request on any rank stops every rank after the same step.
        let halt = dist::any(world, stop.load(Ordering::SeqCst))?
            || opts.stop_after.is_some_and(|s| step >= s);
        if periodic || halt || step == total {
            save(step, metrics_lines, epoch_loss, &optimizer)?;
        }
        if halt && step < total {
            if opts.verbose {
                println!("stopped after step {step}; --resume continues");
            }
            return Ok(Outcome {
                steps: step,
                validation: last_validation,
                final_dir: None,
            });
        }
    }
    if last_validation.is_none() {
        last_validation = validate(&model)?;
    }
    let final_dir = checkpoints.dir().join("final");
    if !leader {
        return Ok(Outcome {
            steps: total,
            validation: None,
            final_dir: Some(final_dir),
        });
    }
    replace_dir(&final_dir, |dir| {
        write_weights(&model, dir, &meta(total, last_validation.clone()))
    })?;
    if opts.verbose {
        println!(
            "verifier trained: {total} steps; checkpoint {} (sha256 {})",
            final_dir.display(),
            super::checkpoint_sha256(&final_dir)?
        );
    }
    Ok(Outcome {
        steps: total,
        validation: last_validation,
        final_dir: Some(final_dir),
    })
}

/// The adapter, the head and `verifier.json`: what serving needs.
fn write_weights(model: &VerifierModel, dir: &Path, meta: &Meta) -> anyhow::Result<()> {
    model
        .agent
        .lora
        .as_ref()
        .context("internal: no adapter")?
        .save(dir, &meta.base_model)?;
    model
        .agent
        .value_head
        .as_ref()
        .context("internal: no head")?
        .save(&dir.join(HEAD_FILE))?;
    write_atomic(
        &dir.join(META_FILE),
        serde_json::to_string_pretty(meta)?.as_bytes(),
    )
}

fn read_state(dir: &Path) -> anyhow::Result<State> {
    let path = dir.join(STATE_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let st: State = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a verifier training state", path.display()))?;
    if st.format != FORMAT {
        bail!(
            "{}: checkpoint format {} (this maporl reads format {FORMAT})",
            path.display(),
            st.format
        );
    }
    Ok(st)
}

/// Puts a checkpoint's adapter, head and optimizer state into the freshly built model.
fn restore(
    model: &VerifierModel,
    optimizer: &mut AgentOptimizer,
    dir: &Path,
    hidden: usize,
) -> anyhow::Result<()> {
    let lora = Lora::load(dir, &model.agent.base)?;
    let mine = model.agent.lora.as_ref().context("internal: no adapter")?;
    let saved: std::collections::HashMap<String, candle_core::Var> =
        lora.named_vars().into_iter().collect();
    for (name, var) in mine.named_vars() {
        let t = saved
            .get(&name)
            .with_context(|| format!("{}: the adapter lacks `{name}`", dir.display()))?;
        var.set(t.as_tensor())?;
    }
    let head = ValueHead::load(
        &dir.join(HEAD_FILE),
        hidden,
        DType::F32,
        model.agent.base.device(),
    )?;
    let mine = model
        .agent
        .value_head
        .as_ref()
        .context("internal: no head")?;
    for ((_, var), (_, saved)) in mine.named_vars().into_iter().zip(head.named_vars()) {
        var.set(saved.as_tensor())?;
    }
    optimizer.load(&dir.join(OPTIMIZER_FILE))
}
