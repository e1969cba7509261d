//! A collaboration protocol plugin: who speaks at each turn, what they see, and the team's
//! answer after a turn.

use std::collections::HashSet;
use std::path::Path;

use wasmtime::component::InstancePre;
use wasmtime::Store;

use super::bindings::{protocol as b, wit};
use super::handle::{Handle, Identity, WorldBindings};
use super::sandbox::{Limits, Sandbox};
use super::{Failure, PluginError, Runtime, World};
use crate::transcript::{Prompt, Task, Transcript};

impl WorldBindings for b::Protocol {
    type Pre = b::ProtocolPre<Sandbox>;
    const WORLD: World = World::Protocol;
    fn pre(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self::Pre> {
        b::ProtocolPre::new(pre)
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<Sandbox>) -> wasmtime::Result<Self> {
        pre.instantiate(store)
    }
    fn configure(
        &self,
        store: &mut Store<Sandbox>,
        settings: &str,
    ) -> wasmtime::Result<Result<(), String>> {
        self.maporl_plugin_collaboration()
            .call_configure(store, settings)
    }
}

/// A loaded protocol plugin.
pub struct Protocol {
    handle: Handle<b::Protocol>,
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
        let (wtask, wtranscript) = (without_reference(task), wit::Transcript::from(transcript));
        let plan = self.handle.call("plan-turn", Some(&task.id), |p, store| {
            p.maporl_plugin_collaboration()
                .call_plan_turn(store, &wtask, turn, &wtranscript)
        })?;
        let plan: Vec<Prompt> = plan.into_iter().map(Prompt::from).collect();
        validate_plan(&plan, transcript.agents).map_err(|msg| {
            self.handle
                .error("plan-turn", Some(&task.id), Failure::Invalid(msg))
        })?;
        Ok(plan)
    }

    /// The team's answer after turn `turn`: the most supported answers (several on a tie),
    /// none when no agent gave a valid answer.
    pub fn decide(
        &mut self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<String>, PluginError> {
        let (wtask, wtranscript) = (without_reference(task), wit::Transcript::from(transcript));
        self.handle.call("decide", Some(&task.id), |p, store| {
            p.maporl_plugin_collaboration()
                .call_decide(store, &wtask, turn, &wtranscript)
        })
    }
}

/// The task as a protocol sees it: without the gold answer, which must never reach a prompt.
fn without_reference(task: &Task) -> wit::Task {
    wit::Task {
        reference: String::new(),
        ..wit::Task::from(task)
    }
}

fn validate_plan(plan: &[Prompt], agents: u32) -> Result<(), String> {
    let mut seen = HashSet::new();
    for (i, prompt) in plan.iter().enumerate() {
        if prompt.agent >= agents {
            return Err(format!(
                "prompt {i} is for agent {}, but the team has {agents} agents (0..{})",
                prompt.agent,
                agents.saturating_sub(1)
            ));
        }
        if !seen.insert(prompt.agent) {
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
        assert!(validate_plan(&[prompt(0), prompt(1)], 2).is_ok());
        assert!(validate_plan(&[], 2).is_ok());
        let err = validate_plan(&[prompt(0), prompt(2)], 2).unwrap_err();
        assert!(err.contains("agent 2") && err.contains("2 agents"), "{err}");
        let err = validate_plan(&[prompt(1), prompt(1)], 3).unwrap_err();
        assert!(err.contains("twice"), "{err}");
        let empty = Prompt {
            agent: 0,
            messages: vec![],
        };
        assert!(validate_plan(&[empty], 1)
            .unwrap_err()
            .contains("no messages"));
    }
}
