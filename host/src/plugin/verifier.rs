//! A verifier plugin: reads the answer out of a response and scores it in [0, 1].

use std::path::Path;

use wasmtime::component::{ComponentExportIndex, InstancePre};
use wasmtime::Store;

use super::bindings::{export_index, types, Configure, Export, Signature, TaskView};
use super::handle::{Handle, Identity, WorldBindings};
use super::sandbox::{Limits, Sandbox};
use super::{Failure, PluginError, Runtime, World};
use crate::transcript::{Task, Verdict};

/// `extract(task, text) -> result<option<string>, string>`.
pub(crate) struct Extract;

impl Signature for Extract {
    type Params<'a> = (TaskView<'a>, &'a str);
    type Results = (Result<Option<String>, String>,);
}

/// `score(task, responses) -> result<list<verdict>, string>`.
pub(crate) struct Score;

impl Signature for Score {
    type Params<'a> = (TaskView<'a>, &'a [String]);
    type Results = (Result<Vec<types::Verdict>, String>,);
}

/// A verifier's instance: `configure`, and its calls, which lower the host's records
/// without copying them first.
pub(crate) struct Exports {
    configure: Export<Configure>,
    extract: Export<Extract>,
    score: Export<Score>,
}

/// A verifier component ready to instantiate, its exports found once.
#[derive(Clone)]
pub(crate) struct ExportsPre {
    pre: InstancePre<Sandbox>,
    configure: ComponentExportIndex,
    extract: ComponentExportIndex,
    score: ComponentExportIndex,
}

impl WorldBindings for Exports {
    type Pre = ExportsPre;
    const WORLD: World = World::Verifier;
    fn pre(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self::Pre> {
        Ok(ExportsPre {
            configure: export_index::<Configure>(&pre, Self::WORLD, "configure")?,
            extract: export_index::<Extract>(&pre, Self::WORLD, "extract")?,
            score: export_index::<Score>(&pre, Self::WORLD, "score")?,
            pre,
        })
    }
    fn instantiate(pre: &Self::Pre, store: &mut Store<Sandbox>) -> wasmtime::Result<Self> {
        let instance = pre.pre.instantiate(&mut *store)?;
        Ok(Exports {
            configure: Export::load(store, &instance, &pre.configure)?,
            extract: Export::load(store, &instance, &pre.extract)?,
            score: Export::load(store, &instance, &pre.score)?,
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

/// A loaded verifier plugin.
pub struct Verifier {
    handle: Handle<Exports>,
}

impl Verifier {
    /// Loads the component at `path`, checks it implements world `verifier`, and configures
    /// it with `settings`.
    pub fn load(
        runtime: &Runtime,
        path: &Path,
        settings: &serde_json::Value,
        limits: &Limits,
    ) -> Result<Verifier, PluginError> {
        Ok(Verifier {
            handle: Handle::new(runtime, path, settings, limits)?,
        })
    }

    pub fn identity(&self) -> &Identity {
        &self.handle.identity
    }

    /// The learned verifier this plugin's `judge` calls reach, if the run has one.
    pub fn judge(&self) -> Option<&std::sync::Arc<dyn super::Judge>> {
        self.handle.judge()
    }

    /// Fuel used by the last call.
    pub fn fuel_used(&self) -> u64 {
        self.handle.fuel_used()
    }

    /// A fresh instance whose randomness is seeded by `epoch` (e.g. a training step).
    pub fn restart(&mut self, epoch: u64) -> Result<(), PluginError> {
        self.handle.restart(epoch)
    }

    /// The answer in one response; `None` when it holds no valid answer.
    pub fn extract(&mut self, task: &Task, text: &str) -> Result<Option<String>, PluginError> {
        let answer = self.handle.call("extract", Some(&task.id), |v, store| {
            let params = (TaskView::of(task), text);
            v.extract.call(store, params).map(|(answer,)| answer)
        })?;
        let max = self.handle.limits().max_answer_bytes;
        match answer {
            Some(a) if a.len() as u64 > max => Err(self.handle.error(
                "extract",
                Some(&task.id),
                Failure::Invalid(too_long(None, a.len(), max)),
            )),
            answer => Ok(answer),
        }
    }

    /// One verdict per response, in order; every score is checked to be in [0, 1].
    pub fn score(
        &mut self,
        task: &Task,
        responses: &[String],
    ) -> Result<Vec<Verdict>, PluginError> {
        let verdicts = self.handle.call("score", Some(&task.id), |v, store| {
            let params = (TaskView::of(task), responses);
            v.score.call(store, params).map(|(verdicts,)| verdicts)
        })?;
        let verdicts: Vec<Verdict> = verdicts.into_iter().map(Verdict::from).collect();
        let max = self.handle.limits().max_answer_bytes;
        validate_verdicts(&verdicts, responses.len(), max).map_err(|msg| {
            self.handle
                .error("score", Some(&task.id), Failure::Invalid(msg))
        })?;
        Ok(verdicts)
    }
}

/// Why an answer of `len` bytes is refused (response `i` of a `score`, or `extract`'s).
fn too_long(i: Option<usize>, len: usize, max: u64) -> String {
    let whose = i.map_or("the answer".to_string(), |i| {
        format!("the answer of response {i}")
    });
    format!("{whose} is {len} bytes, over limits.max_answer_bytes = {max}")
}

fn validate_verdicts(
    verdicts: &[Verdict],
    responses: usize,
    max_answer: u64,
) -> Result<(), String> {
    if verdicts.len() != responses {
        return Err(format!(
            "{} verdicts for {responses} responses (one per response expected)",
            verdicts.len()
        ));
    }
    for (i, v) in verdicts.iter().enumerate() {
        if v.score.is_nan() {
            return Err(format!("score of response {i} is NaN"));
        }
        if !(0.0..=1.0).contains(&v.score) {
            return Err(format!(
                "score of response {i} is {}, outside [0, 1]",
                v.score
            ));
        }
        if v.correct && v.answer.is_none() {
            return Err(format!("response {i} is marked correct but has no answer"));
        }
        if let Some(a) = v.answer.as_ref().filter(|a| a.len() as u64 > max_answer) {
            return Err(too_long(Some(i), a.len(), max_answer));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(score: f32) -> Verdict {
        Verdict {
            answer: Some("1".into()),
            score,
            correct: false,
        }
    }

    #[test]
    fn verdicts_are_checked() {
        assert!(validate_verdicts(&[verdict(0.0), verdict(1.0)], 2, 1024).is_ok());
        assert!(validate_verdicts(&[verdict(0.5)], 2, 1024)
            .unwrap_err()
            .contains("1 verdicts for 2"));
        assert!(validate_verdicts(&[verdict(f32::NAN)], 1, 1024)
            .unwrap_err()
            .contains("NaN"));
        let err = validate_verdicts(&[verdict(0.2), verdict(1.5)], 2, 1024).unwrap_err();
        assert!(err.contains("response 1") && err.contains("1.5"), "{err}");
        assert!(validate_verdicts(&[verdict(-0.1)], 1, 1024).is_err());
        assert!(validate_verdicts(&[verdict(f32::INFINITY)], 1, 1024).is_err());
        let no_answer = Verdict {
            answer: None,
            score: 1.0,
            correct: true,
        };
        assert!(validate_verdicts(&[no_answer], 1, 1024)
            .unwrap_err()
            .contains("no answer"));
        // An answer one byte over the bound is refused, naming the response and the key.
        let long = |n: usize| Verdict {
            answer: Some("7".repeat(n)),
            score: 0.0,
            correct: false,
        };
        assert!(validate_verdicts(&[long(16)], 1, 16).is_ok());
        let err = validate_verdicts(&[verdict(0.0), long(17)], 2, 16).unwrap_err();
        assert!(
            err.contains("response 1")
                && err.contains("17 bytes")
                && err.contains("max_answer_bytes"),
            "{err}"
        );
    }
}
