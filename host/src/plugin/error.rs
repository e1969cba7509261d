//! What can go wrong in a plugin call, and how it is told to a person.

use std::fmt;

use super::printable::{printable, printable_lines};
use super::World;

/// Why a plugin call failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The component could not be read, compiled or linked, or targets another world or an
    /// incompatible WIT version.
    Load(String),
    /// The call used up its fuel budget (an endless loop, or far too much work).
    OutOfFuel { budget: u64 },
    /// The call ran past its wall-clock deadline.
    Deadline { millis: u64 },
    /// The plugin tried to grow its memories and tables past the cap (on their sum).
    MemoryCap { desired: usize, limit: usize },
    /// The plugin recursed past the stack limit.
    StackOverflow,
    /// The plugin panicked; the message is the panic text it printed.
    Panic(String),
    /// Any other trap (e.g. `unreachable`), with wasmtime's description.
    Trap(String),
    /// The plugin returned an error of its own.
    Returned(String),
    /// The plugin returned a result the host refuses (NaN score, unknown agent, ...).
    Invalid(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Load(msg) => write!(f, "cannot load: {}", printable_lines(msg)),
            Failure::OutOfFuel { budget } => write!(
                f,
                "ran out of fuel (budget {budget} per call): an endless loop, or far more work \
                 than expected; raise `fuel` in the plugin's limits if the work is legitimate"
            ),
            Failure::Deadline { millis } => write!(
                f,
                "ran past its wall-clock deadline of {millis} ms; raise `deadline_ms` in the \
                 plugin's limits if the work is legitimate"
            ),
            Failure::MemoryCap { desired, limit } => write!(
                f,
                "memory cap exceeded: its memories and tables would take {} MiB in all, the cap \
                 is {} MiB",
                desired.div_ceil(1 << 20),
                limit / (1 << 20)
            ),
            Failure::StackOverflow => write!(f, "stack overflow (runaway recursion?)"),
            Failure::Panic(msg) => write!(f, "panicked: {}", printable_lines(msg)),
            Failure::Trap(msg) => write!(f, "trapped: {}", printable_lines(msg)),
            Failure::Returned(msg) => write!(f, "returned an error: {}", printable_lines(msg)),
            Failure::Invalid(msg) => {
                write!(f, "returned an invalid result: {}", printable_lines(msg))
            }
        }
    }
}

/// A failed plugin call: which plugin, which world, which function, which task, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginError {
    /// The component file, as the user named it.
    pub plugin: String,
    pub world: World,
    /// The WIT function, e.g. "plan-turn"; "load" when the component never ran.
    pub function: &'static str,
    /// The task being worked on, when the call was about one.
    pub task: Option<String>,
    pub failure: Failure,
}

impl PluginError {
    /// Whether the failure came from the plugin's own behaviour (trap, limit, bad result)
    /// rather than from loading it. A run may choose to drop the task and go on.
    pub fn is_call_failure(&self) -> bool {
        !matches!(self.failure, Failure::Load(_))
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The file name and the task id come from outside (a bundle someone sent, a
        // dataset): shown escaped, like everything the plugin said.
        write!(
            f,
            "plugin {} (world {}) failed in `{}`",
            printable(&self.plugin),
            self.world,
            self.function
        )?;
        if let Some(task) = &self.task {
            write!(f, " on task `{}`", printable(task))?;
        }
        write!(f, ": {}", self.failure)
    }
}

impl std::error::Error for PluginError {}
