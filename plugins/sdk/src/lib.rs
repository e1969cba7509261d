//! `maporl-plugin`: write maporl plugins in Rust.
//!
//! A plugin is one WebAssembly component that implements one of the three worlds of
//! `wit/maporl.wit`. With this crate it is a settings struct, a type that implements one
//! trait, and one macro call:
//!
//! ```ignore
//! use maporl_plugin::{Protocol, Prompt, Task, Transcript};
//! use serde::Deserialize;
//!
//! #[derive(Default, Deserialize)]
//! #[serde(default, deny_unknown_fields)]
//! struct Settings { show_scores: bool }
//!
//! struct MyDebate { settings: Settings }
//!
//! impl Protocol for MyDebate {
//!     const NAME: &'static str = "my-debate";
//!     type Settings = Settings;
//!     fn new(settings: Settings) -> Result<Self, String> { Ok(Self { settings }) }
//!     fn plan_turn(&self, task: &Task, turn: u32, t: &Transcript) -> Result<Vec<Prompt>, String> { todo!() }
//!     fn decide(&self, task: &Task, turn: u32, t: &Transcript) -> Result<Vec<String>, String> { todo!() }
//! }
//!
//! maporl_plugin::export_protocol!(MyDebate);
//! ```
//!
//! - [`Protocol`], [`Verifier`], [`RewardShaper`]: one trait per world; the export macros
//!   [`export_protocol!`], [`export_verifier!`], [`export_reward_shaper!`] write the WIT glue.
//!   The settings are typed: `configure`'s JSON is parsed into `Settings` by
//!   [`settings::parse_settings`], whose errors name the plugin and the key.
//! - [`host`]: the host's functions (`log`, `judge`).
//! - The helpers the reference plugins share: [`answers`] (`\boxed{...}` extraction, integer
//!   and label parsing, normalisation), [`vote`] (majority vote with the paper's tie rule),
//!   [`prompts`] (turn-1 prompts per task kind, the debate's follow-up messages),
//!   [`transcript`] (look-ups and consistency checks), [`reward`], and [`testing`]
//!   (record builders for unit tests).
//!
//! **Lifecycle** (the full contract is in the WIT): the host makes a fresh instance at the
//! start of every training step, after any failed call, and whenever it chooses to; each
//! fresh instance gets `configure` first, which is where `new` runs. Nothing may be kept
//! between calls: the methods take `&self`. Per turn the calls come in the order
//! `plan-turn` → `score` (and `extract`) → `decide`; `shape` comes once a debate has ended.
//!
//! The logic of a plugin is best written as plain functions over these types with native
//! unit tests (`cargo test`); the host functions are `unreachable!()` stubs outside wasm32,
//! so native tests pass them in as closures (see the `learned` verifier).

pub mod allocator;
pub mod answers;
pub mod prompts;
pub mod settings;
pub mod transcript;
pub mod vote;

use serde::de::DeserializeOwned;
use std::any::Any;
use std::cell::RefCell;
use std::marker::PhantomData;

/// The allocator of every plugin built with this crate (see [`allocator`]); turn the
/// feature `allocator` off to keep the system allocator or to install another.
#[cfg(all(target_arch = "wasm32", feature = "allocator"))]
#[global_allocator]
static ALLOCATOR: allocator::SizeClasses<std::alloc::System> =
    allocator::SizeClasses::new(std::alloc::System);

/// The bindings wit-bindgen generates for the three worlds from the contract in `$wit`, whose
/// `types` and `host` interfaces are named `$types` and `$host` (with their version).
macro_rules! bindings {
    ($wit:literal, $types:literal, $host:literal) => {
        /// The bindings wit-bindgen generates for the three worlds. Plugins use the traits
        /// and macros of this crate instead; this is public for the export macros (and for
        /// test fixtures that need the raw bindings).
        #[doc(hidden)]
        pub mod bindings {
            /// The `protocol` world; it also generates the shared `types` and `host`
            /// interfaces.
            pub mod protocol {
                wit_bindgen::generate!({
                    world: "protocol",
                    path: $wit,
                    generate_all,
                    generate_unused_types: true,
                    additional_derives: [PartialEq],
                    pub_export_macro: true,
                    export_macro_name: "export_protocol_world",
                    default_bindings_module: "maporl_plugin::bindings::protocol",
                });
            }

            /// The `verifier` world.
            pub mod verifier {
                wit_bindgen::generate!({
                    world: "verifier",
                    path: $wit,
                    with: {
                        $types: crate::bindings::protocol::maporl::plugin::types,
                        $host: crate::bindings::protocol::maporl::plugin::host,
                    },
                    pub_export_macro: true,
                    export_macro_name: "export_verifier_world",
                    default_bindings_module: "maporl_plugin::bindings::verifier",
                });
            }

            /// The `reward-shaper` world.
            pub mod reward_shaper {
                wit_bindgen::generate!({
                    world: "reward-shaper",
                    path: $wit,
                    with: {
                        $types: crate::bindings::protocol::maporl::plugin::types,
                        $host: crate::bindings::protocol::maporl::plugin::host,
                    },
                    pub_export_macro: true,
                    export_macro_name: "export_reward_shaper_world",
                    default_bindings_module: "maporl_plugin::bindings::reward_shaper",
                });
            }
        }
    };
}

// The contract a plugin is built against: `wit/maporl.wit` (0.2.0), or with the feature
// `since-v0-1-0` the frozen 0.1.0 (a plugin that must load in hosts from before 0.2.0; the
// host's tests build reference plugins this way to show that 0.1.0 plugins still run).
#[cfg(not(feature = "since-v0-1-0"))]
bindings!(
    "../../wit",
    "maporl:plugin/types@0.2.0",
    "maporl:plugin/host@0.2.0"
);
#[cfg(feature = "since-v0-1-0")]
bindings!(
    "../../wit/since_v0.1.0",
    "maporl:plugin/types@0.1.0",
    "maporl:plugin/host@0.1.0"
);

/// The WIT record types (`maporl:plugin/types`). Raw bindings map them in with
/// `with: { "maporl:plugin/types@0.2.0": maporl_plugin::wit::types }`.
pub mod wit {
    pub use crate::bindings::protocol::maporl::plugin::types;
}

pub use wit::types::{ChatMessage, Prompt, Reward, Role, Task, Transcript, Utterance, Verdict};

/// The host's functions.
pub mod host {
    use crate::bindings::protocol::maporl::plugin::host as raw;

    pub use raw::Level;

    /// Writes a line to the run's plugin log (bounded and sanitised by the host).
    pub fn log(level: Level, message: &str) {
        raw::log(level, message)
    }

    /// [`log`] at `debug`.
    pub fn debug(message: &str) {
        log(Level::Debug, message)
    }

    /// [`log`] at `info`.
    pub fn info(message: &str) {
        log(Level::Info, message)
    }

    /// [`log`] at `warn`.
    pub fn warn(message: &str) {
        log(Level::Warn, message)
    }

    /// [`log`] at `error`.
    pub fn error(message: &str) {
        log(Level::Error, message)
    }

    /// The run's learned verifier: the probability that each response answers `question`
    /// correctly. Fails with "no verifier model configured" when the run has none;
    /// `judge("", &[])` asks the model nothing and only checks that there is one.
    pub fn judge(question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
        raw::judge(question, responses)
    }

    /// The bounds this plugin runs under in this run (fuel, deadline, memory, the sizes
    /// the host accepts, what `judge` would still take): fit the work to them instead of
    /// guessing. Contract 0.2.0; absent when built with the feature `since-v0-1-0`.
    #[cfg(not(feature = "since-v0-1-0"))]
    pub fn limits() -> PluginLimits {
        raw::limits()
    }

    #[cfg(not(feature = "since-v0-1-0"))]
    pub use raw::PluginLimits;
}

/// A collaboration protocol: who speaks at each turn, what each agent sees, and the team's
/// answer. Export it with [`export_protocol!`].
pub trait Protocol: Sized + 'static {
    /// The plugin's name in error messages.
    const NAME: &'static str;
    /// The settings from the run config, parsed from `configure`'s JSON. Declare it with
    /// `#[serde(default, deny_unknown_fields)]`: `{}` then means all defaults and unknown
    /// keys are refused by name.
    type Settings: DeserializeOwned + Default;
    /// Builds the plugin from its settings; an `Err` fails `configure` (and the run, before
    /// anything is generated).
    fn new(settings: Self::Settings) -> Result<Self, String>;
    /// The prompts of `turn` (1-based): at most one per agent, for the agents that speak.
    /// An empty list ends the debate.
    fn plan_turn(
        &self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<Prompt>, String>;
    /// The team's answer(s) after `turn`; the host counts the team right when the verifier
    /// accepts one of them.
    fn decide(
        &self,
        task: &Task,
        turn: u32,
        transcript: &Transcript,
    ) -> Result<Vec<String>, String>;
}

/// A verifier: reads a response's answer and scores responses against the task's reference.
/// Export it with [`export_verifier!`].
pub trait Verifier: Sized + 'static {
    /// The plugin's name in error messages.
    const NAME: &'static str;
    /// See [`Protocol::Settings`].
    type Settings: DeserializeOwned + Default;
    /// See [`Protocol::new`].
    fn new(settings: Self::Settings) -> Result<Self, String>;
    /// The answer in one response, normalised, or `None` when it has no valid answer.
    fn extract(&self, task: &Task, text: &str) -> Result<Option<String>, String>;
    /// One verdict per response, in order.
    fn score(&self, task: &Task, responses: &[String]) -> Result<Vec<Verdict>, String>;
}

/// A reward shaper: turns a finished debate's scores into one reward per utterance.
/// Export it with [`export_reward_shaper!`].
pub trait RewardShaper: Sized + 'static {
    /// The plugin's name in error messages.
    const NAME: &'static str;
    /// See [`Protocol::Settings`].
    type Settings: DeserializeOwned + Default;
    /// See [`Protocol::new`].
    fn new(settings: Self::Settings) -> Result<Self, String>;
    /// One reward per utterance of the transcript.
    fn shape(&self, task: &Task, transcript: &Transcript) -> Result<Vec<Reward>, String>;
}

/// A reward for the utterance of `agent` at `turn` from its named parts (computed in
/// `f64`): each part is rounded to `f32` and `total` is the `f32` sum of the rounded parts,
/// so `total` always equals the sum of the logged parts. The parts may come from any
/// iterator (an array, a `Vec`, a chain): the reward's list is the only one allocated.
pub fn reward<'a>(
    turn: u32,
    agent: u32,
    parts: impl IntoIterator<Item = (&'a str, f64)>,
) -> Reward {
    let parts: Vec<(String, f32)> = parts
        .into_iter()
        .map(|(name, value)| (name.to_string(), value as f32))
        .collect();
    Reward {
        turn,
        agent,
        total: parts.iter().map(|(_, v)| *v).sum(),
        parts,
    }
}

// The one plugin instance of this component. A component implements one world, so one slot
// serves all three; wasm32-wasip2 is single-threaded.
thread_local! {
    static INSTANCE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// Parses the settings, builds the plugin and keeps it for the calls that follow.
fn configure<P: 'static, S: DeserializeOwned>(
    name: &str,
    json: &str,
    new: impl FnOnce(S) -> Result<P, String>,
) -> Result<(), String> {
    let settings = settings::parse_settings::<S>(name, json)?;
    let plugin = new(settings)?;
    INSTANCE.with(|slot| *slot.borrow_mut() = Some(Box::new(plugin)));
    Ok(())
}

/// Runs `call` on the instance, building it from default settings when `configure` has not
/// run (the host always calls it first; this keeps a direct call from trapping).
fn with_instance<P: 'static, S: Default, R>(
    new: impl FnOnce(S) -> Result<P, String>,
    call: impl FnOnce(&P) -> Result<R, String>,
) -> Result<R, String> {
    INSTANCE.with(|slot| {
        let mut slot = slot.borrow_mut();
        if !slot.as_ref().is_some_and(|b| b.is::<P>()) {
            *slot = Some(Box::new(new(S::default())?));
        }
        let plugin = slot
            .as_ref()
            .and_then(|b| b.downcast_ref::<P>())
            .expect("the slot was filled with a P just above");
        call(plugin)
    })
}

/// The WIT glue for a [`Protocol`]; use [`export_protocol!`].
#[doc(hidden)]
pub struct ProtocolExport<P>(PhantomData<P>);

impl<P: Protocol> bindings::protocol::exports::maporl::plugin::collaboration::Guest
    for ProtocolExport<P>
{
    fn configure(settings: String) -> Result<(), String> {
        configure(P::NAME, &settings, P::new)
    }

    fn plan_turn(task: Task, turn: u32, transcript: Transcript) -> Result<Vec<Prompt>, String> {
        with_instance(P::new, |p: &P| p.plan_turn(&task, turn, &transcript))
    }

    fn decide(task: Task, turn: u32, transcript: Transcript) -> Result<Vec<String>, String> {
        with_instance(P::new, |p: &P| p.decide(&task, turn, &transcript))
    }
}

/// The WIT glue for a [`Verifier`]; use [`export_verifier!`].
#[doc(hidden)]
pub struct VerifierExport<V>(PhantomData<V>);

impl<V: Verifier> bindings::verifier::exports::maporl::plugin::verification::Guest
    for VerifierExport<V>
{
    fn configure(settings: String) -> Result<(), String> {
        configure(V::NAME, &settings, V::new)
    }

    fn extract(task: Task, text: String) -> Result<Option<String>, String> {
        with_instance(V::new, |v: &V| v.extract(&task, &text))
    }

    fn score(task: Task, responses: Vec<String>) -> Result<Vec<Verdict>, String> {
        with_instance(V::new, |v: &V| v.score(&task, &responses))
    }
}

/// The WIT glue for a [`RewardShaper`]; use [`export_reward_shaper!`].
#[doc(hidden)]
pub struct RewardShaperExport<S>(PhantomData<S>);

impl<S: RewardShaper> bindings::reward_shaper::exports::maporl::plugin::reward_shaping::Guest
    for RewardShaperExport<S>
{
    fn configure(settings: String) -> Result<(), String> {
        configure(S::NAME, &settings, S::new)
    }

    fn shape(task: Task, transcript: Transcript) -> Result<Vec<Reward>, String> {
        with_instance(S::new, |s: &S| s.shape(&task, &transcript))
    }
}

/// Exports a [`Protocol`] as this component's `protocol` world. Call it once, at the crate
/// root. The export is compiled for wasm32 only, so `cargo test` runs natively.
#[macro_export]
macro_rules! export_protocol {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type MaporlProtocol = $crate::ProtocolExport<$plugin>;
            $crate::bindings::protocol::export_protocol_world!(
                MaporlProtocol with_types_in $crate::bindings::protocol
            );
        };
    };
}

/// Exports a [`Verifier`] as this component's `verifier` world; see [`export_protocol!`].
#[macro_export]
macro_rules! export_verifier {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type MaporlVerifier = $crate::VerifierExport<$plugin>;
            $crate::bindings::verifier::export_verifier_world!(
                MaporlVerifier with_types_in $crate::bindings::verifier
            );
        };
    };
}

/// Exports a [`RewardShaper`] as this component's `reward-shaper` world; see
/// [`export_protocol!`].
#[macro_export]
macro_rules! export_reward_shaper {
    ($plugin:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            type MaporlRewardShaper = $crate::RewardShaperExport<$plugin>;
            $crate::bindings::reward_shaper::export_reward_shaper_world!(
                MaporlRewardShaper with_types_in $crate::bindings::reward_shaper
            );
        };
    };
}

/// Builders for the records, for plugins' unit tests.
pub mod testing {
    use super::{Task, Transcript, Utterance};

    /// A xorshift64 stream for randomised tests, the same from the same seed everywhere.
    pub struct Xorshift(u64);

    impl Xorshift {
        /// A stream from `seed`, which must not be 0 (the stream would stay 0).
        pub fn new(seed: u64) -> Self {
            assert_ne!(seed, 0, "a xorshift seed must not be 0");
            Xorshift(seed)
        }

        /// The next 64 bits.
        pub fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// A number in `0..n` (close to uniform for `n` far below 2^64).
        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n
        }
    }

    /// A task with the given kind, question and reference and no extra fields.
    pub fn task(kind: &str, question: &str, reference: &str) -> Task {
        Task {
            id: "t-1".to_string(),
            kind: kind.to_string(),
            question: question.to_string(),
            reference: reference.to_string(),
            fields: Vec::new(),
        }
    }

    /// An utterance with the given answer and score; `correct` is `score >= 0.5`.
    pub fn utt(turn: u32, agent: u32, text: &str, answer: Option<&str>, score: f32) -> Utterance {
        Utterance {
            turn,
            agent,
            text: text.to_string(),
            answer: answer.map(str::to_string),
            score,
            correct: score >= 0.5,
        }
    }

    /// A transcript of `agents` agents and at most `turns` turns.
    pub fn transcript(agents: u32, turns: u32, utterances: Vec<Utterance>) -> Transcript {
        Transcript {
            agents,
            turns,
            utterances,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Default, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    struct Settings {
        bonus: f64,
    }

    struct Bonus {
        bonus: f64,
    }

    impl RewardShaper for Bonus {
        const NAME: &'static str = "bonus";
        type Settings = Settings;
        fn new(settings: Settings) -> Result<Self, String> {
            if !settings.bonus.is_finite() || settings.bonus < 0.0 {
                return Err(format!(
                    "bonus: `bonus` must be >= 0, got {}",
                    settings.bonus
                ));
            }
            Ok(Self {
                bonus: settings.bonus,
            })
        }
        fn shape(&self, _task: &Task, transcript: &Transcript) -> Result<Vec<Reward>, String> {
            Ok(transcript
                .utterances
                .iter()
                .map(|u| reward(u.turn, u.agent, [("bonus", self.bonus)]))
                .collect())
        }
    }

    type Glue = RewardShaperExport<Bonus>;
    use bindings::reward_shaper::exports::maporl::plugin::reward_shaping::Guest;

    fn one_utterance() -> Transcript {
        testing::transcript(1, 1, vec![testing::utt(1, 0, "x", None, 0.0)])
    }

    #[test]
    fn configure_builds_the_plugin_the_calls_use() {
        let task = testing::task("arith", "q", "1");
        Glue::configure(r#"{"bonus": 2.5}"#.into()).unwrap();
        let rewards = Glue::shape(task.clone(), one_utterance()).unwrap();
        assert_eq!(rewards[0].total, 2.5);
        // A new configure replaces the instance.
        Glue::configure("{}".into()).unwrap();
        assert_eq!(Glue::shape(task, one_utterance()).unwrap()[0].total, 0.0);
    }

    #[test]
    fn settings_and_new_errors_fail_configure() {
        let e = Glue::configure(r#"{"bonnus": 1}"#.into()).unwrap_err();
        assert!(
            e.starts_with("bonus: unknown setting `bonnus` (did you mean `bonus`?)"),
            "{e}"
        );
        let e = Glue::configure(r#"{"bonus": -1}"#.into()).unwrap_err();
        assert_eq!(e, "bonus: `bonus` must be >= 0, got -1");
    }

    #[test]
    fn a_call_before_configure_uses_the_default_settings() {
        INSTANCE.with(|slot| *slot.borrow_mut() = None);
        let rewards = Glue::shape(testing::task("arith", "q", "1"), one_utterance()).unwrap();
        assert_eq!(rewards[0].total, 0.0);
    }

    #[test]
    fn reward_totals_are_the_sum_of_the_rounded_parts() {
        let r = reward(2, 1, vec![("a", 0.1), ("b", 0.2)]);
        assert_eq!((r.turn, r.agent), (2, 1));
        assert_eq!(r.total, 0.1f32 + 0.2f32);
    }
}
