//! Transcripts on disk: JSONL, one record per task, with the hashes of the plugins that
//! produced it.

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
}

impl PluginHashes {
    pub fn of(plugins: &Plugins) -> PluginHashes {
        PluginHashes {
            protocol: plugins.protocol.identity().sha256.clone(),
            verifier: plugins.verifier.identity().sha256.clone(),
            shaper: plugins.shaper.identity().sha256.clone(),
            verifier_checkpoint: plugins.verifier.judge().and_then(|j| j.checkpoint_sha256()),
        }
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
