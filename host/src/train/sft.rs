//! The paper's SFT baseline (`train.mode = "sft"`): debates of the untrained team over the
//! data, the best `train.sft.top_fraction` of them by total shaped reward kept, and every
//! agent fine-tuned with a LoRA adapter on its own utterances in those debates
//! (cross-entropy on the response tokens).
//!
//! Under `mpirun -np N` (with `[distributed]`) it is one run over the ranks, as `train.mode =
//! "maporl"` is: each rank debates a contiguous share of the tasks (every response drawing
//! from a stream of its own, so a debate does not depend on its rank) and every rank gathers
//! them all; every rank keeps the same best debates; each minibatch of the fine-tuning is
//! split between the ranks and their gradients added in rank order before AdamW, so every
//! rank holds the adapters one process would train; rank 0 alone writes the run directory.

use crate::model::Pass;
use std::path::PathBuf;

use anyhow::Context;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::samples_of;
use super::{check_distributed, check_same_run, evaluate, gather_rollout, Outcome};
use crate::checkpoint::{replace_dir, Checkpoints};
use crate::config::Config;
use crate::debate::{self, Debate, PluginHashes, Rollout};
use crate::distributed as dist;
use crate::model::{score, score_checkpointed, Lora, LoraConfig};
use crate::optim::{shared_step, AgentOptimizer, Loss};
use crate::run_log::{RunLog, Start};
use crate::session::{held_out, tasks, Progress, Session};

/// One line of `metrics.jsonl`: an epoch of one agent.
#[derive(Serialize)]
struct Metrics {
    agent: u32,
    epoch: usize,
    /// Mean negative log-likelihood per response token over the epoch.
    loss: f64,
    grad_norm: f64,
    samples: usize,
    tokens: usize,
    /// The process's resident memory after the epoch and its peak so far (MiB; absent off
    /// Linux).
    #[serde(skip_serializing_if = "Option::is_none")]
    resident_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_resident_mib: Option<u64>,
}

pub(super) fn run(config: Config, progress: &mut dyn Progress) -> anyhow::Result<Outcome> {
    let run_dir = PathBuf::from(&config.run_dir);
    let world = dist::world();
    check_distributed(world, &config)?;
    let leader = world.rank() == 0;
    let data_parallel = config.distributed.is_some();
    if Checkpoints::new(&run_dir).latest()?.is_some() || run_dir.join("metrics.jsonl").exists() {
        anyhow::bail!(
            "{} already holds a training run; choose another run_dir",
            run_dir.display()
        );
    }
    let (held, tasks) = held_out(tasks(&config)?, &config)?;
    // Refusals (model, plugins, limits, ranks that disagree) come before anything is
    // written; every rank has looked at the run directory before rank 0 writes into it.
    let mut session = Session::open(config)?;
    let hashes = PluginHashes::of(&session.plugins);
    check_same_run(world, &session.config, &hashes)?;
    if leader {
        session.start_run_dir(&run_dir)?;
    }
    let cfg = session.config.clone();
    let sft = &cfg.train.sft;

    // 1. The off-the-shelf team's debates, each rank a share of them.
    if data_parallel {
        // Each response its own stream (those of a MAPoRL run's first step), so a debate is
        // the same whichever rank holds it.
        session.team.draw_per_request(Some(cfg.seed ^ (1 << 24)));
    }
    let mine = &tasks[dist::shard(tasks.len(), world.rank(), world.size())];
    let debated = session.debate_all(mine, "debating (off the shelf)", progress);
    if data_parallel {
        session.team.draw_per_request(None);
    }
    let debated = debated?;
    let debates = if world.size() > 1 {
        let rollout = Rollout {
            debates: debated.debates,
            plugin_time: debated.plugin_time,
            team_time: debated.team_time,
        };
        gather_rollout(world, rollout)
            .context("gathering the off-the-shelf team's debates")?
            .debates
    } else {
        debated.debates
    };
    if leader {
        debate::write_transcripts(&run_dir.join("transcripts.jsonl"), &debates, &hashes)?;
    }

    // 2. The best of them (the same on every rank: every rank holds every debate).
    let kept = best(&debates, sft.top_fraction);
    progress.note(&format!(
        "kept {} of {} debates (top {:.0}% by total reward)",
        kept.len(),
        debates.len(),
        sft.top_fraction * 100.0
    ));

    // 3. Every agent learns its own utterances in them.
    // Rank 0 writes the metrics and events; the other ranks compute the same lines.
    let mut log = RunLog::open(&run_dir, leader, Start::Fresh)?;
    let t = &cfg.train;
    for a in 0..cfg.debate.agents {
        // Turns before `adapter_from_turn` are spoken by the base, not the adapter.
        let samples: Vec<_> = samples_of(&kept, a)
            .into_iter()
            .filter(|s| s.turn >= t.adapter_from_turn)
            .collect();
        if samples.is_empty() {
            tracing::warn!(
                agent = a,
                "no utterances in the kept debates: the agent stays untrained"
            );
            continue;
        }
        let agent = session.team.agent_mut(a as usize);
        let base = agent.base.clone();
        let mut lora = Lora::new(
            &base,
            LoraConfig {
                r: t.lora_r,
                alpha: t.lora_alpha,
                target_modules: t.lora_targets.clone(),
            },
            cfg.seed + u64::from(a),
        )?;
        lora.set_dropout(sft.lora_dropout, cfg.seed ^ 0xd509 ^ u64::from(a))?;
        agent.lora = Some(lora);
        let agent = session.team.agent(a as usize);
        let mut optimizer =
            AgentOptimizer::new(agent.named_trainable_vars(), sft.lr, t.ppo.weight_decay)?;
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x5f7 ^ u64::from(a));
        let mut order: Vec<usize> = (0..samples.len()).collect();
        for epoch in 0..sft.epochs {
            order.shuffle(&mut rng);
            let (mut loss_sum, mut norm_sum, mut tokens, mut batches) = (0.0, 0.0, 0, 0);
            for batch in order.chunks(sft.batch_size.max(1)) {
                // The minibatch's mean over its response tokens, each rank's share of the
                // responses weighted by the minibatch's token count, not its own.
                let n: usize = batch.iter().map(|&i| samples[i].response.len()).sum();
                let (norm, loss) = shared_step(
                    world,
                    &mut optimizer,
                    batch.len(),
                    t.ppo.max_grad_norm,
                    |share| {
                        let pairs: Vec<(Vec<u32>, Vec<u32>)> = batch[share]
                            .iter()
                            .map(|&i| (samples[i].prompt.clone(), samples[i].response.clone()))
                            .collect();
                        let (scored, checkpoint) = if sft.activation_checkpointing {
                            let (s, c) = score_checkpointed(agent, &pairs, t.ppo.chunk, 1.0)?;
                            (s, Some((c, agent.trainable_vars())))
                        } else {
                            (score(agent, &pairs, Pass::Training, t.ppo.chunk)?, None)
                        };
                        Ok(Loss {
                            value: ((&scored.logprobs * &scored.mask)?.sum_all()?.neg()?
                                / n as f64)?,
                            checkpoint,
                        })
                    },
                )
                .with_context(|| format!("fine-tuning agent {a} in epoch {epoch}"))?;
                norm_sum += norm;
                loss_sum += f64::from(loss) * n as f64;
                tokens += n;
                batches += 1;
            }
            let memory = crate::model::resident_mib();
            let line = Metrics {
                agent: a,
                epoch,
                loss: loss_sum / tokens.max(1) as f64,
                grad_norm: norm_sum / f64::from(batches.max(1)),
                samples: samples.len(),
                tokens,
                resident_mib: memory.map(|m| m.now),
                peak_resident_mib: memory.map(|m| m.peak),
            };
            progress.note(&format!(
                "agent {a} epoch {epoch}: loss {:.4} over {} responses",
                line.loss, line.samples
            ));
            log.write(
                &line,
                epoch as i64,
                &format!("agent_{a}"),
                &["agent", "epoch"],
            )?;
        }
        // Evaluation and the held-out debates run without dropout.
        if let Some(lora) = session.team.agent_mut(a as usize).lora.as_mut() {
            lora.set_dropout(0.0, 0)?;
        }
    }

    // 4. The adapters, in the PEFT layout (rank 0's; every rank holds the same).
    let final_dir = run_dir.join("checkpoints/final");
    if leader {
        replace_dir(&final_dir, |tmp| {
            for a in 0..cfg.debate.agents {
                if let Some(lora) = &session.team.agent(a as usize).lora {
                    lora.save(&tmp.join(format!("agent-{a}")), cfg.agent_model(a as usize))?;
                }
            }
            Ok(())
        })?;
    }
    // The held-out evaluations are shared between the ranks, as a training run's are.
    let held_out = if cfg.data.held_out > 0 {
        // The untrained team's debates on the held-out set, then the tuned team's.
        let tuned: Vec<_> = (0..cfg.debate.agents as usize)
            .map(|a| session.team.agent_mut(a).lora.take())
            .collect();
        let before = evaluate::held_out(
            world,
            &mut session,
            &held,
            &run_dir,
            "before",
            cfg.seed,
            progress,
        )?;
        for (a, lora) in tuned.into_iter().enumerate() {
            session.team.agent_mut(a).lora = lora;
        }
        let after = evaluate::held_out(
            world,
            &mut session,
            &held,
            &run_dir,
            "after",
            cfg.seed,
            progress,
        )?;
        Some([before, after])
    } else {
        None
    };
    Ok(Outcome::Trained {
        steps: sft.epochs,
        metrics: log.path().to_path_buf(),
        adapters: final_dir,
        held_out,
    })
}

/// The best `fraction` of the debates that finished, by the sum of their utterances' shaped
/// rewards (at least one; ties keep the data order).
fn best(debates: &[Debate], fraction: f64) -> Vec<Debate> {
    let total = |d: &Debate| d.rewards.iter().map(|r| f64::from(r.total)).sum::<f64>();
    let mut ok: Vec<&Debate> = debates.iter().filter(|d| d.error.is_none()).collect();
    ok.sort_by(|a, b| total(b).total_cmp(&total(a)));
    let keep = ((ok.len() as f64 * fraction).ceil() as usize).clamp(1.min(ok.len()), ok.len());
    ok.into_iter().take(keep).cloned().collect()
}
