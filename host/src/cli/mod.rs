//! The `maporl` command line.

mod demo;
mod plugin;

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
    /// Run debates between scripted stand-in agents (not LLMs) through real plugins: the
    /// reference protocol, verifier and reward shaper, on the synthetic arithmetic task.
    Demo(demo::DemoArgs),
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plugin(cmd) => plugin::run(cmd),
        Command::Demo(args) => demo::run(args),
    };
    match result {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("error: {err}");
            for cause in err.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            1
        }
    }
}

/// Where the reference plugins are built: `plugins/target/wasm32-wasip2/release` under the
/// repository, or `$MAPORL_PLUGINS`.
pub(crate) fn default_plugins_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MAPORL_PLUGINS") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("plugins/target/wasm32-wasip2/release")
}
