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

use super::bindings::host;

/// Resource limits of one plugin, per call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Fuel (roughly, wasm instructions) one call may use. Deterministic: the same call
    /// always uses the same fuel.
    pub fuel: u64,
    /// Wall-clock deadline of one call, in milliseconds.
    pub deadline_ms: u64,
    /// Cap on the plugin's linear memory, in MiB.
    pub memory_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // The reference plugins use under 1% of this on GSM8K-sized debates (tested).
            fuel: 2_000_000_000,
            deadline_ms: 5_000,
            memory_mib: 64,
        }
    }
}

impl Limits {
    /// Refuses limits under which no call could run: a zero budget, deadline or memory cap
    /// (the error names the key).
    pub fn check(&self) -> Result<(), String> {
        for (key, v) in [
            ("fuel", self.fuel),
            ("deadline_ms", self.deadline_ms),
            ("memory_mib", self.memory_mib),
        ] {
            if v == 0 {
                return Err(format!(
                    "limits.{key} = 0: no call could run; expected at least 1"
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn memory_bytes(&self) -> usize {
        usize::try_from(self.memory_mib.saturating_mul(1 << 20)).unwrap_or(usize::MAX)
    }
}

/// The run's learned verifier, as offered to plugins through the host `judge` function.
pub trait Judge: Send + Sync {
    /// One probability in [0, 1] per response, in order.
    fn judge(&self, question: &str, responses: &[String]) -> Result<Vec<f32>, String>;

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

/// Where plugins' log lines go: called with the plugin's name, the level and the line.
pub type LogSink = Arc<dyn Fn(&str, LogLevel, &str) + Send + Sync>;

/// The default sink: warnings and errors on stderr, everything with MAPORL_PLUGIN_LOG=debug.
/// Each log call is one line, `[plugin FILE] Level: text`, with everything a terminal would
/// act on in the name and the text escaped ([`super::printable`]): a plugin can neither
/// rewrite the screen nor print a line that passes for the host's or another plugin's.
pub fn stderr_sink() -> LogSink {
    let threshold = match std::env::var("MAPORL_PLUGIN_LOG").as_deref() {
        Ok("debug") => LogLevel::Debug,
        Ok("info") => LogLevel::Info,
        Ok("error") => LogLevel::Error,
        _ => LogLevel::Warn,
    };
    Arc::new(move |plugin, level, line| {
        if level >= threshold {
            eprintln!("{}", log_line(plugin, level, line));
        }
    })
}

/// How the default sink shows a plugin's log line.
pub(crate) fn log_line(plugin: &str, level: LogLevel, line: &str) -> String {
    use super::printable::printable;
    format!(
        "[plugin {}] {level:?}: {}",
        printable(plugin),
        printable(line)
    )
}

/// Most log text one call may write; the rest is dropped with a note.
const LOG_BYTES_PER_CALL: usize = 64 * 1024;
/// Capacity of the captured stderr (panic messages land there).
pub(crate) const STDERR_CAPACITY: usize = 256 * 1024;

/// The data of one plugin Store.
pub(crate) struct Sandbox {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) stderr: MemoryOutputPipe,
    memory_limit: usize,
    /// Set when the limiter refused a growth, so the trap can be told as a memory-cap error.
    pub(crate) memory_refused: Option<(usize, usize)>,
    plugin_name: String,
    log: LogSink,
    log_bytes: usize,
    judge: Option<Arc<dyn Judge>>,
}

impl Sandbox {
    pub(crate) fn new(
        plugin_name: &str,
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
            memory_refused: None,
            plugin_name: plugin_name.to_string(),
            log,
            log_bytes: 0,
            judge,
        }
    }

    /// Called before each call: resets the per-call log budget.
    pub(crate) fn begin_call(&mut self) {
        self.log_bytes = 0;
        self.memory_refused = None;
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

impl ResourceLimiter for Sandbox {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_refused = Some((desired, self.memory_limit));
            // Trap rather than let `memory.grow` return -1: a Rust guest would otherwise
            // abort with a message that hides the cause.
            return Err(wasmtime::Error::msg(format!(
                "memory cap exceeded: desired {desired} bytes, limit {} bytes",
                self.memory_limit
            )));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
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
        if message.len() <= room {
            (self.log)(&self.plugin_name, level, &message);
        } else {
            let mut cut = room;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            let line = format!(
                "{}... [log budget of {LOG_BYTES_PER_CALL} bytes per call spent; rest dropped]",
                &message[..cut]
            );
            (self.log)(&self.plugin_name, level, &line);
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
                let probs = judge.judge(&question, &responses)?;
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
mod tests {
    use super::*;
    use host::Host as _;

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
        Sandbox::new("t", &Limits::default(), 0, stderr_sink(), judge)
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
