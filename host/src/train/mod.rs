//! MAPoRL's training loop. Each step debates a batch of tasks, shapes the rewards, and
//! updates every learning agent with PPO on its own utterances; one metrics line per step;
//! checkpoints every N steps, at the end and when asked to stop, from which a resumed run
//! continues exactly. The baselines live beside it: `sft` and `off-the-shelf` (an
//! evaluation, [`evaluate`]).

mod epochs;
mod evaluate;
pub mod grpo;
pub mod ppo;
mod sft;
mod state;

pub use evaluate::{evaluate, Evaluation};
pub use state::check_config;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::DType;
use serde::Serialize;

use crate::checkpoint::{replace_dir, Checkpoints};
use crate::config::{Algorithm, Config, Schedule, TrainMode, ValueHeads};
use crate::debate::{self, Debate, PluginHashes, Rollout};
use crate::distributed::{self as dist, World};
use crate::eval::Report;
use crate::model::{Agent, Lora, LoraConfig, PrefixStats, ValueHead};
use crate::optim::{learning_rate, AgentOptimizer};
use crate::run_log::{RunLog, Start};
use crate::session::{held_out, tasks, Progress, Session};
use crate::transcript::Task;
use ppo::{ppo_step_in, Batch, KlController, Sample, StepStats};

/// How a training run starts and when it stops early.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Continue the run in the config's run_dir from its latest checkpoint, exactly as if
    /// it had not stopped.
    pub resume: bool,
    /// Stop with a checkpoint once this many steps are done, as a stop request would.
    pub stop_after: Option<usize>,
    /// Resume even though a plugin component differs from the one the checkpoint used.
    pub allow_plugin_change: bool,
}

/// How a training run ended.
pub enum Outcome {
    /// Every step done: the metrics file, the final adapters, and the held-out
    /// evaluation before and after training when the config asks for one.
    Trained {
        steps: usize,
        metrics: PathBuf,
        adapters: PathBuf,
        held_out: Option<[Report; 2]>,
    },
    /// Stopped early (a stop request or `stop_after`) with a checkpoint to resume from.
    Stopped {
        step: usize,
        steps: usize,
        checkpoint: PathBuf,
    },
    /// `train.mode = "off-the-shelf"`: nothing trained, the team evaluated.
    Evaluated(Evaluation),
}

/// Runs the config's training (`train.mode`: MAPoRL, single-agent RL, SFT, or the
/// off-the-shelf team's evaluation). `stop` asks the run to checkpoint and end after the
/// step in progress (Ctrl-C in the command line).
pub fn run(
    config: Config,
    opts: &Options,
    progress: &mut dyn Progress,
    stop: &AtomicBool,
) -> anyhow::Result<Outcome> {
    let ranks = dist::world().size();
    if ranks > 1 && config.train.mode == TrainMode::OffTheShelf {
        bail!(
            "train.mode = \"off-the-shelf\" is an evaluation and runs in one process, but this \
             one was started on {ranks} (mpirun -np {ranks}); run it without mpirun, or \
             share the evaluation between ranks with `mpirun -np {ranks} maporl eval` (with \
             [distributed])"
        );
    }
    match config.train.mode {
        TrainMode::OffTheShelf => {
            if opts.resume {
                bail!(
                    "train.mode = \"off-the-shelf\" trains nothing, so there is nothing to resume"
                );
            }
            evaluate(config, progress).map(Outcome::Evaluated)
        }
        TrainMode::Sft => {
            if opts.resume {
                bail!("train.mode = \"sft\" does not resume; run it again from the start");
            }
            sft::run(config, progress)
        }
        TrainMode::Maporl | TrainMode::Single => {
            Trainer::open(config, opts, progress)?.run(progress, stop, opts.stop_after)
        }
    }
}

/// One line of `metrics.jsonl`.
#[derive(Serialize)]
struct Metrics {
    step: usize,
    learning_rate: f64,
    tasks: usize,
    /// Majority accuracy per turn on this step's debates.
    accuracy: Vec<f64>,
    /// Mean of each named reward part over the step's rewarded utterances.
    reward_parts: BTreeMap<String, f64>,
    /// The turns whose utterances this step trained on.
    trained_turns: Vec<u32>,
    /// PPO statistics per learning agent.
    agents: BTreeMap<u32, StepStats>,
    rollout_seconds: f64,
    /// The parts of `rollout_seconds` spent generating and inside plugin calls.
    generation_seconds: f64,
    /// The share of the step's prompt positions the generation prefix cache served.
    generation_prefix_hit_rate: f64,
    /// The most keys and values the generation prefix cache held at once (this rank's).
    generation_prefix_cache_mib: f64,
    plugin_seconds: f64,
    update_seconds: f64,
    /// The parts of `update_seconds`, summed over agents: scoring with the policy (old
    /// log-probs, values) and the reference; then the epochs × minibatches, of which
    /// `backward_seconds` went to backward passes and AdamW. Agents that update at the same
    /// time (`train.ppo.agents_in_parallel`, or one agent per rank) make the sums exceed
    /// `update_seconds`.
    score_seconds: f64,
    optimize_seconds: f64,
    backward_seconds: f64,
    generated_tokens_per_second: f64,
    /// Response tokens of the update per second of update.
    update_tokens_per_second: f64,
    /// The process's resident memory after the step and its peak so far (MiB; absent off
    /// Linux): flat from step to step in a healthy run.
    #[serde(skip_serializing_if = "Option::is_none")]
    resident_mib: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_resident_mib: Option<u64>,
    /// On several ranks: the bytes this rank sent through collectives during the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    collective_bytes: Option<u64>,
}

impl Metrics {
    /// The step as the person running the command sees it; `seconds` its wall time.
    fn summary(&self, steps: usize, seconds: f64) -> crate::session::StepSummary {
        // The mean of the learning agents' mean rewards (each agent speaks as often).
        let n = self.agents.len().max(1) as f64;
        let reward = self
            .agents
            .values()
            .map(|s| f64::from(s.reward_mean))
            .sum::<f64>()
            / n;
        crate::session::StepSummary {
            done: self.step + 1,
            steps,
            reward,
            accuracy: self.accuracy.clone(),
            kl: self
                .agents
                .iter()
                .map(|(&a, s)| (a, f64::from(s.kl)))
                .collect(),
            seconds,
        }
    }
}

/// One learning agent's training state.
struct Learner {
    agent: u32,
    optimizer: AgentOptimizer,
    /// The frozen, shared base: the KL reference.
    reference: Agent,
    kl: KlController,
    /// With `train.value_heads = "per-turn"`, the head of turn t + 1 (the agent itself then
    /// has none); else empty.
    turn_heads: Vec<ValueHead>,
}

/// What every learner's update of one step shares.
struct Update<'a> {
    debates: &'a [Debate],
    turns: &'a [u32],
    lr: f64,
    cfg: &'a Config,
    step: usize,
}

impl Update<'_> {
    /// Learner `l`'s PPO update on its samples of the step, or `None` when it has none.
    fn run(
        &self,
        l: &mut Learner,
        agent: &Agent,
        update_world: &dyn World,
    ) -> anyhow::Result<Option<StepStats>> {
        let Update {
            debates,
            turns,
            lr,
            cfg,
            step,
        } = *self;
        let t = &cfg.train;
        l.optimizer.set_lr(lr);
        let (debate_of, samples): (Vec<usize>, Vec<Sample>) = indexed_samples_of(debates, l.agent)
            .into_iter()
            .filter(|(_, s)| turns.contains(&s.turn))
            .unzip();
        if samples.is_empty() {
            return Ok(None);
        }
        let seed = cfg.seed ^ (step as u64) << 8 ^ u64::from(l.agent);
        // The update scores the responses at the temperature that sampled them.
        let temperature = cfg.agent_sampling(l.agent as usize).temperature;
        let stats: anyhow::Result<StepStats> = if t.algorithm == Algorithm::Grpo {
            // A step's debates come in groups of group_size, one question each: an agent's
            // reward at a turn is compared with its rewards at that turn in its group.
            let group = t.grpo.group_size;
            let keys: Vec<(usize, u32)> = debate_of
                .iter()
                .zip(&samples)
                .map(|(&d, s)| (d / group, s.turn))
                .collect();
            let rewards: Vec<f32> = samples.iter().map(|s| s.reward).collect();
            let (advantages, flat) = grpo::group_advantages(&rewards, &keys, t.grpo.scale_rewards);
            grpo::grpo_step_in(
                update_world,
                agent,
                &l.reference,
                &mut l.optimizer,
                Batch {
                    samples: &samples,
                    temperature,
                },
                (&advantages, flat),
                &mut l.kl,
                &t.ppo,
                seed,
            )
        } else if l.turn_heads.is_empty() {
            ppo_step_in(
                update_world,
                agent,
                &l.reference,
                &mut l.optimizer,
                Batch {
                    samples: &samples,
                    temperature,
                },
                &mut l.kl,
                &t.ppo,
                seed,
            )
        } else {
            // One update per turn, each with that turn's value head.
            let mut parts = Vec::new();
            for &turn in turns {
                // Generation records the shared head's values, so a turn's own head
                // scores its samples afresh.
                let group: Vec<_> = samples
                    .iter()
                    .filter(|s| s.turn == turn)
                    .map(|s| Sample {
                        policy: None,
                        ..s.clone()
                    })
                    .collect();
                if group.is_empty() {
                    continue;
                }
                let view = Agent {
                    base: agent.base.clone(),
                    lora: agent.lora.clone(),
                    value_head: Some(l.turn_heads[turn as usize - 1].clone()),
                    weights: agent.weights.clone(),
                };
                let s = ppo_step_in(
                    update_world,
                    &view,
                    &l.reference,
                    &mut l.optimizer,
                    Batch {
                        samples: &group,
                        temperature,
                    },
                    &mut l.kl,
                    &t.ppo,
                    seed ^ u64::from(turn) << 32,
                )?;
                parts.push((group.len(), s));
            }
            Ok(weighted_mean(&parts))
        };
        stats
            .with_context(|| {
                let parts: Vec<String> = reward_parts(debates)
                    .iter()
                    .map(|(k, v)| format!("{k} = {v}"))
                    .collect();
                format!(
                    "{} update of agent {} at step {step} (the step's mean reward parts: {}); \
                 nothing of this step was saved",
                    match t.algorithm {
                        Algorithm::Ppo => "PPO",
                        Algorithm::Grpo => "GRPO",
                    },
                    l.agent,
                    parts.join(", ")
                )
            })
            .map(Some)
    }
}

/// What a step's updates measured: each learning agent's statistics, the update's phases
/// (scoring, optimising, of which backward), summed over agents, and the response tokens
/// trained on.
struct Updated {
    agents: BTreeMap<u32, StepStats>,
    phases: [f64; 3],
    tokens: usize,
}

struct Trainer {
    session: Session,
    cfg: Config,
    tasks: Vec<Task>,
    /// `data.held_out`'s evaluation set, debated before and after training.
    held: Vec<Task>,
    learners: Vec<Learner>,
    run_dir: PathBuf,
    checkpoints: Checkpoints,
    /// Steps done.
    step: usize,
    /// Tasks handed out so far (the data cursor).
    cursor: usize,
    metrics_lines: usize,
    plugin_hashes: PluginHashes,
    /// The ranks of this run (`mpirun -np N`; a world of one without it). With
    /// `[distributed]`, every response draws from a stream of its own, and either each
    /// step's debates are split between the ranks (`data_parallel`) or the team's agents are
    /// (`spread`: each rank holds and updates its own agents, every rank holds every
    /// debate); rank 0 alone writes the run directory.
    world: &'static dyn World,
    data_parallel: bool,
    spread: bool,
}

impl Trainer {
    fn open(
        config: Config,
        args: &Options,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Trainer> {
        let run_dir = PathBuf::from(&config.run_dir);
        let checkpoints = Checkpoints::new(&run_dir);
        let world = dist::world();
        let spread = config.spreads_agents();
        let data_parallel = config.distributed.is_some() && !spread;
        check_distributed(world, &config)?;
        let leader = world.rank() == 0;
        let resume_from = if args.resume {
            if !run_dir.is_dir() {
                bail!(
                    "--resume: run_dir {} does not exist, so there is no run to continue; \
                     start it without --resume, or set run_dir to the directory of the run \
                     to continue",
                    run_dir.display()
                );
            }
            state::check_config(&run_dir, &config)?;
            let latest = checkpoints.latest()?.with_context(|| {
                format!(
                    "--resume: {} holds no complete checkpoint",
                    checkpoints.dir().display()
                )
            })?;
            Some(latest)
        } else {
            if checkpoints.latest()?.is_some() {
                bail!(
                    "{} already holds checkpoints of a run: continue it with --resume, or \
                     choose another run_dir",
                    run_dir.display()
                );
            }
            None
        };
        let (held, tasks) = held_out(tasks(&config)?, &config)?;
        let held = if config.data.held_out > 0 {
            held
        } else {
            vec![]
        };
        // Everything that can refuse the run (model, plugins, limits, the agents' set-up)
        // comes before anything is written: a refused run leaves no directory behind.
        let mut session = Session::open(config)?;
        let mut changes = Vec::new();
        if resume_from.is_some() {
            // The plugins must be the ones the run started with (plugins.lock).
            changes = crate::bundle::check_lock(&run_dir, &session.lock, args.allow_plugin_change)?;
        }
        let cfg = session.config.clone();
        let plugin_hashes = PluginHashes::of(&session.plugins);
        check_same_run(world, &cfg, &plugin_hashes)?;
        // With the agents split between ranks, each rank trains the agents it holds.
        let mut learners = Vec::new();
        let mine: Vec<u32> = learner_ids(&cfg)
            .into_iter()
            .filter(|&a| session.team.holds(a as usize))
            .collect();
        for a in mine {
            let dir = resume_from
                .as_ref()
                .map(|(_, p)| p.join(format!("agent-{a}")));
            learners.push(
                new_learner(&mut session, &cfg, a, dir.as_deref())
                    .with_context(|| format!("setting up agent {a} for training"))?,
            );
        }
        for change in changes {
            tracing::warn!("resuming with a changed plugin: {change}");
        }
        // Rank 0 is the one writer; the others wait until the run directory exists.
        if leader {
            if resume_from.is_none() {
                session.start_run_dir(&run_dir)?;
            } else {
                session.lock.write(&run_dir)?;
            }
        }
        let mut trainer = Trainer {
            session,
            cfg,
            tasks,
            held,
            learners,
            checkpoints,
            step: 0,
            cursor: 0,
            metrics_lines: 0,
            plugin_hashes,
            run_dir,
            world,
            data_parallel,
            spread,
        };
        match resume_from {
            Some((_, dir)) => trainer.restore(&dir, args.allow_plugin_change, progress)?,
            None if leader => {
                std::fs::File::create(trainer.metrics_path())
                    .with_context(|| format!("creating {}", trainer.metrics_path().display()))?;
            }
            None => {}
        }
        world.barrier()?;
        Ok(trainer)
    }

    fn metrics_path(&self) -> PathBuf {
        self.run_dir.join("metrics.jsonl")
    }

    fn run(
        &mut self,
        progress: &mut dyn Progress,
        stop: &AtomicBool,
        stop_after: Option<usize>,
    ) -> anyhow::Result<Outcome> {
        let steps = self.cfg.train.steps;
        let leader = self.world.rank() == 0;
        // A resumed run's events start again at the first step it redoes (metrics lines
        // count steps from 0, so that is the number of steps done).
        let resume_at = (self.step > 0).then_some(self.step as i64);
        let mut log = RunLog::open(&self.run_dir, leader, Start::Continue { resume_at })?;
        let every = self.cfg.train.checkpoint_every;
        // The held-out evaluations are shared between the ranks like a step's debates.
        if self.step == 0 && !self.held.is_empty() {
            evaluate::held_out(
                self.world,
                &mut self.session,
                &self.held,
                &self.run_dir,
                "before",
                self.cfg.seed,
                progress,
            )?;
        }
        progress.begin("training", steps as u64, self.step as u64);
        while self.step < steps {
            let started = std::time::Instant::now();
            let line = self.train_step()?;
            let summary = line.summary(steps, started.elapsed().as_secs_f64());
            log.write(&line, line.step as i64, "", &["step", "trained_turns"])?;
            self.metrics_lines += 1;
            progress.step(&summary);
            // A stop request on any rank stops every rank after the same step.
            let interrupted = dist::any(self.world, stop.load(Ordering::SeqCst))?;
            let stopping = interrupted || stop_after.is_some_and(|n| self.step >= n);
            if stopping || (every > 0 && self.step.is_multiple_of(every)) || self.step == steps {
                let checkpoint = self.save_checkpoint()?;
                if stopping && self.step < steps {
                    progress.end();
                    return Ok(Outcome::Stopped {
                        step: self.step,
                        steps,
                        checkpoint,
                    });
                }
            }
        }
        progress.end();
        let adapters = self.run_dir.join("checkpoints/final");
        self.export_adapters(&adapters)?;
        let held_out = if self.held.is_empty() {
            None
        } else {
            let after = evaluate::held_out(
                self.world,
                &mut self.session,
                &self.held,
                &self.run_dir,
                "after",
                self.cfg.seed,
                progress,
            )?;
            // Rank 0 alone speaks for the run.
            if leader {
                Some([evaluate::read_report(&self.run_dir, "before")?, after])
            } else {
                None
            }
        };
        Ok(Outcome::Trained {
            steps,
            metrics: self.metrics_path(),
            adapters,
            held_out,
        })
    }

    /// The turns trained at step `step` (0-based), by `train.schedule`.
    fn trained_turns(&self, step: usize) -> Vec<u32> {
        let t = &self.cfg.train;
        let last = self.cfg.debate.turns;
        if t.schedule == Schedule::TurnBased {
            if step < t.turn2_steps {
                return vec![2];
            }
            let cycle: Vec<u32> = (2..=last).rev().collect();
            return vec![cycle[(step - t.turn2_steps) % cycle.len()]];
        }
        (t.adapter_from_turn..=last).collect()
    }

    /// One step: the debates, every learner's update on them, the metrics line.
    fn train_step(&mut self) -> anyhow::Result<Metrics> {
        let step = self.step;
        let sent_before = self.world.bytes_sent();
        let (rollout, prefixes, rollout_seconds) = self.rollout(step)?;
        let started = Instant::now();
        let t = &self.cfg.train;
        let lr = learning_rate(step, t.steps, t.warmup_steps, t.ppo.lr, t.final_lr_fraction);
        let turns = self.trained_turns(step);
        let updated = self.update(&rollout.debates, &turns, lr, step)?;
        let update_seconds = started.elapsed().as_secs_f64();
        self.cursor += self.cfg.questions_per_step();
        self.step += 1;
        let report = crate::eval::evaluate(&rollout.debates);
        let generated: usize = rollout
            .debates
            .iter()
            .flat_map(|d| &d.speeches)
            .map(|s| s.response_tokens)
            .sum();
        let [score_seconds, optimize_seconds, backward_seconds] = updated.phases;
        let memory = crate::model::resident_mib();
        let generation_seconds = rollout.team_time.as_secs_f64();
        Ok(Metrics {
            step,
            learning_rate: lr,
            tasks: report.tasks,
            accuracy: report.turns.iter().map(|t| t.majority_accuracy).collect(),
            reward_parts: reward_parts(&rollout.debates),
            trained_turns: turns,
            update_tokens_per_second: updated.tokens as f64 / update_seconds.max(1e-9),
            agents: updated.agents,
            rollout_seconds,
            generation_seconds,
            generation_prefix_hit_rate: prefixes.hit_rate(),
            generation_prefix_cache_mib: prefixes.peak_bytes as f64 / (1 << 20) as f64,
            plugin_seconds: rollout.plugin_time.as_secs_f64(),
            update_seconds,
            score_seconds,
            optimize_seconds,
            backward_seconds,
            generated_tokens_per_second: generated as f64 / generation_seconds.max(1e-9),
            resident_mib: memory.map(|m| m.now),
            peak_resident_mib: memory.map(|m| m.peak),
            collective_bytes: (self.world.size() > 1)
                .then(|| self.world.bytes_sent() - sent_before),
        })
    }

    /// The step's tasks: the next questions of the data, each once, or with GRPO each
    /// `train.grpo.group_size` times, told apart by their ids (under [distributed] each
    /// debate's draws are its own, whichever rank holds it).
    fn step_tasks(&self) -> Vec<Task> {
        let questions = self.cfg.questions_per_step();
        let copies = self.cfg.debate.batch_size / questions;
        (0..questions)
            .map(|i| &self.tasks[(self.cursor + i) % self.tasks.len()])
            .flat_map(|task| {
                (0..copies).map(move |k| match copies {
                    1 => task.clone(),
                    _ => Task {
                        id: format!("{}#{k}", task.id),
                        ..task.clone()
                    },
                })
            })
            .collect()
    }

    /// The step's debates, shaped and (with the debates split between ranks) gathered on
    /// every rank; this rank's generation prefix-cache statistics, and the rollout's wall
    /// time.
    fn rollout(&mut self, step: usize) -> anyhow::Result<(Rollout, PrefixStats, f64)> {
        let chunk = self.step_tasks();
        let cfg = &self.cfg;
        // Fresh plugin instances seeded by the step: a resumed run sees the same plugins.
        self.session
            .plugins
            .restart(step as u64)
            .with_context(|| format!("restarting the plugins for step {step}"))?;
        let started = Instant::now();
        let (world, size) = (self.world, self.world.size());
        if cfg.distributed.is_some() {
            // Each response its own stream, so a debate is the same whichever rank holds it.
            self.session
                .team
                .draw_per_request(Some(cfg.seed ^ ((step as u64 + 1) << 24)));
        }
        let mine = if self.data_parallel {
            &chunk[dist::shard(chunk.len(), world.rank(), size)]
        } else {
            &chunk[..]
        };
        self.session.team.take_prefix_stats();
        let mut rollout = self
            .session
            .debate(mine)
            .with_context(|| format!("debates of step {step}"))?;
        if size > 1 && self.data_parallel {
            rollout = gather_rollout(world, rollout)
                .with_context(|| format!("gathering the debates of step {step}"))?;
        }
        if size > 1 && self.spread {
            skew_rewards_for_tests(world, &mut rollout);
            check_plugins_agree(world, &rollout, &self.session.config)
                .with_context(|| format!("step {step}"))?;
        }
        let seconds = started.elapsed().as_secs_f64();
        // This rank's share: each rank generates its own debates.
        let prefixes = self.session.team.take_prefix_stats();
        Ok((rollout, prefixes, seconds))
    }

    /// Every learner's update on its utterances at `turns` of `debates`; with the agents
    /// split between ranks, every rank's statistics gathered.
    fn update(
        &mut self,
        debates: &[Debate],
        turns: &[u32],
        lr: f64,
        step: usize,
    ) -> anyhow::Result<Updated> {
        let (cfg, world, size) = (&self.cfg, self.world, self.world.size());
        let mut agents = BTreeMap::new();
        let mut update_tokens = 0;
        // Data placement: every rank updates every agent on its share of the batch, summing
        // gradients over ranks; agents placement: each rank updates its own agents alone.
        let update_world: &dyn World = if self.spread { &dist::Single } else { world };
        // Each learner's update is its own (its adapter, optimizer and KL controller): on
        // the CPU, in one process, they run side by side and the ops inside each share the
        // threads (a small model's ops are too small to keep every thread busy alone).
        let team = &self.session.team;
        let jobs: Vec<(&mut Learner, &Agent)> = self
            .learners
            .iter_mut()
            .map(|l| {
                let agent = team.agent(l.agent as usize);
                (l, agent)
            })
            .collect();
        let parallel = cfg.train.ppo.agents_in_parallel
            && update_world.size() == 1
            && jobs.len() > 1
            && jobs.iter().all(|(_, a)| a.base.device().is_cpu())
            && rayon::current_num_threads() > 1;
        let update = Update {
            debates,
            turns,
            lr,
            cfg,
            step,
        };
        let results: Vec<anyhow::Result<Option<StepStats>>> = if parallel {
            use rayon::prelude::*;
            jobs.into_par_iter()
                .map(|(l, agent)| update.run(l, agent, &dist::Single))
                .collect()
        } else {
            // One by one, stopping at the first failure.
            let mut results = Vec::new();
            for (l, agent) in jobs {
                let result = update.run(l, agent, update_world);
                let failed = result.is_err();
                results.push(result);
                if failed {
                    break;
                }
            }
            results
        };
        for (l, result) in self.learners.iter().zip(results) {
            if let Some(stats) = result? {
                update_tokens += stats.tokens;
                agents.insert(l.agent, stats);
            }
        }
        let phase = |f: fn(&StepStats) -> f64| -> f64 { agents.values().map(f).sum() };
        // The update's phases, summed over agents (timings are not part of the statistics
        // that are serialized).
        let mut phases = [
            phase(|s| s.score_seconds),
            phase(|s| s.optimize_seconds),
            phase(|s| s.backward_seconds),
        ];
        if self.spread && size > 1 {
            // Every rank's agents' statistics and phases, for rank 0's metrics line.
            let all = dist::gather_json(world, &(agents, phases), "update statistics")?;
            phases = [0.0; 3];
            agents = BTreeMap::new();
            for (theirs, times) in all {
                agents.extend(theirs);
                for (sum, t) in phases.iter_mut().zip(times) {
                    *sum += t;
                }
            }
            update_tokens = agents.values().map(|s| s.tokens).sum();
        }
        Ok(Updated {
            agents,
            phases,
            tokens: update_tokens,
        })
    }

    /// Writes a checkpoint of the run as it stands after `self.step` steps: rank 0 writes
    /// it (every rank holds the same agents), the others wait until it is complete. With the
    /// agents split between ranks, each writes its own agents into rank 0's staging
    /// directory before rank 0 puts it in place.
    fn save_checkpoint(&self) -> anyhow::Result<PathBuf> {
        if self.spread && self.world.size() > 1 {
            let states = self.learner_states()?;
            let name = self.checkpoints.dir().join(Checkpoints::name(self.step));
            let keep = self.cfg.train.keep_checkpoints;
            return stage_together(self.world, &|dir| self.write_learners(dir, true), |fill| {
                self.checkpoints.save(self.step, keep, |dir| {
                    fill(dir)?;
                    self.write_state(dir, states)
                })
            })
            .map(|saved| saved.unwrap_or(name))
            .with_context(|| format!("writing the checkpoint of step {}", self.step));
        }
        if self.world.rank() != 0 {
            self.world.barrier()?;
            return Ok(self.checkpoints.dir().join(Checkpoints::name(self.step)));
        }
        let saved = self.write_checkpoint();
        if saved.is_ok() {
            self.world.barrier()?;
        }
        saved
    }

    fn write_checkpoint(&self) -> anyhow::Result<PathBuf> {
        let keep = self.cfg.train.keep_checkpoints;
        let states = self.learner_states()?;
        self.checkpoints
            .save(self.step, keep, |dir| {
                self.write_learners(dir, true)?;
                self.write_state(dir, states)
            })
            .with_context(|| format!("writing the checkpoint of step {}", self.step))
    }

    /// This rank's learners under `dir/agent-N/`: their trained parts, and with
    /// `optimizer` their AdamW state.
    fn write_learners(&self, dir: &Path, optimizer: bool) -> anyhow::Result<()> {
        for l in &self.learners {
            let out = dir.join(format!("agent-{}", l.agent));
            self.save_agent(l, &out)
                .with_context(|| format!("writing agent {}", l.agent))?;
            if optimizer {
                l.optimizer.save(&out.join("optimizer.safetensors"))?;
            }
        }
        Ok(())
    }

    /// Every learner's state for a checkpoint, in agent order (gathered from every rank when
    /// the agents are split between them; a collective then).
    fn learner_states(&self) -> anyhow::Result<Vec<state::LearnerState>> {
        let mine: Vec<state::LearnerState> = self
            .learners
            .iter()
            .map(|l| state::LearnerState {
                agent: l.agent,
                kl: l.kl.clone(),
                optimizer_steps: l.optimizer.steps(),
            })
            .collect();
        if !self.spread || self.world.size() == 1 {
            return Ok(mine);
        }
        let mut all: Vec<state::LearnerState> =
            dist::gather_json(self.world, &mine, "learner states")?
                .into_iter()
                .flatten()
                .collect();
        all.sort_by_key(|l| l.agent);
        Ok(all)
    }

    /// The checkpoint's state file, last into its staging directory `dir`.
    fn write_state(&self, dir: &Path, learners: Vec<state::LearnerState>) -> anyhow::Result<()> {
        state::stall_for_tests(&self.run_dir, self.step);
        state::TrainState {
            format: state::FORMAT,
            step: self.step,
            data_cursor: self.cursor,
            metrics_lines: self.metrics_lines,
            samplers: self.session.team.rng_states(),
            plugins: self.plugin_hashes.clone(),
            learners,
            ranks: self.world.size(),
        }
        .write(dir)
    }

    /// An agent's trained parts: PEFT adapter, value head(s), full weights.
    fn save_agent(&self, l: &Learner, out: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(out)?;
        let agent = self.session.team.agent(l.agent as usize);
        if let Some(lora) = &agent.lora {
            lora.save(out, self.cfg.agent_model(l.agent as usize))?;
        }
        if let Some(vh) = &agent.value_head {
            vh.save(&out.join("value_head.safetensors"))?;
        }
        for (t, vh) in l.turn_heads.iter().enumerate() {
            vh.save(&out.join(format!("value_head.turn-{}.safetensors", t + 1)))?;
        }
        if !agent.weights.is_empty() {
            agent.save_weights(&out.join("model.safetensors"))?;
        }
        Ok(())
    }

    /// Puts the run back where the checkpoint in `dir` left it.
    fn restore(
        &mut self,
        dir: &Path,
        allow_plugin_change: bool,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<()> {
        let st = state::TrainState::read(dir)?;
        // What the state says must be a run of this config: a state.json that claims more
        // steps than the config holds, or data handed out that those steps cannot have used,
        // is refused rather than resumed into doing nothing.
        let state_file = dir.join(crate::checkpoint::STATE_FILE);
        if st.step > self.cfg.train.steps {
            bail!(
                "{} says {} steps are done, but train.steps = {}: to continue this run, \
                 train.steps must be at least the steps done (or the file is not this run's)",
                state_file.display(),
                st.step,
                self.cfg.train.steps
            );
        }
        let per_step = self.cfg.questions_per_step();
        if Some(st.data_cursor) != st.step.checked_mul(per_step) || st.metrics_lines > st.step {
            bail!(
                "{} says {} steps are done with {} tasks handed out and {} metrics lines, but \
                 each step takes {per_step} tasks (debate.batch_size = {}{}) and writes one \
                 line: the file was changed, or is not of this run",
                state_file.display(),
                st.step,
                st.data_cursor,
                st.metrics_lines,
                self.cfg.debate.batch_size,
                match self.cfg.train.algorithm {
                    Algorithm::Ppo => String::new(),
                    Algorithm::Grpo => format!(
                        " debates, each question train.grpo.group_size = {} times",
                        self.cfg.train.grpo.group_size
                    ),
                }
            );
        }
        dist::check_resume_ranks(
            self.world,
            st.ranks,
            dir,
            "the debates' split and the updates' order depend on the number of ranks",
        )?;
        if !st.plugins.same_plugins(&self.plugin_hashes) && !allow_plugin_change {
            bail!(
                "{}",
                state::plugin_change(&st.plugins, &self.plugin_hashes, dir)
            );
        }
        let ids = learner_ids(&self.cfg);
        let saved: Vec<u32> = st.learners.iter().map(|l| l.agent).collect();
        if ids != saved {
            bail!(
                "the checkpoint {} trained agents {saved:?}, this config trains {ids:?}",
                dir.display()
            );
        }
        // This rank's learners (all of them, unless the agents are split between ranks).
        for l in &mut self.learners {
            let s = st
                .learners
                .iter()
                .find(|s| s.agent == l.agent)
                .expect("the checkpoint has every learner");
            let path = dir
                .join(format!("agent-{}", l.agent))
                .join("optimizer.safetensors");
            l.optimizer.load(&path)?;
            if l.optimizer.steps() != s.optimizer_steps {
                bail!(
                    "{}: {} optimizer steps, but {} records {}",
                    path.display(),
                    l.optimizer.steps(),
                    dir.join(crate::checkpoint::STATE_FILE).display(),
                    s.optimizer_steps
                );
            }
            l.kl = s.kl.clone();
        }
        self.session
            .team
            .restore_rng_states(&st.samplers)
            .with_context(|| format!("restoring the samplers from {}", dir.display()))?;
        self.step = st.step;
        self.cursor = st.data_cursor;
        self.metrics_lines = st.metrics_lines;
        if self.world.rank() == 0 {
            crate::checkpoint::truncate_lines(&self.metrics_path(), st.metrics_lines)?;
        }
        progress.note(&format!(
            "resuming after step {} of {} from {}",
            st.step,
            self.cfg.train.steps,
            dir.display()
        ));
        Ok(())
    }

    /// The trained adapters and value heads in the PEFT layout, under `dir/agent-N/` (rank
    /// 0 writes them; with the agents split between ranks, each rank its own, into rank 0's
    /// staging directory).
    fn export_adapters(&self, dir: &Path) -> anyhow::Result<()> {
        if self.spread && self.world.size() > 1 {
            stage_together(self.world, &|tmp| self.write_learners(tmp, false), |fill| {
                replace_dir(dir, |tmp| fill(tmp))
            })?;
            return Ok(());
        }
        if self.world.rank() == 0 {
            replace_dir(dir, |tmp| self.write_learners(tmp, false))?;
        }
        Ok(())
    }
}

/// The agents a config trains: agent 0 alone in single-agent RL, else every agent.
fn learner_ids(cfg: &Config) -> Vec<u32> {
    match cfg.train.mode {
        TrainMode::Single => vec![0],
        _ => (0..cfg.debate.agents).collect(),
    }
}

/// Writes a directory that holds every rank's learners and that rank 0 stages and puts in
/// place at once (a checkpoint, the final adapters), for a run whose agents are split
/// between ranks. Every rank calls it. On rank 0 it runs `stage`, which must call the fill
/// it is given with its staging directory: the fill tells the other ranks where that is,
/// every rank writes its own learners there with `mine`, and the fill returns once all have
/// (or fails, on every rank, naming the rank that could not). Every rank ends with rank 0's
/// outcome: rank 0's result as `Some`, the others' `None`; a failure anywhere leaves the
/// previous directory as it was.
fn stage_together<T>(
    world: &dyn World,
    mine: &dyn Fn(&Path) -> anyhow::Result<()>,
    stage: impl FnOnce(&mut dyn FnMut(&Path) -> anyhow::Result<()>) -> anyhow::Result<T>,
) -> anyhow::Result<Option<T>> {
    use std::os::unix::ffi::{OsStrExt as _, OsStringExt as _};
    // Every rank's learners written, or the first rank's failure; the same on every rank.
    let all_written = |dir: &Path| -> anyhow::Result<()> {
        let failed = mine(dir).err().map(|e| format!("{e:#}"));
        let all = dist::gather_json(world, &failed, "writes")?;
        match all
            .iter()
            .enumerate()
            .find_map(|(r, f)| Some((r, f.as_ref()?)))
        {
            Some((r, why)) => bail!("rank {r} could not write its agents: {why}"),
            None => Ok(()),
        }
    };
    if world.rank() != 0 {
        let mut path = Vec::new();
        world.broadcast_bytes(0, &mut path)?;
        if path.is_empty() {
            bail!("rank 0 could not make the staging directory (its error says why)");
        }
        let dir = PathBuf::from(std::ffi::OsString::from_vec(path));
        all_written(&dir)?;
        let mut outcome = Vec::new();
        world.broadcast_bytes(0, &mut outcome)?;
        if !outcome.is_empty() {
            bail!(
                "rank 0 could not finish {}: {}",
                dir.display(),
                String::from_utf8_lossy(&outcome)
            );
        }
        return Ok(None);
    }
    // How far rank 0 got: 0 nothing sent, 1 the directory sent, 2 every rank wrote.
    let mut reached = 0;
    let result = stage(&mut |dir: &Path| {
        let mut path = dir.as_os_str().as_bytes().to_vec();
        world.broadcast_bytes(0, &mut path)?;
        reached = 1;
        all_written(dir)?;
        reached = 2;
        Ok(())
    });
    match reached {
        // The others wait for a directory, or (once every rank wrote) for the outcome.
        0 => world.broadcast_bytes(0, &mut Vec::new())?,
        2 => {
            let mut outcome = match &result {
                Ok(_) => Vec::new(),
                Err(e) => format!("{e:#}").into_bytes(),
            };
            world.broadcast_bytes(0, &mut outcome)?;
        }
        _ => {}
    }
    result.map(Some)
}

/// A learner for agent `a`: an adapter (or its own trainable weights), value head(s) and an
/// optimizer, fresh or read from the checkpoint directory `from`.
fn new_learner(
    session: &mut Session,
    cfg: &Config,
    a: u32,
    from: Option<&Path>,
) -> anyhow::Result<Learner> {
    let t = &cfg.train;
    let agent = session.team.agent_mut(a as usize);
    let base = agent.base.clone();
    let hidden = base.config().hidden_size;
    let seed = cfg.seed + u64::from(a);
    let head = |k: u64| ValueHead::new(hidden, DType::F32, base.device(), seed + 100 + k);
    if t.full_finetune {
        agent.train_all_weights()?;
        if let Some(dir) = from {
            agent.load_weights(&dir.join("model.safetensors"))?;
        }
    } else {
        agent.lora = Some(match (from, agent.lora.take()) {
            (Some(dir), _) => Lora::load(dir, &base)?,
            // The config's `agents[a].adapter`: training continues from it.
            (None, Some(given)) => given,
            (None, None) => Lora::new(
                &base,
                LoraConfig {
                    r: t.lora_r,
                    alpha: t.lora_alpha,
                    target_modules: t.lora_targets.clone(),
                },
                seed,
            )?,
        });
    }
    let load_head = |name: String, k: u64| match from {
        Some(dir) => ValueHead::load(&dir.join(name), hidden, DType::F32, base.device()),
        None => head(k),
    };
    let mut turn_heads = Vec::new();
    if t.algorithm == Algorithm::Grpo {
        // GRPO has no critic.
    } else if t.value_heads == ValueHeads::PerTurn {
        for turn in 1..=cfg.debate.turns {
            turn_heads.push(load_head(
                format!("value_head.turn-{turn}.safetensors"),
                u64::from(turn),
            )?);
        }
    } else {
        agent.value_head = Some(load_head("value_head.safetensors".into(), 0)?);
    }
    let mut named = agent.named_trainable_vars();
    // Generation records the learner's log-probs (and its shared value head's values) for
    // its update; per-turn heads score their turn's samples afresh.
    if turn_heads.is_empty() {
        session.team.mark_learner(a as usize);
    }
    for (i, h) in turn_heads.iter().enumerate() {
        named.extend(
            h.named_vars()
                .into_iter()
                .map(|(k, v)| (format!("turn-{}.{k}", i + 1), v)),
        );
    }
    let optimizer = AgentOptimizer::new(named, t.ppo.lr, t.ppo.weight_decay)?;
    let kl = match t.kl_target {
        Some(target) => KlController::Adaptive {
            value: t.kl_coef,
            target,
            horizon: t.kl_horizon,
        },
        None => KlController::Fixed { value: t.kl_coef },
    };
    Ok(Learner {
        agent: a,
        optimizer,
        reference: Agent::new(base),
        kl,
        turn_heads,
    })
}

/// One rank's debates as the others receive them: the debate and each speech's token ids
/// and policy trace (which transcripts leave out), floats as their bits.
#[derive(Serialize, serde::Deserialize)]
struct SharedDebate {
    debate: Debate,
    ids: Vec<SharedIds>,
}

#[derive(Serialize, serde::Deserialize)]
struct SharedIds {
    prompt: Vec<u32>,
    response: Vec<u32>,
    /// temperature, log-probs and values (`f32::to_bits`).
    policy: Option<(f64, Vec<u32>, Vec<u32>)>,
}

/// Every rank's debates of a step, in rank order (the order of the step's tasks), on every
/// rank: the rollout one process would have made of the whole batch. The times stay this
/// rank's.
/// Refuses a run started on several processes whose config has no `[distributed]` table
/// (`maporl train`, `eval` and `verifier train`).
pub fn check_distributed(world: &dyn World, config: &Config) -> anyhow::Result<()> {
    if world.size() > 1 && config.distributed.is_none() {
        bail!(
            "this run was started on {} processes (mpirun -np {}), but its config has no \
             [distributed] table: add `[distributed]` with `placement = \"data\"`, or run \
             it without mpirun",
            world.size(),
            world.size()
        );
    }
    Ok(())
}

/// On several ranks: stops every rank unless all run the same binary, config and plugins
/// (sha256s), naming what differs and where.
fn check_same_run(world: &dyn World, cfg: &Config, plugins: &PluginHashes) -> anyhow::Result<()> {
    check_same_config(
        world,
        cfg,
        &[(
            "plugins (protocol, verifier, shaper sha256)",
            format!(
                "{}, {}, {}",
                plugins.protocol, plugins.verifier, plugins.shaper
            ),
        )],
    )
    .context("checking that every rank runs the same run")
}

/// On several ranks: stops every rank unless all run the same binary and resolved config
/// (sha256s) and agree on `more`'s (what, fingerprint) pairs, naming what differs and where
/// ([`dist::check_agreement`]). Nothing on one.
pub fn check_same_config(
    world: &dyn World,
    cfg: &Config,
    more: &[(&str, String)],
) -> anyhow::Result<()> {
    if world.size() == 1 {
        return Ok(());
    }
    use sha2::Digest as _;
    let mut items = vec![
        ("maporl binary (sha256)", dist::binary_sha256()?),
        (
            "config (sha256 of the resolved config.toml)",
            hex::encode(sha2::Sha256::digest(cfg.to_toml().as_bytes())),
        ),
    ];
    items.extend(more.iter().cloned());
    dist::check_agreement(world, &items)
}

fn gather_rollout(world: &dyn World, rollout: Rollout) -> anyhow::Result<Rollout> {
    let shared: Vec<SharedDebate> = rollout
        .debates
        .into_iter()
        .map(|d| SharedDebate {
            ids: d
                .speeches
                .iter()
                .map(|s| SharedIds {
                    prompt: s.ids.prompt.clone(),
                    response: s.ids.response.clone(),
                    policy: s.ids.policy.as_ref().map(|t| {
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
                        (t.temperature, bits(&t.logprobs), bits(&t.values))
                    }),
                })
                .collect(),
            debate: d,
        })
        .collect();
    let mut debates = Vec::new();
    for (r, theirs) in dist::gather_json(world, &shared, "debates")?
        .into_iter()
        .enumerate()
    {
        for SharedDebate { mut debate, ids } in theirs {
            if ids.len() != debate.speeches.len() {
                bail!(
                    "rank {r} sent {} speeches' token ids for {} speeches",
                    ids.len(),
                    debate.speeches.len()
                );
            }
            for (s, i) in debate.speeches.iter_mut().zip(ids) {
                let floats = |v: Vec<u32>| v.into_iter().map(f32::from_bits).collect();
                s.ids = debate::TokenIds {
                    prompt: i.prompt,
                    response: i.response,
                    policy: i
                        .policy
                        .map(|(temperature, lp, v)| crate::model::PolicyTrace {
                            temperature,
                            logprobs: floats(lp),
                            values: floats(v),
                        }),
                };
            }
            debates.push(debate);
        }
    }
    Ok(Rollout {
        debates,
        plugin_time: rollout.plugin_time,
        team_time: rollout.team_time,
    })
}

/// With the agents split between ranks, every rank runs the plugins on the same debates,
/// and the sandbox makes plugins deterministic, so the ranks must get the same plans and
/// decisions, verdicts and rewards. Compares their sha256s, in the data's order (protocol,
/// verifier, shaper), and stops the run naming the first plugin whose results differ.
fn check_plugins_agree(world: &dyn World, rollout: &Rollout, cfg: &Config) -> anyhow::Result<()> {
    use sha2::Digest as _;
    let digest = |v: serde_json::Value| hex::encode(sha2::Sha256::digest(v.to_string()));
    let d = &rollout.debates;
    let mine = [
        digest(serde_json::json!(d
            .iter()
            .map(|d| (&d.task.id, &d.speeches, &d.decisions, &d.error))
            .collect::<Vec<_>>())),
        digest(serde_json::json!(d
            .iter()
            .flat_map(|d| &d.transcript.utterances)
            .map(|u| (u.turn, u.agent, &u.answer, u.score.to_bits(), u.correct))
            .collect::<Vec<_>>())),
        digest(serde_json::json!(d
            .iter()
            .flat_map(|d| &d.rewards)
            .map(|r| {
                let bits: Vec<(&String, u32)> =
                    r.parts.iter().map(|(k, v)| (k, v.to_bits())).collect();
                (r.turn, r.agent, r.total.to_bits(), bits)
            })
            .collect::<Vec<_>>())),
    ];
    let all = dist::gather_json(world, &mine, "plugin results")?;
    let plugins = [
        (
            "protocol",
            "plans and decisions",
            &cfg.plugins.protocol.path,
        ),
        ("verifier", "verdicts", &cfg.plugins.verifier.path),
        ("shaper", "rewards", &cfg.plugins.shaper.path),
    ];
    for (i, (slot, what, path)) in plugins.into_iter().enumerate() {
        if let Some(r) = (1..all.len()).find(|&r| all[r][i] != all[0][i]) {
            bail!(
                "the {slot} plugin ({path}) gave rank {r} other {what} than rank 0 for the same \
                 debates (sha256 {} against {}): with distributed.placement = \"agents\" every \
                 rank runs the plugins, and they must give the same results for the same \
                 inputs; nothing of this step was saved",
                &all[r][i][..12],
                &all[0][i][..12]
            );
        }
    }
    Ok(())
}

/// With the `test-hooks` feature, `MAPORL_TEST_SKEW_REWARDS_ON_RANK=r` adds 0.001 to the
/// first reward rank r's shaper gave, as a nondeterministic plugin would (the tests check
/// that the ranks' comparison stops the run).
#[cfg(feature = "test-hooks")]
fn skew_rewards_for_tests(world: &dyn World, rollout: &mut Rollout) {
    let Ok(rank) = std::env::var("MAPORL_TEST_SKEW_REWARDS_ON_RANK") else {
        return;
    };
    if rank.parse::<usize>().ok() == Some(world.rank()) {
        if let Some(r) = rollout
            .debates
            .iter_mut()
            .flat_map(|d| &mut d.rewards)
            .next()
        {
            r.total += 0.001;
        }
    }
}

#[cfg(not(feature = "test-hooks"))]
fn skew_rewards_for_tests(_world: &dyn World, _rollout: &mut Rollout) {}

/// Agent `agent`'s rewarded utterances in `debates` (those that failed are left out), with
/// their token ids, in debate then turn order.
pub fn samples_of(debates: &[Debate], agent: u32) -> Vec<Sample> {
    indexed_samples_of(debates, agent)
        .into_iter()
        .map(|(_, s)| s)
        .collect()
}

/// [`samples_of`], each with the index of its debate in `debates`.
fn indexed_samples_of(debates: &[Debate], agent: u32) -> Vec<(usize, Sample)> {
    let mut out = Vec::new();
    for (i, d) in debates
        .iter()
        .enumerate()
        .filter(|(_, d)| d.error.is_none())
    {
        for (u, s) in d.transcript.utterances.iter().zip(&d.speeches) {
            if u.agent != agent || s.ids.response.is_empty() || s.ids.prompt.is_empty() {
                continue;
            }
            if let Some(r) = d
                .rewards
                .iter()
                .find(|r| r.turn == u.turn && r.agent == agent)
            {
                out.push((
                    i,
                    Sample {
                        prompt: s.ids.prompt.clone(),
                        response: s.ids.response.clone(),
                        turn: u.turn,
                        reward: r.total,
                        policy: s.ids.policy.clone(),
                    },
                ));
            }
        }
    }
    out
}

/// Statistics of several updates, weighted by their sample counts (tokens and timings
/// summed).
fn weighted_mean(parts: &[(usize, StepStats)]) -> StepStats {
    let n: usize = parts.iter().map(|(n, _)| n).sum();
    let mut out = StepStats::default();
    for (k, s) in parts {
        let w = *k as f32 / n.max(1) as f32;
        out.reward_mean += w * s.reward_mean;
        out.kl += w * s.kl;
        out.kl_coef = s.kl_coef;
        out.policy_loss += w * s.policy_loss;
        if let Some(v) = s.value_loss {
            *out.value_loss.get_or_insert(0.0) += w * v;
        }
        out.approx_kl += w * s.approx_kl;
        out.clip_fraction += w * s.clip_fraction;
        out.entropy += w * s.entropy;
        out.grad_norm += w * s.grad_norm;
        out.reference_prefix_hit_rate += w * s.reference_prefix_hit_rate;
        out.tokens += s.tokens;
        out.score_seconds += s.score_seconds;
        out.optimize_seconds += s.optimize_seconds;
        out.backward_seconds += s.backward_seconds;
    }
    out
}

fn reward_parts(debates: &[Debate]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for r in debates.iter().flat_map(|d| &d.rewards) {
        for (name, value) in &r.parts {
            let e = sums.entry(name.clone()).or_default();
            e.0 += f64::from(*value);
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(k, (s, n))| (k, s / n as f64))
        .collect()
}
