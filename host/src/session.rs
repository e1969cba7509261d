//! A run's working set, loaded once for every command: the config, the three plugins in
//! their sandboxes (with the learned verifier they may `judge` with), the team of agents,
//! and the lock that pins the plugins. Also the config's tasks and their held-out split.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use candle_core::Device;

use crate::bundle::{LockedPlugin, PluginLock};
use crate::config::{Config, DataSource};
use crate::debate::{self, Debate, ModelTeam, OnPluginError, Plugins, TeamOptions};
use crate::files::{expand_home, write_atomic};
use crate::model::Lora;
use crate::plugin::{Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier};
use crate::transcript::Task;

/// What a long library call tells its caller as it goes: a command line draws progress
/// bars and prints the notes; a test or a server may ignore both.
pub trait Progress {
    /// A phase of `len` units (tasks, steps) begins, `done` of them already done.
    fn begin(&mut self, what: &str, len: u64, done: u64) {
        let _ = (what, len, done);
    }
    /// `by` more units of the phase are done.
    fn advance(&mut self, by: u64) {
        let _ = by;
    }
    /// The phase is over.
    fn end(&mut self) {}
    /// A line for the person running the command (a summary, not a diagnostic).
    fn note(&mut self, line: &str) {
        let _ = line;
    }
    /// A training step is done (one unit of the "training" phase): what it measured.
    fn step(&mut self, step: &StepSummary) {
        let _ = step;
        self.advance(1);
    }
}

/// What the person running `maporl train` sees of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSummary {
    /// Steps done (this one included) and in all.
    pub done: usize,
    pub steps: usize,
    /// Mean total reward over the step's rewarded utterances of the learning agents.
    pub reward: f64,
    /// Majority accuracy per turn on the step's debates.
    pub accuracy: Vec<f64>,
    /// (agent, mean KL to its reference) per learning agent.
    pub kl: Vec<(u32, f64)>,
    /// The step's wall time.
    pub seconds: f64,
}

impl std::fmt::Display for StepSummary {
    /// `step 3/16: reward 0.412, accuracy by turn 0.50 0.62 0.66, KL 0.0031 (agent 0)
    /// 0.0042 (agent 1), 2.9 s`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "step {}/{}: reward {:.3}",
            self.done, self.steps, self.reward
        )?;
        if !self.accuracy.is_empty() {
            write!(f, ", accuracy by turn")?;
            for a in &self.accuracy {
                write!(f, " {a:.2}")?;
            }
        }
        for (i, (agent, kl)) in self.kl.iter().enumerate() {
            let lead = if i == 0 { ", KL" } else { "" };
            write!(f, "{lead} {kl:.4} (agent {agent})")?;
        }
        write!(f, ", {:.1} s", self.seconds)
    }
}

/// Progress that goes nowhere.
pub struct Quiet;

impl Progress for Quiet {}

/// Everything a debate run needs, built from a config.
pub struct Session {
    pub config: Config,
    pub plugins: Plugins,
    pub team: ModelTeam,
    /// The exact plugins loaded, for the run's `plugins.lock`.
    pub lock: PluginLock,
}

/// The debates of many batches and where the time went.
pub struct Debated {
    pub debates: Vec<Debate>,
    /// Time inside plugin calls, and generating.
    pub plugin_time: Duration,
    pub team_time: Duration,
}

impl Session {
    /// Loads the config's plugins and team (with any adapters it names). Everything that
    /// can refuse a run (models, plugins, limits) happens here, before a command writes
    /// anything.
    pub fn open(config: Config) -> anyhow::Result<Session> {
        let (plugins, lock) = load_plugins(&config)?;
        let team = load_team(&config)?;
        Ok(Session {
            config,
            plugins,
            team,
            lock,
        })
    }

    /// Makes `run_dir` and writes the resolved config and the plugins' lock into it.
    pub fn start_run_dir(&self, run_dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("creating run dir {}", run_dir.display()))?;
        write_atomic(
            &run_dir.join("config.toml"),
            self.config.to_toml().as_bytes(),
        )?;
        self.lock.write(run_dir)
    }

    /// Debates `tasks` in batches of `debate.batch_size`.
    pub fn debate_all(
        &mut self,
        tasks: &[Task],
        label: &str,
        progress: &mut dyn Progress,
    ) -> anyhow::Result<Debated> {
        let batch = self.config.debate.batch_size;
        progress.begin(label, tasks.len() as u64, 0);
        let mut out = Debated {
            debates: Vec::with_capacity(tasks.len()),
            plugin_time: Duration::ZERO,
            team_time: Duration::ZERO,
        };
        for chunk in tasks.chunks(batch) {
            let rollout = self.debate(chunk)?;
            out.plugin_time += rollout.plugin_time;
            out.team_time += rollout.team_time;
            out.debates.extend(rollout.debates);
            progress.advance(chunk.len() as u64);
        }
        progress.end();
        Ok(out)
    }

    /// One batch of debates, one per task, in one rollout. With the team's agents split
    /// between ranks (`distributed.placement = "agents"`), every rank must call it with the
    /// same tasks: each generates its agents' responses and all hold every debate.
    pub fn debate(&mut self, tasks: &[Task]) -> anyhow::Result<debate::Rollout> {
        // Each batch's prompts share prefixes within it only, so that what it generates
        // does not depend on the batches before it (a resumed run has none of them), and
        // the cache's memory is free again for what follows (the update).
        self.team.forget_prefixes();
        let d = &self.config.debate;
        let (agents, turns, on_error) = (d.agents, d.turns, d.on_plugin_error);
        let rollout = if self.config.spreads_agents() {
            let world = crate::distributed::world();
            let mut team = debate::SpreadTeam::new(&mut self.team, world);
            debate::run(&mut self.plugins, &mut team, tasks, agents, turns, on_error)
        } else {
            debate::run(
                &mut self.plugins,
                &mut self.team,
                tasks,
                agents,
                turns,
                on_error,
            )
        };
        self.team.forget_prefixes();
        rollout
    }

    /// What a plugin failure does to the run (`debate.on_plugin_error`).
    pub fn on_error(&self) -> OnPluginError {
        self.config.debate.on_plugin_error
    }
}

/// The config's team of agents, each with the adapter its `[[agents]]` entry names, on its
/// device.
pub fn load_team(config: &Config) -> anyhow::Result<ModelTeam> {
    let paths: Vec<PathBuf> = (0..config.debate.agents as usize)
        .map(|a| {
            let path = crate::model::resolve_model(config.agent_model(a))?;
            missing_model(config, a, &path).map_or(Ok(path), Err)
        })
        .collect::<anyhow::Result<_>>()?;
    let opts = TeamOptions {
        sampling: (0..paths.len()).map(|a| config.agent_sampling(a)).collect(),
        max_new_tokens: config.generation.max_new_tokens,
        // A turn's prompts for every agent on one base form one batch.
        batch_size: config.debate.batch_size * config.debate.agents as usize,
        seed: config.seed,
        dtype: config.model.candle_dtype(),
        prefix_cache_bytes: config.generation.prefix_cache_mib << 20,
    };
    // With one agent per rank, each rank loads (and opens the device of) its own agents.
    let world = crate::distributed::world();
    let holds = |a: usize| {
        !config.spreads_agents() || crate::distributed::agent_rank(a, world.size()) == world.rank()
    };
    if config.spreads_agents() && world.size() > paths.len() {
        bail!(
            "distributed.placement = \"agents\" puts each agent on a rank of its own, but \
             this job has {} ranks for {} agents: start at most {} (mpirun -np {})",
            world.size(),
            paths.len(),
            paths.len(),
            paths.len()
        );
    }
    let devices = agent_devices(config, &holds)?;
    let mut team = ModelTeam::load_part(&paths, &devices, &opts)?;
    for a in (0..config.debate.agents as usize).filter(|&a| holds(a)) {
        if let Some(dir) = config.agent_adapter(a) {
            let dir = expand_home(dir);
            let agent = team.agent_mut(a);
            agent.lora = Some(
                Lora::load(&dir, &agent.base)
                    .with_context(|| format!("agents[{a}].adapter: loading {}", dir.display()))?,
            );
        }
    }
    // The paper's frozen turn-1 policy: adapters speak from this turn on.
    team.use_adapters_from_turn(config.train.adapter_from_turn);
    Ok(team)
}

/// The error for agent `a`'s model when its local path holds nothing, saying what would
/// make one: the config's `[warm_start]`, a hub name written without `hf:`, or what a model
/// path may be.
fn missing_model(config: &Config, a: usize, path: &Path) -> Option<anyhow::Error> {
    let named = config.agent_model(a);
    if crate::model::hub::is_hub_path(named) || path.exists() {
        return None;
    }
    let key = match config.agents.get(a) {
        Some(agent) if !agent.model.is_empty() => format!("agents[{a}].model"),
        _ => "model.path".to_string(),
    };
    let hub_like = {
        let parts: Vec<&str> = named.split('/').collect();
        parts.len() == 2
            && !named.starts_with('.')
            && !named.starts_with('~')
            && parts.iter().all(|p| {
                !p.is_empty()
                    && p.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            })
    };
    let hint = if config.warm_start.is_some() {
        format!(
            "this config has a [warm_start] section that makes it: run `maporl warm-start \
             --config CONFIG` with this config first (the warm start writes it to {key})"
        )
    } else if hub_like {
        format!("to download {named:?} from the Hugging Face hub, write {key} = \"hf:{named}\"")
    } else {
        "a model is a Hugging Face folder (config.json, *.safetensors, tokenizer.json), a \
         .gguf file, or hf:ORG/NAME to download one"
            .to_string()
    };
    Some(anyhow::anyhow!(
        "{key} = {named:?}: {} does not exist; {hint}",
        path.display()
    ))
}

/// Each agent's device, opened, where this process `holds` the agent; says on stderr
/// where the team runs.
fn agent_devices(
    config: &Config,
    holds: &dyn Fn(usize) -> bool,
) -> anyhow::Result<Vec<Option<Device>>> {
    let mut devices = Vec::new();
    let mut told = Vec::new();
    for a in 0..config.debate.agents as usize {
        if !holds(a) {
            devices.push(None);
            continue;
        }
        let choice = config.agent_device(a);
        let device = choice
            .open()
            .with_context(|| format!("the device of agent {a}"))?;
        told.push(format!("agent {a} on {} ({choice})", device_name(&device)));
        devices.push(Some(device));
    }
    tracing::info!("devices: {}", told.join(", "));
    Ok(devices)
}

/// "cpu" or "cuda:N".
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// The config's three plugins, each in its own sandbox, and the lock that pins them (and
/// the learned verifier's checkpoint, offered to plugins as `judge`).
pub fn load_plugins(config: &Config) -> anyhow::Result<(Plugins, PluginLock)> {
    // The learned verifier (`[verifier] checkpoint`), offered to plugins as `judge`.
    let judge = crate::verifier::LearnedVerifier::from_config(config)?.map(Arc::new);
    load_plugins_judged(config, judge)
}

/// [`load_plugins`] with the learned verifier already loaded (`judge`, the config's), so
/// that several sets of plugins (a server's workers) share one.
pub fn load_plugins_judged(
    config: &Config,
    judge: Option<Arc<crate::verifier::LearnedVerifier>>,
) -> anyhow::Result<(Plugins, PluginLock)> {
    let runtime = Runtime::new(RuntimeOptions {
        seed: config.seed,
        judge: judge.clone().map(|j| j as Arc<dyn crate::plugin::Judge>),
        ..RuntimeOptions::default()
    })?;
    let p = &config.plugins;
    // Paths or `bundle/component@req` references; bundles are checked against the
    // config's trust policy and pinned by sha256 in `lock`.
    let [protocol, verifier, shaper] = crate::bundle::resolve_plugins(config)?;
    let plugins = Plugins {
        protocol: Protocol::load(
            &runtime,
            &protocol.path,
            &protocol.settings,
            &p.protocol.limits,
        )?,
        verifier: Verifier::load(
            &runtime,
            &verifier.path,
            &verifier.settings,
            &p.verifier.limits,
        )?,
        shaper: RewardShaper::load(&runtime, &shaper.path, &shaper.settings, &p.shaper.limits)?,
    };
    let lock = PluginLock {
        protocol: LockedPlugin::new(&protocol, plugins.protocol.identity())?,
        verifier: LockedPlugin::new(&verifier, plugins.verifier.identity())?,
        shaper: LockedPlugin::new(&shaper, plugins.shaper.identity())?,
        verifier_checkpoint: judge.map(|j| crate::bundle::LockedCheckpoint {
            path: j.checkpoint().display().to_string(),
            sha256: j.sha256().to_string(),
        }),
    };
    Ok((plugins, lock))
}

/// Splits the selected tasks into the evaluation set (the first `data.held_out`) and the
/// training set (the rest); without a held-out set both are every task.
pub fn held_out(tasks: Vec<Task>, config: &Config) -> anyhow::Result<(Vec<Task>, Vec<Task>)> {
    let n = config.data.held_out;
    if n == 0 {
        return Ok((tasks.clone(), tasks));
    }
    if n >= tasks.len() {
        bail!(
            "data.held_out = {n} leaves no training tasks: the config selects {} (raise \
             data.count)",
            tasks.len()
        );
    }
    let train = tasks[n..].to_vec();
    let mut eval = tasks;
    eval.truncate(n);
    Ok((eval, train))
}

/// The tasks the config names.
pub fn tasks(config: &Config) -> anyhow::Result<Vec<Task>> {
    let d = &config.data;
    let path = expand_home(&d.path);
    if matches!(d.source, DataSource::Gsm8k | DataSource::Anli) && !path.exists() {
        let name = if d.source == DataSource::Gsm8k {
            "gsm8k"
        } else {
            "anli"
        };
        bail!(
            "data.path = {:?}: {} does not exist; `maporl data fetch {name} DIR` downloads \
             the {name} dataset into DIR/{name}/ (then set data.path to one of its files)",
            d.path,
            path.display()
        );
    }
    let all = match d.source {
        DataSource::Arithmetic => crate::data::arithmetic(
            d.offset + d.count.max(1),
            d.difficulty,
            d.seed.unwrap_or(config.seed),
        )?,
        DataSource::Gsm8k => crate::data::gsm8k(&path)?,
        DataSource::Anli => crate::data::anli(&path)?,
        DataSource::Jsonl => {
            let fields = d
                .fields
                .as_ref()
                .context("data.fields is required for jsonl")?;
            let kind = if d.kind.is_empty() {
                "jsonl"
            } else {
                d.kind.as_str()
            };
            crate::data::jsonl(&path, kind, fields)?
        }
    };
    let take = if d.count == 0 { usize::MAX } else { d.count };
    let tasks: Vec<Task> = all.into_iter().skip(d.offset).take(take).collect();
    if tasks.is_empty() {
        bail!(
            "the config selects no tasks (data.offset = {}, data.count = {})",
            d.offset,
            d.count
        );
    }
    Ok(tasks)
}
