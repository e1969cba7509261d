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

use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
use wasmtime::component::__internal::{
    CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext, LowerContext,
};
use wasmtime::component::{
    ComponentExportIndex, ComponentNamedList, ComponentType, Func, Instance, InstancePre, Lift,
    Lower, TypedFunc,
};
use wasmtime::{Store, ValRaw};

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

/// The WIT `utterance` record, for type checking only: [`Utterances`] lowers a transcript's
/// utterances itself, from the host's records. Field names, order and types are checked
/// against the WIT record when an instance is made ([`Export::load`]).
#[derive(ComponentType)]
#[component(record)]
#[allow(dead_code, reason = "only its type is used")]
pub(crate) struct UtteranceView<'a> {
    turn: u32,
    agent: u32,
    text: &'a str,
    answer: Option<&'a str>,
    score: f32,
    correct: bool,
}

/// Where each field of an `utterance` lies in the canonical ABI's layout: `turn` u32 at 0,
/// `agent` u32 at 4, `text` (pointer, length) at 8, `answer` (discriminant u8 at 16, then
/// pointer and length at 20), `score` f32 at 28, `correct` u8 at 32; 36 bytes, aligned to 4.
mod utterance_layout {
    pub const TURN: usize = 0;
    pub const AGENT: usize = 4;
    pub const TEXT: usize = 8;
    pub const ANSWER: usize = 16;
    pub const SCORE: usize = 28;
    pub const CORRECT: usize = 32;
    pub const SIZE: usize = 36;
}
const _: () = assert!(
    <UtteranceView<'static> as ComponentType>::SIZE32 == utterance_layout::SIZE
        && <UtteranceView<'static> as ComponentType>::ALIGN32 == 4,
    "the utterance record's layout changed: update `utterance_layout`"
);

/// A transcript's utterances as a call lowers them (a WIT `list<utterance>`), straight from
/// the host's records: `correct` is shown only when `correctness` is set.
///
/// A derived lowering would store every field through its own lookup of the guest's memory
/// (wasmtime's `LowerContext::get`: eleven for one utterance, a tenth of a reward shaper's
/// call on 3 agents x 3 turns) from a `Vec` of views built first. Here each utterance's
/// strings are allocated in the guest (one `realloc` call each, as the derived code does),
/// then its record and its strings' bytes are written with one lookup. What the guest
/// receives is the same; no host allocation is made.
#[derive(Clone, Copy)]
pub(crate) struct Utterances<'a> {
    items: &'a [t::Utterance],
    correctness: bool,
}

// SAFETY: a list's flat form and ABI (a pointer and a length), as wasmtime's `[T]`; the
// type check is `[T]`'s with the derived record, and `store` writes that record's layout.
unsafe impl ComponentType for Utterances<'_> {
    type Lower = [ValRaw; 2];

    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <[UtteranceView<'static>] as ComponentType>::typecheck(ty, types)
    }
}

unsafe impl Lower for Utterances<'_> {
    fn linear_lower_to_flat<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        _ty: InterfaceType,
        dst: &mut std::mem::MaybeUninit<[ValRaw; 2]>,
    ) -> wasmtime::Result<()> {
        let (ptr, len) = self.store(cx)?;
        // Pointers travel as 64-bit integers in flat values, as wasmtime's own lists do.
        dst.write([ValRaw::i64(ptr as i64), ValRaw::i64(len as i64)]);
        Ok(())
    }

    fn linear_lower_to_memory<T>(
        &self,
        cx: &mut LowerContext<'_, T>,
        _ty: InterfaceType,
        offset: usize,
    ) -> wasmtime::Result<()> {
        let (ptr, len) = self.store(cx)?;
        let (ptr, len) = (guest_u32(ptr)?, guest_u32(len)?);
        let slot = guest_range(cx.as_slice_mut(), offset, 8)?;
        slot[..4].copy_from_slice(&ptr);
        slot[4..].copy_from_slice(&len);
        Ok(())
    }
}

impl Utterances<'_> {
    /// Copies the list into the guest: its records' array and every string; the array's
    /// (pointer, length).
    fn store<T>(&self, cx: &mut LowerContext<'_, T>) -> wasmtime::Result<(usize, usize)> {
        use utterance_layout as at;
        let size = self
            .items
            .len()
            .checked_mul(at::SIZE)
            .ok_or_else(|| wasmtime::format_err!("size overflow copying a list"))?;
        let array = cx.realloc(0, 0, 4, size)?;
        for (i, u) in self.items.iter().enumerate() {
            let text = guest_string(cx, &u.text)?;
            let answer = match &u.answer {
                Some(a) => Some((guest_string(cx, a)?, a.as_bytes())),
                None => None,
            };
            // One lookup of the guest's memory for everything of this utterance.
            let memory = cx.as_slice_mut();
            guest_range(memory, text, u.text.len())?.copy_from_slice(u.text.as_bytes());
            let (tag, answer_at, answer_len) = match answer {
                Some((place, bytes)) => {
                    guest_range(memory, place, bytes.len())?.copy_from_slice(bytes);
                    (1, place, bytes.len())
                }
                None => (0, 0, 0),
            };
            let record = guest_range(memory, array + i * at::SIZE, at::SIZE)?;
            let mut put =
                |field: usize, bytes: [u8; 4]| record[field..field + 4].copy_from_slice(&bytes);
            put(at::TURN, u.turn.to_le_bytes());
            put(at::AGENT, u.agent.to_le_bytes());
            put(at::TEXT, guest_u32(text)?);
            put(at::TEXT + 4, guest_u32(u.text.len())?);
            put(at::ANSWER, [tag, 0, 0, 0]);
            put(at::ANSWER + 4, guest_u32(answer_at)?);
            put(at::ANSWER + 8, guest_u32(answer_len)?);
            put(at::SCORE, u.score.to_bits().to_le_bytes());
            let correct = self.correctness && u.correct;
            put(at::CORRECT, [u8::from(correct), 0, 0, 0]);
        }
        Ok((array, self.items.len()))
    }
}

/// Allocates `s.len()` bytes in the guest for `s` through its `realloc` (wasmtime checks
/// the block's alignment and that it lies in the guest's memory); the bytes are copied by
/// the caller.
fn guest_string<T>(cx: &mut LowerContext<'_, T>, s: &str) -> wasmtime::Result<usize> {
    // The canonical ABI's limit on a string's length (wasmtime's `MAX_STRING_BYTE_LENGTH`).
    if s.len() > (1 << 31) - 1 {
        wasmtime::bail!("string length of {} too large to copy into wasm", s.len());
    }
    cx.realloc(0, 0, 1, s.len())
}

fn guest_u32(n: usize) -> wasmtime::Result<[u8; 4]> {
    Ok(u32::try_from(n)?.to_le_bytes())
}

/// `len` bytes of the guest's memory from `at`; an error past its end.
fn guest_range(memory: &mut [u8], at: usize, len: usize) -> wasmtime::Result<&mut [u8]> {
    memory
        .get_mut(at..)
        .and_then(|m| m.get_mut(..len))
        .ok_or_else(|| wasmtime::format_err!("a lowered value lies beyond the guest's memory"))
}

/// The transcript as a call lowers it (see [`TaskView`] and [`Utterances`]).
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct TranscriptView<'a> {
    agents: u32,
    turns: u32,
    utterances: Utterances<'a>,
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
            utterances: Utterances {
                items: &transcript.utterances,
                correctness: shown,
            },
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

/// A plan's prompts as a call lifts them (a WIT `list<prompt>`), straight into the host's
/// records.
///
/// The derived lifting looks the guest's memory up again for every prompt, message and
/// text (`Instance::options_memory_mut` and the list machinery around it were 7% of
/// debate's turn-3 plan in a profile), into [`PromptLift`]s converted after. Here a prompt
/// takes four lookups whatever its number of messages: its record; its messages' list;
/// a pass that checks every message (its role, where its text lies) and adds up the texts'
/// bytes, which are then charged to the call's budget for data copied out of the guest at
/// once, before anything is allocated; a pass that checks the texts are UTF-8 and copies
/// them. The checks and their errors are wasmtime's: a list or text out of the guest's
/// memory, a list not aligned, a role that is no `role`, text that is not UTF-8, the budget
/// exhausted (charged the same amounts); only which error a plan with several faults
/// reports may differ (roles and bounds are checked before any text). The UTF-8 check is
/// `simdutf8`'s (wasmtime's `core::str::from_utf8` took 73 ns for 1.6 KB of text on this
/// project's 2-core Xeon, `simdutf8` 15 ns; a turn-3 plan returns 24 KB). Components whose
/// strings are not UTF-8 (the canonical ABI allows UTF-16 and Latin-1) are lifted through
/// [`PromptLift`].
pub(crate) struct Plan(pub(crate) Vec<t::Prompt>);

/// Where each field of a `prompt` and of a `chat-message` lies: `agent` u32 at 0, then the
/// messages' (pointer, length) at 4; `role` (an enum of three cases: one byte) at 0, then
/// the content's (pointer, length) at 4. Both 12 bytes, aligned to 4.
mod plan_layout {
    pub const AGENT: usize = 0;
    pub const MESSAGES: usize = 4;
    pub const ROLE: usize = 0;
    pub const CONTENT: usize = 4;
    pub const SIZE: usize = 12;
    pub const ALIGN: usize = 4;
}
const _: () = assert!(
    <PromptLift as ComponentType>::SIZE32 == plan_layout::SIZE
        && <PromptLift as ComponentType>::ALIGN32 as usize == plan_layout::ALIGN
        && <MessageLift as ComponentType>::SIZE32 == plan_layout::SIZE
        && <MessageLift as ComponentType>::ALIGN32 as usize == plan_layout::ALIGN,
    "the prompt or chat-message record's layout changed: update `plan_layout`"
);

// SAFETY: a list's flat form and ABI (a pointer and a length), as wasmtime's `Vec<T>`; the
// type check is `Vec<PromptLift>`'s, and `lift` reads that record's layout.
unsafe impl ComponentType for Plan {
    type Lower = [ValRaw; 2];

    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <Vec<PromptLift> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: reads only what the type check admits, within the guest's memory.
unsafe impl Lift for Plan {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &[ValRaw; 2],
    ) -> wasmtime::Result<Self> {
        if cx.options().string_encoding != StringEncoding::Utf8 {
            return Vec::<PromptLift>::linear_lift_from_flat(cx, ty, src).map(Plan::from);
        }
        Plan::lift(cx, src[0].get_u32() as usize, src[1].get_u32() as usize)
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        if cx.options().string_encoding != StringEncoding::Utf8 {
            return Vec::<PromptLift>::linear_lift_from_memory(cx, ty, bytes).map(Plan::from);
        }
        Plan::lift(cx, word(bytes, 0) as usize, word(bytes, 4) as usize)
    }
}

impl From<Vec<PromptLift>> for Plan {
    fn from(prompts: Vec<PromptLift>) -> Self {
        Plan(prompts.into_iter().map(t::Prompt::from).collect())
    }
}

/// The little-endian u32 at `at` of `bytes`, which the caller has sized.
fn word(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks a list of `len` 12-byte records at `ptr` as wasmtime's `WasmList::new` does
/// (within memory, aligned) and charges its host-side size, `host_size` bytes a record, to
/// the call's data budget.
fn guest_list(
    cx: &mut LiftContext<'_>,
    ptr: usize,
    len: usize,
    host_size: usize,
) -> wasmtime::Result<()> {
    match len
        .checked_mul(plan_layout::SIZE)
        .and_then(|n| ptr.checked_add(n))
    {
        Some(end) if end <= cx.memory().len() => cx.consume_fuel_array(len, host_size)?,
        _ => wasmtime::bail!("list pointer/length out of bounds of memory"),
    }
    if !ptr.is_multiple_of(plan_layout::ALIGN) {
        wasmtime::bail!("list pointer is not aligned");
    }
    Ok(())
}

impl Plan {
    fn lift(cx: &mut LiftContext<'_>, ptr: usize, len: usize) -> wasmtime::Result<Plan> {
        use plan_layout as at;
        guest_list(cx, ptr, len, std::mem::size_of::<PromptLift>())?;
        let mut prompts = Vec::with_capacity(len);
        for i in 0..len {
            let record = ptr + i * at::SIZE;
            let (agent, messages, count) = {
                let memory = cx.memory();
                let r = &memory[record..record + at::SIZE];
                (
                    word(r, at::AGENT),
                    word(r, at::MESSAGES) as usize,
                    word(r, at::MESSAGES + 4) as usize,
                )
            };
            guest_list(cx, messages, count, std::mem::size_of::<MessageLift>())?;
            // The roles and where the texts lie, and their bytes (charged before copying).
            let mut bytes = 0usize;
            {
                let memory = cx.memory();
                for m in 0..count {
                    let r = &memory[messages + m * at::SIZE..][..at::SIZE];
                    role(r[at::ROLE])?;
                    let (text, text_len) = (
                        word(r, at::CONTENT) as usize,
                        word(r, at::CONTENT + 4) as usize,
                    );
                    match text.checked_add(text_len) {
                        Some(end) if end <= memory.len() => {}
                        _ => wasmtime::bail!("string pointer/length out of bounds of memory"),
                    }
                    bytes = bytes.saturating_add(text_len);
                }
            }
            cx.consume_fuel(bytes)?;
            let memory = cx.memory();
            let mut lifted = Vec::with_capacity(count);
            for m in 0..count {
                let r = &memory[messages + m * at::SIZE..][..at::SIZE];
                let text = word(r, at::CONTENT) as usize;
                let text = &memory[text..][..word(r, at::CONTENT + 4) as usize];
                lifted.push(t::ChatMessage {
                    role: role(r[at::ROLE])?,
                    content: utf8(text)?.to_owned(),
                });
            }
            prompts.push(t::Prompt {
                agent,
                messages: lifted,
            });
        }
        Ok(Plan(prompts))
    }
}

/// The host's role for a WIT `role`'s discriminant; wasmtime's error for one that is none.
fn role(discriminant: u8) -> wasmtime::Result<t::Role> {
    const SYSTEM: u8 = wit::Role::System as u8;
    const USER: u8 = wit::Role::User as u8;
    const ASSISTANT: u8 = wit::Role::Assistant as u8;
    Ok(match discriminant {
        SYSTEM => t::Role::System,
        USER => t::Role::User,
        ASSISTANT => t::Role::Assistant,
        other => wasmtime::bail!("unexpected discriminant: {other}"),
    })
}

/// `bytes` as text, checked with `simdutf8`; wasmtime's error (where the bytes stop being
/// UTF-8) when they are not.
fn utf8(bytes: &[u8]) -> wasmtime::Result<&str> {
    simdutf8::basic::from_utf8(bytes).map_err(|_| {
        std::str::from_utf8(bytes)
            .err()
            .map(wasmtime::Error::from)
            .unwrap_or_else(|| wasmtime::format_err!("invalid UTF-8"))
    })
}

/// A prompt as a plan's call lifts it when its strings are not UTF-8 (see [`Plan`]). Field
/// names, order and types are checked against the WIT record when an instance is made.
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct PromptLift {
    agent: u32,
    messages: Vec<MessageLift>,
}

/// A chat message as a plan's call lifts it (see [`PromptLift`]).
#[derive(ComponentType, Lift)]
#[component(record)]
pub(crate) struct MessageLift {
    role: wit::Role,
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
