//! `maporl report`: one self-contained HTML page for a run directory. Plots of a training
//! run's metrics (per-turn accuracy over training, reward parts, KL and the other PPO
//! statistics; SFT loss), an evaluation's per-turn table, accuracy and transitions between
//! turns, and a browser for the run's debate transcripts (filter by task id, team answer and
//! turn; expand a debate turn by turn). What the run directory lacks, the page says it lacks.
//!
//! The page needs no network: plots are inline SVG drawn here, the style and script are
//! inline, and its Content-Security-Policy forbids loading anything. Text from the run
//! (model outputs, plugin names) is escaped, and the script renders it as text only.

mod load;
mod page;
mod plot;

use std::path::{Path, PathBuf};

/// Writes the report of the run in `run_dir` to `out` (atomically) and returns `out`.
/// Fails, naming what it looked for, when `run_dir` holds neither `metrics.jsonl` nor
/// `eval.json`, and, naming the file and line, when a file of the run does not parse.
pub fn write(run_dir: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let run = load::run(run_dir)?;
    let html = page::render(&run)?;
    crate::files::write_atomic(out, html.as_bytes())?;
    Ok(out.to_path_buf())
}
