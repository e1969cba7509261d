//! `maporl serve`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Args;

use maporl::config::{AgentConfig, Config};
use maporl::serve::{Limits, ReadLimits, ServeOptions, Server};

/// The connection cap when --max-connections is not given.
const DEFAULT_MAX_CONNECTIONS: usize = 256;

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
    /// Most bytes of request bodies held at once across all requests being read; a body
    /// that does not fit what is left is answered 503 with Retry-After (default 32 MiB).
    #[arg(long, default_value_t = 32 << 20)]
    max_buffered_body_bytes: usize,
    /// Most connections served at once [default: 256, lowered to fit `ulimit -n`]. Beyond
    /// them a reserve of 64 more answers only /health and /metrics (503 for anything else),
    /// each new one taking the place of the oldest.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a client has to send a whole request head, from connecting (or from the end
    /// of the previous answer on a kept-alive connection, which is closed after this long
    /// idle); then the connection is closed. Decimals allowed.
    #[arg(long, default_value = "10", value_parser = seconds)]
    header_timeout: std::time::Duration,
    /// Seconds a request body may pause before the request is answered 408 and its
    /// connection closed. Decimals allowed.
    #[arg(long, default_value = "10", value_parser = seconds)]
    body_timeout: std::time::Duration,
    /// Seconds a client has to send a whole request, head and body, counted as for
    /// --header-timeout; a body not whole by then is answered 408. At least
    /// --header-timeout. Decimals allowed.
    #[arg(long, default_value = "30", value_parser = seconds)]
    request_timeout: std::time::Duration,
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
    /// Seconds the requests in flight may take to finish after SIGTERM or Ctrl-C; then they
    /// are cancelled and the server exits (within about 3 s more). Requests still queued at
    /// the signal are answered 503 at once.
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
    let max_connections = maporl::serve::fit_open_files(
        args.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        args.max_connections.is_some(),
    )?;
    let opts = ServeOptions {
        addr: args.addr,
        workers: args.workers,
        queue: args.queue,
        read: ReadLimits {
            max_connections,
            header_timeout: args.header_timeout,
            body_timeout: args.body_timeout,
            request_timeout: args.request_timeout,
            max_body_bytes: args.max_body_bytes,
            max_buffered_body_bytes: args.max_buffered_body_bytes,
        },
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

/// A positive number of seconds (decimals allowed), at most a day.
fn seconds(s: &str) -> Result<std::time::Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s} seconds: give more than 0 and at most 86400"));
    }
    Ok(std::time::Duration::from_secs_f64(v))
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
