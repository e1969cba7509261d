//! One loaded plugin with its sandboxed instance: how a call is made, limited, and how a
//! failure is told and recovered from.

use std::path::Path;

use wasmtime::component::InstancePre;
use wasmtime::{Store, Trap, WasmBacktrace};

use super::runtime::{load_error, Runtime, EPOCH_TICK};
use super::sandbox::{Limits, LogLevel, Sandbox, STDERR_CAPACITY};
use super::{Failure, PluginError, World};

/// The generated bindings of one world, as the generic handle needs them.
pub(crate) trait WorldBindings: Sized {
    type Pre: Clone;
    const WORLD: World;
    fn pre(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self::Pre>;
    fn instantiate(pre: &Self::Pre, store: &mut Store<Sandbox>) -> wasmtime::Result<Self>;
    fn configure(
        &self,
        store: &mut Store<Sandbox>,
        settings: &str,
    ) -> wasmtime::Result<Result<(), String>>;
}

/// Who a plugin is: the file the user named and its content hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The component file as given.
    pub name: String,
    /// sha256 of the component file, hex.
    pub sha256: String,
    /// sha256 of the source it was built from, as the component declares it (see
    /// [`super::source`]): the same across rebuilds that do not give the same bytes.
    pub source_sha256: Option<String>,
    pub world: World,
}

pub(crate) struct Handle<B: WorldBindings> {
    pub identity: Identity,
    engine: wasmtime::Engine,
    pre: B::Pre,
    settings: String,
    limits: Limits,
    /// The plugin's own seed (run seed and component hash); `seed` mixes in the epoch.
    base_seed: u64,
    seed: u64,
    log: super::LogSink,
    judge: Option<std::sync::Arc<dyn super::Judge>>,
    live: Option<(Store<Sandbox>, B)>,
    stderr_seen: usize,
    fuel_used: u64,
    /// Responses judged through `judge` per task since the last restart (one debate per
    /// task in a training step): what the per-debate bound counts.
    judged_by_task: std::collections::HashMap<String, usize>,
}

impl<B: WorldBindings> Handle<B> {
    /// Loads, checks and links the component, then instantiates and configures it, so that
    /// bad settings are reported now rather than at the first task.
    pub fn new(
        runtime: &Runtime,
        path: &Path,
        settings: &serde_json::Value,
        limits: &Limits,
    ) -> Result<Self, PluginError> {
        limits
            .check()
            .map_err(|e| load_error(&path.display().to_string(), B::WORLD, e))?;
        let loaded = runtime.load(path, B::WORLD, limits.component_bytes())?;
        let fail = |msg: String| load_error(&loaded.name, B::WORLD, msg);
        let pre = runtime
            .linker
            .instantiate_pre(&loaded.component)
            .map_err(|e| fail(format!("{e:#}")))?;
        let pre = B::pre(pre).map_err(|e| fail(format!("{e:#}")))?;
        // Each plugin gets its own stream of randomness, the same on every run and, where
        // the component declares its source, on every rebuild of that source.
        let key = loaded.source_sha256.as_deref().unwrap_or(&loaded.sha256);
        let seed = runtime.options.seed ^ u64::from_str_radix(&key[..16], 16).expect("hex");
        let mut handle = Handle {
            identity: Identity {
                name: loaded.name,
                sha256: loaded.sha256,
                source_sha256: loaded.source_sha256,
                world: B::WORLD,
            },
            engine: runtime.engine.clone(),
            pre,
            settings: settings.to_string(),
            limits: limits.clone(),
            base_seed: seed,
            seed,
            log: runtime.options.log.clone(),
            judge: runtime.options.judge.clone(),
            live: None,
            stderr_seen: 0,
            fuel_used: 0,
            judged_by_task: Default::default(),
        };
        handle.start(None)?;
        Ok(handle)
    }

    /// The limits every call runs under, and that its results are checked against.
    pub(crate) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The learned verifier the plugin's `judge` calls reach, if the run has one.
    pub fn judge(&self) -> Option<&std::sync::Arc<dyn super::Judge>> {
        self.judge.as_ref()
    }

    /// Fuel used by the last call.
    pub fn fuel_used(&self) -> u64 {
        self.fuel_used
    }

    /// Replaces the instance with a fresh one whose randomness is seeded by `epoch` (e.g. a
    /// training step), so that what the plugin does from here depends only on the run seed,
    /// the epoch and its inputs: a resumed run sees the same plugin behaviour as an
    /// uninterrupted one.
    pub fn restart(&mut self, epoch: u64) -> Result<(), PluginError> {
        // SplitMix64's finaliser, so nearby epochs get unrelated seeds.
        let mut z = epoch.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.seed = self.base_seed ^ z ^ (z >> 31);
        self.live = None;
        self.judged_by_task.clear();
        self.start(None)
    }

    /// Makes a fresh instance and configures it.
    fn start(&mut self, task: Option<&str>) -> Result<(), PluginError> {
        let sandbox = Sandbox::new(
            &self.identity.name,
            B::WORLD,
            &self.limits,
            self.seed,
            self.log.clone(),
            self.judge.clone(),
        );
        let mut store = Store::new(&self.engine, sandbox);
        store.limiter(|s| s as &mut dyn wasmtime::ResourceLimiter);
        // What one call's result (or one host call's arguments) may make the host allocate.
        store.set_hostcall_fuel(self.limits.result_bytes());
        store.epoch_deadline_trap();
        self.stderr_seen = 0;
        self.arm(&mut store, task);
        let bindings = match B::instantiate(&self.pre, &mut store) {
            Ok(b) => b,
            Err(e) => {
                let failure = self.classify(&store, e, 0);
                return Err(self.error("instantiate", task, failure));
            }
        };
        self.live = Some((store, bindings));
        let settings = self.settings.clone();
        let configured = self.call("configure", task, |b, store| b.configure(store, &settings));
        if configured.is_err() {
            self.live = None;
        }
        configured
    }

    fn arm(&self, store: &mut Store<Sandbox>, task: Option<&str>) {
        let judged = task.map_or(0, |t| self.judged_by_task.get(t).copied().unwrap_or(0));
        store
            .data_mut()
            .begin_call(self.limits.deadline_ms, judged, task);
        store
            .set_fuel(self.limits.fuel)
            .expect("fuel is enabled on the engine");
        let ticks = self
            .limits
            .deadline_ms
            .div_ceil(EPOCH_TICK.as_millis() as u64);
        store.set_epoch_deadline(ticks.max(1));
    }

    /// Runs one call of the plugin under its limits. A trap discards the instance; the next
    /// call gets a fresh one.
    pub fn call<R>(
        &mut self,
        function: &'static str,
        task: Option<&str>,
        f: impl FnOnce(&B, &mut Store<Sandbox>) -> wasmtime::Result<Result<R, String>>,
    ) -> Result<R, PluginError> {
        if self.live.is_none() {
            self.start(task)?;
        }
        let (mut store, bindings) = self.live.take().expect("started above");
        self.arm(&mut store, task);
        // The clock is read only for the debug log: a call of a few microseconds notices.
        let traced = tracing::enabled!(tracing::Level::DEBUG);
        let started = traced.then(std::time::Instant::now);
        let outcome = f(&bindings, &mut store);
        self.fuel_used = self.limits.fuel - store.get_fuel().unwrap_or(0);
        if let Some(started) = started {
            let task = task.map(super::printable);
            tracing::debug!(
                plugin = %super::printable(&self.identity.name),
                world = self.identity.world.name(),
                function,
                task = task.as_deref(),
                fuel = self.fuel_used,
                micros = started.elapsed().as_micros() as u64,
                ok = matches!(outcome, Ok(Ok(_))),
                "plugin call"
            );
        }
        if let Some(task) = task.filter(|_| store.data().judged() > 0) {
            *self.judged_by_task.entry(task.to_string()).or_default() += store.data().judged();
        }
        let seen_before = self.stderr_seen;
        let stderr_len = self.forward_stderr(&store);
        match outcome {
            Ok(result) => {
                // Keep the captured stderr from ever filling up: recycle the instance.
                if stderr_len < STDERR_CAPACITY / 2 {
                    self.live = Some((store, bindings));
                }
                result.map_err(|msg| self.error(function, task, Failure::Returned(msg)))
            }
            Err(trap) => {
                let failure = self.classify(&store, trap, seen_before);
                Err(self.error(function, task, failure))
            }
        }
    }

    pub fn error(
        &self,
        function: &'static str,
        task: Option<&str>,
        failure: Failure,
    ) -> PluginError {
        PluginError {
            plugin: self.identity.name.clone(),
            world: self.identity.world,
            function,
            task: task.map(str::to_string),
            failure,
        }
    }

    /// Why a call trapped; `seen_before` is how much of the instance's stderr was written
    /// before the call (what it wrote since is the call's own output).
    fn classify(
        &self,
        store: &Store<Sandbox>,
        err: wasmtime::Error,
        seen_before: usize,
    ) -> Failure {
        if let Some((desired, limit)) = store.data().memory_refused {
            return Failure::MemoryCap { desired, limit };
        }
        let backtrace = err.downcast_ref::<WasmBacktrace>();
        // wasmtime's host-call data budget (its error type is private: told by its text).
        if err
            .chain()
            .any(|e| e.to_string().contains("too much data is being copied"))
        {
            return Failure::Invalid(format!(
                "its result, or the data of a host call it made, is larger than \
                 limits.max_result_kib = {} KiB",
                self.limits.max_result_kib
            ));
        }
        match err.downcast_ref::<Trap>() {
            Some(Trap::OutOfFuel) => Failure::OutOfFuel {
                budget: self.limits.fuel,
            },
            Some(Trap::Interrupt) => Failure::Deadline {
                millis: self.limits.deadline_ms,
            },
            Some(Trap::StackOverflow) => Failure::StackOverflow,
            // A Rust guest keeps its frames in linear memory too: runaway recursion runs
            // that stack off the bottom of memory before the wasm stack limit is reached.
            Some(Trap::MemoryOutOfBounds) if backtrace.is_some_and(is_runaway_recursion) => {
                Failure::StackOverflow
            }
            Some(trap @ Trap::UnreachableCodeReached) => {
                let output = call_output(store, seen_before);
                // A Python runtime prints the traceback, then panics with a generic message.
                match python_exception(&output).or_else(|| panic_message(&output)) {
                    Some(msg) => Failure::Panic(msg),
                    None => Failure::Trap(with_output(
                        describe_trap(&trap.to_string(), backtrace),
                        &output,
                    )),
                }
            }
            Some(trap) => Failure::Trap(with_output(
                describe_trap(&trap.to_string(), backtrace),
                &call_output(store, seen_before),
            )),
            None => Failure::Trap(with_output(
                describe_trap(&format!("{:#}", err.root_cause()), backtrace),
                &call_output(store, seen_before),
            )),
        }
    }

    /// Passes what the plugin wrote to stderr since the last call on to the log; returns how
    /// much the instance has written in all.
    fn forward_stderr(&mut self, store: &Store<Sandbox>) -> usize {
        let contents = store.data().stderr.contents();
        if contents.len() > self.stderr_seen {
            let new = String::from_utf8_lossy(&contents[self.stderr_seen..]).to_string();
            let origin = store.data().log_origin();
            for line in new.lines().filter(|l| !l.trim().is_empty()) {
                (self.log)(&origin, LogLevel::Info, &format!("stderr: {line}"));
            }
            self.stderr_seen = contents.len();
        }
        contents.len()
    }
}

/// Whether the innermost frames are one function calling itself, over and over.
fn is_runaway_recursion(backtrace: &WasmBacktrace) -> bool {
    let frames = backtrace.frames();
    frames.len() >= 16
        && frames[..16]
            .iter()
            .all(|f| f.func_index() == frames[0].func_index())
}

/// A trap's description with the innermost few frames of the guest's backtrace.
fn describe_trap(what: &str, backtrace: Option<&WasmBacktrace>) -> String {
    let mut text = what.to_string();
    if let Some(bt) = backtrace {
        for frame in bt.frames().iter().take(4) {
            let module = frame.module().name().unwrap_or("plugin");
            match frame.func_name() {
                Some(name) => {
                    let name = rustc_demangle::demangle(name);
                    text.push_str(&format!("\n    at {module}!{name:#}"));
                }
                None => text.push_str(&format!(
                    "\n    at {module}!<function {}>",
                    frame.func_index()
                )),
            }
        }
    }
    text
}

/// The message of the last Rust panic in a guest's stderr: the lines after
/// "panicked at FILE:LINE:COL:", up to the "note:" hint.
fn panic_message(stderr: &str) -> Option<String> {
    let start = stderr.rfind("panicked at ")?;
    let after = &stderr[start..];
    let (location, rest) = after.split_once('\n').unwrap_or((after, ""));
    let location = location
        .trim_start_matches("panicked at ")
        .trim_end_matches(':');
    let message: Vec<&str> = rest
        .lines()
        .take_while(|l| !l.starts_with("note:"))
        .collect();
    Some(format!("{} (at {location})", message.join("\n").trim()))
}

/// What the plugin wrote to stderr during the call that failed.
fn call_output(store: &Store<Sandbox>, seen_before: usize) -> String {
    let contents = store.data().stderr.contents();
    String::from_utf8_lossy(contents.get(seen_before..).unwrap_or_default()).to_string()
}

/// Lines of a failed call's stderr kept in its error, and characters kept of each.
const OUTPUT_LINES: usize = 5;
const OUTPUT_LINE_CHARS: usize = 240;

/// A trap's description followed by the last lines the call wrote to stderr, if any: what
/// the plugin said just before it failed.
fn with_output(description: String, output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return description;
    }
    let mut text = description;
    text.push_str("\nits last lines on stderr:");
    for line in &lines[lines.len().saturating_sub(OUTPUT_LINES)..] {
        text.push_str("\n    ");
        text.extend(line.chars().take(OUTPUT_LINE_CHARS));
        if line.chars().nth(OUTPUT_LINE_CHARS).is_some() {
            text.push('…');
        }
    }
    text
}

/// The reason of the last Python traceback in a guest's stderr: the exception's line, with
/// the innermost frame's file, line and function ("KeyError: 'x' (at app.py:9, in score)").
fn python_exception(stderr: &str) -> Option<String> {
    let start = stderr.rfind("Traceback (most recent call last):")?;
    let mut location = None;
    for line in stderr[start..].lines().skip(1) {
        if let Some(frame) = line.strip_prefix("  File \"") {
            // `  File "/app/app.py", line 9, in score`
            let (file, rest) = frame.split_once("\", line ")?;
            let (number, function) = rest.split_once(", in ").unwrap_or((rest, "?"));
            let file = file.rsplit('/').next().unwrap_or(file);
            location = Some(format!("{file}:{number}, in {function}"));
        } else if !line.is_empty() && !line.starts_with(' ') {
            let reason = format!("uncaught Python exception {line}");
            return Some(match location {
                Some(at) => format!("{reason} (at {at})"),
                None => reason,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn panic_message_is_read_from_rust_guest_stderr() {
        let stderr = "thread '<unnamed>' panicked at src/lib.rs:12:9:\nboom went the plugin\n\
                      note: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            super::panic_message(stderr).as_deref(),
            Some("boom went the plugin (at src/lib.rs:12:9)")
        );
        assert_eq!(super::panic_message("just some output"), None);
    }

    /// componentize-py's output for an exception that reached its runtime: the traceback
    /// (with 3.11's caret lines), then the runtime's panic.
    #[test]
    fn an_uncaught_python_exception_is_read_from_its_traceback() {
        let stderr = "Traceback (most recent call last):\n  \
            File \"/tmp/x/app.py\", line 21, in score\n    return table[task.kind]\n           \
            ~~~~~^^^^^^^^^^^\nKeyError: 'arith'\n\
            thread '<unnamed>' panicked at runtime/src/lib.rs:1293:29:\n\
            Python function threw an unexpected exception\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            super::python_exception(stderr).as_deref(),
            Some("uncaught Python exception KeyError: 'arith' (at app.py:21, in score)")
        );
        // The last of two (an exception raised while handling another).
        let chained = "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\n\
            ValueError: first\n\nDuring handling of the above exception, another exception \
            occurred:\n\nTraceback (most recent call last):\n  File \"b.py\", line 2, in g\n\
            TypeError: second\n";
        assert_eq!(
            super::python_exception(chained).as_deref(),
            Some("uncaught Python exception TypeError: second (at b.py:2, in g)")
        );
        assert_eq!(super::python_exception("no traceback here"), None);
    }

    #[test]
    fn a_traps_error_keeps_the_last_lines_of_the_calls_stderr() {
        assert_eq!(super::with_output("trap".into(), "\n  \n"), "trap");
        let output: String = (1..=8).map(|i| format!("line {i}\n")).collect();
        let shown = super::with_output("trap".into(), &output);
        assert_eq!(
            shown,
            "trap\nits last lines on stderr:\n    line 4\n    line 5\n    line 6\n    \
             line 7\n    line 8"
        );
        let long = "é".repeat(1000);
        let shown = super::with_output("trap".into(), &long);
        assert_eq!(
            shown.chars().filter(|c| *c == 'é').count(),
            super::OUTPUT_LINE_CHARS
        );
        assert!(shown.ends_with('…'));
    }
}
