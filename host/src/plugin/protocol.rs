//! A collaboration protocol plugin: who speaks at each turn, what they see, and the team's
//! answer after a turn.

use std::collections::HashSet;
use std::path::Path;

use wasmtime::component::{ComponentExportIndex, InstancePre};
use wasmtime::Store;

use super::bindings::{
    export_index, Configure, Export, PromptLift, Signature, TaskView, TranscriptView,
};
use super::handle::{Handle, Identity, WorldBindings};
use super::sandbox::{Limits, Sandbox};
use super::{Failure, PluginError, Runtime, World};
use crate::transcript::{Prompt, Task, Transcript};

/// `plan-turn(task, turn, transcript) -> result<list<prompt>, string>`.
pub(crate) struct PlanTurn;

impl Signature for PlanTurn {
    type Params<'a> = (TaskView<'a>, u32, TranscriptView<'a>);
    type Results = (Result<Vec<PromptLift>, String>,);
}

/// `decide(task, turn, transcript) -> result<list<string>, string>`.
pub(crate) struct Decide;

impl Signature for Decide {
    type Params<'a> = (TaskView<'a>, u32, TranscriptView<'a>);
    type Results = (Result<Vec<String>, String>,);
}

/// A protocol's instance: `configure`, and the calls of a debate, which lower the host's
/// records without copying them first.
pub(crate) struct Exports {
    configure: Export<Configure>,
    plan_turn: Export<PlanTurn>,
    decide: Export<Decide>,
}

/// A protocol component ready to instantiate, its exports found once.
#[derive(Clone)]
pub(crate) struct ExportsPre {
    pre: InstancePre<Sandbox>,
    configure: ComponentExportIndex,
    plan_turn: ComponentExportIndex,
    decide: ComponentExportIndex,
}

impl WorldBindings for Exports {
    type Pre = ExportsPre;
    const WORLD: World = World::Protocol;
    fn pre(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self::Pre> {
        Ok(ExportsPre {
            configure: export_index::<Configure>(&pre, Self::WORLD, "configure")?,
            plan_turn: export_index::<PlanTurn>(&pre, Self::WORLD, "plan-turn")?,
            decide: export_index::<Decide>(&pre, Self::WORLD, "decide")?,
            pre,
        })
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<Sandbox>) -> wasmtime::Result<Self> {
        let instance = pre.pre.instantiate(&mut *store)?;
        Ok(Exports {
            configure: Export::load(store, &instance, &pre.configure)?,
            plan_turn: Export::load(store, &instance, &pre.plan_turn)?,
            decide: Export::load(store, &instance, &pre.decide)?,
        })
    }
    fn configure(
        &self,
        store: &mut Store<Sandbox>,
        settings: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        self.configure.call(store, (settings,)).map(|(r,)| r)
    }
}

/// A loaded protocol plugin.
pub struct Protocol {
    handle: Handle<Exports>,
}

impl Protocol {
    /// Loads the component at `path`, checks it implements world `protocol`, and configures
    /// it with `settings`.
    pub fn load(
        runtime: &Runtime,
        path: &Path,
        settings: &serde_json::Value,
        limits: &Limits,
    ) -> Result<Protocol, PluginError> {
        Ok(Protocol {
            handle: Handle::new(runtime, path, settings, limits)?,
        })
    }

    pub fn identity(&self) -> &Identity {
        &self.handle.identity
    }

    /// Fuel used by the last call.
    pub fn fuel_used(&self) -> u64 {
        self.handle.fuel_used()
    }

    /// A fresh instance whose randomness is seeded by `epoch` (e.g. a training step).
    pub fn restart(&mut self, epoch: u64) -> Result<(), PluginError> {
        self.handle.restart(epoch)
    }

    /// The plan for turn `turn` (1-based): who speaks and what each sees. Empty when the
    /// protocol ends the debate early.
    pub fn plan_turn(
        &mut self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<Prompt>, PluginError> {
        let plan = self.handle.call("plan-turn", Some(&task.id), |p, store| {
            let params = (
                TaskView::without_reference(task),
                turn,
                TranscriptView::without_correctness(transcript),
            );
            p.plan_turn.call(store, params).map(|(plan,)| plan)
        })?;
        let plan: Vec<Prompt> = plan.into_iter().map(Prompt::from).collect();
        validate_plan(
            &plan,
            transcript.agents,
            self.handle.limits().max_prompt_bytes,
        )
        .map_err(|msg| {
            self.handle
                .error("plan-turn", Some(&task.id), Failure::Invalid(msg))
        })?;
        Ok(plan)
    }

    /// The error for a result of `function` on `task` that the run refuses after the call
    /// (a prompt the agent's model cannot read), named like the call's own errors.
    pub fn refuse(&self, function: &'static str, task: &Task, reason: String) -> PluginError {
        self.handle
            .error(function, Some(&task.id), Failure::Invalid(reason))
    }

    /// The team's answer after turn `turn`: the most supported answers (several on a tie),
    /// none when no agent gave a valid answer.
    pub fn decide(
        &mut self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<String>, PluginError> {
        let answers = self.handle.call("decide", Some(&task.id), |p, store| {
            let params = (
                TaskView::without_reference(task),
                turn,
                TranscriptView::without_correctness(transcript),
            );
            p.decide.call(store, params).map(|(answers,)| answers)
        })?;
        validate_decision(&answers, turn, transcript).map_err(|msg| {
            self.handle
                .error("decide", Some(&task.id), Failure::Invalid(msg))
        })?;
        Ok(answers)
    }
}

/// The team's answer must be one an agent gave by that turn (else the team would be
/// credited with an answer nobody said; a protocol may weigh earlier turns' answers, as
/// round-robin does), each at most once, no more of them than agents.
fn validate_decision(answers: &[String], turn: u32, transcript: &Transcript) -> Result<(), String> {
    if answers.len() > transcript.agents as usize {
        return Err(format!(
            "decided {} answers at turn {turn}, more than the team's {} agents",
            answers.len(),
            transcript.agents
        ));
    }
    let given = || {
        transcript
            .utterances
            .iter()
            .filter(move |u| u.turn <= turn)
            .filter_map(|u| u.answer.as_deref())
    };
    // A decision is a few answers over a few dozen utterances, checked after every turn of
    // every debate: scans, where a set hashed every answer of the transcript on every call.
    // Past that (a huge team, or a plugin deciding many answers), sets.
    let scan = answers.len().saturating_mul(transcript.utterances.len()) <= 4_096;
    let given_set: Option<HashSet<&str>> = (!scan).then(|| given().collect());
    let mut seen = HashSet::new();
    for (i, a) in answers.iter().enumerate() {
        let was_given = match &given_set {
            Some(set) => set.contains(a.as_str()),
            None => given().any(|g| g == a),
        };
        if !was_given {
            let mut theirs: Vec<&str> = given().collect();
            theirs.sort_unstable();
            theirs.dedup();
            return Err(format!(
                "answer {i} ({:?}) was given by no agent up to turn {turn} (their answers: {:?})",
                shorten(a),
                theirs.iter().map(|g| shorten(g)).collect::<Vec<_>>()
            ));
        }
        let twice = if scan {
            answers[..i].contains(a)
        } else {
            !seen.insert(a.as_str())
        };
        if twice {
            return Err(format!("answer {:?} is decided twice", shorten(a)));
        }
    }
    Ok(())
}

/// At most 80 characters of `s`, for messages.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((cut, _)) => format!("{}...", &s[..cut]),
        None => s.to_string(),
    }
}

fn validate_plan(plan: &[Prompt], agents: u32, max_bytes: u64) -> Result<(), String> {
    // Who speaks twice: a scan for a few prompts (every turn of every debate), a set beyond.
    let scan = plan.len() <= 64;
    let mut seen = HashSet::new();
    for (i, prompt) in plan.iter().enumerate() {
        let bytes: usize = prompt.messages.iter().map(|m| m.content.len()).sum();
        if bytes as u64 > max_bytes {
            return Err(format!(
                "prompt {i} for agent {} holds {bytes} bytes of messages, over the limit of \
                 {max_bytes} (limits.max_prompt_bytes)",
                prompt.agent
            ));
        }
        if prompt.agent >= agents {
            return Err(format!(
                "prompt {i} is for agent {}, but the team has {agents} agents (0..{})",
                prompt.agent,
                agents.saturating_sub(1)
            ));
        }
        let twice = if scan {
            plan[..i].iter().any(|p| p.agent == prompt.agent)
        } else {
            !seen.insert(prompt.agent)
        };
        if twice {
            return Err(format!(
                "agent {} is planned to speak twice in one turn (prompt {i})",
                prompt.agent
            ));
        }
        if prompt.messages.is_empty() {
            return Err(format!(
                "prompt {i} for agent {} has no messages",
                prompt.agent
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{ChatMessage, Role};

    fn prompt(agent: u32) -> Prompt {
        Prompt {
            agent,
            messages: vec![ChatMessage {
                role: Role::User,
                content: "q".into(),
            }],
        }
    }

    #[test]
    fn plans_are_checked_against_the_team() {
        assert!(validate_plan(&[prompt(0), prompt(1)], 2, 1 << 20).is_ok());
        assert!(validate_plan(&[], 2, 1 << 20).is_ok());
        let err = validate_plan(&[prompt(0), prompt(2)], 2, 1 << 20).unwrap_err();
        assert!(err.contains("agent 2") && err.contains("2 agents"), "{err}");
        let err = validate_plan(&[prompt(1), prompt(1)], 3, 1 << 20).unwrap_err();
        assert!(err.contains("twice"), "{err}");
        // Past the scan, the set: the same verdicts.
        let mut many: Vec<Prompt> = (0..70).map(prompt).collect();
        assert!(validate_plan(&many, 70, 1 << 20).is_ok());
        many.push(prompt(5));
        let err = validate_plan(&many, 70, 1 << 20).unwrap_err();
        assert!(
            err.contains("agent 5") && err.contains("prompt 70"),
            "{err}"
        );
        let empty = Prompt {
            agent: 0,
            messages: vec![],
        };
        assert!(validate_plan(&[empty], 1, 1 << 20)
            .unwrap_err()
            .contains("no messages"));
        // One byte over the limit, across two messages.
        let mut long = prompt(0);
        long.messages.push(long.messages[0].clone());
        assert!(validate_plan(&[long.clone()], 1, 2).is_ok());
        let err = validate_plan(&[long], 1, 1).unwrap_err();
        assert!(
            err.contains("2 bytes") && err.contains("max_prompt_bytes"),
            "{err}"
        );
    }

    #[test]
    fn decisions_are_answers_the_agents_gave_by_that_turn() {
        use crate::transcript::Utterance;
        let mut t = Transcript::new(3, 2);
        for (turn, agent, answer) in [(1, 0, "5"), (1, 1, "6"), (1, 2, "5"), (2, 0, "7")] {
            t.utterances.push(Utterance {
                turn,
                agent,
                text: String::new(),
                answer: Some(answer.into()),
                score: 0.0,
                correct: false,
            });
        }
        let ok = |a: &[&str], turn| {
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            validate_decision(&a, turn, &t)
        };
        assert!(ok(&["5"], 1).is_ok() && ok(&["5", "6"], 1).is_ok() && ok(&[], 1).is_ok());
        assert!(
            ok(&["7"], 2).is_ok() && ok(&["5", "7"], 2).is_ok(),
            "earlier turns count"
        );
        for (answers, turn, needle) in [
            (&["42"][..], 1, "no agent"),
            (&["7"][..], 1, "no agent"),
            (&["5", "5"][..], 1, "twice"),
            (&["5", "6", "5", "6"][..], 1, "more than"),
        ] {
            let err = ok(answers, turn).unwrap_err();
            assert!(err.contains(needle), "{answers:?} at {turn}: {err}");
        }
        // Their answers are listed sorted, once each.
        let err = ok(&["42"], 2).unwrap_err();
        assert!(err.contains(r#"(their answers: ["5", "6", "7"])"#), "{err}");

        // A transcript long enough for the sets (later turns, which do not count, pad it):
        // the same verdicts.
        let mut long = t.clone();
        long.turns = 5_000;
        for turn in 3..5_000 {
            long.utterances.push(Utterance {
                turn,
                agent: 0,
                text: String::new(),
                answer: Some("99".into()),
                score: 0.0,
                correct: false,
            });
        }
        assert!(long.utterances.len() > 4_096);
        let ok_long = |a: &[&str], turn| {
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            validate_decision(&a, turn, &long)
        };
        for (answers, turn) in [
            (&["5"][..], 1),
            (&["5", "6"][..], 1),
            (&["5", "7"][..], 2),
            (&["42"][..], 1),
            (&["7"][..], 1),
            (&["99"][..], 2),
            (&["5", "5"][..], 1),
            (&["5", "6", "5", "6"][..], 1),
        ] {
            assert_eq!(
                ok_long(answers, turn),
                ok(answers, turn),
                "{answers:?} at {turn}"
            );
        }
        assert!(ok_long(&["99"], 3).is_ok());
    }
}
