//! `plugins.lock`: the exact plugins a run used (reference, bundle and version, component
//! file, sha256), written into the run directory when the run starts; and the check that
//! refuses to resume a run with other plugins.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use super::reference::ResolvedPlugin;
use crate::plugin::Identity;

/// The lock file's name inside a run directory.
pub const LOCK_FILE: &str = "plugins.lock";

/// The plugins of a run, one per role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginLock {
    pub protocol: LockedPlugin,
    pub verifier: LockedPlugin,
    pub shaper: LockedPlugin,
    /// The learned verifier served through `judge`, when the run has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_checkpoint: Option<LockedCheckpoint>,
}

/// A learned verifier's checkpoint, pinned by `verifier::checkpoint_sha256`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedCheckpoint {
    /// The checkpoint directory, as loaded.
    pub path: String,
    pub sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedPlugin {
    /// The reference as the run config wrote it (a path, or `bundle/component@req`).
    pub reference: String,
    /// The component file loaded.
    pub path: String,
    /// sha256 of the component file, hex.
    pub sha256: String,
    /// sha256 of the source it was built from, as the component declares it (see
    /// `plugin::source`): a rebuild of the same source continues the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_sha256: Option<String>,
    /// For bundle references: the bundle, its exact version and the component's name and file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// For bundle references: the key id that signed the bundle (or `unsigned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
}

impl LockedPlugin {
    /// Locks a resolved plugin at the sha256 of the file actually loaded (`loaded`); refuses
    /// a bundle component whose loaded bytes are not those its manifest pins.
    pub fn new(resolved: &ResolvedPlugin, loaded: &Identity) -> anyhow::Result<LockedPlugin> {
        let loaded_sha256 = loaded.sha256.as_str();
        if let Some(b) = &resolved.bundle {
            if b.sha256 != loaded_sha256 {
                bail!(
                    "plugin `{}` ({}): the loaded file has sha256 {loaded_sha256}, but bundle \
                     {}@{} pins {}: it changed while the run was starting",
                    resolved.reference,
                    resolved.path.display(),
                    b.name,
                    b.version,
                    b.sha256
                );
            }
        }
        Ok(LockedPlugin {
            reference: resolved.reference.clone(),
            path: resolved.path.display().to_string(),
            sha256: loaded_sha256.to_string(),
            source_sha256: loaded.source_sha256.clone(),
            bundle: resolved.bundle.as_ref().map(|b| b.name.clone()),
            version: resolved.bundle.as_ref().map(|b| b.version.to_string()),
            component: resolved.bundle.as_ref().map(|b| b.component.clone()),
            file: resolved.bundle.as_ref().map(|b| b.file.clone()),
            signer: resolved.bundle.as_ref().map(|b| b.signer.clone()),
        })
    }

    fn describe(&self) -> String {
        let hashes = match &self.source_sha256 {
            Some(source) => format!("sha256 {}, built from source sha256 {source}", self.sha256),
            None => format!("sha256 {}", self.sha256),
        };
        match (&self.bundle, &self.version) {
            (Some(b), Some(v)) => format!(
                "{b}@{v} component {} ({hashes}) signed by {}",
                self.component.as_deref().unwrap_or("?"),
                self.signer.as_deref().unwrap_or("?")
            ),
            _ => format!("{} ({hashes})", self.path),
        }
    }
}

impl PluginLock {
    pub fn roles(&self) -> [(&'static str, &LockedPlugin); 3] {
        [
            ("protocol", &self.protocol),
            ("verifier", &self.verifier),
            ("shaper", &self.shaper),
        ]
    }

    pub fn to_toml(&self) -> String {
        format!(
            "# The exact plugins of this run (written by maporl when the run started).\n\
             # Resuming with other plugins is refused unless explicitly allowed.\n{}",
            toml::to_string_pretty(self).expect("a lock serializes")
        )
    }

    /// Writes `RUN_DIR/plugins.lock` atomically.
    pub fn write(&self, run_dir: &Path) -> anyhow::Result<()> {
        crate::files::write_atomic(&run_dir.join(LOCK_FILE), self.to_toml().as_bytes())
    }

    /// Reads `RUN_DIR/plugins.lock`; `None` when there is none.
    pub fn read(run_dir: &Path) -> anyhow::Result<Option<PluginLock>> {
        let path = run_dir.join(LOCK_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("in {}", path.display()))
            .map(Some)
    }
}

/// Compares the plugins a run is about to resume with (`current`) against the run's
/// `plugins.lock`. A changed sha256 or bundle version, or a missing lock, is refused with
/// an error naming each plugin and both hashes, unless `allow_change` (then the changes
/// are returned, for the caller to print). Returns the changes (empty when none).
pub fn check_lock(
    run_dir: &Path,
    current: &PluginLock,
    allow_change: bool,
) -> anyhow::Result<Vec<String>> {
    let path = run_dir.join(LOCK_FILE);
    let Some(locked) = PluginLock::read(run_dir)? else {
        let msg = format!(
            "{} does not exist, so the plugins this run started with are unknown",
            path.display()
        );
        if allow_change {
            return Ok(vec![msg]);
        }
        bail!("cannot resume: {msg}; pass --allow-plugin-change to resume anyway");
    };
    let mut changes = Vec::new();
    for ((role, was), (_, now)) in locked.roles().into_iter().zip(current.roles()) {
        // A signer recorded by an older lock (none) is no change.
        let signer_changed = was.signer.is_some() && was.signer != now.signer;
        let rebuilt = was.sha256 != now.sha256
            && was.source_sha256.is_some()
            && was.source_sha256 == now.source_sha256;
        if rebuilt {
            tracing::info!(
                "the {role} plugin `{}` was rebuilt from the same source (sha256 {}): \
                 resuming with it ({} -> {})",
                now.reference,
                now.source_sha256.as_deref().unwrap_or_default(),
                was.sha256,
                now.sha256
            );
        }
        if (was.sha256 != now.sha256 && !rebuilt)
            || was.version != now.version
            || was.bundle != now.bundle
            || signer_changed
        {
            changes.push(format!(
                "{role} plugin `{}`: the run started with {}, now {}",
                now.reference,
                was.describe(),
                now.describe()
            ));
        }
    }
    if locked.verifier_checkpoint.as_ref().map(|c| &c.sha256)
        != current.verifier_checkpoint.as_ref().map(|c| &c.sha256)
    {
        let describe = |c: &Option<LockedCheckpoint>| match c {
            Some(c) => format!("{} (sha256 {})", c.path, c.sha256),
            None => "none".to_string(),
        };
        changes.push(format!(
            "learned verifier: the run started with {}, now {}",
            describe(&locked.verifier_checkpoint),
            describe(&current.verifier_checkpoint)
        ));
    }
    if !changes.is_empty() && !allow_change {
        bail!(
            "cannot resume {}: its plugins changed since it started ({}):\n  {}\n\
             resume with the same plugins, or pass --allow-plugin-change to resume anyway",
            run_dir.display(),
            path.display(),
            changes.join("\n  ")
        );
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locked(sha: &str) -> LockedPlugin {
        LockedPlugin {
            reference: "arith/debate@^0.1".into(),
            path: "/store/arith/0.1.0/debate.wasm".into(),
            sha256: sha.into(),
            source_sha256: None,
            bundle: Some("arith".into()),
            version: Some("0.1.0".into()),
            component: Some("debate".into()),
            file: Some("debate.wasm".into()),
            signer: Some("0123456789abcdef".into()),
        }
    }

    fn lock(sha: &str) -> PluginLock {
        PluginLock {
            protocol: locked(sha),
            verifier: LockedPlugin {
                reference: "gsm8k.wasm".into(),
                path: "/p/gsm8k.wasm".into(),
                sha256: "bb".into(),
                source_sha256: None,
                bundle: None,
                version: None,
                component: None,
                file: None,
                signer: None,
            },
            shaper: locked("cc"),
            verifier_checkpoint: None,
        }
    }

    #[test]
    fn a_changed_hash_is_refused_unless_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let err = check_lock(dir.path(), &lock("aa"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("plugins.lock does not exist"), "{err}");
        lock("aa").write(dir.path()).unwrap();
        assert_eq!(PluginLock::read(dir.path()).unwrap(), Some(lock("aa")));
        assert!(check_lock(dir.path(), &lock("aa"), false)
            .unwrap()
            .is_empty());
        let err = check_lock(dir.path(), &lock("dd"), false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("protocol plugin `arith/debate@^0.1`")
                && err.contains("sha256 aa")
                && err.contains("sha256 dd")
                && err.contains("--allow-plugin-change"),
            "{err}"
        );
        let changes = check_lock(dir.path(), &lock("dd"), true).unwrap();
        assert_eq!(changes.len(), 1, "{changes:?}");
        let mut newer = lock("aa");
        newer.protocol.version = Some("0.1.1".into());
        let err = check_lock(dir.path(), &newer, false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("arith@0.1.0") && err.contains("arith@0.1.1"),
            "{err}"
        );
    }

    /// A component rebuilt from the same declared source continues the run; another source,
    /// or a component that declares none, is a change. A lock written before sources were
    /// recorded still reads.
    #[test]
    fn a_rebuild_of_the_same_source_is_no_change() {
        let dir = tempfile::tempdir().unwrap();
        let built = |sha: &str, source: Option<&str>| {
            let mut l = lock("aa");
            l.verifier.sha256 = sha.into();
            l.verifier.source_sha256 = source.map(str::to_string);
            l
        };
        built("b1", Some("s1")).write(dir.path()).unwrap();
        let text = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(text.contains("source_sha256 = \"s1\""), "{text}");
        assert!(check_lock(dir.path(), &built("b2", Some("s1")), false)
            .unwrap()
            .is_empty());
        for other in [built("b2", Some("s2")), built("b2", None)] {
            let err = check_lock(dir.path(), &other, false)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("verifier plugin `gsm8k.wasm`")
                    && err.contains("sha256 b1, built from source sha256 s1"),
                "{err}"
            );
        }
        // Declaring a source does not excuse a lock that had none.
        built("b1", None).write(dir.path()).unwrap();
        assert!(check_lock(dir.path(), &built("b2", Some("s1")), false).is_err());
        let old = std::fs::read_to_string(dir.path().join(LOCK_FILE)).unwrap();
        assert!(!old.contains("source_sha256"), "{old}");
        assert_eq!(
            PluginLock::read(dir.path()).unwrap(),
            Some(built("b1", None))
        );
    }
}
