//! `maporl serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;

use maporl::config::{AgentConfig, Config};
use maporl::serve::{Limits, ServeOptions, Server};

#[derive(Args)]
pub struct ServeArgs {
    /// The run config (TOML); default with --run: the run's own config.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override any config key, e.g. --set generation.temperature=0.7 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// A training run: each agent speaks with its trained adapter,
    /// RUN/checkpoints/final/agent-N.
    #[arg(long)]
    run: Option<PathBuf>,
    /// The one address to listen on (port 0: any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Model worker threads: requests served at the same time.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Requests that may wait for a worker; more are refused with 429 and Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Most new tokens a request may ask for, and the default (default: the config's
    /// generation.max_new_tokens).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Most completions per chat request (`n`).
    #[arg(long, default_value_t = 4)]
    max_n: usize,
    /// Most messages in one chat request.
    #[arg(long, default_value_t = 256)]
    max_messages: usize,
    /// Most responses in one judge request.
    #[arg(long, default_value_t = 256)]
    max_responses: usize,
    /// Longest chat prompt, and longest debate or judge question, in tokens (prefill memory
    /// grows with its square).
    #[arg(long, default_value_t = 4096)]
    max_prompt_tokens: usize,
    /// Seconds the requests in flight may take to finish after SIGTERM or Ctrl-C.
    #[arg(long, default_value_t = 60)]
    shutdown_timeout: u64,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config_path = match (&args.config, &args.run) {
        (Some(c), _) => c.clone(),
        (None, Some(run)) => run.join("config.toml"),
        (None, None) => bail!("serve: give --config CONFIG, or --run RUN_DIR"),
    };
    let mut config = Config::load(&config_path, &args.overrides)?;
    if let Some(run) = &args.run {
        use_trained_adapters(&mut config, run)?;
    }
    let opts = ServeOptions {
        addr: args.addr,
        workers: args.workers,
        queue: args.queue,
        max_body_bytes: args.max_body_bytes,
        limits: Limits {
            max_tokens: args.max_tokens.unwrap_or(config.generation.max_new_tokens),
            max_n: args.max_n,
            max_messages: args.max_messages,
            max_responses: args.max_responses,
            max_prompt_tokens: args.max_prompt_tokens,
        },
        shutdown_timeout: std::time::Duration::from_secs(args.shutdown_timeout),
    };
    let server = Server::start(config, opts)?;
    // The one line a script waits for; the port is the real one when --addr asked for 0.
    println!("listening on http://{}", server.local_addr()?);
    server.run(maporl::serve::shutdown_signal())?;
    println!("stopped");
    Ok(())
}

/// Gives every agent its adapter from `run`'s final checkpoint.
fn use_trained_adapters(config: &mut Config, run: &Path) -> anyhow::Result<()> {
    let agents = config.debate.agents as usize;
    if config.agents.len() < agents {
        config.agents.resize_with(agents, AgentConfig::default);
    }
    let mut found = 0;
    for a in 0..agents {
        let dir = run.join(format!("checkpoints/final/agent-{a}"));
        if dir.join("adapter_config.json").is_file() {
            config.agents[a].adapter = dir.display().to_string();
            found += 1;
        } else if dir.join("model.safetensors").is_file() {
            bail!(
                "{}: agent {a} was fully fine-tuned (train.full_finetune); serving such an \
                 agent is not supported yet",
                dir.display()
            );
        }
    }
    if found == 0 {
        let final_dir = run.join("checkpoints/final");
        return Err(anyhow::anyhow!(
            "{} holds no agent adapters: has the run finished training? (a stopped run \
             can be finished with `maporl train --resume`)",
            final_dir.display()
        ))
        .context(format!("serve --run {}", run.display()));
    }
    Ok(())
}
