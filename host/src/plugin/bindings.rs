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

use std::marker::PhantomData;

use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, ComponentType, Func, Instance, InstancePre, Lift,
    Lower, TypedFunc,
};
use wasmtime::Store;

use super::sandbox::Sandbox;
use super::World;
use crate::transcript as t;

/// The task as a call lowers it, borrowed from the host's record: nothing is copied on the
/// host before the canonical ABI copies the strings into the guest's memory. (An owned
/// `wit::Transcript` cloned every text first: about 0.9 µs a call for 3 agents × 3 turns of
/// 1,250-byte answers.) Field names and order are the WIT record's, checked when an
/// instance is made ([`Export::load`]).
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct TaskView<'a> {
    id: &'a str,
    kind: &'a str,
    question: &'a str,
    reference: &'a str,
    fields: &'a [(String, String)],
}

impl<'a> TaskView<'a> {
    pub(crate) fn of(task: &'a t::Task) -> Self {
        TaskView {
            id: &task.id,
            kind: &task.kind,
            question: &task.question,
            reference: &task.reference,
            fields: &task.fields,
        }
    }

    /// The task as a protocol sees it: without the gold answer, which must never reach a
    /// prompt.
    pub(crate) fn without_reference(task: &'a t::Task) -> Self {
        TaskView {
            reference: "",
            ..TaskView::of(task)
        }
    }
}

/// One utterance as a call lowers it (see [`TaskView`]).
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct UtteranceView<'a> {
    turn: u32,
    agent: u32,
    text: &'a str,
    answer: Option<&'a str>,
    score: f32,
    correct: bool,
}

/// The transcript as a call lowers it (see [`TaskView`]).
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct TranscriptView<'a> {
    agents: u32,
    turns: u32,
    utterances: Vec<UtteranceView<'a>>,
}

impl<'a> TranscriptView<'a> {
    pub(crate) fn of(transcript: &'a t::Transcript) -> Self {
        Self::with_correctness(transcript, true)
    }

    /// The transcript as a protocol sees it: no utterance marked correct, since
    /// correctness is the gold answer in another form.
    pub(crate) fn without_correctness(transcript: &'a t::Transcript) -> Self {
        Self::with_correctness(transcript, false)
    }

    fn with_correctness(transcript: &'a t::Transcript, shown: bool) -> Self {
        TranscriptView {
            agents: transcript.agents,
            turns: transcript.turns,
            utterances: transcript
                .utterances
                .iter()
                .map(|u| UtteranceView {
                    turn: u.turn,
                    agent: u.agent,
                    text: &u.text,
                    answer: u.answer.as_deref(),
                    score: u.score,
                    correct: shown && u.correct,
                })
                .collect(),
        }
    }
}

/// The parameter and result types of one export function; the parameters may borrow.
pub(crate) trait Signature {
    type Params<'a>: ComponentNamedList + Lower;
    type Results: ComponentNamedList + Lift;
}

/// Where one export function is, found once per component: the function of the interface
/// `world` exports named `function`.
pub(crate) fn export_index(
    pre: &InstancePre<Sandbox>,
    world: World,
    function: &str,
) -> wasmtime::Result<ComponentExportIndex> {
    let interface = format!(
        "{}/{}@{}",
        super::WIT_PACKAGE,
        world.export_interface(),
        super::wit_version()
    );
    let missing = |what: &str| wasmtime::format_err!("the component exports no {what}");
    let component = pre.component();
    let index = component
        .get_export_index(None, &interface)
        .ok_or_else(|| missing(&format!("interface `{interface}`")))?;
    component
        .get_export_index(Some(&index), function)
        .ok_or_else(|| missing(&format!("function `{function}` in `{interface}`")))
}

/// One export function of an instance, its type checked against `S` when the instance was
/// made, so that a call needs no check.
pub(crate) struct Export<S: Signature> {
    func: Func,
    signature: PhantomData<S>,
}

impl<S: Signature> Export<S> {
    /// The function at `index` (see [`export_index`]) of a fresh instance, its type checked.
    pub(crate) fn load(
        store: &mut Store<Sandbox>,
        instance: &Instance,
        index: &ComponentExportIndex,
    ) -> wasmtime::Result<Self> {
        let typed = instance.get_typed_func::<S::Params<'static>, S::Results>(store, index)?;
        Ok(Export {
            func: *typed.func(),
            signature: PhantomData,
        })
    }

    /// Calls the function.
    pub(crate) fn call(
        &self,
        store: &mut Store<Sandbox>,
        params: S::Params<'_>,
    ) -> wasmtime::Result<S::Results> {
        // SAFETY: `load` checked the function's type against `S::Params<'static>` and
        // `S::Results`; component types do not depend on lifetimes, so `S::Params<'_>`
        // has the same type.
        let typed = unsafe { TypedFunc::<S::Params<'_>, S::Results>::new_unchecked(self.func) };
        typed.call(store, params)
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
