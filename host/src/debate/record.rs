//! Transcripts on disk: JSONL, one record per task, with the hashes of the plugins that
//! produced it.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{Debate, Plugins};

/// The sha256 of each plugin a debate ran with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginHashes {
    pub protocol: String,
    pub verifier: String,
    pub shaper: String,
    /// The learned verifier's checkpoint (see `verifier::checkpoint_sha256`), when the run
    /// served one through `judge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifier_checkpoint: Option<String>,
    /// The source sha256 of each plugin (by role) that declares the source it was built
    /// from (see `plugin::source`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
}

impl PluginHashes {
    pub fn of(plugins: &Plugins) -> PluginHashes {
        let sources = [
            ("protocol", plugins.protocol.identity()),
            ("verifier", plugins.verifier.identity()),
            ("shaper", plugins.shaper.identity()),
        ]
        .into_iter()
        .filter_map(|(role, id)| Some((role.to_string(), id.source_sha256.clone()?)))
        .collect();
        PluginHashes {
            protocol: plugins.protocol.identity().sha256.clone(),
            verifier: plugins.verifier.identity().sha256.clone(),
            shaper: plugins.shaper.identity().sha256.clone(),
            verifier_checkpoint: plugins.verifier.judge().and_then(|j| j.checkpoint_sha256()),
            sources,
        }
    }

    /// Each role's component sha256, by role.
    pub fn roles(&self) -> [(&'static str, &str); 3] {
        [
            ("protocol", &self.protocol),
            ("verifier", &self.verifier),
            ("shaper", &self.shaper),
        ]
    }

    /// The roles whose plugin differs between `self` and `now`: another component, unless
    /// both declare the same source (a rebuild of it).
    pub fn changed_roles(&self, now: &PluginHashes) -> Vec<&'static str> {
        self.roles()
            .into_iter()
            .zip(now.roles())
            .filter(|((role, was), (_, is))| {
                was != is
                    && (!self.sources.contains_key(*role)
                        || self.sources.get(*role) != now.sources.get(*role))
            })
            .map(|((role, _), _)| role)
            .collect()
    }

    /// Whether `now` continues a run of `self`: the same plugins (or rebuilds of the same
    /// sources) and the same learned verifier.
    pub fn same_plugins(&self, now: &PluginHashes) -> bool {
        self.changed_roles(now).is_empty() && self.verifier_checkpoint == now.verifier_checkpoint
    }
}

#[derive(Serialize)]
struct Record<'a> {
    #[serde(flatten)]
    debate: &'a Debate,
    plugins: &'a PluginHashes,
}

/// Writes `debates` as JSONL to `path`, atomically (a failed write leaves the old file).
pub fn write_transcripts(
    path: &Path,
    debates: &[Debate],
    plugins: &PluginHashes,
) -> anyhow::Result<()> {
    let mut text = Vec::new();
    for debate in debates {
        serde_json::to_writer(&mut text, &Record { debate, plugins })?;
        text.push(b'\n');
    }
    crate::files::write_atomic(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(verifier: &str, source: Option<&str>) -> PluginHashes {
        PluginHashes {
            protocol: "p".into(),
            verifier: verifier.into(),
            shaper: "s".into(),
            verifier_checkpoint: None,
            sources: source
                .map(|s| [("verifier".to_string(), s.to_string())].into())
                .unwrap_or_default(),
        }
    }

    #[test]
    fn a_rebuild_of_the_same_source_is_the_same_plugin() {
        let run = hashes("v1", Some("src"));
        assert!(run.same_plugins(&hashes("v1", Some("src"))));
        assert!(run.same_plugins(&hashes("v2", Some("src"))));
        assert_eq!(
            run.changed_roles(&hashes("v2", Some("other"))),
            ["verifier"]
        );
        assert_eq!(run.changed_roles(&hashes("v2", None)), ["verifier"]);
        // A source declared now does not excuse a component that declared none.
        assert_eq!(
            hashes("v1", None).changed_roles(&hashes("v2", Some("src"))),
            ["verifier"]
        );
        let mut judged = hashes("v1", Some("src"));
        judged.verifier_checkpoint = Some("c".into());
        assert!(judged.changed_roles(&run).is_empty() && !judged.same_plugins(&run));
        // A checkpoint from before sources were recorded reads as none.
        let old: PluginHashes =
            serde_json::from_str(r#"{"protocol":"p","verifier":"v1","shaper":"s"}"#).unwrap();
        assert_eq!(old, hashes("v1", None));
        assert!(!serde_json::to_string(&old).unwrap().contains("sources"));
    }
}
