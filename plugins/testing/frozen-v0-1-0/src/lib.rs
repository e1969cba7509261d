//! TEST FIXTURE: a verifier built only from the frozen copy of the contract as released at
//! 0.1.0 (`wit/since_v0.1.0/`), with raw wit-bindgen bindings and nothing shared with the
//! reference plugins. The host must keep loading it as the contract grows: see
//! `tests/contract.rs`.
//!
//! Its answer is the response, trimmed; it is right when that equals the reference,
//! trimmed. It logs one line at configure time, so the host import is exercised too.

mod bindings {
    wit_bindgen::generate!({
        world: "verifier",
        path: "../../../wit/since_v0.1.0",
    });
}

use bindings::exports::maporl::plugin::verification::Guest;
use bindings::maporl::plugin::host::{log, Level};
use bindings::maporl::plugin::types::{Task, Verdict};

struct Frozen;

impl Guest for Frozen {
    fn configure(_settings: String) -> Result<(), String> {
        log(Level::Info, "built against maporl:plugin@0.1.0 as frozen");
        Ok(())
    }

    fn extract(_task: Task, text: String) -> Result<Option<String>, String> {
        let answer = text.trim();
        Ok((!answer.is_empty()).then(|| answer.to_string()))
    }

    fn score(task: Task, responses: Vec<String>) -> Result<Vec<Verdict>, String> {
        Ok(responses
            .iter()
            .map(|text| {
                let answer = text.trim().to_string();
                let correct = !answer.is_empty() && answer == task.reference.trim();
                Verdict {
                    answer: (!answer.is_empty()).then_some(answer),
                    score: if correct { 1.0 } else { 0.0 },
                    correct,
                }
            })
            .collect())
    }
}

#[cfg(target_arch = "wasm32")]
bindings::export!(Frozen with_types_in bindings);
