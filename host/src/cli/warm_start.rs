//! `maporl warm-start`: makes the tiny model a config's `[warm_start]` section describes and
//! writes it to the config's `model.path`.

use clap::Args;

use super::run::ConfigArgs;
use maporl::config::Config;
use maporl::files::expand_home;
use maporl::session::load_plugins;
use maporl::warm_start::{excluded, warm_start, Summary};

#[derive(Args)]
pub struct WarmStartArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Make the model again even if `model.path` already holds one made with these settings.
    #[arg(long)]
    force: bool,
}

pub fn run(args: WarmStartArgs) -> anyhow::Result<()> {
    let config = Config::load(&args.config.config, &args.config.overrides)?;
    if maporl::model::hub::is_hub_path(&config.model.path) {
        anyhow::bail!(
            "model.path = {:?} names a hub model; warm-start writes the model it makes to \
             model.path, so it must be a local folder",
            config.model.path
        );
    }
    let out = expand_home(&config.model.path);
    if config.warm_start.is_none() {
        anyhow::bail!(
            "{}: no [warm_start] section, so there is no model to make (model.path = {})",
            args.config.config.display(),
            out.display()
        );
    }
    let exclude = excluded(&config)?;
    if !args.force {
        if let Some(done) = Summary::read(&out).filter(|s| s.matches(&config, &exclude)) {
            println!(
                "{} already holds this warm start ({} parameters, loss {:.3} -> {:.3}); \
                 --force makes it again",
                out.display(),
                done.parameters,
                done.first_loss,
                done.last_loss
            );
            return Ok(());
        }
    }
    let (mut plugins, _) = load_plugins(&config)?;
    let ws = config.warm_start.as_ref().expect("checked above");
    println!(
        "warm start: a {}-layer, {}-wide decoder on {} scripted debates ({} agents x {} turns), \
         {} steps of about {} tokens",
        ws.layers,
        ws.hidden_size,
        ws.tasks,
        config.debate.agents,
        config.debate.turns,
        ws.steps,
        ws.batch_tokens
    );
    let every = (ws.steps / 10).max(1);
    let total = ws.steps;
    let mut window = Vec::new();
    // The clock starts at the first step: the scripted debates and the tokenizer before it
    // are not steps, and would make the first estimate too long.
    let mut first_step: Option<std::time::Instant> = None;
    let summary = warm_start(&config, &mut plugins, &exclude, &out, |step, loss| {
        let started = *first_step.get_or_insert_with(std::time::Instant::now);
        window.push(loss);
        if (step + 1) % every == 0 || step + 1 == total {
            let memory = maporl::model::resident_mib()
                .map(|m| format!(", resident {} MiB (peak {})", m.now, m.peak))
                .unwrap_or_default();
            let elapsed = started.elapsed().as_secs_f64();
            let eta = elapsed / (step + 1) as f64 * total.saturating_sub(step + 1) as f64;
            println!(
                "  step {:>5}/{total}: loss {:.4}{memory}, {:.0} s elapsed, ETA {}",
                step + 1,
                window.iter().sum::<f64>() / window.len() as f64,
                elapsed,
                super::run::duration(eta)
            );
            window.clear();
        }
    })?;
    println!(
        "wrote {} ({} parameters, {} utterances, loss {:.3} -> {:.3}, {:.0} s)",
        out.display(),
        summary.parameters,
        summary.utterances,
        summary.first_loss,
        summary.last_loss,
        summary.seconds
    );
    Ok(())
}
