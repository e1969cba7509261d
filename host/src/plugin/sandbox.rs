//! The sandbox one plugin instance runs in: limits, WASI with nothing granted, deterministic
//! clocks and randomness, the host functions (`log`, `judge`) and the memory limiter.

use std::sync::Arc;
use std::time::Duration;

use rand_wasi::SeedableRng;
use serde::{Deserialize, Serialize};
use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{
    HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView,
};

use super::wit::latest::host;
use super::World;

/// Resource limits of one plugin, per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Fuel (roughly, wasm instructions) one call may use. Deterministic: the same call
    /// always uses the same fuel.
    pub fuel: u64,
    /// Wall-clock deadline of one call, in milliseconds.
    pub deadline_ms: u64,
    /// Cap on the plugin's memory, in MiB: every linear memory and table of every instance
    /// of the component, summed.
    pub memory_mib: u64,
    /// Protocols: the most bytes one prompt's messages may hold (checked before anything
    /// is tokenized).
    pub max_prompt_bytes: u64,
    /// Reward shapers: the largest magnitude a reward's total or any of its parts may have.
    pub max_abs_reward: f64,
    /// The most data, in KiB, one call may hand the host: its result, or what one host call
    /// it makes (log, judge) passes. Counted while the host reads it, so that a larger
    /// result is refused before the host holds it (wasmtime's host-call data budget).
    pub max_result_kib: u64,
    /// Verifiers: the longest answer, in bytes, `extract` or `score` may give. Answers are
    /// kept in every utterance and decision the run records.
    pub max_answer_bytes: u64,
    /// Reward shapers: the most named parts one reward may have (their names are kept in
    /// every step's metrics).
    pub max_reward_parts: u64,
    /// Reward shapers: the longest name of one part, in bytes.
    pub max_part_name_bytes: u64,
    /// The largest component file the plugin may be, in MiB (at most 1024). A Python
    /// plugin that bundles large packages needs more than the default; raise `memory_mib`
    /// with it (`maporl plugin check` says how much memory the component starts with).
    pub max_component_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The reference plugins use under 1% of this on GSM8K-sized debates (tested).
            fuel: 2_000_000_000,
            deadline_ms: 5_000,
            memory_mib: 64,
            // The paper's prompts are a few KB; a turn that shows 3 agents 3 long answers
            // stays far below.
            max_prompt_bytes: 256 * 1024,
            // The paper's rewards are in [-1, 2] or so; anything near this is a bug.
            max_abs_reward: 1_000.0,
            // A plan of 8 agents' prompts at max_prompt_bytes each is 2 MiB.
            max_result_kib: 4096,
            // A number, a label, a short phrase.
            max_answer_bytes: 1024,
            // The influence shaper gives 6 parts with names under 20 bytes.
            max_reward_parts: 32,
            max_part_name_bytes: 64,
            max_component_mib: crate::files::COMPONENT_MAX >> 20,
        }
    }
}

impl Limits {
    /// Refuses limits under which no call could run or no result could pass: a zero fuel
    /// budget, deadline, memory cap or prompt size, a reward bound that is not a positive
    /// finite number (the error names the key).
    pub fn check(&self) -> Result<(), String> {
        for (key, v) in [
            ("fuel", self.fuel),
            ("deadline_ms", self.deadline_ms),
            ("memory_mib", self.memory_mib),
            ("max_result_kib", self.max_result_kib),
            ("max_answer_bytes", self.max_answer_bytes),
            ("max_part_name_bytes", self.max_part_name_bytes),
            ("max_component_mib", self.max_component_mib),
        ] {
            if v == 0 {
                return Err(format!(
                    "limits.{key} = 0: no call could run; expected at least 1"
                ));
            }
        }
        let most = crate::files::COMPONENT_CAP_MAX >> 20;
        if self.max_component_mib > most {
            return Err(format!(
                "limits.max_component_mib = {}: at most {most} (1 GiB)",
                self.max_component_mib
            ));
        }
        if self.max_prompt_bytes == 0 {
            return Err(
                "limits.max_prompt_bytes = 0: no prompt could pass; expected at least 1"
                    .to_string(),
            );
        }
        if !(self.max_abs_reward.is_finite() && self.max_abs_reward > 0.0) {
            return Err(format!(
                "limits.max_abs_reward = {}: expected a finite number above 0",
                self.max_abs_reward
            ));
        }
        Ok(())
    }

    /// The host-call data budget of one call, in bytes.
    pub(crate) fn result_bytes(&self) -> usize {
        usize::try_from(self.max_result_kib.saturating_mul(1 << 10)).unwrap_or(usize::MAX)
    }

    /// The largest component file the plugin may be, in bytes.
    pub(crate) fn component_bytes(&self) -> u64 {
        self.max_component_mib.saturating_mul(1 << 20)
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

/// The run's learned verifier, as offered to plugins through the host `judge` function.
pub trait Judge: Send + Sync {
    /// One probability in [0, 1] per response, in order.
    fn judge(&self, question: &str, responses: &[String]) -> Result<Vec<f32>, String>;

    /// [`judge`](Self::judge) for a plugin call that must end by `deadline`: the work
    /// stops, refused, once the deadline has passed (between batches of forward passes),
    /// so that host work done for a plugin is held to the plugin's deadline. The default
    /// checks only before it starts.
    fn judge_until(
        &self,
        question: &str,
        responses: &[String],
        deadline: std::time::Instant,
    ) -> Result<Vec<f32>, String> {
        if std::time::Instant::now() >= deadline {
            return Err("the call's deadline passed before the learned verifier ran".into());
        }
        self.judge(question, responses)
    }

    /// Scores every (question, response) of a step at once, before the verifier plugin asks
    /// for them task by task: the batching path. The default does nothing.
    fn prefetch(&self, _pairs: &[(&str, &str)]) -> Result<(), String> {
        Ok(())
    }

    /// The identity (sha256) of the model that judges, recorded by every run it scores.
    fn checkpoint_sha256(&self) -> Option<String> {
        None
    }
}

/// Severity of a plugin's log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// Who wrote a plugin log line: the plugin (the component file as given), its world, and
/// the task its call was about (`None` for calls about no one task, e.g. `configure`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogOrigin<'a> {
    pub plugin: &'a str,
    pub world: World,
    pub task: Option<&'a str>,
}

/// Where plugins' log lines go: called with who wrote the line, the level and the line (as
/// the plugin wrote it: a sink that shows it must escape it, see [`super::printable`]).
pub type LogSink = Arc<dyn Fn(&LogOrigin<'_>, LogLevel, &str) + Send + Sync>;

/// The tracing target of plugins' log lines: `RUST_LOG=maporl::plugin=debug` shows them all.
pub const PLUGIN_LOG_TARGET: &str = "maporl::plugin";

/// The default sink: each log call is one `tracing` event, target [`PLUGIN_LOG_TARGET`],
/// at the level the plugin gave, with the fields `plugin` (name), `world` and `task` (when
/// the call was about one task). Which levels show is the subscriber's filter (the
/// `maporl` binary: warnings and errors unless `RUST_LOG` or `MAPORL_PLUGIN_LOG` say
/// otherwise). The name, the task id and the text are escaped ([`super::printable`])
/// before they reach the event, so that whatever subscriber formats it, a plugin can
/// neither rewrite the screen nor print a line that passes for the host's or another
/// plugin's; a sink of one's own gets the text as written.
pub fn stderr_sink() -> LogSink {
    Arc::new(emit_log_event)
}

/// One plugin log line as a `tracing` event (see [`stderr_sink`]).
pub(crate) fn emit_log_event(origin: &LogOrigin<'_>, level: LogLevel, line: &str) {
    use super::printable::printable;
    let plugin = printable(origin.plugin);
    let plugin = plugin.as_ref();
    let world = origin.world.name();
    let task = origin.task.map(printable);
    let task = task.as_deref();
    let line = printable(line);
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(target: PLUGIN_LOG_TARGET, $level, plugin, world, task, "{line}")
        };
    }
    match level {
        LogLevel::Debug => event!(tracing::Level::DEBUG),
        LogLevel::Info => event!(tracing::Level::INFO),
        LogLevel::Warn => event!(tracing::Level::WARN),
        LogLevel::Error => event!(tracing::Level::ERROR),
    }
}

/// Most log text one call may write; the rest is dropped with a note.
pub(crate) const LOG_BYTES_PER_CALL: usize = 64 * 1024;
/// What a plugin may ask of the host's `judge` (the learned verifier's forward passes):
/// responses per `judge` call, responses over all `judge` calls of one plugin call and of
/// one debate (every call on one task within a training step), and the bytes of the
/// question and of each response (a bound on their tokens too: a byte-level tokenizer
/// makes at most one token of a byte).
pub const JUDGE_MAX_RESPONSES: usize = 256;
pub const JUDGE_MAX_RESPONSES_PER_CALL: usize = 1024;
pub const JUDGE_MAX_RESPONSES_PER_DEBATE: usize = 4096;
pub const JUDGE_MAX_QUESTION_BYTES: usize = 64 * 1024;
pub const JUDGE_MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Capacity of the captured stderr (panic messages land there).
pub(crate) const STDERR_CAPACITY: usize = 256 * 1024;

/// The data of one plugin Store.
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) stderr: MemoryOutputPipe,
    memory_limit: usize,
    /// The limits the plugin runs under, as the host function `limits` tells them.
    limits: Limits,
    /// Bytes of every linear memory and table of every instance in this store: what the
    /// cap bounds.
    footprint: usize,
    /// Set when the limiter refused a growth, so the trap can be told as a memory-cap error:
    /// the footprint it would have made, and the cap.
    pub(crate) memory_refused: Option<(usize, usize)>,
    plugin_name: String,
    world: World,
    /// The task the call in progress is about, if it is about one: told with its log lines.
    task: Option<String>,
    log: LogSink,
    log_bytes: usize,
    judge: Option<Arc<dyn Judge>>,
    /// When the call in progress must end (its deadline), and how many responses it has
    /// had judged: host work refuses past either bound.
    deadline: Option<(std::time::Instant, u64)>,
    judged: usize,
    /// Responses judged for the same task by the plugin's earlier calls in this debate.
    judged_before: usize,
}

impl Sandbox {
    pub(crate) fn new(
        plugin_name: &str,
        world: World,
        limits: &Limits,
        seed: u64,
        log: LogSink,
        judge: Option<Arc<dyn Judge>>,
    ) -> Sandbox {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut builder = WasiCtxBuilder::new();
        // Nothing is inherited or preopened: no args, env, dirs, stdin or sockets.
        builder
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(SteppingClock::new())
            .monotonic_clock(SteppingClock::new())
            .secure_random(rand_wasi::rngs::StdRng::seed_from_u64(seed))
            .insecure_random(rand_wasi::rngs::StdRng::seed_from_u64(
                seed ^ 0x9e37_79b9_7f4a_7c15,
            ))
            .insecure_random_seed(u128::from(seed) << 64 | u128::from(!seed));
        Sandbox {
            wasi: builder.build(),
            table: ResourceTable::new(),
            stderr,
            memory_limit: limits.memory_bytes(),
            limits: limits.clone(),
            footprint: 0,
            memory_refused: None,
            plugin_name: plugin_name.to_string(),
            world,
            task: None,
            log,
            log_bytes: 0,
            judge,
            deadline: None,
            judged: 0,
            judged_before: 0,
        }
    }

    /// Called before each call: resets the per-call budgets; the call must end within
    /// `deadline_ms`, and the debate it belongs to has had `judged_before` responses judged;
    /// `task` is the task it is about, if it is about one (its log lines tell it).
    pub(crate) fn begin_call(
        &mut self,
        deadline_ms: u64,
        judged_before: usize,
        task: Option<&str>,
    ) {
        self.log_bytes = 0;
        if self.task.as_deref() != task {
            self.task = task.map(str::to_string);
        }
        self.memory_refused = None;
        self.judged = 0;
        self.judged_before = judged_before;
        self.deadline = Some((
            std::time::Instant::now() + Duration::from_millis(deadline_ms),
            deadline_ms,
        ));
    }

    /// Who writes the log lines of the call in progress.
    pub(crate) fn log_origin(&self) -> LogOrigin<'_> {
        LogOrigin {
            plugin: &self.plugin_name,
            world: self.world,
            task: self.task.as_deref(),
        }
    }

    /// Bytes of every linear memory and table the store holds now.
    pub(crate) fn footprint(&self) -> usize {
        self.footprint
    }

    /// Responses the call in progress has had judged.
    pub(crate) fn judged(&self) -> usize {
        self.judged
    }

    /// Refuses a `judge` call that would do more host work than a call may ask for.
    fn check_judge(&self, question: &str, responses: &[String]) -> Result<(), String> {
        if let Some((end, ms)) = self.deadline {
            if std::time::Instant::now() >= end {
                return Err(format!(
                    "judge refused: the call's deadline of {ms} ms has passed"
                ));
            }
        }
        if responses.len() > JUDGE_MAX_RESPONSES {
            return Err(format!(
                "judge refused: {} responses in one call; at most {JUDGE_MAX_RESPONSES}",
                responses.len()
            ));
        }
        if self.judged + responses.len() > JUDGE_MAX_RESPONSES_PER_CALL {
            return Err(format!(
                "judge refused: {} responses judged in this call already, {} more asked; at \
                 most {JUDGE_MAX_RESPONSES_PER_CALL} per call",
                self.judged,
                responses.len()
            ));
        }
        let debate = self.judged_before + self.judged;
        if debate + responses.len() > JUDGE_MAX_RESPONSES_PER_DEBATE {
            return Err(format!(
                "judge refused: {debate} responses judged in this debate already, {} more \
                 asked; at most {JUDGE_MAX_RESPONSES_PER_DEBATE} per debate",
                responses.len()
            ));
        }
        if question.len() > JUDGE_MAX_QUESTION_BYTES {
            return Err(format!(
                "judge refused: the question is {} bytes; at most {JUDGE_MAX_QUESTION_BYTES}",
                question.len()
            ));
        }
        if let Some((i, r)) = responses
            .iter()
            .enumerate()
            .find(|(_, r)| r.len() > JUDGE_MAX_RESPONSE_BYTES)
        {
            return Err(format!(
                "judge refused: response {i} is {} bytes; at most {JUDGE_MAX_RESPONSE_BYTES}",
                r.len()
            ));
        }
        Ok(())
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What one table element is counted as against the memory cap (a function reference in
/// wasmtime is a pointer; counted at twice that to leave room for its bookkeeping).
pub const TABLE_ELEMENT_BYTES: usize = 16;
/// How many instances, linear memories and tables one plugin's store may hold. A component
/// instantiates a few core instances (its module, the WASI adapter, shims); each may have a
/// memory and a table or two.
pub const MAX_INSTANCES: usize = 64;
pub const MAX_MEMORIES: usize = 64;
pub const MAX_TABLES: usize = 64;

impl Sandbox {
    /// Admits a growth of one memory or table from `current` to `desired` bytes if the whole
    /// footprint stays under the cap; else records the refusal and traps.
    fn grow(&mut self, what: &str, current: usize, desired: usize) -> wasmtime::Result<bool> {
        let total = (self.footprint - current.min(self.footprint)).saturating_add(desired);
        if total > self.memory_limit {
            self.memory_refused = Some((total, self.memory_limit));
            // Trap rather than let `memory.grow` return -1: a Rust guest would otherwise
            // abort with a message that hides the cause.
            return Err(wasmtime::Error::msg(format!(
                "memory cap exceeded: growing a {what} to {desired} bytes would bring the \
                 plugin's memories and tables to {total} bytes, over its cap of {} bytes",
                self.memory_limit
            )));
        }
        self.footprint = total;
        Ok(true)
    }
}

impl ResourceLimiter for Sandbox {
    /// Every linear memory of every instance counts: their sum is capped, not each alone.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow("linear memory", current, desired)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.grow(
            "table",
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        )
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

impl host::Host for Sandbox {
    fn log(&mut self, level: host::Level, message: String) {
        if self.log_bytes >= LOG_BYTES_PER_CALL {
            return;
        }
        let room = LOG_BYTES_PER_CALL - self.log_bytes;
        self.log_bytes += message.len();
        let level = match level {
            host::Level::Debug => LogLevel::Debug,
            host::Level::Info => LogLevel::Info,
            host::Level::Warn => LogLevel::Warn,
            host::Level::Error => LogLevel::Error,
        };
        let origin = self.log_origin();
        if message.len() <= room {
            (self.log)(&origin, level, &message);
        } else {
            let mut cut = room;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            let line = format!(
                "{}... [log budget of {LOG_BYTES_PER_CALL} bytes per call spent; rest dropped]",
                &message[..cut]
            );
            (self.log)(&origin, level, &line);
        }
    }

    fn judge(&mut self, question: String, responses: Vec<String>) -> Result<Vec<f32>, String> {
        match &self.judge {
            None => Err(
                "no verifier model configured: this run has no learned verifier; \
                 train one with `maporl verifier train` and name it in the run config's \
                 [verifier] section (checkpoint = \"RUN/checkpoints/final\")"
                    .to_string(),
            ),
            // The probe (`judge("", [])` at configure time) and any other empty list: the
            // answer is the empty list, without asking the model.
            Some(_) if responses.is_empty() => Ok(Vec::new()),
            Some(judge) => {
                self.check_judge(&question, &responses)?;
                self.judged += responses.len();
                let probs = match self.deadline {
                    Some((end, ms)) => judge
                        .judge_until(&question, &responses, end)
                        .map_err(|e| format!("judge (deadline {ms} ms): {e}"))?,
                    None => judge.judge(&question, &responses)?,
                };
                if probs.len() != responses.len() {
                    return Err(format!(
                        "the learned verifier gave {} scores for {} responses",
                        probs.len(),
                        responses.len()
                    ));
                }
                Ok(probs)
            }
        }
    }

    fn limits(&mut self) -> host::PluginLimits {
        let l = &self.limits;
        let call = JUDGE_MAX_RESPONSES_PER_CALL.saturating_sub(self.judged);
        let debate = JUDGE_MAX_RESPONSES_PER_DEBATE
            .saturating_sub(self.judged_before.saturating_add(self.judged));
        host::PluginLimits {
            fuel: l.fuel,
            deadline_ms: l.deadline_ms,
            memory_bytes: l.memory_mib.saturating_mul(1 << 20),
            max_result_bytes: l.max_result_kib.saturating_mul(1 << 10),
            max_prompt_bytes: l.max_prompt_bytes,
            max_answer_bytes: l.max_answer_bytes,
            max_abs_reward: l.max_abs_reward,
            max_reward_parts: l.max_reward_parts,
            max_part_name_bytes: l.max_part_name_bytes,
            judge_responses_left: u32::try_from(call.min(debate)).unwrap_or(u32::MAX),
        }
    }
}

/// What a plugin that tries to wait is told (the trap's message).
pub(crate) const NO_WAITING: &str = "plugins may not sleep or wait on a clock \
     (wasi:clocks/monotonic-clock subscribe-duration / subscribe-instant): a call's deadline \
     bounds its whole wall time, and host time spent waiting is not guest time the deadline \
     could interrupt";

/// Replaces WASI's two blocking clock functions with ones that trap: the epoch deadline
/// interrupts only guest code, so a sleep inside the host (a pollable on the monotonic
/// clock, blocked on by `poll` or `block`) would hold the call past its deadline, or for
/// ever. Nothing else WASI gives a plugin can block: it has no files, sockets or stdin, and
/// its stderr is a memory pipe.
pub(crate) fn forbid_waiting(
    linker: &mut wasmtime::component::Linker<Sandbox>,
) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    linker.allow_shadowing(true);
    let mut clock = linker.instance("wasi:clocks/monotonic-clock@0.2.12")?;
    clock.func_wrap(
        "subscribe-duration",
        |_, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Err(wasmtime::Error::msg(NO_WAITING))
        },
    )?;
    clock.func_wrap(
        "subscribe-instant",
        |_, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Err(wasmtime::Error::msg(NO_WAITING))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A clock that starts at a fixed instant and moves 1 µs forward each time it is read, so
/// that a plugin that reads the time behaves the same on every run.
struct SteppingClock {
    ticks: std::sync::atomic::AtomicU64,
}

impl SteppingClock {
    /// 2020-01-01T00:00:00Z, as seconds since the Unix epoch.
    const START_SECS: u64 = 1_577_836_800;

    fn new() -> Self {
        SteppingClock {
            ticks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn tick(&self) -> u64 {
        self.ticks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1
    }
}

impl HostWallClock for SteppingClock {
    fn resolution(&self) -> Duration {
        Duration::from_micros(1)
    }
    fn now(&self) -> Duration {
        Duration::from_secs(Self::START_SECS) + Duration::from_micros(self.tick())
    }
}

impl HostMonotonicClock for SteppingClock {
    fn resolution(&self) -> u64 {
        1_000
    }
    fn now(&self) -> u64 {
        self.tick() * 1_000
    }
}

#[cfg(test)]
mod footprint_tests {
    use super::*;
    use wasmtime::{Engine, Instance, Module, Store};

    const MIB: usize = 1 << 20;
    /// 64 KiB wasm pages in `mib` MiB.
    fn pages(mib: usize) -> usize {
        mib * 16
    }

    fn store(engine: &Engine, cap_mib: u64) -> Store<Sandbox> {
        let limits = Limits {
            memory_mib: cap_mib,
            ..Limits::default()
        };
        let mut store = Store::new(
            engine,
            Sandbox::new("t.wasm", World::Protocol, &limits, 0, stderr_sink(), None),
        );
        store.limiter(|s| s as &mut dyn ResourceLimiter);
        store
    }

    fn module(engine: &Engine, wat: &str) -> Module {
        Module::new(engine, wat::parse_str(wat).unwrap()).unwrap()
    }

    fn refused(store: &Store<Sandbox>) -> (usize, usize) {
        store.data().memory_refused.expect("a refusal was recorded")
    }

    #[test]
    fn the_cap_bounds_the_sum_of_every_memory_and_table_of_every_instance() {
        let engine = Engine::default();
        // Two memories of 40 MiB: each under a 64 MiB cap, not together.
        let m = module(
            &engine,
            &format!("(module (memory {}) (memory {}))", pages(40), pages(40)),
        );
        let mut s = store(&engine, 64);
        assert!(Instance::new(&mut s, &m, &[]).is_err());
        let (total, limit) = refused(&s);
        assert_eq!((total, limit), (80 * MIB, 64 * MIB));
        // The same two at 20 MiB fit.
        let ok = module(
            &engine,
            &format!("(module (memory {}) (memory {}))", pages(20), pages(20)),
        );
        Instance::new(&mut store(&engine, 64), &ok, &[]).unwrap();

        // A memory and a large table: 40 MiB + 2M elements x 16 B = 72 MiB.
        let m = module(
            &engine,
            &format!("(module (memory {}) (table 2097152 funcref))", pages(40)),
        );
        let mut s = store(&engine, 64);
        assert!(Instance::new(&mut s, &m, &[]).is_err());
        assert_eq!(refused(&s).0, 72 * MIB);

        // Growth at run time of a second memory once the first holds 40 MiB.
        let m = module(
            &engine,
            &format!(
                "(module (memory {}) (memory $b 1) \
                 (func (export \"grow\") (result i32) (memory.grow $b (i32.const {}))))",
                pages(40),
                pages(30)
            ),
        );
        let mut s = store(&engine, 64);
        let inst = Instance::new(&mut s, &m, &[]).unwrap();
        let grow = inst.get_typed_func::<(), i32>(&mut s, "grow").unwrap();
        let err = grow.call(&mut s, ()).unwrap_err();
        assert!(
            format!("{err:?}").contains("memory cap exceeded"),
            "{err:?}"
        );
        assert!(refused(&s).0 > 64 * MIB);

        // Table growth at run time counts too.
        let m = module(
            &engine,
            "(module (table $t 1 funcref) \
             (func (export \"grow\") (result i32) \
               (table.grow $t (ref.null func) (i32.const 8000000))))",
        );
        let mut s = store(&engine, 64);
        let inst = Instance::new(&mut s, &m, &[]).unwrap();
        let grow = inst.get_typed_func::<(), i32>(&mut s, "grow").unwrap();
        assert!(grow.call(&mut s, ()).is_err());
        assert!(refused(&s).0 > 64 * MIB);
    }

    #[test]
    fn instances_add_up_and_their_number_is_bounded() {
        let engine = Engine::default();
        // 2 MiB each: the 33rd instance would take the store past 64 MiB.
        let m = module(&engine, &format!("(module (memory {}))", pages(2)));
        let mut s = store(&engine, 64);
        for _ in 0..32 {
            Instance::new(&mut s, &m, &[]).unwrap();
        }
        assert!(Instance::new(&mut s, &m, &[]).is_err());
        assert_eq!(refused(&s), (66 * MIB, 64 * MIB));
        // Instances without memory: at most MAX_INSTANCES.
        let empty = module(&engine, "(module)");
        let mut s = store(&engine, 64);
        let made = (0..MAX_INSTANCES + 10)
            .take_while(|_| Instance::new(&mut s, &empty, &[]).is_ok())
            .count();
        assert_eq!(made, MAX_INSTANCES);
        // So are memories and tables per store.
        let m = module(&engine, "(module (memory 0) (table 0 funcref))");
        let mut s = store(&engine, 64);
        let made = (0..MAX_MEMORIES + 10)
            .take_while(|_| Instance::new(&mut s, &m, &[]).is_ok())
            .count();
        assert_eq!(made, MAX_MEMORIES.min(MAX_TABLES));
    }

    /// A component, as plugins are: its core instances' memories and tables are summed too,
    /// whether they come from one module instantiated twice or from modules of their own.
    #[test]
    fn a_components_core_instances_share_one_cap() {
        use wasmtime::component::{Component, Linker};
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        let engine = Engine::new(&config).unwrap();
        let instantiate = |wat: &str, cap_mib: u64| {
            let component = Component::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
            let mut s = store(&engine, cap_mib);
            let made = Linker::<Sandbox>::new(&engine).instantiate(&mut s, &component);
            (made.is_ok(), s.data().memory_refused)
        };
        // One module with a 24 MiB memory, instantiated three times: 72 MiB.
        let thrice = format!(
            "(component (core module $m (memory {})) \
               (core instance (instantiate $m)) (core instance (instantiate $m)) \
               (core instance (instantiate $m)))",
            pages(24)
        );
        assert_eq!(
            instantiate(&thrice, 64),
            (false, Some((72 * MIB, 64 * MIB)))
        );
        assert_eq!(instantiate(&thrice, 80), (true, None));
        // Two modules, one with two memories and one with a table of 1M elements (16 MiB):
        // 20 + 20 + 16 MiB.
        let mixed = format!(
            "(component (core module $a (memory {0}) (memory {0})) \
               (core module $b (table 1048576 funcref)) \
               (core instance (instantiate $a)) (core instance (instantiate $b)))",
            pages(20)
        );
        assert_eq!(instantiate(&mixed, 48), (false, Some((56 * MIB, 48 * MIB))));
        assert_eq!(instantiate(&mixed, 56), (true, None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use host::Host as _;

    /// Every limit under which nothing could run, and a component cap past its stated
    /// maximum, is refused naming its key; the defaults and the bounds themselves pass.
    #[test]
    fn limits_that_leave_nothing_runnable_are_refused_by_key() {
        assert_eq!(Limits::default().check(), Ok(()));
        let refused = |l: Limits, says: &str| {
            let err = l.check().unwrap_err();
            assert!(err.contains(says), "{err}");
        };
        let d = Limits::default;
        refused(Limits { fuel: 0, ..d() }, "limits.fuel = 0");
        refused(
            Limits {
                deadline_ms: 0,
                ..d()
            },
            "limits.deadline_ms = 0",
        );
        refused(
            Limits {
                memory_mib: 0,
                ..d()
            },
            "limits.memory_mib = 0",
        );
        refused(
            Limits {
                max_prompt_bytes: 0,
                ..d()
            },
            "limits.max_prompt_bytes = 0",
        );
        refused(
            Limits {
                max_abs_reward: f64::NAN,
                ..d()
            },
            "limits.max_abs_reward = NaN",
        );
        refused(
            Limits {
                max_abs_reward: -1.0,
                ..d()
            },
            "limits.max_abs_reward = -1",
        );
        refused(
            Limits {
                max_component_mib: 0,
                ..d()
            },
            "limits.max_component_mib = 0",
        );
        refused(
            Limits {
                max_component_mib: 1025,
                ..d()
            },
            "limits.max_component_mib = 1025: at most 1024",
        );
        assert_eq!(
            Limits {
                max_component_mib: 1024,
                ..d()
            }
            .check(),
            Ok(())
        );
        assert_eq!(d().component_bytes(), 64 << 20);
    }

    /// Answers 0.5 per response and counts its calls.
    struct Half(std::sync::atomic::AtomicUsize);

    impl Judge for Half {
        fn judge(&self, _question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(vec![0.5; responses.len()])
        }
    }

    /// A judge that loses a score.
    struct Short;

    impl Judge for Short {
        fn judge(&self, _question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
            Ok(vec![0.5; responses.len().saturating_sub(1)])
        }
    }

    fn sandbox(judge: Option<Arc<dyn Judge>>) -> Sandbox {
        Sandbox::new(
            "t",
            World::Verifier,
            &Limits::default(),
            0,
            stderr_sink(),
            judge,
        )
    }

    /// The WIT contract of `judge`, the configure-time probe `judge("", [])` included.
    #[test]
    fn judge_of_an_empty_list_is_an_empty_list_or_the_no_verifier_error() {
        let err = sandbox(None).judge(String::new(), vec![]).unwrap_err();
        assert!(err.starts_with("no verifier model configured"), "{err}");
        let err = sandbox(None)
            .judge("q".into(), vec!["a".into()])
            .unwrap_err();
        assert!(err.starts_with("no verifier model configured"), "{err}");

        let half = Arc::new(Half(Default::default()));
        let mut s = sandbox(Some(half.clone()));
        assert_eq!(s.judge(String::new(), vec![]), Ok(vec![]));
        assert_eq!(s.judge("q".into(), vec![]), Ok(vec![]));
        assert_eq!(
            half.0.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "an empty list does not reach the model"
        );
        assert_eq!(
            s.judge("q".into(), vec!["a".into(), "b".into()]),
            Ok(vec![0.5, 0.5])
        );

        let err = sandbox(Some(Arc::new(Short)))
            .judge("q".into(), vec!["a".into(), "b".into()])
            .unwrap_err();
        assert!(err.contains("1 scores for 2 responses"), "{err}");
    }
}
