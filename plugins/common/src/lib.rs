//! Shared logic of maporl's reference plugins.
//!
//! The record types of the WIT package (`maporl:plugin/types`) are generated here once and
//! every plugin maps them in with wit-bindgen's `with` option, so the pure logic below works
//! on the very types the exports receive and can be unit-tested natively.
//!
//! - [`settings`]: the `configure` JSON, with errors that name the plugin and the key;
//! - [`answers`]: `\boxed{...}` extraction, integer and label parsing, text normalisation;
//! - [`vote`]: majority vote with the paper's tie rule;
//! - [`prompts`]: turn-1 prompts per task kind and the debate's follow-up messages;
//! - [`transcript`]: look-ups and consistency checks on a transcript.

pub mod answers;
pub mod prompts;
pub mod settings;
pub mod transcript;
pub mod vote;

/// The generated WIT types (bindings for `maporl:plugin/types@0.1.0`).
pub mod wit {
    mod generated {
        wit_bindgen::generate!({
            inline: "
                package maporl:plugin-common;
                world types-only {
                    import maporl:plugin/types@0.1.0;
                }
            ",
            path: "../../wit",
            world: "maporl:plugin-common/types-only",
            generate_all,
            generate_unused_types: true,
            additional_derives: [PartialEq],
        });
    }

    /// Map a plugin's bindings onto these with
    /// `with: { "maporl:plugin/types@0.1.0": maporl_plugin_common::wit::types }`.
    pub use generated::maporl::plugin::types;
}

pub use wit::types::{ChatMessage, Prompt, Reward, Role, Task, Transcript, Utterance, Verdict};

/// A reward for the utterance of `agent` at `turn` from its named parts (computed in
/// `f64`): each part is rounded to `f32` and `total` is the `f32` sum of the rounded parts,
/// so `total` always equals the sum of the logged parts.
pub fn reward(turn: u32, agent: u32, parts: Vec<(&str, f64)>) -> Reward {
    let parts: Vec<(String, f32)> = parts
        .into_iter()
        .map(|(name, value)| (name.to_string(), value as f32))
        .collect();
    Reward {
        turn,
        agent,
        total: parts.iter().map(|(_, v)| *v).sum(),
        parts,
    }
}

/// Builders for the records, used by the plugins' unit tests.
pub mod testing {
    use super::{Task, Transcript, Utterance};

    /// A task with the given kind, question and reference and no extra fields.
    pub fn task(kind: &str, question: &str, reference: &str) -> Task {
        Task {
            id: "t-1".to_string(),
            kind: kind.to_string(),
            question: question.to_string(),
            reference: reference.to_string(),
            fields: Vec::new(),
        }
    }

    /// An utterance with the given answer and score; `correct` is `score >= 0.5`.
    pub fn utt(turn: u32, agent: u32, text: &str, answer: Option<&str>, score: f32) -> Utterance {
        Utterance {
            turn,
            agent,
            text: text.to_string(),
            answer: answer.map(str::to_string),
            score,
            correct: score >= 0.5,
        }
    }

    /// A transcript of `agents` agents and at most `turns` turns.
    pub fn transcript(agents: u32, turns: u32, utterances: Vec<Utterance>) -> Transcript {
        Transcript {
            agents,
            turns,
            utterances,
        }
    }
}
