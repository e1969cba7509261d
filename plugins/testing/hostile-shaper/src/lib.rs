//! TEST FIXTURE: a reward-shaper component that misbehaves according to `task.question`;
//! see plugins/testing/README.md. Normally each utterance's reward is its score, with one
//! part ("score", score).

use maporl_hostile_common::{misbehave, Outcome};
use maporl_plugin::{Reward, Task, Transcript};

/// The fixture's name in messages.
pub const PLUGIN: &str = "hostile-shaper";

fn one(turn: u32, agent: u32, name: &str, value: f32) -> Reward {
    Reward {
        turn,
        agent,
        total: value,
        parts: vec![(name.to_string(), value)],
    }
}

/// `shape`; the bool says whether it behaved normally.
pub fn shape(task: &Task, transcript: &Transcript) -> Result<(Vec<Reward>, bool), String> {
    let normal = || -> Vec<Reward> {
        transcript
            .utterances
            .iter()
            .map(|u| one(u.turn, u.agent, "score", u.score))
            .collect()
    };
    match task.question.trim() {
        "bad-agent" => Ok((vec![one(1, 99, "score", 0.0)], false)),
        "bad-turn" => Ok((vec![one(99, 0, "score", 0.0)], false)),
        // Finite, but far past any sane reward.
        "huge-reward" => Ok((vec![one(1, 0, "score", 1e30)], false)),
        "huge-part" => {
            let mut r = one(1, 0, "score", 0.5);
            r.parts.push(("bonus".into(), -3e9));
            Ok((vec![r], false))
        }
        // Part lists and names the host must not keep: more parts than the default bound,
        // a name over the default length bound, a name over the call's data budget.
        "many-parts" => {
            let mut r = one(1, 0, "score", 0.5);
            r.parts = (0..1_000).map(|i| (format!("part{i}"), 0.0)).collect();
            Ok((vec![r], false))
        }
        "long-part-name" => Ok((vec![one(1, 0, &"n".repeat(200), 0.5)], false)),
        "huge-part-name" => Ok((vec![one(1, 0, &"n".repeat(20 << 20), 0.5)], false)),
        "nan" => Ok((
            normal()
                .into_iter()
                .map(|mut r| {
                    r.total = f32::NAN;
                    r
                })
                .collect(),
            false,
        )),
        mode => match misbehave(mode) {
            Outcome::Normal => Ok((normal(), true)),
            Outcome::Output(out) => Ok((
                transcript
                    .utterances
                    .iter()
                    .map(|u| one(u.turn, u.agent, &out, 0.0))
                    .collect(),
                false,
            )),
            Outcome::Error(e) => Err(e),
        },
    }
}

mod bindings {
    wit_bindgen::generate!({
        world: "reward-shaper",
        path: "../../../wit",
        with: { "maporl:plugin/types@0.2.0": maporl_plugin::wit::types },
    });
}

use bindings::maporl::plugin::host::{log, Level};

struct Hostile;

impl bindings::exports::maporl::plugin::reward_shaping::Guest for Hostile {
    fn configure(settings: String) -> Result<(), String> {
        if maporl_hostile_common::configure(PLUGIN, &settings)? {
            log(
                Level::Info,
                &format!("{PLUGIN}: configure: behaving normally"),
            );
        }
        Ok(())
    }

    fn shape(task: Task, transcript: Transcript) -> Result<Vec<Reward>, String> {
        let (rewards, normal) = shape(&task, &transcript)?;
        if normal {
            log(
                Level::Info,
                &format!(
                    "{PLUGIN}: shape: behaving normally ({} rewards)",
                    rewards.len()
                ),
            );
        }
        Ok(rewards)
    }
}

#[cfg(target_arch = "wasm32")]
bindings::export!(Hostile with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{task, transcript, utt};

    fn tr() -> Transcript {
        transcript(
            2,
            1,
            vec![utt(1, 0, "", None, 0.25), utt(1, 1, "", None, 1.0)],
        )
    }

    #[test]
    fn behaves_normally_on_other_questions() {
        let (r, normal) = shape(&task("x", "q", "4"), &tr()).unwrap();
        assert!(normal);
        assert_eq!(
            r.iter()
                .map(|r| (r.turn, r.agent, r.total))
                .collect::<Vec<_>>(),
            vec![(1, 0, 0.25), (1, 1, 1.0)]
        );
        assert_eq!(r[0].parts, vec![("score".to_string(), 0.25)]);
    }

    #[test]
    fn world_specific_misbehaviours() {
        assert_eq!(
            shape(&task("x", "bad-agent", ""), &tr()).unwrap().0[0].agent,
            99
        );
        assert_eq!(
            shape(&task("x", "bad-turn", ""), &tr()).unwrap().0[0].turn,
            99
        );
        let (r, _) = shape(&task("x", "nan", ""), &tr()).unwrap();
        assert!(!r.is_empty() && r.iter().all(|r| r.total.is_nan()));
        match shape(&task("x", "read-file", ""), &tr()) {
            Ok((r, _)) => assert!(r[0].parts[0].0.starts_with("read-file: ")),
            Err(e) => assert!(e.starts_with("read-file /etc/passwd: ")),
        }
    }
}
