//! `maporl verifier generate` and `maporl verifier train`: the learned verifier's data and
//! training (arXiv 2502.18439). Serving is the run config's `[verifier]` section.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use super::run::{progress_bar, Bars, ConfigArgs};
use maporl::config::{AnswerTurns, Config};
use maporl::session::{held_out, tasks, Session};
use maporl::verifier::data::{answers_from_debates, balance, sample_answers, write_jsonl};
use maporl::verifier::train::{train, TrainOptions};

#[derive(Subcommand)]
pub enum VerifierCommand {
    /// Samples answers to the config's questions: every utterance of the run's debates
    /// (`verifier.generate.turns = "every"`, the default) or agent 0's answers to the
    /// protocol's turn-1 prompt ("first"), labelled right or wrong by the config's verifier
    /// plugin; keeps k right + k wrong per question (questions that cannot be balanced are
    /// dropped), and writes JSONL.
    Generate(GenerateArgs),
    /// Trains a verifier (LoRA + linear head + sigmoid, BCE) on labelled answers; reports
    /// validation AUC and ECE per epoch; checkpoints as `maporl train` does, the result in
    /// RUN/checkpoints/final (name it in a run config's [verifier] checkpoint).
    Train(TrainArgs),
}

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Where to write the labelled answers (JSONL).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
pub struct TrainArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Labelled answers (`maporl verifier generate`'s JSONL).
    #[arg(long)]
    data: PathBuf,
    /// The run directory (default: the config's run_dir).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Continue from the run's latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Checkpoint and stop after this many optimizer steps, as Ctrl-C does after the step in
    /// progress.
    #[arg(long)]
    stop_after: Option<usize>,
}

pub fn run(cmd: VerifierCommand) -> anyhow::Result<()> {
    match cmd {
        VerifierCommand::Generate(args) => generate(args),
        VerifierCommand::Train(args) => train_cmd(args),
    }
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    // Never the evaluation set: a verifier trained on it would inflate held-out scores.
    let (_, tasks) = held_out(tasks(&config)?, &config)?;
    let g = config.verifier.generate.clone();
    let mut session = Session::open(config)?;
    let (agents, turns) = (session.config.debate.agents, session.config.debate.turns);
    let all = match g.turns {
        AnswerTurns::Every => {
            // Whole debates until every task has its answers; the samplers move on, so
            // each round debates anew.
            let per_debate = (agents * turns) as usize;
            let rounds = g.samples_per_question.div_ceil(per_debate);
            let mut debated = Vec::with_capacity(rounds);
            for round in 1..=rounds {
                let label = format!("sampling debates, round {round} of {rounds}");
                debated.push(
                    session
                        .debate_all(&tasks, &label, &mut Bars::default())?
                        .debates,
                );
            }
            answers_from_debates(&debated, g.samples_per_question)
        }
        AnswerTurns::First => {
            let batch = session.config.debate.batch_size.max(1);
            let bar = progress_bar(tasks.len() as u64, "sampling answers");
            let mut all = Vec::new();
            for chunk in tasks.chunks(batch) {
                all.extend(sample_answers(
                    &mut session.plugins.protocol,
                    &mut session.plugins.verifier,
                    &mut session.team,
                    chunk,
                    g.samples_per_question,
                    agents,
                    turns,
                )?);
                bar.inc(chunk.len() as u64);
            }
            bar.finish_and_clear();
            all
        }
    };
    let right = all.iter().filter(|s| s.correct).count();
    let sampled = all.len();
    let (kept, stats) = balance(all, g.per_class, session.config.seed);
    write_jsonl(&args.out, &kept)?;
    println!(
        "{sampled} answers to {} questions ({right} right, {:.1}%); kept {} questions x ({} \
         right + {} wrong) = {} answers, dropped {} that could not be balanced; wrote {}",
        tasks.len(),
        100.0 * right as f64 / sampled.max(1) as f64,
        stats.kept_questions,
        g.per_class,
        g.per_class,
        kept.len(),
        stats.dropped_questions,
        args.out.display()
    );
    if kept.is_empty() {
        anyhow::bail!(
            "no question had {k} right and {k} wrong answers among {} samples: raise \
             verifier.generate.samples_per_question, lower verifier.generate.per_class, or \
             use a stronger model or easier questions",
            g.samples_per_question,
            k = g.per_class
        );
    }
    Ok(())
}

fn train_cmd(args: TrainArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    let v = &config.verifier;
    let model_name = if v.model.is_empty() {
        config.model.path.clone()
    } else {
        v.model.clone()
    };
    let run_dir = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(&config.run_dir));
    // Under mpirun (with [distributed]) one run over the ranks; rank 0 speaks for it and
    // alone writes the run directory.
    let world = maporl::distributed::world();
    maporl::train::check_distributed(world, &config)?;
    let leader = world.rank() == 0;
    let opts = TrainOptions {
        model: maporl::model::resolve_model(&model_name)?,
        model_name,
        data: args.data.clone(),
        run_dir: run_dir.clone(),
        train: v.train.clone(),
        max_response_tokens: v.max_response_tokens,
        seed: config.seed,
        dtype: config.model.candle_dtype(),
        device: config
            .verifier
            .device
            .unwrap_or(config.device)
            .open()
            .context("verifier.device")?,
        resume: args.resume,
        stop_after: args.stop_after,
        verbose: leader,
    };
    // A fresh run directory made here, removed again if the run is refused before it began.
    let mut fresh = false;
    if args.resume {
        // A resumed run must be the same run: only how long and how often to checkpoint
        // may change.
        maporl::train::check_config(&run_dir, &config)?;
    } else if maporl::checkpoint::Checkpoints::new(&run_dir)
        .latest()?
        .is_some()
    {
        anyhow::bail!(
            "{} already holds checkpoints of a verifier run: continue it with --resume, or \
             choose another --out",
            run_dir.display()
        );
    }
    // Every rank has looked at the run directory before rank 0 writes into it.
    maporl::train::check_same_config(world, &config, &[])
        .context("checking that every rank runs the same verifier training")?;
    if leader && !args.resume {
        fresh = !run_dir.exists();
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating run dir {}", run_dir.display()))?;
        maporl::files::write_atomic(&run_dir.join("config.toml"), config.to_toml().as_bytes())?;
    }
    let stop = super::interrupt::interrupt_flag();
    if world.size() > 1 {
        super::interrupt::stop_on_sigusr1(stop.clone());
    }
    let trained = train(&opts, &stop);
    if trained.is_err() && fresh {
        // Refused before it began (no model, bad data): leave nothing behind. A run that
        // wrote anything more is kept as it is.
        let only_config = std::fs::read_dir(&run_dir)
            .map(|d| d.flatten().all(|e| e.file_name() == "config.toml"))
            .unwrap_or(false);
        if only_config {
            let _ = std::fs::remove_dir_all(&run_dir);
        }
    }
    trained?;
    Ok(())
}
