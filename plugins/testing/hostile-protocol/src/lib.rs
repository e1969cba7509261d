//! TEST FIXTURE: a protocol component that misbehaves according to `task.question`; see
//! plugins/testing/README.md. Normally every agent answers at every turn with the question
//! as the only message, and `decide` returns the first agent's answer at the turn.

use maporl_hostile_common::{misbehave, Outcome};
use maporl_plugin::prompts::message;
use maporl_plugin::transcript::at_turn;
use maporl_plugin::{Prompt, Role, Task, Transcript};

/// The fixture's name in messages.
pub const PLUGIN: &str = "hostile-protocol";

fn prompt(agent: u32, content: &str) -> Prompt {
    Prompt {
        agent,
        messages: vec![message(Role::User, content)],
    }
}

/// `plan-turn`; the bool says whether it behaved normally (the glue then logs).
pub fn plan(task: &Task, transcript: &Transcript) -> Result<(Vec<Prompt>, bool), String> {
    let everyone = |content: &str| (0..transcript.agents).map(|a| prompt(a, content)).collect();
    match task.question.trim() {
        "bad-plan" => Ok((vec![prompt(99, &task.question)], false)),
        // No speaker at all: the debate ends before turn 1, with no answer.
        "silent" => Ok((Vec::new(), false)),
        "duplicate-agent" => Ok((
            vec![prompt(0, &task.question), prompt(0, &task.question)],
            false,
        )),
        // 8 MiB of prompt: far past what a model could read.
        "huge-prompt" => Ok((everyone(&"x".repeat(8 << 20)), false)),
        // 64 KiB of prompt: under the byte bound, some 32k tokens, past a small model's
        // context.
        "long-prompt" => Ok((everyone(&" x".repeat(32 << 10)), false)),
        // The question, then every utterance's text, one message each, roles in turn: what
        // the host lifts.
        "echo-texts" => {
            let roles = [Role::System, Role::User, Role::Assistant];
            let texts = transcript.utterances.iter().map(|u| u.text.as_str());
            let messages = std::iter::once(message(Role::User, task.question.as_str()))
                .chain(
                    texts
                        .zip(roles.iter().cycle())
                        .map(|(t, role)| message(*role, t)),
                )
                .collect();
            Ok((vec![Prompt { agent: 0, messages }], false))
        }
        // A message whose bytes are not UTF-8, which safe Rust cannot make.
        "invalid-utf8" => {
            // SAFETY: this breaks `String`'s UTF-8 invariant on purpose (the point is text
            // the host must refuse); nothing here reads it as text: it is copied and handed
            // over as bytes by the canonical ABI.
            let bad = unsafe { String::from_utf8_unchecked(vec![b'o', b'k', 0xff, b'!']) };
            Ok((vec![prompt(0, "fine"), prompt(1, &bad)], false))
        }
        mode => match misbehave(mode) {
            Outcome::Normal => Ok((everyone(&task.question), true)),
            Outcome::Output(text) => Ok((everyone(&text), false)),
            Outcome::Error(e) => Err(e),
        },
    }
}

/// `decide`: the first answer given at `turn`; the bool says whether it behaved normally.
pub fn decide(
    task: &Task,
    turn: u32,
    transcript: &Transcript,
) -> Result<(Vec<String>, bool), String> {
    let first = at_turn(transcript, turn)
        .next()
        .and_then(|u| u.answer.clone())
        .unwrap_or_default();
    match task.question.trim() {
        // An answer nobody gave, one answer twice, more answers than agents.
        "foreign-answer" => return Ok((vec!["424242".into()], false)),
        "duplicate-answer" => return Ok((vec![first.clone(), first], false)),
        "many-answers" => return Ok((vec![first; 10_000], false)),
        // Tells what it was given that only the grader should know.
        "report-correct" => {
            let correct: Vec<bool> = transcript.utterances.iter().map(|u| u.correct).collect();
            return Err(format!(
                "report-correct: correct {correct:?}, reference {:?}",
                task.reference
            ));
        }
        // Tells every field of every utterance it was given: what the host lowered.
        "report-transcript" => {
            let said: Vec<String> = transcript
                .utterances
                .iter()
                .map(|u| {
                    format!(
                        "{}/{}/{:?}/{:?}/{:08x}/{}",
                        u.turn,
                        u.agent,
                        u.text,
                        u.answer,
                        u.score.to_bits(),
                        u.correct
                    )
                })
                .collect();
            return Err(format!(
                "report-transcript: agents {} turns {} [{}]",
                transcript.agents,
                transcript.turns,
                said.join("; ")
            ));
        }
        _ => {}
    }
    match misbehave(&task.question) {
        Outcome::Normal => Ok((
            at_turn(transcript, turn)
                .next()
                .and_then(|u| u.answer.clone())
                .into_iter()
                .collect(),
            true,
        )),
        Outcome::Output(text) => Ok((vec![text], false)),
        Outcome::Error(e) => Err(e),
    }
}

mod bindings {
    wit_bindgen::generate!({
        world: "protocol",
        path: "../../../wit",
        with: { "maporl:plugin/types@0.2.0": maporl_plugin::wit::types },
    });
}

use bindings::maporl::plugin::host::{log, Level};

struct Hostile;

impl bindings::exports::maporl::plugin::collaboration::Guest for Hostile {
    fn configure(settings: String) -> Result<(), String> {
        if maporl_hostile_common::configure(PLUGIN, &settings)? {
            log(
                Level::Info,
                &format!("{PLUGIN}: configure: behaving normally"),
            );
        }
        Ok(())
    }

    fn plan_turn(task: Task, turn: u32, transcript: Transcript) -> Result<Vec<Prompt>, String> {
        if task.question.trim() == "escape-log" {
            log(Level::Error, maporl_hostile_common::TERMINAL_ATTACK);
        }
        let (plan, normal) = plan(&task, &transcript)?;
        if normal {
            log(
                Level::Info,
                &format!("{PLUGIN}: plan-turn {turn}: behaving normally"),
            );
        }
        Ok(plan)
    }

    fn decide(task: Task, turn: u32, transcript: Transcript) -> Result<Vec<String>, String> {
        let (answers, normal) = decide(&task, turn, &transcript)?;
        if normal {
            log(
                Level::Info,
                &format!("{PLUGIN}: decide {turn}: behaving normally"),
            );
        }
        Ok(answers)
    }
}

#[cfg(target_arch = "wasm32")]
bindings::export!(Hostile with_types_in bindings);

#[cfg(test)]
mod tests {
    use super::*;
    use maporl_plugin::testing::{task, transcript, utt};

    #[test]
    fn behaves_normally_on_other_questions() {
        let tr = transcript(
            2,
            2,
            vec![utt(1, 0, "", Some("a"), 1.0), utt(1, 1, "", Some("b"), 0.0)],
        );
        let (p, normal) = plan(&task("x", "2+2?", "4"), &tr).unwrap();
        assert!(normal);
        assert_eq!(p.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(p[0].messages[0].content, "2+2?");
        assert_eq!(
            decide(&task("x", "q", "4"), 1, &tr).unwrap(),
            (vec!["a".to_string()], true)
        );
        assert!(decide(&task("x", "q", "4"), 2, &tr).unwrap().0.is_empty());
    }

    #[test]
    fn world_specific_misbehaviours() {
        let tr = transcript(2, 2, vec![]);
        let (p, _) = plan(&task("x", "bad-plan", ""), &tr).unwrap();
        assert_eq!(p[0].agent, 99);
        let (p, _) = plan(&task("x", "duplicate-agent", ""), &tr).unwrap();
        assert_eq!(p.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 0]);
        assert!(plan(&task("x", "env", ""), &tr)
            .unwrap_err()
            .starts_with("env: "));
        assert!(decide(&task("x", "clock", ""), 1, &tr)
            .unwrap_err()
            .starts_with("clock: "));
    }
}
