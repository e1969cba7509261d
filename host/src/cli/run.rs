//! `maporl eval` and `maporl debate`: debates between LLM agents, as a run config describes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use clap::Args;

use crate::bundle::{LockedPlugin, PluginLock};
use crate::config::{expand_home, write_atomic, Config};
use crate::debate::{self, Debate, ModelTeam, OnPluginError, PluginHashes, Plugins, TeamOptions};
use crate::model::{Lora, SamplingParams};
use crate::plugin::{Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier};
use crate::transcript::Task;

#[derive(Args)]
pub struct ConfigArgs {
    /// The run config (TOML), e.g. configs/quickstart.toml.
    #[arg(long)]
    pub config: PathBuf,
    /// Override any config key, e.g. --set debate.turns=2 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

#[derive(Args)]
pub struct DebateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The question to debate.
    #[arg(long)]
    question: String,
    /// The gold answer, if known (for scores and correctness).
    #[arg(long, default_value = "")]
    reference: String,
    /// The task kind the plugins see (default: the config's data kind, else "arith").
    #[arg(long)]
    kind: Option<String>,
}

/// Everything a debate run needs, built from a config.
pub(crate) struct Setup {
    pub config: Config,
    pub plugins: Plugins,
    pub team: ModelTeam,
    /// The exact plugins loaded, for the run's `plugins.lock`.
    pub lock: PluginLock,
}

impl Setup {
    pub fn new(config: Config) -> anyhow::Result<Setup> {
        let (plugins, lock) = load_plugins(&config)?;
        let paths: Vec<PathBuf> = (0..config.debate.agents as usize)
            .map(|a| expand_home(config.agent_model(a)))
            .collect();
        let g = &config.generation;
        let opts = TeamOptions {
            sampling: SamplingParams {
                temperature: g.temperature,
                top_p: g.top_p,
                top_k: g.top_k,
            },
            max_new_tokens: g.max_new_tokens,
            // A turn's prompts for every agent on one base form one batch.
            batch_size: config.debate.batch_size * config.debate.agents as usize,
            seed: config.seed,
            dtype: match config.model.dtype.as_str() {
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                _ => DType::F32,
            },
        };
        let mut team = ModelTeam::load(&paths, &opts, &Device::Cpu)?;
        for a in 0..config.debate.agents as usize {
            if let Some(dir) = config.agent_adapter(a) {
                let dir = expand_home(dir);
                let agent = team.agent_mut(a);
                agent.lora =
                    Some(Lora::load(&dir, &agent.base).with_context(|| {
                        format!("agents[{a}].adapter: loading {}", dir.display())
                    })?);
            }
        }
        // The paper's frozen turn-1 policy: adapters speak from this turn on.
        team.use_adapters_from_turn(config.train.adapter_from_turn);
        Ok(Setup {
            config,
            plugins,
            team,
            lock,
        })
    }

    /// Debates `tasks` in batches of `debate.batch_size`, with a progress bar; returns the
    /// debates and the time spent in plugins and in the team.
    pub fn debate_all(
        &mut self,
        tasks: &[Task],
        label: &'static str,
    ) -> anyhow::Result<(Vec<Debate>, Duration, Duration)> {
        let d = &self.config.debate;
        let (agents, turns, batch) = (d.agents, d.turns, d.batch_size);
        let on_error = self.on_error();
        let bar = progress_bar(tasks.len() as u64, label);
        let (mut plugin_time, mut team_time) = (Duration::ZERO, Duration::ZERO);
        let mut debates = Vec::with_capacity(tasks.len());
        for chunk in tasks.chunks(batch) {
            let rollout = debate::run(
                &mut self.plugins,
                &mut self.team,
                chunk,
                agents,
                turns,
                on_error,
            )?;
            plugin_time += rollout.plugin_time;
            team_time += rollout.team_time;
            debates.extend(rollout.debates);
            bar.inc(chunk.len() as u64);
        }
        bar.finish_and_clear();
        Ok((debates, plugin_time, team_time))
    }

    pub fn on_error(&self) -> OnPluginError {
        if self.config.debate.on_plugin_error == "drop-task" {
            OnPluginError::DropTask
        } else {
            OnPluginError::Stop
        }
    }
}

/// The config's three plugins, each in its own sandbox, and the lock that pins them (and
/// the learned verifier's checkpoint, offered to plugins as `judge`).
pub(crate) fn load_plugins(config: &Config) -> anyhow::Result<(Plugins, PluginLock)> {
    // The learned verifier (`[verifier] checkpoint`), offered to plugins as `judge`.
    let judge = crate::verifier::LearnedVerifier::from_config(config)?.map(Arc::new);
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
        protocol: LockedPlugin::new(&protocol, &plugins.protocol.identity().sha256)?,
        verifier: LockedPlugin::new(&verifier, &plugins.verifier.identity().sha256)?,
        shaper: LockedPlugin::new(&shaper, &plugins.shaper.identity().sha256)?,
        verifier_checkpoint: judge.map(|j| crate::bundle::LockedCheckpoint {
            path: j.checkpoint().display().to_string(),
            sha256: j.sha256().to_string(),
        }),
    };
    Ok((plugins, lock))
}

/// Scores `debates` and writes the report to `path` (atomically), with the learned
/// verifier's checkpoint hash when one scored them.
pub(crate) fn write_report(
    path: &Path,
    debates: &[Debate],
    hashes: &PluginHashes,
) -> anyhow::Result<crate::eval::Report> {
    let report = crate::eval::evaluate(debates);
    let mut json = serde_json::to_value(&report)?;
    if let (Some(sha), Some(obj)) = (&hashes.verifier_checkpoint, json.as_object_mut()) {
        obj.insert("verifier_checkpoint_sha256".into(), sha.clone().into());
    }
    write_atomic(path, serde_json::to_string_pretty(&json)?.as_bytes())?;
    Ok(report)
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
    let all = match d.source.as_str() {
        "arithmetic" => crate::data::arithmetic(
            d.offset + d.count.max(1),
            d.difficulty,
            d.seed.unwrap_or(config.seed),
        ),
        "gsm8k" => crate::data::gsm8k(&path)?,
        "anli" => crate::data::anli(&path)?,
        "jsonl" => {
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
        other => bail!("unknown data.source {other:?}"),
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

pub fn eval(args: ConfigArgs) -> anyhow::Result<()> {
    evaluate(Config::load(&args.config, &args.overrides)?)
}

/// Debates over the config's tasks with the team as configured; writes the transcripts,
/// `eval.json` and the per-turn table.
pub fn evaluate(config: Config) -> anyhow::Result<()> {
    let run_dir = PathBuf::from(&config.run_dir);
    let (tasks, _) = held_out(tasks(&config)?, &config)?;
    // Everything that can refuse the run (model, plugins, limits) before anything is
    // written: a refused run leaves no directory behind.
    let mut setup = Setup::new(config)?;
    std::fs::create_dir_all(&run_dir)
        .with_context(|| format!("creating run dir {}", run_dir.display()))?;
    write_atomic(
        &run_dir.join("config.toml"),
        setup.config.to_toml().as_bytes(),
    )?;
    setup.lock.write(&run_dir)?;
    let started = Instant::now();
    let (debates, plugin_time, team_time) = setup.debate_all(&tasks, "debating")?;
    let elapsed = started.elapsed();
    let hashes = PluginHashes::of(&setup.plugins);
    debate::write_transcripts(&run_dir.join("transcripts.jsonl"), &debates, &hashes)?;
    let report = write_report(&run_dir.join("eval.json"), &debates, &hashes)?;
    println!("{}", report.table());
    let utterances: usize = debates.iter().map(|d| d.speeches.len()).sum();
    let tokens: usize = debates
        .iter()
        .flat_map(|d| &d.speeches)
        .map(|s| s.response_tokens)
        .sum();
    println!(
        "{utterances} utterances, {tokens} generated tokens in {:.1} s ({:.2} utterances/s, {:.1} tokens/s); \
         plugins took {:.3}% of the time",
        elapsed.as_secs_f64(),
        utterances as f64 / elapsed.as_secs_f64(),
        tokens as f64 / team_time.as_secs_f64().max(1e-9),
        100.0 * plugin_time.as_secs_f64() / elapsed.as_secs_f64()
    );
    for d in debates.iter().filter(|d| d.error.is_some()) {
        eprintln!(
            "dropped task {}: {}",
            d.task.id,
            d.error.as_deref().unwrap_or_default()
        );
    }
    println!("wrote {}", run_dir.display());
    Ok(())
}

pub fn debate(args: DebateArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    let kind = args
        .kind
        .clone()
        .unwrap_or_else(|| match config.data.source.as_str() {
            "jsonl" if !config.data.kind.is_empty() => config.data.kind.clone(),
            "jsonl" | "arithmetic" => "arith".into(),
            other => other.to_string(),
        });
    let task = Task {
        id: "question".into(),
        kind,
        question: args.question.clone(),
        reference: args.reference.clone(),
        fields: vec![],
    };
    let mut setup = Setup::new(config)?;
    let (agents, turns) = (setup.config.debate.agents, setup.config.debate.turns);
    let rollout = debate::run(
        &mut setup.plugins,
        &mut setup.team,
        std::slice::from_ref(&task),
        agents,
        turns,
        OnPluginError::Stop,
    )?;
    let d = &rollout.debates[0];
    println!("Question: {}\n", task.question);
    for (t, decision) in d.decisions.iter().enumerate() {
        let turn = t as u32 + 1;
        println!("──────── turn {turn} ────────");
        for u in d.transcript.utterances.iter().filter(|u| u.turn == turn) {
            let reward = d
                .rewards
                .iter()
                .find(|r| r.turn == turn && r.agent == u.agent);
            println!(
                "Agent {} (answer {}, score {:.2}{}{}):",
                u.agent + 1,
                u.answer.as_deref().unwrap_or("invalid"),
                u.score,
                if args.reference.is_empty() {
                    ""
                } else if u.correct {
                    ", right"
                } else {
                    ", wrong"
                },
                reward
                    .map(|r| format!(", reward {:.3}", r.total))
                    .unwrap_or_default()
            );
            println!("{}\n", indent(&u.text));
        }
        println!(
            "Team answer after turn {turn}: {}\n",
            if decision.is_empty() {
                "none".to_string()
            } else {
                decision.join(" / ")
            }
        );
    }
    Ok(())
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A progress bar with an ETA on a terminal; nothing when stderr is not a TTY.
pub(crate) fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} tasks, {elapsed} elapsed, ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// `maporl data fetch`.
pub fn fetch(dataset: &str, dir: &Path) -> anyhow::Result<()> {
    let files = crate::data::fetch(dataset, dir, None)?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(())
}
