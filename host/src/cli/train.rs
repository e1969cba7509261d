//! `maporl train`: MAPoRL's loop. Each step debates a batch of tasks, shapes the rewards,
//! and updates every learning agent with PPO on its own utterances; one metrics line per
//! step; the adapters and value heads are saved at the end.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::DType;
use serde::Serialize;

use super::run::{tasks, ConfigArgs, Setup};
use crate::config::{write_atomic, Config};
use crate::debate::{self, Debate};
use crate::model::{Agent, Lora, LoraConfig, ValueHead};
use crate::ppo::{learning_rate, ppo_step, AgentOptimizer, KlController, Sample, StepStats};

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
    /// PPO statistics per learning agent.
    agents: BTreeMap<u32, StepStats>,
    rollout_seconds: f64,
    update_seconds: f64,
    generated_tokens_per_second: f64,
}

pub fn train(args: ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config, &args.overrides)?;
    let run_dir = PathBuf::from(&config.run_dir);
    let tasks = tasks(&config)?;
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating run dir {}", run_dir.display()))?;
    write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
    let mut setup = Setup::new(config)?;
    setup.lock.write(&run_dir)?;
    let cfg = setup.config.clone();
    let learners: Vec<u32> = match cfg.train.mode.as_str() {
        "single" => vec![0],
        _ => (0..cfg.debate.agents).collect(),
    };
    let lora = LoraConfig {
        r: cfg.train.lora_r,
        alpha: cfg.train.lora_alpha,
        target_modules: cfg.train.lora_targets.clone(),
    };
    let mut optimizers = Vec::new();
    let mut references = Vec::new();
    for &a in &learners {
        let agent = setup.team.agent_mut(a as usize);
        let base = agent.base.clone();
        agent.lora = Some(Lora::new(&base, lora.clone(), cfg.seed + u64::from(a))?);
        agent.value_head = Some(ValueHead::new(
            base.config().hidden_size,
            DType::F32,
            base.device(),
            cfg.seed + 100 + u64::from(a),
        )?);
        optimizers.push(AgentOptimizer::new(agent, cfg.train.ppo.lr)?);
        // The reference policy is the frozen, shared base.
        references.push(Agent::new(base));
    }
    let mut kl: Vec<KlController> = learners
        .iter()
        .map(|_| match cfg.train.kl_target {
            Some(target) => KlController::Adaptive {
                value: cfg.train.kl_coef,
                target,
                horizon: cfg.train.kl_horizon,
            },
            None => KlController::Fixed {
                value: cfg.train.kl_coef,
            },
        })
        .collect();

    let metrics_path = run_dir.join("metrics.jsonl");
    let mut metrics_file = std::fs::File::create(&metrics_path)
        .with_context(|| format!("creating {}", metrics_path.display()))?;
    let bar = super::run::progress_bar(cfg.train.steps as u64, "training");
    let batch = cfg.debate.batch_size;
    let on_error = setup.on_error();
    for step in 0..cfg.train.steps {
        // The next batch of tasks, cycling through the data.
        let chunk: Vec<_> = (0..batch)
            .map(|i| tasks[(step * batch + i) % tasks.len()].clone())
            .collect();
        let started = Instant::now();
        let rollout = debate::run(
            &mut setup.plugins,
            &mut setup.team,
            &chunk,
            cfg.debate.agents,
            cfg.debate.turns,
            on_error,
        )?;
        let rollout_seconds = started.elapsed().as_secs_f64();
        let started = Instant::now();
        let t = &cfg.train;
        let lr = learning_rate(step, t.steps, t.warmup_steps, t.ppo.lr, t.final_lr_fraction);
        for o in &mut optimizers {
            o.set_lr(lr);
        }
        let mut agents = BTreeMap::new();
        for (k, &a) in learners.iter().enumerate() {
            let samples = samples_of(&rollout.debates, a);
            if samples.is_empty() {
                continue;
            }
            let stats = ppo_step(
                setup.team.agent(a as usize),
                &references[k],
                &mut optimizers[k],
                &samples,
                &mut kl[k],
                &cfg.train.ppo,
                cfg.seed ^ (step as u64) << 8 ^ u64::from(a),
            )
            .with_context(|| format!("PPO update of agent {a} at step {step}"))?;
            agents.insert(a, stats);
        }
        let update_seconds = started.elapsed().as_secs_f64();
        let report = crate::eval::evaluate(&rollout.debates);
        let tokens: usize = rollout
            .debates
            .iter()
            .flat_map(|d| &d.speeches)
            .map(|s| s.response_tokens)
            .sum();
        let line = Metrics {
            step,
            learning_rate: lr,
            tasks: report.tasks,
            accuracy: report.turns.iter().map(|t| t.majority_accuracy).collect(),
            reward_parts: reward_parts(&rollout.debates),
            agents,
            rollout_seconds,
            update_seconds,
            generated_tokens_per_second: tokens as f64 / rollout.team_time.as_secs_f64().max(1e-9),
        };
        serde_json::to_writer(&mut metrics_file, &line)?;
        metrics_file.write_all(b"\n")?;
        metrics_file.flush()?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    let checkpoint = run_dir.join("checkpoints/final");
    save_adapters(&setup, &learners, &checkpoint, &cfg.model.path)?;
    println!(
        "trained {} steps; metrics in {}, adapters in {}",
        cfg.train.steps,
        metrics_path.display(),
        checkpoint.display()
    );
    Ok(())
}

/// Agent `a`'s rewarded utterances with their token ids.
fn samples_of(debates: &[Debate], a: u32) -> Vec<Sample> {
    let mut out = Vec::new();
    for d in debates.iter().filter(|d| d.error.is_none()) {
        for (u, s) in d.transcript.utterances.iter().zip(&d.speeches) {
            if u.agent != a || s.ids.response.is_empty() || s.ids.prompt.is_empty() {
                continue;
            }
            if let Some(r) = d.rewards.iter().find(|r| r.turn == u.turn && r.agent == a) {
                out.push(Sample {
                    prompt: s.ids.prompt.clone(),
                    response: s.ids.response.clone(),
                    reward: r.total,
                });
            }
        }
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

/// Writes each learner's adapter (PEFT layout) and value head under `dir/agent-N/`, into a
/// temporary directory first and renamed into place, so a failed save leaves the old one.
fn save_adapters(
    setup: &Setup,
    learners: &[u32],
    dir: &Path,
    base_name: &str,
) -> anyhow::Result<()> {
    let parent = dir.parent().expect("checkpoints live in the run dir");
    std::fs::create_dir_all(parent)?;
    let tmp = tempfile::tempdir_in(parent)?;
    for &a in learners {
        let agent = setup.team.agent(a as usize);
        let out = tmp.path().join(format!("agent-{a}"));
        std::fs::create_dir_all(&out)?;
        if let Some(lora) = &agent.lora {
            lora.save(&out, base_name)?;
        }
        if let Some(vh) = &agent.value_head {
            vh.save(&out.join("value_head.safetensors"))?;
        }
    }
    let staged = tmp.keep();
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::rename(&staged, dir)
        .with_context(|| format!("moving the checkpoint into {}", dir.display()))?;
    Ok(())
}
