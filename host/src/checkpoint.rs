//! A run's checkpoints: `checkpoints/step-NNNNNN/` directories, each written whole into a
//! staging directory and renamed into place, then named in `checkpoints/latest` (itself
//! replaced atomically). A crash at any point, SIGKILL included, leaves the previous
//! checkpoint intact and findable; half-written staging directories are swept away later.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::files::write_atomic;

/// The file every complete checkpoint holds; written last into the staging directory.
pub const STATE_FILE: &str = "state.json";

/// The checkpoints directory of one run.
pub struct Checkpoints {
    dir: PathBuf,
}

impl Checkpoints {
    pub fn new(run_dir: &Path) -> Checkpoints {
        Checkpoints {
            dir: run_dir.join("checkpoints"),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn name(step: usize) -> String {
        format!("step-{step:06}")
    }

    /// Writes the checkpoint after `step` steps: `fill` writes its files into a staging
    /// directory (ending with [`STATE_FILE`]), which then replaces any checkpoint of that step
    /// and becomes `latest`. Older checkpoints beyond the newest `keep` are removed.
    pub fn save(
        &self,
        step: usize,
        keep: usize,
        fill: impl FnOnce(&Path) -> anyhow::Result<()>,
    ) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)
            .with_context(|| format!("creating {}", self.dir.display()))?;
        let staging = tempfile::Builder::new()
            .prefix(".staging-")
            .tempdir_in(&self.dir)
            .with_context(|| format!("creating a staging directory in {}", self.dir.display()))?;
        fill(staging.path())?;
        if !staging.path().join(STATE_FILE).is_file() {
            bail!("internal: a checkpoint was staged without its {STATE_FILE}");
        }
        sync_tree(staging.path());
        let target = self.dir.join(Self::name(step));
        let staged = staging.keep();
        if target.exists() {
            // Re-saving the same step (e.g. Ctrl-C right after a periodic checkpoint).
            let old = self.dir.join(format!(".old-{}", Self::name(step)));
            let _ = std::fs::remove_dir_all(&old);
            std::fs::rename(&target, &old)
                .with_context(|| format!("moving {} aside", target.display()))?;
            std::fs::rename(&staged, &target)
                .with_context(|| format!("moving the checkpoint into {}", target.display()))?;
            let _ = std::fs::remove_dir_all(&old);
        } else {
            std::fs::rename(&staged, &target)
                .with_context(|| format!("moving the checkpoint into {}", target.display()))?;
        }
        sync_dir(&self.dir);
        write_atomic(&self.dir.join("latest"), Self::name(step).as_bytes())?;
        self.prune(keep)?;
        Ok(target)
    }

    /// Complete checkpoints (those holding their state file), oldest first.
    pub fn list(&self) -> anyhow::Result<Vec<(usize, PathBuf)>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e).with_context(|| format!("reading {}", self.dir.display())),
        };
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            let Some(step) = name
                .strip_prefix("step-")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            if entry.path().join(STATE_FILE).is_file() {
                out.push((step, entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The checkpoint to resume from: the one `latest` names when it is complete, else the
    /// newest complete one.
    pub fn latest(&self) -> anyhow::Result<Option<(usize, PathBuf)>> {
        self.recover();
        let all = self.list()?;
        if let Ok(name) = std::fs::read_to_string(self.dir.join("latest")) {
            if let Some(found) = all.iter().find(|(_, p)| p.ends_with(name.trim())) {
                return Ok(Some(found.clone()));
            }
        }
        Ok(all.last().cloned())
    }

    /// Puts back a checkpoint whose re-save was killed between its two renames: its
    /// set-aside copy (`.old-step-N`) is then the only complete one.
    fn recover(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(step) = name.strip_prefix(".old-") {
                let target = self.dir.join(step);
                if !target.exists() && entry.path().join(STATE_FILE).is_file() {
                    let _ = std::fs::rename(entry.path(), &target);
                }
            }
        }
    }

    /// Removes staging leftovers of interrupted saves, and all but the newest `keep`
    /// complete checkpoints (`keep = 0` keeps all).
    pub fn prune(&self, keep: usize) -> anyhow::Result<()> {
        self.recover();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().to_string();
                if name.starts_with(".staging-") || name.starts_with(".old-") {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        if keep == 0 {
            return Ok(());
        }
        let all = self.list()?;
        let latest = self.latest()?.map(|(s, _)| s);
        for (step, path) in all.iter().rev().skip(keep) {
            if Some(*step) != latest {
                std::fs::remove_dir_all(path)
                    .with_context(|| format!("removing old checkpoint {}", path.display()))?;
            }
        }
        Ok(())
    }
}

/// Fills a staging directory beside `dir` and renames it into place, so that a failure
/// leaves the old `dir` (or none) rather than half of a new one (e.g. `checkpoints/final`).
pub fn replace_dir(
    dir: &Path,
    fill: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let parent = dir
        .parent()
        .context("a directory to replace needs a parent")?;
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let staging = tempfile::Builder::new()
        .prefix(".staging-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a staging directory in {}", parent.display()))?;
    fill(staging.path())?;
    sync_tree(staging.path());
    let staged = staging.keep();
    if dir.exists() {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let old = parent.join(format!(".old-{name}"));
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(dir, &old).with_context(|| format!("moving {} aside", dir.display()))?;
        std::fs::rename(&staged, dir)
            .with_context(|| format!("moving the new {} into place", dir.display()))?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        std::fs::rename(&staged, dir).with_context(|| format!("moving into {}", dir.display()))?;
    }
    Ok(())
}

/// Keeps the first `n` lines of `path` (rewritten atomically): on a resume, the metrics of
/// steps after the checkpoint are redone.
pub fn truncate_lines(path: &Path, n: usize) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() < n {
        bail!(
            "{} has {} lines but the checkpoint counts {n} lines of metrics",
            path.display(),
            lines.len()
        );
    }
    let mut kept = lines[..n].join("\n");
    if n > 0 {
        kept.push('\n');
    }
    write_atomic(path, kept.as_bytes())
}

/// Flushes every file under `dir`, then the directories (best effort): a checkpoint renamed
/// into place after this survives a power loss, not only a killed process.
fn sync_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                sync_tree(&path);
            } else if let Ok(f) = std::fs::File::open(&path) {
                let _ = f.sync_all();
            }
        }
    }
    sync_dir(dir);
}

/// Flushes a directory's entries to disk (best effort; a no-op where unsupported).
fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(text: &'static str) -> impl FnOnce(&Path) -> anyhow::Result<()> {
        move |d: &Path| {
            std::fs::write(d.join("weights"), text)?;
            std::fs::write(d.join(STATE_FILE), "{}")?;
            Ok(())
        }
    }

    #[test]
    fn latest_is_the_last_complete_save_and_old_ones_are_pruned() {
        let run = tempfile::tempdir().unwrap();
        let c = Checkpoints::new(run.path());
        assert!(c.latest().unwrap().is_none());
        for step in 1..=4 {
            c.save(step, 2, fill("w")).unwrap();
        }
        let steps: Vec<usize> = c.list().unwrap().into_iter().map(|(s, _)| s).collect();
        assert_eq!(steps, vec![3, 4]);
        assert_eq!(c.latest().unwrap().unwrap().0, 4);
    }

    #[test]
    fn a_save_that_fails_midway_leaves_the_previous_checkpoint() {
        let run = tempfile::tempdir().unwrap();
        let c = Checkpoints::new(run.path());
        c.save(1, 0, fill("good")).unwrap();
        let err = c
            .save(2, 0, |d| {
                std::fs::write(d.join("weights"), "half")?;
                bail!("disk full")
            })
            .unwrap_err();
        assert!(err.to_string().contains("disk full"));
        let (step, path) = c.latest().unwrap().unwrap();
        assert_eq!(step, 1);
        assert_eq!(
            std::fs::read_to_string(path.join("weights")).unwrap(),
            "good"
        );
    }

    #[test]
    fn leftovers_of_a_killed_save_are_ignored_and_swept() {
        let run = tempfile::tempdir().unwrap();
        let c = Checkpoints::new(run.path());
        c.save(1, 0, fill("good")).unwrap();
        // What SIGKILL leaves: a staging dir with some files, and a step dir without state.
        let staging = c.dir().join(".staging-abc");
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::write(staging.join("weights"), "partial").unwrap();
        std::fs::create_dir_all(c.dir().join("step-000002")).unwrap();
        // `latest` pointing at an incomplete checkpoint falls back to the newest complete.
        std::fs::write(c.dir().join("latest"), "step-000002").unwrap();
        assert_eq!(c.latest().unwrap().unwrap().0, 1);
        c.prune(0).unwrap();
        assert!(!staging.exists());

        // A re-save of step 1 killed between moving the old copy aside and moving the new
        // one in: the old copy comes back.
        std::fs::rename(
            c.dir().join("step-000001"),
            c.dir().join(".old-step-000001"),
        )
        .unwrap();
        let (step, path) = c.latest().unwrap().unwrap();
        assert_eq!(
            (step, path.file_name().unwrap().to_str().unwrap()),
            (1, "step-000001")
        );
        assert_eq!(
            std::fs::read_to_string(path.join("weights")).unwrap(),
            "good"
        );
    }
}
