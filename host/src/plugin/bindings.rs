//! How the host calls a plugin's exports: the records it lowers (views that borrow the
//! host's records, so that nothing is copied on the host before the canonical ABI copies it
//! into the guest), the records it lifts, and one typed handle per export function, its
//! type checked once per component.
//!
//! All of it is wasmtime's public API with derived component types. Component types are
//! checked structurally (a record's field names, order and types; an enum's cases), so the
//! same views call a plugin built against any contract version the host links (`super::wit`)
//! as long as the version keeps these records, which the versioning policy promises within
//! a major version.

use std::marker::PhantomData;

use wasmtime::component::types::ComponentItem;
use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, ComponentType, Func, Instance, InstancePre, Lift,
    Lower, TypedFunc,
};
use wasmtime::Store;

use super::sandbox::Sandbox;
use super::World;
use crate::transcript as t;

/// The latest contract's records (`verdict`, `reward`, `role`), which results are lifted
/// into whatever version the plugin was built against.
pub(crate) use super::wit::latest::types;

/// The task as a call lowers it, borrowed from the host's record.
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

/// One utterance as a call lowers it, borrowed from the host's record.
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

/// The transcript as a call lowers it: `correct` is shown only when asked for.
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

/// A prompt as a plan's call lifts it.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct PromptLift {
    agent: u32,
    messages: Vec<MessageLift>,
}

/// A chat message as a plan's call lifts it.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct MessageLift {
    role: types::Role,
    content: String,
}

impl From<PromptLift> for t::Prompt {
    fn from(p: PromptLift) -> Self {
        t::Prompt {
            agent: p.agent,
            messages: p
                .messages
                .into_iter()
                .map(|m| t::ChatMessage {
                    role: match m.role {
                        types::Role::System => t::Role::System,
                        types::Role::User => t::Role::User,
                        types::Role::Assistant => t::Role::Assistant,
                    },
                    content: m.content,
                })
                .collect(),
        }
    }
}

impl From<types::Verdict> for t::Verdict {
    fn from(v: types::Verdict) -> Self {
        t::Verdict {
            answer: v.answer,
            score: v.score,
            correct: v.correct,
        }
    }
}

impl From<types::Reward> for t::Reward {
    fn from(r: types::Reward) -> Self {
        t::Reward {
            turn: r.turn,
            agent: r.agent,
            total: r.total,
            parts: r.parts,
        }
    }
}

/// The parameter and result types of one export function; the parameters may borrow.
pub(crate) trait Signature {
    type Params<'a>: ComponentNamedList + Lower;
    type Results: ComponentNamedList + Lift;
}

/// `configure(settings) -> result<_, string>`, which every world exports.
pub(crate) struct Configure;

impl Signature for Configure {
    type Params<'a> = (&'a str,);
    type Results = (Result<(), String>,);
}

/// The name of the interface through which `component` implements `world`, at the version
/// it was built against (`maporl:plugin/verification@0.1.0`); the loader has checked that
/// the host links that version.
fn exported_interface(pre: &InstancePre<Sandbox>, world: World) -> wasmtime::Result<String> {
    let component = pre.component();
    component
        .component_type()
        .exports(component.engine())
        .map(|(name, _)| name)
        .find(|name| {
            super::inspect::parse_name(name).is_some_and(|(iface, version)| {
                iface == world.export_interface()
                    && version.is_some_and(|v| super::wit::linked_for(v).is_some())
            })
        })
        .map(str::to_string)
        .ok_or_else(|| {
            wasmtime::format_err!(
                "the component exports no `{}/{}` at a version this host links",
                super::WIT_PACKAGE,
                world.export_interface()
            )
        })
}

/// Where one export function is, found and type-checked against `S` once per component:
/// the function `function` of the interface `world` exports.
pub(crate) fn export_index<S: Signature>(
    pre: &InstancePre<Sandbox>,
    world: World,
    function: &str,
) -> wasmtime::Result<ComponentExportIndex> {
    let interface = exported_interface(pre, world)?;
    let component = pre.component();
    let instance = component
        .get_export_index(None, &interface)
        .ok_or_else(|| wasmtime::format_err!("the component exports no `{interface}`"))?;
    let (item, index) = component
        .get_export(Some(&instance), function)
        .ok_or_else(|| {
            wasmtime::format_err!("the component exports no function `{function}` in `{interface}`")
        })?;
    match item {
        ComponentItem::ComponentFunc(func) => func
            .typecheck::<S::Params<'static>, S::Results>(&pre.instance_type())
            .map_err(|e| e.context(format!("type-checking `{function}` in `{interface}`")))?,
        _ => wasmtime::bail!("`{function}` in `{interface}` is not a function"),
    }
    Ok(index)
}

/// One export function of an instance, its type checked against `S` (by [`export_index`])
/// for the component the instance was made from, so that a call needs no check.
pub(crate) struct Export<S: Signature> {
    func: Func,
    signature: PhantomData<S>,
}

impl<S: Signature> Export<S> {
    /// The function at `index` (from [`export_index`]) of a fresh instance.
    pub(crate) fn load(
        store: &mut Store<Sandbox>,
        instance: &Instance,
        index: &ComponentExportIndex,
    ) -> wasmtime::Result<Self> {
        let func = instance.get_func(store, index).ok_or_else(|| {
            wasmtime::format_err!("the instance lacks an export its component has")
        })?;
        Ok(Export {
            func,
            signature: PhantomData,
        })
    }

    /// Calls the function.
    pub(crate) fn call(
        &self,
        store: &mut Store<Sandbox>,
        params: S::Params<'_>,
    ) -> wasmtime::Result<S::Results> {
        // SAFETY: `export_index` checked the function's type against `S::Params<'static>`
        // and `S::Results` for the component this instance was made from; component types
        // do not depend on lifetimes, so `S::Params<'_>` has the same type.
        let typed = unsafe { TypedFunc::<S::Params<'_>, S::Results>::new_unchecked(self.func) };
        typed.call(store, params)
    }
}
