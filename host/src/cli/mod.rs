//! The `maporl` command line.

mod bundle;
mod compare;
mod interrupt;
mod logging;
mod plugin;
mod reference;
mod report;
mod run;
mod scripted;
mod serve;
mod toy;
mod train;
mod verifier;
mod warm_start;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "maporl",
    version,
    about = "Multi-agent post-co-training of LLMs with RL (MAPoRL), with sandboxed WebAssembly plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Work with plugin components: inspect, check, scaffold, call.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Plugin bundles: pack, sign, verify, install, list, remove; push and pull them to and
    /// from OCI registries.
    #[command(subcommand)]
    Bundle(bundle::BundleCommand),
    /// Evaluate a team of LLM agents: debates over the config's tasks, per-turn accuracy,
    /// transitions; writes transcripts and metrics into the run directory.
    Eval(run::ConfigArgs),
    /// Train the agents with MAPoRL, or run a baseline (single-agent RL, SFT, off the
    /// shelf): debates, shaped rewards, PPO on every learning agent; metrics per step,
    /// checkpoints every N steps and on Ctrl-C, `--resume` to continue.
    Train(train::TrainArgs),
    /// One debate on a question of yours, shown turn by turn.
    Debate(run::DebateArgs),
    /// The learned verifier: sample and label answers (`generate`), train one (`train`).
    #[command(subcommand)]
    Verifier(verifier::VerifierCommand),
    /// Datasets.
    #[command(subcommand)]
    Data(DataCommand),
    /// Run debates between scripted stand-in agents (not LLMs) through real plugins: the
    /// reference protocol, verifier and reward shaper, on the synthetic arithmetic task.
    Scripted(scripted::ScriptedArgs),
    /// The old name of `maporl scripted`; the main job is `cargo xtask demo`.
    #[command(hide = true, disable_help_flag = true)]
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// The resolved config (the file with every default and `--set` applied), as TOML.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// The reference, generated from this binary: every config key, every command and
    /// flag, the built-in plugins and their settings, the plugin contract and its limits
    /// (Markdown; docs/reference/ is this output).
    Reference(reference::ReferenceArgs),
    /// The paper's game-theoretic toy model: the collaboration rate of a single learner
    /// against a fixed partner and of two joint learners, over training; table + SVG plot.
    Toy(toy::ToyArgs),
    /// Two evaluations of the same tasks, paired task by task: per turn, the difference in
    /// accuracy with a bootstrap 95% confidence interval (a run directory: its held-out
    /// evaluations before and after training).
    Compare(compare::CompareArgs),
    /// An HTML page for a run directory: plots of accuracy per turn, transitions, reward
    /// parts and KL, and a browser for its debate transcripts.
    Report(report::ReportArgs),
    /// Serve a team over HTTP: OpenAI-compatible chat completions (one model per agent),
    /// whole debates through the run's plugins, the learned verifier as a reward model,
    /// health, models and Prometheus metrics.
    Serve(serve::ServeArgs),
    /// Make the tiny model a config's `[warm_start]` section describes (the quickstart's
    /// agents): a small decoder trained from scratch on scripted debates of the task.
    WarmStart(warm_start::WarmStartArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the config as a run would use it: the file, every default, every `--set`,
    /// validated.
    Show(run::ConfigArgs),
}

#[derive(Subcommand)]
enum DataCommand {
    /// Download a dataset from its public source, verify its sha256, and check it parses.
    Fetch {
        /// gsm8k or anli.
        dataset: String,
        /// Where to put it (DIR/gsm8k/..., DIR/anli/...).
        dir: PathBuf,
    },
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    logging::init();
    let cli = Cli::parse();
    // A command whose output is piped into `head` ends quietly when the pipe closes, as Unix
    // tools do, instead of panicking on a write to it. Not for the server, which writes to
    // sockets and must outlive a client that goes away.
    if !matches!(cli.command, Command::Serve(_)) {
        // SAFETY: restores the default disposition of one signal before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // Before any thread starts (MPI's included): candle's large elementwise ops on the
    // calling thread, except for a command that trains one model alone, which gains from
    // candle's pool for them (the warm start 1.1x on 2 cores; BENCHMARKS.md).
    let alone = matches!(
        cli.command,
        Command::WarmStart(_) | Command::Verifier(verifier::VerifierCommand::Train(_))
    );
    if !alone {
        maporl::model::elementwise_ops_inline();
    }
    // Under mpirun/srun: `train`, `eval` and `verifier train` join the launcher's world (one
    // run over N processes); other commands run in one process only.
    let world = match maporl::distributed::launched_size() {
        Some(n) if n > 1 => {
            let joined = match &cli.command {
                Command::Train(_)
                | Command::Eval(_)
                | Command::Verifier(verifier::VerifierCommand::Train(_)) => {
                    maporl::distributed::timeout_from_env().and_then(maporl::distributed::init)
                }
                _ => Err(anyhow::anyhow!(
                    "started as one of {n} processes (under mpirun or srun), but only \
                     `maporl train`, `maporl eval` and `maporl verifier train` run over several \
                     processes; run this command without mpirun"
                )),
            };
            match joined {
                Ok(w) => Some(w),
                Err(err) => {
                    eprintln!("error: {err}");
                    return 1;
                }
            }
        }
        _ => None,
    };
    let result = match cli.command {
        Command::Plugin(cmd) => plugin::run(cmd),
        Command::Bundle(cmd) => bundle::run(cmd),
        Command::Eval(args) => run::eval(args),
        Command::Debate(args) => run::debate(args),
        Command::Train(args) => train::train(args),
        Command::Verifier(cmd) => verifier::run(cmd),
        Command::Data(DataCommand::Fetch { dataset, dir }) => run::fetch(&dataset, &dir),
        Command::Scripted(args) => scripted::run(args),
        Command::Demo { .. } => Err(anyhow::anyhow!(
            "`maporl demo` is now `maporl scripted` (debates between scripted stand-in \
             agents); the main job, MAPoRL training on the embedded default, is `cargo xtask demo`"
        )),
        Command::Config(ConfigCommand::Show(args)) => run::show_config(&args),
        Command::Reference(args) => reference::run(args),
        Command::Toy(args) => toy::run(args),
        Command::Report(args) => report::run(args),
        Command::Compare(args) => compare::run(args),
        Command::WarmStart(args) => warm_start::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match (result, world) {
        (Ok(()), None) => 0,
        (Ok(()), Some(w)) => {
            w.finalize();
            0
        }
        (Err(err), w) => {
            let who = w.map_or(String::new(), |w| format!(" (rank {})", w.rank()));
            // Messages escape what servers and plugins said where they quote it; this is
            // the last net: no escape sequence or other control character (but the line
            // breaks of a multi-line message) reaches the terminal from an error.
            eprintln!("error{who}: {}", terminal_safe(&err.to_string()));
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {}", terminal_safe(&cause.to_string()));
            }
            // The other ranks may be waiting for this one in a collective: end them all.
            if let Some(w) = w {
                w.abort(1);
            }
            1
        }
    }
}

/// `text` with every line escaped for a terminal ([`maporl::plugin::printable`]), its line
/// breaks kept.
fn terminal_safe(text: &str) -> String {
    text.split('\n')
        .map(maporl::plugin::printable)
        .collect::<Vec<_>>()
        .join("\n")
}
