//! `maporl train`: parses the arguments, runs [`maporl::train::run`], prints the outcome.

use clap::Args;

use super::run::{print_evaluation, Bars, ConfigArgs};
use maporl::config::Config;
use maporl::train::{Options, Outcome};

#[derive(Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Continue the run in the config's run_dir from its latest checkpoint, exactly as if it
    /// had not stopped.
    #[arg(long)]
    pub resume: bool,
    /// Stop with a checkpoint once this many steps are done, as Ctrl-C would.
    #[arg(long, value_name = "STEPS")]
    pub stop_after: Option<usize>,
    /// Resume even though a plugin component differs from the one the checkpoint used.
    #[arg(long)]
    pub allow_plugin_change: bool,
}

pub fn train(args: TrainArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    let sft = config.train.mode == maporl::config::TrainMode::Sft;
    let opts = Options {
        resume: args.resume,
        stop_after: args.stop_after,
        allow_plugin_change: args.allow_plugin_change,
    };
    let stop = super::interrupt::interrupt_flag();
    if maporl::distributed::world().size() > 1 {
        super::interrupt::stop_on_sigusr1(stop.clone());
    }
    // Under mpirun, rank 0 speaks for the run; the other ranks work quietly.
    let leader = maporl::distributed::world().rank() == 0;
    let (mut bars, mut quiet) = (Bars::default(), maporl::session::Quiet);
    let progress: &mut dyn maporl::session::Progress = if leader { &mut bars } else { &mut quiet };
    let outcome = maporl::train::run(config, &opts, progress, &stop)?;
    if !leader {
        return Ok(());
    }
    match outcome {
        Outcome::Evaluated(evaluation) => print_evaluation(&evaluation),
        Outcome::Stopped {
            step,
            steps,
            checkpoint,
        } => println!(
            "stopped after step {step} of {steps}; checkpoint {}; continue with --resume",
            checkpoint.display()
        ),
        Outcome::Trained {
            steps,
            metrics,
            adapters,
            held_out,
        } => {
            if let Some(reports) = held_out {
                for (name, report) in ["before", "after"].iter().zip(reports) {
                    println!("held-out tasks, {name} training:\n{}", report.table());
                }
                if let Some(table) = metrics.parent().and_then(super::compare::held_out_table) {
                    println!("held-out tasks, after against before training, {table}");
                }
            }
            let done = if sft {
                "SFT done".to_string()
            } else {
                format!("trained {steps} steps")
            };
            println!(
                "{done}; metrics in {}, adapters in {}",
                metrics.display(),
                adapters.display()
            );
        }
    }
    Ok(())
}
