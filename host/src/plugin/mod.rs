//! Plugins: WebAssembly components that implement one of the worlds of `wit/maporl.wit`,
//! loaded at run time and run in a sandbox.
//!
//! A [`Runtime`] owns the wasmtime engine, the on-disk cache of compiled components and the
//! clock that enforces wall-clock deadlines. It loads a component file as one of three typed
//! handles: [`Protocol`], [`Verifier`] or [`RewardShaper`]. Each handle owns its own sandbox
//! (a wasmtime `Store`): a fuel budget and a deadline per call, a memory cap, WASI with
//! nothing granted, and clocks and randomness derived from the run seed. Every result a
//! plugin returns is validated before the host uses it; every failure is a [`PluginError`]
//! that names the plugin file, the world, the function and the task. After a failure the
//! handle replaces its instance with a fresh one, so the next call starts clean.
//!
//! This module knows nothing of models: it speaks only in the records of
//! [`crate::transcript`].

mod bindings;
pub mod builtin;
mod cache;
mod error;
mod handle;
mod inspect;
mod printable;
mod protocol;
mod runtime;
mod sandbox;
mod shaper;
pub mod source;
mod verifier;
mod wit;

pub use error::{Failure, PluginError};
pub use handle::Identity;
pub(crate) use inspect::check_version as check_wit_version;
pub use inspect::{inspect, Inspection};
pub use printable::{printable, printable_lines};
pub use protocol::Protocol;
pub use runtime::{Runtime, RuntimeOptions};
pub use sandbox::{
    stderr_sink, Judge, Limits, LogLevel, LogOrigin, LogSink, JUDGE_MAX_QUESTION_BYTES,
    JUDGE_MAX_RESPONSES, JUDGE_MAX_RESPONSES_PER_CALL, JUDGE_MAX_RESPONSES_PER_DEBATE,
    JUDGE_MAX_RESPONSE_BYTES, MAX_INSTANCES, MAX_MEMORIES, MAX_TABLES, PLUGIN_LOG_TARGET,
    TABLE_ELEMENT_BYTES,
};
pub use shaper::RewardShaper;
pub use verifier::Verifier;

/// The WIT package every plugin is built against, as shipped with this host.
pub const WIT: &str = include_str!("../../../wit/maporl.wit");

/// The contract as released at 0.1.0 (`wit/since_v0.1.0/`), which `maporl plugin new`
/// vendors beside the current one.
pub const WIT_V0_1_0: &str = include_str!("../../../wit/since_v0.1.0/maporl.wit");

/// The version of the WIT package this host implements: `wit/maporl.wit`'s, the latest
/// of [`WIT_VERSIONS`].
pub const WIT_VERSION: (u64, u64, u64) = wit::VERSIONS[wit::VERSIONS.len() - 1];

/// Every version of the WIT package this host links, oldest first: a plugin built against
/// any of them (or a later patch of one) loads.
pub const WIT_VERSIONS: &[(u64, u64, u64)] = &wit::VERSIONS;

/// The package name of the WIT contract.
pub const WIT_PACKAGE: &str = "maporl:plugin";

/// The three kinds of plugin, one WIT world each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum World {
    Protocol,
    Verifier,
    RewardShaper,
}

impl World {
    pub const ALL: [World; 3] = [World::Protocol, World::Verifier, World::RewardShaper];

    /// The world's name in the WIT package.
    pub fn name(self) -> &'static str {
        match self {
            World::Protocol => "protocol",
            World::Verifier => "verifier",
            World::RewardShaper => "reward-shaper",
        }
    }

    /// The interface the world exports.
    pub fn export_interface(self) -> &'static str {
        match self {
            World::Protocol => "collaboration",
            World::Verifier => "verification",
            World::RewardShaper => "reward-shaping",
        }
    }

    /// The functions the world's export interface must provide.
    pub fn functions(self) -> &'static [&'static str] {
        match self {
            World::Protocol => &["configure", "plan-turn", "decide"],
            World::Verifier => &["configure", "extract", "score"],
            World::RewardShaper => &["configure", "shape"],
        }
    }

    /// Parses a world name as written in configs and on the command line.
    pub fn parse(name: &str) -> Result<World, String> {
        World::ALL
            .into_iter()
            .find(|w| w.name() == name)
            .ok_or_else(|| {
                format!(
                    "unknown world `{name}`; the worlds are protocol, verifier and reward-shaper"
                )
            })
    }
}

impl std::fmt::Display for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The bounds fixed in the host that every plugin runs under, whatever its config's
/// `limits`: (name, value, meaning), for the reference and the security page.
pub fn fixed_limits() -> Vec<(&'static str, String, &'static str)> {
    let kib = |b: usize| format!("{} KiB", b / 1024);
    let mib = |b: u64| format!("{} MiB", b >> 20);
    vec![
        (
            "component size",
            format!(
                "{} by default, at most {}",
                mib(crate::files::COMPONENT_MAX),
                mib(crate::files::COMPONENT_CAP_MAX)
            ),
            "the largest component file read: a run's plugin's is its limits.max_component_mib",
        ),
        (
            "compiled-component cache entry",
            mib(crate::files::COMPILED_MAX),
            "the largest compiled component read back from the cache",
        ),
        (
            "wasm stack",
            kib(runtime::MAX_WASM_STACK),
            "the stack one call may use; deeper recursion traps",
        ),
        (
            "deadline tick",
            format!("{} ms", runtime::EPOCH_TICK.as_millis()),
            "deadlines are counted in whole ticks of this clock",
        ),
        (
            "log text per call",
            kib(sandbox::LOG_BYTES_PER_CALL),
            "what one call may write to the plugin log; the rest is dropped with a note",
        ),
        (
            "captured stderr",
            kib(sandbox::STDERR_CAPACITY),
            "a plugin's stderr kept for its error messages (panics land there)",
        ),
        (
            "judge: responses per judge call",
            sandbox::JUDGE_MAX_RESPONSES.to_string(),
            "responses one `judge` call may ask the learned verifier to score",
        ),
        (
            "judge: responses per plugin call",
            sandbox::JUDGE_MAX_RESPONSES_PER_CALL.to_string(),
            "over all `judge` calls of one plugin call",
        ),
        (
            "judge: responses per debate",
            sandbox::JUDGE_MAX_RESPONSES_PER_DEBATE.to_string(),
            "over all `judge` calls on one task within a training step",
        ),
        (
            "judge: question and response size",
            kib(sandbox::JUDGE_MAX_QUESTION_BYTES),
            "the bytes of the question and of each response a `judge` call passes",
        ),
    ]
}

/// The host's WIT version as text, e.g. "0.2.0".
pub fn wit_version() -> String {
    let (major, minor, patch) = WIT_VERSION;
    format!("{major}.{minor}.{patch}")
}

/// Whether this host runs a plugin built against contract `version` ("0.1.0"): a version it
/// links, or a later patch of one.
pub fn links_wit_version(version: &str) -> bool {
    inspect::parse_version(version).is_some_and(|v| wit::linked_for(v).is_some())
}

/// Every version the host links, as text: "0.1.0, 0.2.0".
pub fn wit_versions() -> String {
    WIT_VERSIONS
        .iter()
        .map(|(a, b, c)| format!("{a}.{b}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}
