//! `maporl scripted`: debates between scripted stand-in agents through the real reference
//! plugins, shown turn by turn. The stand-in is not an LLM: it answers right with a fixed
//! probability per agent and may adopt its peers' majority answer at later turns.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

use maporl::debate::{self, OnPluginError, Plugins, ScriptedTeam};
use maporl::plugin::{Limits, Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier};

#[derive(Args)]
pub struct ScriptedArgs {
    /// Directory holding debate.wasm, gsm8k.wasm and influence.wasm (default: the built-in
    /// reference plugins).
    #[arg(long)]
    plugins: Option<PathBuf>,
    /// Number of questions.
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// Number of agents.
    #[arg(long, default_value_t = 2)]
    agents: u32,
    /// Number of turns.
    #[arg(long, default_value_t = 3)]
    turns: u32,
    /// Difficulty of the arithmetic questions (`data.difficulty`'s families, 1-7).
    #[arg(long, default_value_t = 3)]
    difficulty: u32,
    /// Seed for the questions, the stand-in agents and the plugins' sandbox.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

pub fn run(args: ScriptedArgs) -> anyhow::Result<()> {
    // The built-in reference plugins unless --plugins (or $MAPORL_PLUGINS) names a directory.
    let dir = args.plugins.or_else(maporl::config::plugins_dir_override);
    let runtime = Runtime::new(RuntimeOptions {
        seed: args.seed,
        ..RuntimeOptions::default()
    })?;
    let limits = Limits::default();
    let settings = serde_json::json!({});
    let path = |name: &str| match &dir {
        None => {
            let b = maporl::plugin::builtin::find(name).expect("a reference plugin");
            Ok(maporl::plugin::builtin::path_of(b))
        }
        Some(dir) => {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(anyhow::anyhow!(
                    "{} not found: build the plugins there or leave out --plugins (and \
                     $MAPORL_PLUGINS) for the built-in ones",
                    p.display()
                ))
            }
        }
    };
    let mut plugins = Plugins {
        protocol: Protocol::load(&runtime, &path("debate.wasm")?, &settings, &limits)?,
        verifier: Verifier::load(&runtime, &path("gsm8k.wasm")?, &settings, &limits)?,
        shaper: RewardShaper::load(&runtime, &path("influence.wasm")?, &settings, &limits)?,
    };
    let tasks = maporl::data::arithmetic(args.tasks, args.difficulty, args.seed)?;
    // Skills spread from 0.3 to 0.8 so the agents disagree often enough to debate.
    let skill = (0..args.agents)
        .map(|a| 0.3 + 0.5 * f64::from(a) / f64::from(args.agents.max(2) - 1))
        .collect();
    let mut team = ScriptedTeam::new(&tasks, skill, 0.6, args.seed);
    println!(
        "maporl demo: {} debates, {} agents x {} turns, scripted stand-in agents (not LLMs)",
        tasks.len(),
        args.agents,
        args.turns
    );
    println!(
        "plugins: {} ({}), {} ({}), {} ({})\n",
        plugins.protocol.identity().name,
        &plugins.protocol.identity().sha256[..12],
        plugins.verifier.identity().name,
        &plugins.verifier.identity().sha256[..12],
        plugins.shaper.identity().name,
        &plugins.shaper.identity().sha256[..12],
    );
    let rollout = debate::run(
        &mut plugins,
        &mut team,
        &tasks,
        args.agents,
        args.turns,
        OnPluginError::Stop,
    )
    .context("running the debates")?;
    let debates = rollout.debates;
    for d in &debates {
        println!(
            "== task {}: {} (reference {})",
            d.task.id, d.task.question, d.task.reference
        );
        for (t, decision) in d.decisions.iter().enumerate() {
            let turn = t as u32 + 1;
            for u in d.transcript.utterances.iter().filter(|u| u.turn == turn) {
                let reward = d
                    .rewards
                    .iter()
                    .find(|r| r.turn == turn && r.agent == u.agent)
                    .map(|r| format!("{:.3}", r.total))
                    .unwrap_or_else(|| "-".into());
                println!(
                    "  turn {turn} agent {}: answer {:<8} {} reward {reward}",
                    u.agent,
                    u.answer.as_deref().unwrap_or("invalid"),
                    if u.correct { "right" } else { "wrong" },
                );
            }
            println!("  turn {turn} team answer: {decision:?}");
        }
    }
    println!("\n{}", maporl::eval::evaluate(&debates).table());
    Ok(())
}
