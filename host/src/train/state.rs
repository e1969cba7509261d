//! What a training checkpoint holds besides tensors (`state.json`), and the checks a resume
//! makes before trusting it.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::ppo::KlController;
use crate::checkpoint::STATE_FILE;
use crate::config::Config;
use crate::debate::PluginHashes;
use crate::files::write_atomic;
use crate::model::RngState;

/// Bumped when the checkpoint layout changes.
pub const FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainState {
    pub format: u32,
    /// Steps done.
    pub step: usize,
    /// Tasks handed out so far.
    pub data_cursor: usize,
    /// Lines of `metrics.jsonl` that belong to the steps done.
    pub metrics_lines: usize,
    /// Each agent's sampler.
    pub samplers: Vec<RngState>,
    /// The components the run was trained with.
    pub plugins: PluginHashes,
    pub learners: Vec<LearnerState>,
    /// The processes the run was trained on (`mpirun -np N`); a resume must use as many.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ranks: usize,
}

fn one() -> usize {
    1
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LearnerState {
    pub agent: u32,
    pub kl: KlController,
    pub optimizer_steps: u64,
}

impl TrainState {
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        write_atomic(
            &dir.join(STATE_FILE),
            serde_json::to_string_pretty(self)?.as_bytes(),
        )
    }

    pub fn read(dir: &Path) -> anyhow::Result<TrainState> {
        let path = dir.join(STATE_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let st: TrainState = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a maporl training state", path.display()))?;
        if st.format != FORMAT {
            bail!(
                "{}: checkpoint format {} (this maporl reads format {FORMAT})",
                path.display(),
                st.format
            );
        }
        Ok(st)
    }
}

/// The error for a resume whose plugins differ from the checkpoint's.
pub fn plugin_change(saved: &PluginHashes, now: &PluginHashes, dir: &Path) -> String {
    let short = |s: &str| s.chars().take(12).collect::<String>();
    let changed = saved.changed_roles(now);
    let mut diffs = Vec::new();
    for ((role, a), (_, b)) in saved.roles().into_iter().zip(now.roles()) {
        if changed.contains(&role) {
            diffs.push(format!(
                "the {role} was sha256 {}, it is now {}",
                short(a),
                short(b)
            ));
        }
    }
    if saved.verifier_checkpoint != now.verifier_checkpoint {
        let show = |c: &Option<String>| c.as_deref().map_or("none".into(), short);
        diffs.push(format!(
            "the learned verifier's checkpoint was sha256 {}, it is now {}",
            show(&saved.verifier_checkpoint),
            show(&now.verifier_checkpoint)
        ));
    }
    format!(
        "cannot resume from {}: {}; resuming would not continue the same run (pass \
         --allow-plugin-change to resume anyway)",
        dir.display(),
        diffs.join("; ")
    )
}

/// Keys a resume may change: how long to train (the PPO trainer's steps) and how often to
/// checkpoint.
const RESUMABLE_CHANGES: &[&str] = &[
    "train.steps",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "verifier.train.checkpoint_every",
    "verifier.train.keep_checkpoints",
];

/// Refuses a resume whose config differs from the run's `config.toml` in anything but
/// [`RESUMABLE_CHANGES`], naming the keys that differ.
pub fn check_config(run_dir: &Path, config: &Config) -> anyhow::Result<()> {
    let path = run_dir.join("config.toml");
    let saved = std::fs::read_to_string(&path)
        .with_context(|| format!("--resume: reading the run's config {}", path.display()))?;
    let saved: toml::Table = toml::from_str(&saved)
        .with_context(|| format!("--resume: {} is not valid TOML", path.display()))?;
    let now: toml::Table = toml::from_str(&config.to_toml()).expect("a config round-trips");
    let mut diffs = Vec::new();
    diff(&saved, &now, "", &mut diffs);
    diffs.retain(|k| !RESUMABLE_CHANGES.contains(&k.as_str()));
    if !diffs.is_empty() {
        bail!(
            "--resume: the config differs from the run's {} in {}; a resumed run must be the \
             same run (only {} may change)",
            path.display(),
            diffs.join(", "),
            RESUMABLE_CHANGES.join(", ")
        );
    }
    Ok(())
}

fn diff(a: &toml::Table, b: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        let key = format!("{prefix}{k}");
        match (a.get(k), b.get(k)) {
            (Some(toml::Value::Table(x)), Some(toml::Value::Table(y))) => {
                diff(x, y, &format!("{key}."), out)
            }
            (x, y) if x != y => out.push(key),
            _ => {}
        }
    }
}

/// A test hook (feature `test-hooks`): with `MAPORL_TEST_STALL_CHECKPOINT=<step>`, the
/// checkpoint of that step stops halfway through being written (tensors staged, state not
/// yet), drops a `checkpoint-stalled` marker in the run dir and waits to be killed. The tests
/// use it to SIGKILL a run mid-write.
#[cfg(feature = "test-hooks")]
pub fn stall_for_tests(run_dir: &Path, step: usize) {
    let Ok(at) = std::env::var("MAPORL_TEST_STALL_CHECKPOINT") else {
        return;
    };
    if at.parse::<usize>().ok() == Some(step) {
        let _ = std::fs::write(run_dir.join("checkpoint-stalled"), step.to_string());
        std::thread::sleep(std::time::Duration::from_secs(600));
    }
}

/// Without the `test-hooks` feature: nothing.
#[cfg(not(feature = "test-hooks"))]
pub fn stall_for_tests(_run_dir: &Path, _step: usize) {}
