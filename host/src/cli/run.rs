//! `maporl eval` and `maporl debate`: debates between LLM agents, as a run config describes.
//! Also what the commands share: the config arguments and the progress bars.

use std::path::{Path, PathBuf};

use clap::Args;

use maporl::config::Config;
use maporl::debate::{self, OnPluginError};
use maporl::session::{Progress, Session, StepSummary};
use maporl::train::Evaluation;
use maporl::transcript::Task;

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

pub fn eval(args: ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config, &args.overrides)?;
    // Under mpirun every rank holds the whole evaluation; rank 0 wrote it and reports it.
    let leader = maporl::distributed::world().rank() == 0;
    let (mut bars, mut quiet) = (Bars::default(), maporl::session::Quiet);
    let progress: &mut dyn maporl::session::Progress = if leader { &mut bars } else { &mut quiet };
    let evaluation = maporl::train::evaluate(config, progress)?;
    if leader {
        print_evaluation(&evaluation);
    }
    Ok(())
}

/// The per-turn table of an evaluation, its throughput and the tasks it dropped.
pub(super) fn print_evaluation(e: &Evaluation) {
    println!("{}", e.report.table());
    let utterances: usize = e.debates.iter().map(|d| d.speeches.len()).sum();
    let tokens: usize = e
        .debates
        .iter()
        .flat_map(|d| &d.speeches)
        .map(|s| s.response_tokens)
        .sum();
    let elapsed = e.elapsed.as_secs_f64();
    println!(
        "{utterances} utterances, {tokens} generated tokens in {elapsed:.1} s ({:.2} utterances/s, \
         {:.1} tokens/s); plugins took {:.3}% of the time",
        utterances as f64 / elapsed,
        tokens as f64 / e.team_time.as_secs_f64().max(1e-9),
        100.0 * e.plugin_time.as_secs_f64() / elapsed
    );
    for d in e.debates.iter().filter(|d| d.error.is_some()) {
        tracing::warn!(
            "dropped task {}: {}",
            d.task.id,
            d.error.as_deref().unwrap_or_default()
        );
    }
    println!("wrote {}", e.run_dir.display());
}

pub fn debate(args: DebateArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    let kind = args.kind.clone().unwrap_or_else(|| config.task_kind());
    let task = Task {
        id: "question".into(),
        kind,
        question: args.question.clone(),
        reference: args.reference.clone(),
        fields: vec![],
    };
    let mut session = Session::open(config)?;
    let (agents, turns) = (session.config.debate.agents, session.config.debate.turns);
    let rollout = debate::run(
        &mut session.plugins,
        &mut session.team,
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
pub(super) fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {pos}/{len} {prefix}, {elapsed} elapsed, ETA {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // The training phase counts steps; the others count tasks.
    bar.set_prefix(if what == "training" { "steps" } else { "tasks" });
    bar.set_message(what.to_string());
    bar
}

/// Seconds as `1h02m`, `3m05s` or `42s`, for estimates.
pub(super) fn duration(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The library's progress as the command line shows it: a bar per phase, notes on stdout.
#[derive(Default)]
pub(super) struct Bars(Option<indicatif::ProgressBar>);

impl Progress for Bars {
    fn begin(&mut self, what: &str, len: u64, done: u64) {
        let bar = progress_bar(len, what);
        bar.set_position(done);
        if let Some(old) = self.0.replace(bar) {
            old.finish_and_clear();
        }
    }
    fn advance(&mut self, by: u64) {
        if let Some(bar) = &self.0 {
            bar.inc(by);
        }
    }
    fn end(&mut self) {
        if let Some(bar) = self.0.take() {
            bar.finish_and_clear();
        }
    }
    fn note(&mut self, line: &str) {
        match &self.0 {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }
    fn step(&mut self, step: &StepSummary) {
        let Some(bar) = &self.0 else {
            println!("{step}");
            return;
        };
        bar.inc(1);
        if bar.is_hidden() {
            // Off a terminal (a log file, Slurm, nohup) the bar is not drawn: a line a step,
            // with the estimate the bar would show.
            println!("{step}, ETA {}", duration(bar.eta().as_secs_f64()));
        } else {
            bar.set_message(step.to_string());
        }
    }
}

/// `maporl config show`: the resolved, validated config as TOML.
pub fn show_config(args: &ConfigArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config, &args.overrides)?;
    print!("{}", config.to_toml());
    Ok(())
}

/// `maporl data fetch`.
pub fn fetch(dataset: &str, dir: &Path) -> anyhow::Result<()> {
    let files = maporl::data::fetch(dataset, dir, None)?;
    for f in files {
        println!("{}", f.display());
    }
    Ok(())
}
