//! Reading a run directory: what `maporl train` and `maporl eval` leave there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::debate::Debate;
use crate::eval::Report;

/// One PPO step of `metrics.jsonl` (`maporl train`). Every field but `step` may be absent,
/// and a number may be `null` (a NaN when it was written).
#[derive(Debug, Deserialize)]
pub struct Step {
    pub step: usize,
    pub learning_rate: Option<f64>,
    pub tasks: Option<usize>,
    #[serde(default)]
    pub accuracy: Vec<Option<f64>>,
    #[serde(default)]
    pub reward_parts: BTreeMap<String, Option<f64>>,
    #[serde(default)]
    pub trained_turns: Vec<u32>,
    #[serde(default)]
    pub agents: BTreeMap<u32, AgentStep>,
    pub rollout_seconds: Option<f64>,
    pub update_seconds: Option<f64>,
    pub generated_tokens_per_second: Option<f64>,
    pub update_tokens_per_second: Option<f64>,
}

/// One learning agent's PPO statistics at one step.
#[derive(Debug, Default, Deserialize)]
pub struct AgentStep {
    pub reward_mean: Option<f64>,
    pub kl: Option<f64>,
    pub kl_coef: Option<f64>,
    pub policy_loss: Option<f64>,
    pub value_loss: Option<f64>,
    pub approx_kl: Option<f64>,
    pub clip_fraction: Option<f64>,
    pub entropy: Option<f64>,
    pub grad_norm: Option<f64>,
}

/// One SFT epoch of one agent (`train.mode = "sft"`).
#[derive(Debug, Deserialize)]
pub struct SftEpoch {
    pub agent: u32,
    pub epoch: usize,
    pub loss: Option<f64>,
    pub grad_norm: Option<f64>,
}

/// One evaluation in the run directory: `maporl eval`'s, or one of a training run's
/// held-out evaluations (before and after training).
pub struct Evaluation {
    /// "" for `maporl eval`'s; "before" or "after" for a training run's.
    pub name: &'static str,
    pub report: Report,
    /// Its transcripts, when the file is there.
    pub debates: Option<Vec<Debate>>,
}

/// Everything the report shows, as found in the run directory.
pub struct Run {
    pub dir: PathBuf,
    pub steps: Vec<Step>,
    pub sft: Vec<SftEpoch>,
    pub has_metrics: bool,
    /// `maporl eval`'s evaluation, or a training run's before and after training.
    pub evaluations: Vec<Evaluation>,
    /// Transcripts with no evaluation report beside them (an SFT run's debates).
    pub debates: Option<Vec<Debate>>,
    /// The held-out evaluations after against before training, paired task by task.
    pub paired: Option<crate::eval::Paired>,
    pub config: Option<String>,
    pub lock: Option<String>,
    pub checkpoints: Vec<String>,
}

pub const METRICS: &str = "metrics.jsonl";
pub const EVAL: &str = "eval.json";
pub const TRANSCRIPTS: &str = "transcripts.jsonl";
/// A training run's held-out evaluations: (name, report, transcripts).
pub const HELD_OUT: [(&str, &str, &str); 2] = [
    ("before", "eval-before.json", "transcripts-before.jsonl"),
    ("after", "eval-after.json", "transcripts-after.jsonl"),
];

/// Reads the run in `dir`: its metrics, its evaluation (`maporl eval`'s `eval.json`, or a
/// training run's held-out `eval-before.json` and `eval-after.json`, each with its
/// transcripts, and the two paired), its config, lock and checkpoints. Fails when it holds
/// neither metrics nor an evaluation, or when a file it holds does not parse (naming the
/// file, and the line of a JSONL file).
pub fn run(dir: &Path) -> anyhow::Result<Run> {
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    let (metrics, eval) = (dir.join(METRICS), dir.join(EVAL));
    if !metrics.is_file() && !eval.is_file() {
        bail!(
            "{} is not a run directory: it has neither {METRICS} (written by `maporl train`) \
             nor {EVAL} (written by `maporl eval`)",
            dir.display()
        );
    }
    let (mut steps, mut sft) = (Vec::new(), Vec::new());
    if metrics.is_file() {
        for (n, line) in jsonl(&metrics)? {
            let value: serde_json::Value = parse(&metrics, n, &line)?;
            if value.get("step").is_some() {
                steps.push(parse(&metrics, n, &line)?);
            } else if value.get("epoch").is_some() {
                sft.push(parse(&metrics, n, &line)?);
            } else {
                bail!(
                    "{} line {n}: neither a training step (no \"step\") nor an SFT epoch \
                     (no \"epoch\")",
                    metrics.display()
                );
            }
        }
    }
    let mut evaluations = Vec::new();
    let mut loose = None;
    if eval.is_file() {
        evaluations.push(evaluation(dir, "", EVAL, TRANSCRIPTS)?);
    } else {
        for (name, report, transcripts) in HELD_OUT {
            if dir.join(report).is_file() {
                evaluations.push(evaluation(dir, name, report, transcripts)?);
            }
        }
        if dir.join(TRANSCRIPTS).is_file() {
            loose = Some(debates(&dir.join(TRANSCRIPTS))?);
        }
    }
    let paired = match evaluations.as_slice() {
        [Evaluation {
            debates: Some(before),
            ..
        }, Evaluation {
            debates: Some(after),
            ..
        }] => Some(
            crate::eval::paired(before, after, 10_000, 0).with_context(|| {
                format!(
                    "pairing the held-out evaluations of {} before and after training",
                    dir.display()
                )
            })?,
        ),
        _ => None,
    };
    let optional = |name: &str| -> anyhow::Result<Option<String>> {
        let p = dir.join(name);
        p.is_file().then(|| read(&p)).transpose()
    };
    let mut checkpoints = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join("checkpoints")) {
        for e in entries.flatten() {
            checkpoints.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    checkpoints.sort();
    Ok(Run {
        dir: dir.to_path_buf(),
        steps,
        sft,
        has_metrics: metrics.is_file(),
        evaluations,
        debates: loose,
        paired,
        config: optional("config.toml")?,
        lock: optional("plugins.lock")?,
        checkpoints,
    })
}

/// An evaluation report and its transcripts, if there.
fn evaluation(
    dir: &Path,
    name: &'static str,
    report: &str,
    transcripts: &str,
) -> anyhow::Result<Evaluation> {
    let path = dir.join(report);
    let text = read(&path)?;
    let report = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an evaluation report", path.display()))?;
    let transcripts = dir.join(transcripts);
    Ok(Evaluation {
        name,
        report,
        debates: transcripts
            .is_file()
            .then(|| debates(&transcripts))
            .transpose()?,
    })
}

fn debates(path: &Path) -> anyhow::Result<Vec<Debate>> {
    jsonl(path)?
        .into_iter()
        .map(|(n, line)| parse(path, n, &line))
        .collect()
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The non-blank lines of a JSONL file with their 1-based line numbers.
fn jsonl(path: &Path) -> anyhow::Result<Vec<(usize, String)>> {
    Ok(read(path)?
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect())
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, n: usize, line: &str) -> anyhow::Result<T> {
    serde_json::from_str(line).with_context(|| format!("{} line {n} is malformed", path.display()))
}
