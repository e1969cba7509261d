//! TEST FIXTURE support: the misbehaviours shared by the hostile test plugins. Nothing here
//! belongs in a real plugin.
//!
//! A fixture reads the mode from `task.question` (trimmed) or from its `misbehave` setting
//! in `configure`:
//!
//! | mode        | what happens                                                       |
//! |-------------|--------------------------------------------------------------------|
//! | `loop`      | an infinite loop                                                   |
//! | `alloc`     | allocates 1 GiB and writes to every byte                           |
//! | `panic`     | `panic!("hostile plugin panicked on purpose")`                     |
//! | `trap`      | the wasm `unreachable` instruction                                 |
//! | `trap-after-output` | writes [`LAST_WORDS`] to stderr, then `unreachable`        |
//! | `stack`     | unbounded recursion                                                |
//! | `read-file` | reads /etc/passwd: its first line in the output, or the io error   |
//! | `env`       | an error listing the environment variables and arguments seen      |
//! | `clock`     | an error "clock: <secs> <nanos> random: <u64>" (wall clock, random)|
//! | `sleep`     | sleeps an hour (`std::thread::sleep`: a WASI monotonic-clock wait)  |
//! | `escape-error` | returns [`TERMINAL_ATTACK`] as its error                        |
//! | `escape-panic` | panics with [`TERMINAL_ATTACK`]                                 |
//! | `escape-trap`  | writes [`TERMINAL_ATTACK`] to stderr, then `unreachable`        |
//! | `escape-log`   | (protocol) logs [`TERMINAL_ATTACK`] at level error, then behaves |
//!
//! Any other mode: the fixture behaves (or applies a world-specific misbehaviour).

use maporl_plugin::settings::parse_settings;
use serde::Deserialize;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::time::{SystemTime, UNIX_EPOCH};

/// What a misbehaviour that returns leaves the fixture to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not a shared misbehaviour: behave normally (or apply a world-specific one).
    Normal,
    /// Return this text through the function's Ok path.
    Output(String),
    /// Return this error.
    Error(String),
}

/// The panic message of mode `panic`.
pub const PANIC_MESSAGE: &str = "hostile plugin panicked on purpose";

/// What mode `trap-after-output` writes to stderr before it traps: three lines.
pub const LAST_WORDS: &str =
    "loading the answer table\nreading constants.txt\nno such table: constants";

/// Text that attacks the terminal it is printed on: a forged host error on a new line, a
/// carriage return that overwrites the line, clear-screen and colour sequences, a window
/// title (OSC ... BEL), an 8-bit CSI, a bidi override and a line separator.
pub const TERMINAL_ATTACK: &str = "fine\nerror: forged by the plugin\r[plugin other.wasm] Error: \
     x\x1b[2J\x1b[31mred\x1b]0;pwned\x07\u{9b}1A\u{202e}gpj.exe\u{2028}end";

/// Bytes allocated by mode `alloc`.
pub const ALLOC_BYTES: usize = 1 << 30;

/// Runs the misbehaviour named `mode` (see the crate docs).
pub fn misbehave(mode: &str) -> Outcome {
    match mode.trim() {
        "loop" => spin(),
        "alloc" => Outcome::Error(format!(
            "alloc: allocated and wrote {} bytes (nothing stopped it)",
            allocate(ALLOC_BYTES)
        )),
        "panic" => panic!("{PANIC_MESSAGE}"),
        "trap" => trap(),
        "trap-after-output" => {
            eprintln!("{LAST_WORDS}");
            trap()
        }
        "escape-trap" => {
            eprintln!("{TERMINAL_ATTACK}");
            trap()
        }
        "stack" => Outcome::Error(format!("stack: recursion returned {}", recurse(0))),
        "read-file" => match std::fs::read_to_string("/etc/passwd") {
            Ok(text) => Outcome::Output(format!(
                "read-file: {}",
                text.lines().next().unwrap_or_default()
            )),
            Err(e) => Outcome::Error(format!("read-file /etc/passwd: {e}")),
        },
        "env" => {
            let vars: Vec<(String, String)> = std::env::vars().collect();
            let args: Vec<String> = std::env::args().collect();
            Outcome::Error(format!("env: {vars:?} args: {args:?}"))
        }
        "clock" => Outcome::Error(clock()),
        "escape-error" => Outcome::Error(TERMINAL_ATTACK.to_string()),
        "sleep" => {
            // Host time, not guest time: the epoch deadline cannot interrupt it.
            std::thread::sleep(std::time::Duration::from_secs(3600));
            Outcome::Error("sleep: slept an hour (nothing stopped it)".into())
        }
        "escape-panic" => panic!("{TERMINAL_ATTACK}"),
        _ => Outcome::Normal,
    }
}

/// Spins forever.
pub fn spin() -> ! {
    let mut n: u64 = 0;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Allocates `bytes` and writes every byte so nothing can be optimised away; returns the
/// number of bytes written.
pub fn allocate(bytes: usize) -> usize {
    let mut v: Vec<u8> = Vec::with_capacity(bytes);
    v.resize(bytes, 0xAB);
    black_box(&mut v);
    v.iter().step_by(4096).filter(|b| **b == 0xAB).count() * 4096
}

/// Recurses until the stack runs out; the frame and the use of the callee's result keep the
/// compiler from turning it into a loop.
pub fn recurse(depth: u64) -> u64 {
    let mut frame = [0u8; 1024];
    frame[(depth % 1024) as usize] = depth as u8;
    black_box(&mut frame);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    recurse(depth + 1).wrapping_add(u64::from(frame[(depth % 7) as usize]))
}

/// Executes the wasm `unreachable` instruction (aborts natively).
pub fn trap() -> ! {
    #[cfg(target_arch = "wasm32")]
    {
        core::arch::wasm32::unreachable()
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        std::process::abort()
    }
}

/// "clock: <secs> <nanos> random: <n>": the wall clock and a number derived from the
/// randomness std reads for `RandomState` keys.
pub fn clock() -> String {
    let (secs, nanos) = match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i128, d.subsec_nanos()),
        Err(e) => (
            -(e.duration().as_secs() as i128),
            e.duration().subsec_nanos(),
        ),
    };
    let random = RandomState::new().hash_one(0x5eed_u64);
    format!("clock: {secs} {nanos} random: {random}")
}

/// The settings every hostile fixture takes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// A mode to run inside `configure` itself; also "fail" (configure returns an error).
    pub misbehave: Option<String>,
}

/// `configure` for a fixture named `plugin`: parses the settings and runs the `misbehave`
/// mode, if any. `Ok(true)` when it behaved normally (the caller then logs).
pub fn configure(plugin: &str, json: &str) -> Result<bool, String> {
    let settings: Settings = parse_settings(plugin, json)?;
    match settings.misbehave.as_deref() {
        None => Ok(true),
        Some("fail") => Err(format!(
            "{plugin}: configure failed on purpose (misbehave = fail)"
        )),
        Some(mode) => match misbehave(mode) {
            Outcome::Normal => Ok(true),
            Outcome::Output(_) => Ok(false),
            Outcome::Error(e) => Err(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harmless_modes_run_natively() {
        assert_eq!(misbehave("something else"), Outcome::Normal);
        match misbehave("read-file") {
            Outcome::Output(s) => assert!(s.starts_with("read-file: "), "{s}"),
            Outcome::Error(e) => assert!(e.starts_with("read-file /etc/passwd: "), "{e}"),
            Outcome::Normal => panic!("read-file behaved normally"),
        }
        match misbehave(" env ") {
            Outcome::Error(e) => assert!(e.starts_with("env: [") && e.contains("] args: ["), "{e}"),
            other => panic!("{other:?}"),
        }
        match misbehave("clock") {
            Outcome::Error(e) => {
                let words: Vec<&str> = e.split(' ').collect();
                assert_eq!(words[0], "clock:");
                assert!(words[1].parse::<i128>().is_ok() && words[2].parse::<u32>().is_ok());
                assert_eq!(words[3], "random:");
                assert!(words[4].parse::<u64>().is_ok(), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    #[should_panic(expected = "hostile plugin panicked on purpose")]
    fn panic_mode_panics() {
        misbehave("panic");
    }

    #[test]
    fn small_allocations_are_written() {
        assert_eq!(allocate(1 << 20), 1 << 20);
    }

    #[test]
    fn configure_modes() {
        assert_eq!(configure("hostile-x", "{}"), Ok(true));
        assert_eq!(
            configure("hostile-x", r#"{"misbehave": "read-file"}"#),
            Ok(false)
        );
        assert!(configure("hostile-x", r#"{"misbehave": "fail"}"#)
            .unwrap_err()
            .contains("on purpose"));
        assert!(configure("hostile-x", r#"{"misbehave": "clock"}"#)
            .unwrap_err()
            .starts_with("clock: "));
        assert!(configure("hostile-x", r#"{"nope": 1}"#).is_err());
    }
}
