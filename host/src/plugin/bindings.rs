//! Host-side bindings generated from `wit/maporl.wit`, one module per world. The three worlds
//! share the `types` and `host` interfaces, generated once (in `protocol`) and reused.

pub(crate) mod protocol {
    wasmtime::component::bindgen!({
        world: "protocol",
        path: "../wit",
    });
}

pub(crate) mod verifier {
    wasmtime::component::bindgen!({
        world: "verifier",
        path: "../wit",
        with: {
            "maporl:plugin/types": super::protocol::maporl::plugin::types,
            "maporl:plugin/host": super::protocol::maporl::plugin::host,
        },
    });
}

pub(crate) mod shaper {
    wasmtime::component::bindgen!({
        world: "reward-shaper",
        path: "../wit",
        with: {
            "maporl:plugin/types": super::protocol::maporl::plugin::types,
            "maporl:plugin/host": super::protocol::maporl::plugin::host,
        },
    });
}

pub(crate) use protocol::maporl::plugin::host;
pub(crate) use protocol::maporl::plugin::types as wit;

use crate::transcript as t;

impl From<&t::Task> for wit::Task {
    fn from(task: &t::Task) -> Self {
        wit::Task {
            id: task.id.clone(),
            kind: task.kind.clone(),
            question: task.question.clone(),
            reference: task.reference.clone(),
            fields: task.fields.clone(),
        }
    }
}

impl From<&t::Utterance> for wit::Utterance {
    fn from(u: &t::Utterance) -> Self {
        wit::Utterance {
            turn: u.turn,
            agent: u.agent,
            text: u.text.clone(),
            answer: u.answer.clone(),
            score: u.score,
            correct: u.correct,
        }
    }
}

impl From<&t::Transcript> for wit::Transcript {
    fn from(tr: &t::Transcript) -> Self {
        wit::Transcript {
            agents: tr.agents,
            turns: tr.turns,
            utterances: tr.utterances.iter().map(Into::into).collect(),
        }
    }
}

impl From<wit::Prompt> for t::Prompt {
    fn from(p: wit::Prompt) -> Self {
        t::Prompt {
            agent: p.agent,
            messages: p
                .messages
                .into_iter()
                .map(|m| t::ChatMessage {
                    role: match m.role {
                        wit::Role::System => t::Role::System,
                        wit::Role::User => t::Role::User,
                        wit::Role::Assistant => t::Role::Assistant,
                    },
                    content: m.content,
                })
                .collect(),
        }
    }
}

impl From<wit::Verdict> for t::Verdict {
    fn from(v: wit::Verdict) -> Self {
        t::Verdict {
            answer: v.answer,
            score: v.score,
            correct: v.correct,
        }
    }
}

impl From<wit::Reward> for t::Reward {
    fn from(r: wit::Reward) -> Self {
        t::Reward {
            turn: r.turn,
            agent: r.agent,
            total: r.total,
            parts: r.parts,
        }
    }
}
