//! A reward-shaper plugin: turns a finished debate into one reward per utterance, each with
//! named parts.

use std::path::Path;

use wasmtime::component::{ComponentExportIndex, InstancePre};
use wasmtime::Store;

use super::bindings::{
    export_index, types, Configure, Export, Signature, TaskView, TranscriptView,
};
use super::handle::{Handle, Identity, WorldBindings};
use super::sandbox::{Limits, Sandbox};
use super::{Failure, PluginError, Runtime, World};
use crate::transcript::{Reward, Task, Transcript};

/// `shape(task, transcript) -> result<list<reward>, string>`.
pub(crate) struct Shape;

impl Signature for Shape {
    type Params<'a> = (TaskView<'a>, TranscriptView<'a>);
    type Results = (Result<Vec<types::Reward>, String>,);
}

/// A reward shaper's instance: `configure`, and `shape`, which lowers the host's records
/// without copying them first.
pub(crate) struct Exports {
    configure: Export<Configure>,
    shape: Export<Shape>,
}

/// A reward-shaper component ready to instantiate, its exports found once.
#[derive(Clone)]
pub(crate) struct ExportsPre {
    pre: InstancePre<Sandbox>,
    configure: ComponentExportIndex,
    shape: ComponentExportIndex,
}

impl WorldBindings for Exports {
    type Pre = ExportsPre;
    const WORLD: World = World::RewardShaper;
    fn pre(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self::Pre> {
        Ok(ExportsPre {
            configure: export_index::<Configure>(&pre, Self::WORLD, "configure")?,
            shape: export_index::<Shape>(&pre, Self::WORLD, "shape")?,
            pre,
        })
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<Sandbox>) -> wasmtime::Result<Self> {
        let instance = pre.pre.instantiate(&mut *store)?;
        Ok(Exports {
            configure: Export::load(store, &instance, &pre.configure)?,
            shape: Export::load(store, &instance, &pre.shape)?,
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

/// A loaded reward-shaper plugin.
pub struct RewardShaper {
    handle: Handle<Exports>,
}

impl RewardShaper {
    /// Loads the component at `path`, checks it implements world `reward-shaper`, and
    /// configures it with `settings`.
    pub fn load(
        runtime: &Runtime,
        path: &Path,
        settings: &serde_json::Value,
        limits: &Limits,
    ) -> Result<RewardShaper, PluginError> {
        Ok(RewardShaper {
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

    /// The rewards of a finished debate: at most one per utterance, each for an utterance
    /// that exists, every value finite.
    pub fn shape(
        &mut self,
        task: &Task,
        transcript: &Transcript,
    ) -> Result<Vec<Reward>, PluginError> {
        let rewards = self.handle.call("shape", Some(&task.id), |s, store| {
            let params = (TaskView::of(task), TranscriptView::of(transcript));
            s.shape.call(store, params).map(|(rewards,)| rewards)
        })?;
        let rewards: Vec<Reward> = rewards.into_iter().map(Reward::from).collect();
        validate_rewards(&rewards, transcript, self.handle.limits()).map_err(|msg| {
            self.handle
                .error("shape", Some(&task.id), Failure::Invalid(msg))
        })?;
        Ok(rewards)
    }
}

fn validate_rewards(
    rewards: &[Reward],
    transcript: &Transcript,
    limits: &Limits,
) -> Result<(), String> {
    let max_abs = limits.max_abs_reward;
    // Which utterances have a reward already, by their place in the transcript: no hashing,
    // and no larger than the transcript the call was given.
    let mut seen = vec![false; transcript.utterances.len()];
    for (i, r) in rewards.iter().enumerate() {
        if r.agent >= transcript.agents {
            return Err(format!(
                "reward {i} is for agent {}, but the team has {} agents",
                r.agent, transcript.agents
            ));
        }
        if r.turn == 0 || r.turn > transcript.turns {
            return Err(format!(
                "reward {i} is for turn {}, but turns run from 1 to {}",
                r.turn, transcript.turns
            ));
        }
        let Some(at) = transcript
            .utterances
            .iter()
            .position(|u| u.turn == r.turn && u.agent == r.agent)
        else {
            return Err(format!(
                "reward {i} is for agent {} at turn {}, who said nothing then",
                r.agent, r.turn
            ));
        };
        if std::mem::replace(&mut seen[at], true) {
            return Err(format!(
                "agent {} at turn {} is rewarded twice (reward {i})",
                r.agent, r.turn
            ));
        }
        // Part names are kept in every step's metrics: bounded in number and length, and
        // names a person can read (no control characters).
        if r.parts.len() as u64 > limits.max_reward_parts {
            return Err(format!(
                "reward {i} (agent {}, turn {}) has {} parts, over limits.max_reward_parts = {}",
                r.agent,
                r.turn,
                r.parts.len(),
                limits.max_reward_parts
            ));
        }
        for (name, _) in &r.parts {
            if name.len() as u64 > limits.max_part_name_bytes {
                return Err(format!(
                    "reward {i} (agent {}, turn {}) has a part name of {} bytes, over \
                     limits.max_part_name_bytes = {}",
                    r.agent,
                    r.turn,
                    name.len(),
                    limits.max_part_name_bytes
                ));
            }
            if name.is_empty() || name.chars().any(char::is_control) {
                return Err(format!(
                    "reward {i} (agent {}, turn {}) has a part named `{name}`: a name is one \
                     or more characters, none of them a control character",
                    r.agent, r.turn
                ));
            }
        }
        if !r.total.is_finite() {
            return Err(format!(
                "reward {i} (agent {}, turn {}) has total {}",
                r.agent, r.turn, r.total
            ));
        }
        if let Some((name, value)) = r.parts.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!(
                "reward {i} (agent {}, turn {}) has part `{name}` = {value}",
                r.agent, r.turn
            ));
        }
        // Finite but absurd: PPO would overflow on it and turn every weight into NaN.
        let too_big = |v: f32| f64::from(v).abs() > max_abs;
        if too_big(r.total) {
            return Err(format!(
                "reward {i} (agent {}, turn {}) has total {}, beyond the limit of ±{max_abs} \
                 (limits.max_abs_reward)",
                r.agent, r.turn, r.total
            ));
        }
        if let Some((name, value)) = r.parts.iter().find(|(_, v)| too_big(*v)) {
            return Err(format!(
                "reward {i} (agent {}, turn {}) has part `{name}` = {value}, beyond the limit \
                 of ±{max_abs} (limits.max_abs_reward)",
                r.agent, r.turn
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Utterance;

    fn transcript() -> Transcript {
        let mut t = Transcript::new(2, 3);
        for turn in 1..=2 {
            for agent in 0..2 {
                t.utterances.push(Utterance {
                    turn,
                    agent,
                    text: String::new(),
                    answer: None,
                    score: 0.0,
                    correct: false,
                });
            }
        }
        t
    }

    fn reward(turn: u32, agent: u32, total: f32) -> Reward {
        Reward {
            turn,
            agent,
            total,
            parts: vec![("influence".into(), total)],
        }
    }

    fn validate_rewards_test(rewards: &[Reward], t: &Transcript) -> Result<(), String> {
        validate_rewards(rewards, t, &Limits::default())
    }

    fn with_max(max_abs_reward: f64) -> Limits {
        Limits {
            max_abs_reward,
            ..Limits::default()
        }
    }

    /// Part lists past either bound, names past the length bound, empty names and names
    /// with control characters (a terminal escape, a newline that would forge a line) are
    /// refused, each naming the reward and the key; names at the bounds pass.
    #[test]
    fn reward_parts_are_bounded_in_number_length_and_kind() {
        let t = transcript();
        let limits = Limits {
            max_reward_parts: 3,
            max_part_name_bytes: 8,
            ..Limits::default()
        };
        let with_parts = |names: &[&str]| Reward {
            turn: 1,
            agent: 0,
            total: 0.5,
            parts: names.iter().map(|n| (n.to_string(), 0.1)).collect(),
        };
        assert!(validate_rewards(&[with_parts(&["a", "bb", "12345678"])], &t, &limits).is_ok());
        for (names, expected) in [
            (&["a", "b", "c", "d"][..], "max_reward_parts = 3"),
            (&["123456789"][..], "max_part_name_bytes = 8"),
            (&["é1234567"][..], "max_part_name_bytes = 8"),
            (&[""][..], "control character"),
            (&["a\u{1b}[2J"][..], "control character"),
            (&["x\ny"][..], "control character"),
        ] {
            let err = validate_rewards(&[with_parts(names)], &t, &limits).unwrap_err();
            assert!(
                err.contains(expected) && err.contains("reward 0"),
                "{names:?}: {err}"
            );
        }
    }

    #[test]
    fn finite_but_absurd_rewards_are_refused_by_the_limit() {
        let t = transcript();
        assert!(validate_rewards(&[reward(1, 0, 999.0)], &t, &with_max(1_000.0)).is_ok());
        for total in [1_000.5, -2e3, 1e30, f32::MAX] {
            let err = validate_rewards(&[reward(1, 0, total)], &t, &with_max(1_000.0)).unwrap_err();
            assert!(err.contains("max_abs_reward"), "{err}");
        }
        let mut part = reward(1, 0, 0.5);
        part.parts.push(("alpha".into(), -5e6));
        let err = validate_rewards(&[part], &t, &with_max(1_000.0)).unwrap_err();
        assert!(
            err.contains("`alpha`") && err.contains("max_abs_reward"),
            "{err}"
        );
        assert!(validate_rewards(&[reward(1, 0, 5.0)], &t, &with_max(1.0)).is_err());
    }

    #[test]
    fn rewards_must_name_existing_utterances_once() {
        let t = transcript();
        assert!(validate_rewards_test(&[reward(1, 0, 0.5), reward(2, 1, 1.0)], &t).is_ok());
        assert!(validate_rewards_test(&[reward(1, 2, 0.5)], &t)
            .unwrap_err()
            .contains("agent 2"));
        assert!(validate_rewards_test(&[reward(4, 0, 0.5)], &t)
            .unwrap_err()
            .contains("turn 4"));
        assert!(validate_rewards_test(&[reward(0, 0, 0.5)], &t).is_err());
        // Turn 3 is allowed by the config but nobody spoke (the debate stopped early).
        assert!(validate_rewards_test(&[reward(3, 0, 0.5)], &t)
            .unwrap_err()
            .contains("said nothing"));
        let twice = [reward(1, 0, 0.5), reward(1, 0, 0.1)];
        assert!(validate_rewards_test(&twice, &t)
            .unwrap_err()
            .contains("twice"));
        assert!(validate_rewards_test(&[reward(1, 0, f32::NAN)], &t)
            .unwrap_err()
            .contains("NaN"));
        let mut bad_part = reward(1, 0, 0.5);
        bad_part.parts.push(("alpha-1".into(), f32::INFINITY));
        assert!(validate_rewards_test(&[bad_part], &t)
            .unwrap_err()
            .contains("alpha-1"));
    }
}
