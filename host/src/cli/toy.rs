//! `maporl toy`: the game-theoretic toy model of the paper's Section 2.

use std::path::PathBuf;

use clap::Args;

use maporl::toy;

#[derive(Args)]
pub struct ToyArgs {
    /// Rounds per game, comma-separated (one curve pair per value).
    #[arg(long, value_delimiter = ',', default_value = "10,20")]
    rounds: Vec<usize>,
    /// The synergy reward R_syn.
    #[arg(long, default_value_t = 3.0)]
    r_syn: f64,
    /// The cost c of collaborating.
    #[arg(long, default_value_t = 1.0)]
    cost: f64,
    /// How often the single learner's fixed partner collaborates.
    #[arg(long, default_value_t = 0.2)]
    partner_rate: f64,
    /// Training iterations.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Seeds the game's draws and the learners.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where toy.svg and toy.json go.
    #[arg(long, default_value = "runs/toy")]
    out: PathBuf,
}

pub fn run(args: ToyArgs) -> anyhow::Result<()> {
    let cfg = toy::ToyConfig {
        r_syn: args.r_syn,
        cost: args.cost,
        partner_rate: args.partner_rate,
        iterations: args.iterations,
        seed: args.seed,
        ..toy::ToyConfig::default()
    };
    cfg.validate()?;
    let curves = toy::run_grid(&cfg, &args.rounds)?;
    println!("{}\n\n{}", toy::ASSUMPTIONS, toy::table(&curves));
    let (svg, json) = toy::write_outputs(&args.out, &curves)?;
    println!("wrote {} and {}", svg.display(), json.display());
    Ok(())
}
