//! Hostile plugins (plugins/testing) against the sandbox: every misbehaviour becomes a clear
//! error naming the plugin, world, function and task, and the next call on a fresh instance
//! succeeds.

mod support;

use std::sync::Arc;

use maporl::plugin::{Failure, Limits, PluginError, Protocol, RewardShaper, Verifier};
use maporl::transcript::Task;
use serde_json::json;
use support::*;

fn hostile(question: &str) -> Task {
    task(&format!("task-{question}"), "arith", question, "5")
}

fn protocol(rt: &maporl::plugin::Runtime, limits: &Limits) -> Protocol {
    Protocol::load(rt, &plugin("hostile_protocol"), &json!({}), limits).expect("loads")
}

fn verifier(rt: &maporl::plugin::Runtime, limits: &Limits) -> Verifier {
    Verifier::load(rt, &plugin("hostile_verifier"), &json!({}), limits).expect("loads")
}

fn shaper(rt: &maporl::plugin::Runtime, limits: &Limits) -> RewardShaper {
    RewardShaper::load(rt, &plugin("hostile_shaper"), &json!({}), limits).expect("loads")
}

/// Asserts the error names the plugin, world, function and task, and returns its failure.
fn failure(err: PluginError, file: &str, world: &str, function: &str, task: &str) -> Failure {
    let text = err.to_string();
    for needle in [
        file,
        &format!("world {world}"),
        &format!("`{function}`"),
        &format!("`{task}`"),
    ] {
        assert!(
            text.contains(needle),
            "error does not name {needle}: {text}"
        );
    }
    err.failure
}

/// Runs a misbehaving protocol call, checks the error, then checks the same handle works.
fn protocol_fails(question: &str, limits: Limits) -> Failure {
    let (rt, _, _cache) = runtime();
    let mut p = protocol(&rt, &limits);
    let t = transcript(2, 3, vec![]);
    let err = p
        .plan_turn(&hostile(question), 1, &t)
        .expect_err("must fail");
    let f = failure(
        err,
        "hostile_protocol.wasm",
        "protocol",
        "plan-turn",
        &format!("task-{question}"),
    );
    // The host keeps working: the next call gets a fresh instance and succeeds.
    let plan = p
        .plan_turn(&hostile("What is 2 + 3?"), 1, &t)
        .expect("fresh instance works");
    assert_eq!(plan.iter().map(|p| p.agent).collect::<Vec<_>>(), vec![0, 1]);
    f
}

#[test]
fn infinite_loop_runs_out_of_fuel() {
    let f = protocol_fails("loop", Limits::default());
    assert_eq!(
        f,
        Failure::OutOfFuel {
            budget: Limits::default().fuel
        }
    );
}

#[test]
fn infinite_loop_hits_the_wall_clock_deadline_when_fuel_is_plenty() {
    let limits = Limits {
        fuel: u64::MAX / 2,
        deadline_ms: 200,
        ..Limits::default()
    };
    let f = protocol_fails("loop", limits);
    assert_eq!(f, Failure::Deadline { millis: 200 });
}

#[test]
fn allocating_a_gibibyte_hits_the_memory_cap() {
    match protocol_fails("alloc", Limits::default()) {
        Failure::MemoryCap { desired, limit } => {
            assert_eq!(limit, 64 << 20);
            assert!(desired > limit, "desired {desired}");
        }
        other => panic!("expected a memory-cap error, got {other:?}"),
    }
    // A lower cap is honoured too, and named in the message.
    let (rt, _, _c) = runtime();
    let limits = Limits {
        memory_mib: 16,
        ..Limits::default()
    };
    let mut v = verifier(&rt, &limits);
    let err = v.score(&hostile("alloc"), &["x".into()]).unwrap_err();
    assert!(err.to_string().contains("the cap is 16 MiB"), "{err}");
}

#[test]
fn panic_carries_the_plugins_message() {
    match protocol_fails("panic", Limits::default()) {
        Failure::Panic(msg) => assert!(msg.contains("hostile plugin panicked on purpose"), "{msg}"),
        other => panic!("expected a panic, got {other:?}"),
    }
}

#[test]
fn trap_is_reported() {
    match protocol_fails("trap", Limits::default()) {
        Failure::Trap(msg) => assert!(
            msg.contains("unreachable") && !msg.contains("stderr"),
            "{msg}"
        ),
        other => panic!("expected a trap, got {other:?}"),
    }
}

/// What a plugin wrote to stderr before it trapped is the error's last lines: the reason a
/// trap alone does not say.
#[test]
fn a_trap_carries_what_the_call_wrote_to_stderr() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let err = p
        .plan_turn(&hostile("trap-after-output"), 1, &transcript(2, 3, vec![]))
        .unwrap_err();
    let Failure::Trap(msg) = &err.failure else {
        panic!("expected a trap, got {err}");
    };
    assert!(
        msg.contains("unreachable")
            && msg.contains(
                "its last lines on stderr:\n    loading the answer table\n    \
                 reading constants.txt\n    no such table: constants"
            ),
        "{msg}"
    );
}

#[test]
fn runaway_recursion_overflows_the_stack() {
    assert_eq!(
        protocol_fails("stack", Limits::default()),
        Failure::StackOverflow
    );
}

#[test]
fn host_files_environment_and_arguments_are_denied() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let t = transcript(2, 3, vec![]);
    let err = p.plan_turn(&hostile("read-file"), 1, &t).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err.failure, Failure::Returned(_)), "{text}");
    assert!(
        !text.contains("root:"),
        "the plugin read /etc/passwd: {text}"
    );
    assert!(text.to_lowercase().contains("/etc/passwd"), "{text}");
    let err = p.plan_turn(&hostile("env"), 1, &t).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("env: []"), "{text}");
    assert!(text.contains("args: []"), "{text}");
}

#[test]
fn clocks_and_randomness_follow_the_run_seed() {
    let reading = |seed| {
        let (rt, _, _c) = runtime_with(seed, None);
        let mut p = protocol(&rt, &Limits::default());
        let err = p
            .plan_turn(&hostile("clock"), 1, &transcript(2, 3, vec![]))
            .unwrap_err();
        match err.failure {
            Failure::Returned(msg) => msg,
            other => panic!("{other:?}"),
        }
    };
    let a = reading(1);
    assert!(a.starts_with("clock: "), "{a}");
    assert_eq!(a, reading(1), "same seed, same clock and randomness");
    assert_ne!(a, reading(2), "another seed, other randomness");
}

#[test]
fn nan_and_out_of_range_scores_are_refused() {
    let (rt, _, _c) = runtime();
    let mut v = verifier(&rt, &Limits::default());
    for (question, needle) in [("nan", "NaN"), ("out-of-range", "outside [0, 1]")] {
        let err = v
            .score(&hostile(question), &["5".into(), "6".into()])
            .unwrap_err();
        let f = failure(
            err,
            "hostile_verifier.wasm",
            "verifier",
            "score",
            &format!("task-{question}"),
        );
        match f {
            Failure::Invalid(msg) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("{other:?}"),
        }
        let ok = v
            .score(&hostile("fine"), &["5".into(), "6".into()])
            .expect("next call works");
        assert_eq!(
            ok.iter().map(|v| v.score).collect::<Vec<_>>(),
            vec![1.0, 0.0]
        );
    }
}

#[test]
fn rewards_for_missing_agents_or_turns_and_nan_rewards_are_refused() {
    let (rt, _, _c) = runtime();
    let mut s = shaper(&rt, &Limits::default());
    let t = transcript(
        2,
        3,
        vec![
            utterance(1, 0, Some("5"), 1.0, true),
            utterance(1, 1, Some("4"), 0.0, false),
        ],
    );
    for (question, needle) in [
        ("bad-agent", "agent 99"),
        ("bad-turn", "turn 99"),
        ("nan", "NaN"),
    ] {
        let err = s.shape(&hostile(question), &t).unwrap_err();
        match failure(
            err,
            "hostile_shaper.wasm",
            "reward-shaper",
            "shape",
            &format!("task-{question}"),
        ) {
            Failure::Invalid(msg) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("{other:?}"),
        }
        let rewards = s.shape(&hostile("fine"), &t).expect("next call works");
        assert_eq!(rewards.len(), 2);
    }
}

#[test]
fn plans_for_missing_or_duplicate_agents_are_refused() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let t = transcript(2, 3, vec![]);
    for (question, needle) in [("bad-plan", "agent 99"), ("duplicate-agent", "twice")] {
        let err = p.plan_turn(&hostile(question), 1, &t).unwrap_err();
        match failure(
            err,
            "hostile_protocol.wasm",
            "protocol",
            "plan-turn",
            &format!("task-{question}"),
        ) {
            Failure::Invalid(msg) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(p.plan_turn(&hostile("fine"), 1, &t).unwrap().len(), 2);
}

#[test]
fn every_world_contains_a_trap_and_recovers() {
    let (rt, _, _c) = runtime();
    let limits = Limits::default();
    let mut v = verifier(&rt, &limits);
    let err = v.score(&hostile("panic"), &["1".into()]).unwrap_err();
    assert!(matches!(err.failure, Failure::Panic(_)), "{err}");
    assert_eq!(
        v.score(&hostile("fine"), &["5".into()]).unwrap()[0].score,
        1.0
    );
    let mut s = shaper(&rt, &limits);
    let t = transcript(1, 1, vec![utterance(1, 0, Some("5"), 1.0, true)]);
    let err = s.shape(&hostile("loop"), &t).unwrap_err();
    assert!(matches!(err.failure, Failure::OutOfFuel { .. }), "{err}");
    assert_eq!(s.shape(&hostile("fine"), &t).unwrap().len(), 1);
}

#[test]
fn plugin_logs_reach_the_host_sink_tagged_with_the_plugin() {
    let (rt, captured, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    p.plan_turn(&hostile("fine"), 1, &transcript(2, 3, vec![]))
        .unwrap();
    let lines = captured.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|(plugin, _, _)| plugin.ends_with("hostile_protocol.wasm")),
        "{lines:?}"
    );
}

#[test]
fn judge_without_a_verifier_model_is_a_clear_error_and_with_one_returns_the_hosts_numbers() {
    struct Fixed;
    impl maporl::plugin::Judge for Fixed {
        fn judge(&self, question: &str, responses: &[String]) -> Result<Vec<f32>, String> {
            assert_eq!(question, "judge");
            Ok(responses.iter().map(|r| r.len() as f32 / 100.0).collect())
        }
    }
    let (rt, _, _c) = runtime();
    let mut v = verifier(&rt, &Limits::default());
    let err = v.score(&hostile("judge"), &["abc".into()]).unwrap_err();
    assert!(
        err.to_string().contains("no verifier model configured"),
        "{err}"
    );

    let (rt, _, _c) = runtime_with(0, Some(Arc::new(Fixed)));
    let mut v = verifier(&rt, &Limits::default());
    let verdicts = v
        .score(&hostile("judge"), &["abc".into(), "abcdefghij".into()])
        .unwrap();
    assert_eq!(
        verdicts.iter().map(|v| v.score).collect::<Vec<_>>(),
        vec![0.03, 0.10]
    );
}

/// Whether `text` is safe on a terminal as the host prints plugin text: no control
/// character but a newline, and every line after the first marked as continuing the
/// plugin's message (`  | `), so none passes for a line of the host's.
fn terminal_safe(text: &str) -> bool {
    text.lines().enumerate().all(|(i, l)| {
        !l.chars()
            .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c))
            && (i == 0 || l.starts_with("  | "))
    })
}

#[test]
fn plugin_text_reaches_the_terminal_escaped_in_every_world() {
    let (rt, captured, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let mut v = verifier(&rt, &Limits::default());
    let mut s = shaper(&rt, &Limits::default());
    let t = transcript(2, 1, vec![utterance(1, 0, Some("5"), 1.0, true)]);
    for mode in ["escape-error", "escape-panic", "escape-trap"] {
        let task = hostile(mode);
        for err in [
            p.plan_turn(&task, 1, &transcript(2, 3, vec![]))
                .unwrap_err(),
            p.decide(&task, 1, &t).unwrap_err(),
            v.score(&task, &["5".into()]).unwrap_err(),
            s.shape(&task, &t).unwrap_err(),
        ] {
            let shown = err.to_string();
            assert!(terminal_safe(&shown), "{mode}: {shown:?}");
            // What the plugin said is still there, visibly.
            assert!(
                shown.contains("forged by the plugin") && shown.contains("\\u{1b}[2J"),
                "{mode}: {shown:?}"
            );
        }
    }
    // A file name and a task id from outside are escaped too.
    let mut task = hostile("escape-error");
    task.id = "q1\x1b[2K\nerror: forged".into();
    let shown = p
        .plan_turn(&task, 1, &transcript(2, 3, vec![]))
        .unwrap_err()
        .to_string();
    assert!(
        terminal_safe(&shown) && shown.contains("q1\\u{1b}[2K\\nerror"),
        "{shown:?}"
    );
    // The log sink (the machine-readable side) gets the line intact; the next calls work.
    p.plan_turn(&hostile("escape-log"), 1, &transcript(2, 3, vec![]))
        .unwrap();
    let lines = captured.lock().unwrap();
    assert!(
        lines
            .iter()
            .any(|(_, _, l)| l.contains('\x1b') && l.contains("\nerror: forged")),
        "{lines:?}"
    );
}

#[test]
fn plugin_log_lines_and_errors_on_stderr_cannot_forge_or_rewrite_lines() {
    let input = |question: &str| {
        json!({
            "task": {"id": "t1", "kind": "arith", "question": question, "reference": "5"},
            "turn": 1,
            "transcript": {"agents": 2, "turns": 3, "utterances": []},
        })
        .to_string()
    };
    let file = plugin("hostile_protocol");
    for (question, ok) in [("escape-log", true), ("escape-panic", false)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
            .args([
                "plugin",
                "call",
                file.to_str().unwrap(),
                "plan-turn",
                "--input",
            ])
            .arg(input(question))
            .env("MAPORL_PLUGIN_LOG", "debug")
            .output()
            .unwrap();
        assert_eq!(out.status.success(), ok, "{question}: {out:?}");
        let stderr = String::from_utf8(out.stderr).unwrap();
        for line in stderr.lines() {
            assert!(
                !line.chars().any(|c| c.is_control()),
                "{question}: a control character reached the terminal: {line:?}"
            );
            if line.contains("forged by the plugin") {
                // A log line is tagged; an error's own lines are the host's, the plugin's
                // text inside them is marked as continuing (`  | `).
                assert!(
                    ["[plugin ", "error: ", "  caused by: ", "  | "]
                        .iter()
                        .any(|p| line.starts_with(p))
                        && !line.starts_with("error: forged"),
                    "{question}: plugin text on a line of its own: {line:?}"
                );
            }
        }
        assert!(stderr.contains("forged by the plugin"), "{stderr}");
    }
}

/// `maporl plugin call hostile_protocol.wasm plan-turn` on task `t1` whose question is
/// `question`, with `env` set and every logging variable not in it removed: (success,
/// stderr).
fn plan_turn_logging(question: &str, env: &[(&str, &str)]) -> (bool, String) {
    let input = json!({
        "task": {"id": "t1", "kind": "arith", "question": question, "reference": "5"},
        "turn": 1,
        "transcript": {"agents": 2, "turns": 3, "utterances": []},
    })
    .to_string();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"));
    cmd.args(["plugin", "call"])
        .arg(plugin("hostile_protocol"))
        .args(["plan-turn", "--input", &input]);
    for var in [
        "RUST_LOG",
        "MAPORL_PLUGIN_LOG",
        "MAPORL_LOG_FORMAT",
        "NO_COLOR",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    )
}

/// Whether a terminal would act on `c` (what the host escapes in plugin text).
fn acted_on(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}' | '\u{061c}'
        )
}

/// The JSON objects of stderr; every line but the command's own `fuel used:` result must be
/// one.
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter(|l| !l.starts_with("fuel used: "))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\n{stderr}"))
        })
        .collect()
}

#[test]
fn with_maporl_log_format_json_plugin_log_lines_are_json_events_naming_plugin_world_and_task() {
    let (ok, stderr) = plan_turn_logging(
        "escape-log",
        &[
            ("MAPORL_LOG_FORMAT", "json"),
            ("RUST_LOG", "warn,maporl::plugin=info"),
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        !stderr.chars().any(|c| c != '\n' && acted_on(c)),
        "a control character reached stderr: {stderr:?}"
    );
    let events = json_lines(&stderr);
    let plugin_events: Vec<_> = events
        .iter()
        .filter(|e| e["target"] == "maporl::plugin")
        .collect();
    // configure (about no task), the attack at error level, plan-turn's own info line.
    assert_eq!(plugin_events.len(), 3, "{stderr}");
    for e in &plugin_events {
        assert!(
            e["plugin"]
                .as_str()
                .is_some_and(|p| p.ends_with("hostile_protocol.wasm")),
            "{e}"
        );
        assert_eq!(e["world"], "protocol", "{e}");
        assert!(e["timestamp"].is_string(), "{e}");
    }
    let configure = plugin_events
        .iter()
        .find(|e| e["message"].as_str().unwrap().contains("configure"))
        .expect("the configure line");
    assert_eq!(configure["level"], "INFO", "{configure}");
    assert!(configure.get("task").is_none(), "{configure}");
    let attack = plugin_events
        .iter()
        .find(|e| e["level"] == "ERROR")
        .expect("the error line");
    assert_eq!(attack["task"], "t1", "{attack}");
    let message = attack["message"].as_str().unwrap();
    // Escaped as on a terminal, one line: the JSON value itself holds no control character.
    assert!(
        message.starts_with("fine\\nerror: forged by the plugin\\r[plugin other.wasm]"),
        "{message:?}"
    );
    assert!(!message.chars().any(acted_on), "{message:?}");
    let planned = plugin_events
        .iter()
        .find(|e| e["message"].as_str().unwrap().contains("plan-turn 1"))
        .expect("the plan-turn info line");
    assert_eq!(
        (&planned["level"], &planned["task"]),
        (&json!("INFO"), &json!("t1")),
        "{planned}"
    );
    // Nothing but JSON: a bad RUST_LOG is told as a JSON warning too, and the default
    // filter applies (plugins' warnings and errors only).
    let (ok, stderr) = plan_turn_logging(
        "escape-log",
        &[("MAPORL_LOG_FORMAT", "json"), ("RUST_LOG", "maporl=loud")],
    );
    assert!(ok, "{stderr}");
    let events = json_lines(&stderr);
    assert!(
        events.iter().any(|e| e["level"] == "WARN"
            && e["message"]
                .as_str()
                .unwrap()
                .starts_with("RUST_LOG=maporl=loud: ")),
        "{stderr}"
    );
    let levels: Vec<_> = events
        .iter()
        .filter(|e| e["target"] == "maporl::plugin")
        .map(|e| e["level"].as_str().unwrap())
        .collect();
    assert_eq!(levels, ["ERROR"], "{stderr}");
}

#[test]
fn rust_log_and_maporl_plugin_log_choose_which_lines_show() {
    let plugin_lines = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter(|l| l.starts_with("[plugin "))
            .map(|l| {
                l.split("] ")
                    .nth(1)
                    .unwrap()
                    .split(':')
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let debug_lines = |stderr: &str| stderr.lines().filter(|l| l.starts_with("debug: ")).count();
    // Unset: plugins' warnings and errors only, no debug lines.
    let (ok, stderr) = plan_turn_logging("escape-log", &[]);
    assert!(ok, "{stderr}");
    assert_eq!(plugin_lines(&stderr), ["Error"], "{stderr}");
    assert_eq!(debug_lines(&stderr), 0, "{stderr}");
    // RUST_LOG=maporl::plugin=info: plugins' info lines too.
    let (_, stderr) = plan_turn_logging("escape-log", &[("RUST_LOG", "maporl::plugin=info")]);
    assert_eq!(plugin_lines(&stderr), ["Info", "Error", "Info"], "{stderr}");
    assert_eq!(debug_lines(&stderr), 0, "{stderr}");
    // RUST_LOG=debug: the host's debug lines (one per plugin call, with its fields) too.
    let (_, stderr) = plan_turn_logging("behave", &[("RUST_LOG", "debug")]);
    assert_eq!(plugin_lines(&stderr), ["Info", "Info"], "{stderr}");
    let calls: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("debug: plugin call "))
        .collect();
    assert_eq!(calls.len(), 2, "configure and plan-turn: {stderr}");
    assert!(
        calls[1].contains(" world=protocol function=plan-turn task=t1 fuel="),
        "{stderr}"
    );
    // MAPORL_PLUGIN_LOG sets plugins' level over RUST_LOG's.
    let (_, stderr) = plan_turn_logging(
        "escape-log",
        &[
            ("RUST_LOG", "maporl::plugin=info"),
            ("MAPORL_PLUGIN_LOG", "off"),
        ],
    );
    assert!(plugin_lines(&stderr).is_empty(), "{stderr}");
    let (_, stderr) = plan_turn_logging("escape-log", &[("MAPORL_PLUGIN_LOG", "info")]);
    assert_eq!(plugin_lines(&stderr), ["Info", "Error", "Info"], "{stderr}");
    // A RUST_LOG that does not parse: told, and the default applies.
    let (ok, stderr) = plan_turn_logging("escape-log", &[("RUST_LOG", "maporl=loud")]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.starts_with("warning: RUST_LOG=maporl=loud: "),
        "{stderr}"
    );
    assert_eq!(plugin_lines(&stderr), ["Error"], "{stderr}");
}

#[test]
fn in_text_mode_a_plugin_log_line_is_one_tagged_line_with_every_escape_shown() {
    let (ok, stderr) = plan_turn_logging(
        "escape-log",
        &[("RUST_LOG", "trace"), ("MAPORL_LOG_FORMAT", "text")],
    );
    assert!(ok, "{stderr}");
    // stderr is not a terminal here: no colour, and nothing of the plugin's acts on one.
    assert!(
        !stderr.chars().any(|c| c != '\n' && acted_on(c)),
        "a control character reached stderr: {stderr:?}"
    );
    let attack: Vec<_> = stderr
        .lines()
        .filter(|l| l.contains("forged by the plugin"))
        .collect();
    assert_eq!(attack.len(), 1, "{stderr}");
    let file = plugin("hostile_protocol");
    assert_eq!(
        attack[0],
        format!(
            "[plugin {} world=protocol task=t1] Error: fine\\nerror: forged by the plugin\\r\
             [plugin other.wasm] Error: x\\u{{1b}}[2J\\u{{1b}}[31mred\\u{{1b}}]0;pwned\\u{{7}}\\u{{9b}}1A\
             \\u{{202e}}gpj.exe\\u{{2028}}end",
            file.display()
        )
    );
}

#[test]
fn a_plugin_that_sleeps_is_stopped_at_once_in_every_world() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let mut v = verifier(&rt, &Limits::default());
    let mut s = shaper(&rt, &Limits::default());
    let t = transcript(2, 1, vec![utterance(1, 0, Some("5"), 1.0, true)]);
    let started = std::time::Instant::now();
    let task = hostile("sleep");
    for (err, world, function) in [
        (
            p.plan_turn(&task, 1, &transcript(2, 3, vec![]))
                .unwrap_err(),
            "protocol",
            "plan-turn",
        ),
        (
            v.score(&task, &["5".into()]).unwrap_err(),
            "verifier",
            "score",
        ),
        (s.shape(&task, &t).unwrap_err(), "reward-shaper", "shape"),
    ] {
        let file = format!("hostile_{}.wasm", world.split('-').next_back().unwrap());
        let f = failure(err, &file, world, function, "task-sleep");
        assert!(
            matches!(&f, Failure::Trap(m) if m.contains("may not sleep")),
            "{world}: {f:?}"
        );
    }
    // An hour each, were the sleeps honoured; the bound here only has to tell the two apart.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    // Every handle keeps working.
    p.plan_turn(&hostile("fine"), 1, &transcript(2, 3, vec![]))
        .unwrap();
    v.score(&hostile("fine"), &["5".into()]).unwrap();
    s.shape(&hostile("fine"), &t).unwrap();
}

#[test]
fn judge_refuses_more_work_than_a_call_may_ask_for() {
    /// Counts the responses it is asked to judge.
    struct Counting(std::sync::atomic::AtomicUsize);
    impl maporl::plugin::Judge for Counting {
        fn judge(&self, _q: &str, responses: &[String]) -> Result<Vec<f32>, String> {
            self.0
                .fetch_add(responses.len(), std::sync::atomic::Ordering::SeqCst);
            Ok(vec![0.5; responses.len()])
        }
    }
    let counting = Arc::new(Counting(Default::default()));
    let (rt, _, _c) = runtime_with(0, Some(counting.clone()));
    // Under the default data budget a 16 MiB question never reaches the host's judge: it is
    // refused while the host reads the call's arguments.
    let mut v = verifier(
        &rt,
        &Limits {
            memory_mib: 256,
            ..Limits::default()
        },
    );
    let err = v
        .score(&hostile("judge-long-question"), &["5".into()])
        .unwrap_err();
    let f = failure(
        err,
        "hostile_verifier.wasm",
        "verifier",
        "score",
        "task-judge-long-question",
    );
    assert!(
        matches!(&f, Failure::Invalid(m) if m.contains("max_result_kib")),
        "{f:?}"
    );
    // With a budget that lets them through, the judge's own bounds refuse them.
    let limits = Limits {
        memory_mib: 256,
        max_result_kib: 64 << 10,
        ..Limits::default()
    };
    let mut v = verifier(&rt, &limits);
    for (mode, needle) in [
        ("judge-many", "100000 responses in one call"),
        ("judge-often", "per call"),
        ("judge-long-question", "the question is 16777216 bytes"),
        ("judge-long-response", "response 0 is 16777216 bytes"),
    ] {
        let before = counting.0.load(std::sync::atomic::Ordering::SeqCst);
        let err = v.score(&hostile(mode), &["5".into()]).unwrap_err();
        let f = failure(
            err,
            "hostile_verifier.wasm",
            "verifier",
            "score",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Returned(m) if m.contains("judge refused") && m.contains(needle)),
            "{mode}: {f:?}"
        );
        let judged = counting.0.load(std::sync::atomic::Ordering::SeqCst) - before;
        assert!(
            judged <= maporl::plugin::JUDGE_MAX_RESPONSES_PER_CALL,
            "{mode}: the host judged {judged} responses in one call"
        );
        v.score(&hostile("judge"), &["5".into()]).unwrap();
    }
    // Per debate: 1,000 responses a call pass four times on one task; the fifth call on
    // that task is refused, another task's debate still has its budget, and a restart
    // (the next training step) gives the first task a new one.
    let per_debate = maporl::plugin::JUDGE_MAX_RESPONSES_PER_DEBATE;
    assert_eq!(per_debate, 4096, "the test's arithmetic assumes this bound");
    let one = hostile("judge-1000");
    let other = Task {
        id: "task-judge-1000-other".into(),
        ..one.clone()
    };
    for _ in 0..4 {
        v.score(&one, &["5".into()]).unwrap();
    }
    let before = counting.0.load(std::sync::atomic::Ordering::SeqCst);
    let err = v.score(&one, &["5".into()]).unwrap_err();
    let f = failure(
        err,
        "hostile_verifier.wasm",
        "verifier",
        "score",
        "task-judge-1000",
    );
    assert!(
        matches!(&f, Failure::Returned(m) if m.contains("judge refused")
            && m.contains("4000 responses judged in this debate already")
            && m.contains("per debate")),
        "{f:?}"
    );
    assert_eq!(
        counting.0.load(std::sync::atomic::Ordering::SeqCst) - before,
        0,
        "the refused `judge` call asked the model nothing"
    );
    v.score(&other, &["5".into()]).unwrap();
    v.restart(1).unwrap();
    v.score(&one, &["5".into()]).unwrap();
}

/// A protocol never sees the gold answer: neither the task's reference nor which
/// utterances were right (the WIT's "What each world sees").
#[test]
fn a_protocol_sees_neither_the_reference_nor_correctness() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let said = transcript(
        2,
        2,
        vec![
            utterance(1, 0, Some("5"), 1.0, true),
            utterance(1, 1, Some("6"), 0.0, false),
            utterance(2, 0, Some("5"), 1.0, true),
        ],
    );
    // The task's reference is "5", and two utterances were right.
    let err = p.decide(&hostile("report-correct"), 2, &said).unwrap_err();
    let f = failure(
        err,
        "hostile_protocol.wasm",
        "protocol",
        "decide",
        "task-report-correct",
    );
    assert!(
        matches!(&f, Failure::Returned(m)
            if m.contains("correct [false, false, false], reference \"\"")),
        "{f:?}"
    );
}

/// A small deterministic generator for the transcripts below.
fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// Transcripts of every shape a plugin may be given: empty ones, empty, non-ASCII, long and
/// control-character texts, answers absent, empty and present, scores of every sign and
/// size (zero, negative zero, subnormal, the largest finite, NaN, infinity), turn and
/// agent numbers up to `u32::MAX`.
fn odd_transcripts() -> Vec<maporl::transcript::Transcript> {
    let long = "x".repeat(5_000);
    let texts = [
        "",
        "plain",
        "ünïcödé — 数学 🧮",
        long.as_str(),
        "tab\tnewline\n \"quoted\" \u{1b}[31m",
    ];
    let answers = [None, Some(""), Some("42"), Some("entailment ünï")];
    let scores = [
        0.0f32,
        -0.0,
        1.0,
        0.734,
        1e-40,
        f32::MAX,
        -3.5,
        f32::NAN,
        f32::INFINITY,
    ];
    let numbers = [0u32, 1, 2, 7, 65_536, u32::MAX];
    let mut state = 19;
    (0..60)
        .map(|i| {
            let utterances = (0..(i % 13))
                .map(|_| maporl::transcript::Utterance {
                    turn: numbers[next(&mut state) as usize % numbers.len()],
                    agent: numbers[next(&mut state) as usize % numbers.len()],
                    text: texts[next(&mut state) as usize % texts.len()].to_string(),
                    answer: answers[next(&mut state) as usize % answers.len()].map(String::from),
                    score: scores[next(&mut state) as usize % scores.len()],
                    correct: next(&mut state).is_multiple_of(2),
                })
                .collect();
            transcript(1 + i as u32 % 4, 1 + i as u32 % 5, utterances)
        })
        .collect()
}

/// What the host lowers is what a plugin receives, field by field and bit for bit, on
/// every shape of transcript (the host writes the WIT records itself: see
/// `plugin::bindings::Utterances`); correctness stays hidden from a protocol.
#[test]
fn a_transcript_arrives_field_by_field() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    for said in odd_transcripts() {
        let err = p
            .decide(&hostile("report-transcript"), 1, &said)
            .unwrap_err();
        let want = format!(
            "report-transcript: agents {} turns {} [{}]",
            said.agents,
            said.turns,
            said.utterances
                .iter()
                .map(|u| format!(
                    "{}/{}/{:?}/{:?}/{:08x}/false",
                    u.turn,
                    u.agent,
                    u.text,
                    u.answer,
                    u.score.to_bits()
                ))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let f = failure(
            err,
            "hostile_protocol.wasm",
            "protocol",
            "decide",
            "task-report-transcript",
        );
        assert!(
            matches!(&f, Failure::Returned(m) if *m == want),
            "{f:?}\nwant {want}"
        );
    }
}

/// What a plugin plans is what the host gets: every message's text and role, on every
/// kind of text; bytes that are not UTF-8 fail the call with the place they stop being it.
#[test]
fn a_plans_texts_arrive_whole_and_bytes_that_are_not_utf8_are_refused() {
    use maporl::transcript::Role;
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    for said in odd_transcripts() {
        let plan = p.plan_turn(&hostile("echo-texts"), 1, &said).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].agent, 0);
        let got: Vec<(Role, &str)> = plan[0]
            .messages
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect();
        let roles = [Role::System, Role::User, Role::Assistant];
        let texts = said.utterances.iter().map(|u| u.text.as_str());
        let want: Vec<(Role, &str)> = std::iter::once((Role::User, "echo-texts"))
            .chain(texts.zip(roles.iter().cycle()).map(|(t, r)| (*r, t)))
            .collect();
        assert_eq!(got, want);
    }
    let t = transcript(2, 1, vec![]);
    let err = p.plan_turn(&hostile("invalid-utf8"), 1, &t).unwrap_err();
    let f = failure(
        err,
        "hostile_protocol.wasm",
        "protocol",
        "plan-turn",
        "task-invalid-utf8",
    );
    assert!(
        matches!(&f, Failure::Trap(m) if m.contains("invalid utf-8 sequence of 1 bytes from index 2")),
        "{f:?}"
    );
    // A fresh instance answers the next call.
    assert_eq!(p.plan_turn(&hostile("fine"), 1, &t).unwrap().len(), 2);
}

#[test]
fn results_that_type_check_but_make_no_sense_are_refused() {
    let (rt, _, _c) = runtime();
    let mut p = protocol(&rt, &Limits::default());
    let mut s = shaper(&rt, &Limits::default());
    let said = transcript(
        3,
        1,
        vec![
            utterance(1, 0, Some("5"), 1.0, true),
            utterance(1, 1, Some("6"), 0.0, false),
        ],
    );
    // Decisions: an answer nobody gave, one twice, more answers than agents.
    for (mode, needle) in [
        ("foreign-answer", "given by no agent"),
        ("duplicate-answer", "twice"),
        ("many-answers", "more than the team's 3 agents"),
    ] {
        let err = p.decide(&hostile(mode), 1, &said).unwrap_err();
        let f = failure(
            err,
            "hostile_protocol.wasm",
            "protocol",
            "decide",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Invalid(m) if m.contains(needle)),
            "{mode}: {f:?}"
        );
        assert!(
            f.to_string().len() < 2_000,
            "{mode}: the message stays short"
        );
    }
    assert_eq!(p.decide(&hostile("fine"), 1, &said).unwrap(), vec!["5"]);
    // A plan of 16 MiB (8 MiB for each of two agents) is refused while the host reads it,
    // by the call's data budget; with a budget that holds it, by the bound on one prompt,
    // before anything tokenizes it.
    let err = p
        .plan_turn(&hostile("huge-prompt"), 1, &transcript(2, 3, vec![]))
        .unwrap_err();
    let f = failure(
        err,
        "hostile_protocol.wasm",
        "protocol",
        "plan-turn",
        "task-huge-prompt",
    );
    assert!(
        matches!(&f, Failure::Invalid(m) if m.contains("max_result_kib = 4096 KiB")),
        "{f:?}"
    );
    let wide = Limits {
        max_result_kib: 64 << 10,
        memory_mib: 256,
        ..Limits::default()
    };
    let err = protocol(&rt, &wide)
        .plan_turn(&hostile("huge-prompt"), 1, &transcript(2, 3, vec![]))
        .unwrap_err();
    let f = failure(
        err,
        "hostile_protocol.wasm",
        "protocol",
        "plan-turn",
        "task-huge-prompt",
    );
    assert!(
        matches!(&f, Failure::Invalid(m) if m.contains("8388608 bytes") && m.contains("max_prompt_bytes")),
        "{f:?}"
    );
    let roomy = Limits {
        max_prompt_bytes: 16 << 20,
        max_result_kib: 64 << 10,
        memory_mib: 256,
        ..Limits::default()
    };
    let mut p2 = protocol(&rt, &roomy);
    assert_eq!(
        p2.plan_turn(&hostile("huge-prompt"), 1, &transcript(2, 3, vec![]))
            .unwrap()
            .len(),
        2,
        "the bound is the config's"
    );
    // Rewards: finite but absurd, in the total or in a part.
    for (mode, needle) in [
        ("huge-reward", "1000000000000000000000000000000"),
        ("huge-part", "`bonus`"),
    ] {
        let err = s.shape(&hostile(mode), &said).unwrap_err();
        let f = failure(
            err,
            "hostile_shaper.wasm",
            "reward-shaper",
            "shape",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Invalid(m) if m.contains(needle) && m.contains("max_abs_reward")),
            "{mode}: {f:?}"
        );
    }
    assert_eq!(s.shape(&hostile("fine"), &said).unwrap().len(), 2);
}

/// What the host keeps of a plugin's results is bounded, in every world and whatever the
/// shape: an answer over `max_answer_bytes` (from `extract` and from `score`), a result over
/// the call's data budget (`max_result_kib`: refused while the host reads it, before it holds
/// it), more reward parts than `max_reward_parts`, a part name over `max_part_name_bytes` or
/// over the data budget. Each is refused naming the plugin, world, function, task and key,
/// and the next call on the same handle behaves.
#[test]
fn results_the_host_keeps_are_bounded_in_every_world() {
    let (rt, _, _c) = runtime();
    let limits = Limits {
        memory_mib: 256,
        ..Limits::default()
    };
    let mut v = verifier(&rt, &limits);
    for (mode, key) in [
        ("long-answer", "max_answer_bytes = 1024"),
        ("huge-answer", "max_result_kib = 4096"),
    ] {
        let err = v.extract(&hostile(mode), "5").unwrap_err();
        let f = failure(
            err,
            "hostile_verifier.wasm",
            "verifier",
            "extract",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Invalid(m) if m.contains(key)),
            "{mode}: {f:?}"
        );
        let err = v
            .score(&hostile(mode), &["5".into(), "6".into()])
            .unwrap_err();
        let f = failure(
            err,
            "hostile_verifier.wasm",
            "verifier",
            "score",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Invalid(m) if m.contains(key)),
            "{mode}: {f:?}"
        );
        assert!(
            f.to_string().len() < 2_000,
            "{mode}: the message stays short"
        );
    }
    assert_eq!(
        v.score(&hostile("fine"), &["5".into()]).unwrap()[0]
            .answer
            .as_deref(),
        Some("5")
    );
    // The bound is the config's: a verifier allowed longer answers keeps them.
    let mut lenient = verifier(
        &rt,
        &Limits {
            max_answer_bytes: 4096,
            ..limits.clone()
        },
    );
    assert_eq!(
        lenient
            .extract(&hostile("long-answer"), "5")
            .unwrap()
            .map(|a| a.len()),
        Some(2 << 10)
    );

    let mut s = shaper(&rt, &limits);
    let said = transcript(
        2,
        3,
        vec![
            utterance(1, 0, Some("5"), 1.0, true),
            utterance(1, 1, Some("6"), 0.0, false),
        ],
    );
    for (mode, key) in [
        ("many-parts", "max_reward_parts = 32"),
        ("long-part-name", "max_part_name_bytes = 64"),
        ("huge-part-name", "max_result_kib = 4096"),
    ] {
        let err = s.shape(&hostile(mode), &said).unwrap_err();
        let f = failure(
            err,
            "hostile_shaper.wasm",
            "reward-shaper",
            "shape",
            &format!("task-{mode}"),
        );
        assert!(
            matches!(&f, Failure::Invalid(m) if m.contains(key)),
            "{mode}: {f:?}"
        );
        assert!(
            f.to_string().len() < 2_000,
            "{mode}: the message stays short"
        );
    }
    assert_eq!(s.shape(&hostile("fine"), &said).unwrap().len(), 2);
}

/// A protocol component written by hand (WAT), whose `plan-turn` returns, by the mode in its
/// settings (a digit), a plan that is well formed or one that lies about the guest's memory
/// in one way. A plugin built with wit-bindgen cannot make these: the host lifts the plan
/// with its own code (`plugin::bindings::Plan`), and must refuse every lie as wasmtime's own
/// lifting does, without reading outside the guest's memory or allocating what a lie
/// claims. With `encoding = "utf16"` the component declares UTF-16 strings, which the host
/// lifts through wasmtime's derived code instead.
fn lying_planner(encoding: &str) -> String {
    // Little-endian u32 words as WAT data strings.
    let words = |ws: &[u32]| -> String {
        ws.iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| format!("\\{b:02x}"))
            .collect()
    };
    // Plan results by mode: (pointer, length) of the list of prompts.
    let modes = words(
        &[
            [0x200, 1],       // 0: one prompt, two messages: ok
            [0xffff_fff4, 1], // 1: the prompts' list past the end of memory
            [0x202, 1],       // 2: the prompts' list not aligned
            [0x210, 1],       // 3: a messages' list past the end of memory
            [0x220, 1],       // 4: a role that is no `role`
            [0x230, 1],       // 5: a text past the end of memory
            [0x240, 1],       // 6: a text whose pointer and length overflow 32 bits
            [0x250, 1],       // 7: a text that is not UTF-8
            [0x260, 1],       // 8: 8,192 messages quoting one 56 KiB text: 470 MB to copy
            [0x270, 1],       // 9: a messages' list not aligned
        ]
        .concat(),
    );
    let prompts = [
        (0x200, [0, 0x400, 2]),
        (0x210, [0, 0x400, 0x1000_0000]),
        (0x220, [0, 0x440, 1]),
        (0x230, [0, 0x450, 1]),
        (0x240, [0, 0x460, 1]),
        (0x250, [0, 0x470, 1]),
        (0x260, [0, 0x2_0000, 0x2000]),
        (0x270, [0, 0x401, 1]),
    ];
    let messages = [
        (0x400, [1, 0x800, 2]),
        (0x40c, [2, 0x804, 2]),
        (0x440, [3, 0x800, 2]),
        (0x450, [1, 0x3_ffff, 2]),
        (0x460, [1, 0xffff_ffff, 0xffff_ffff]),
        (0x470, [1, 0x808, 2]),
    ];
    let mut data = format!("(data (i32.const 0x180) \"{modes}\")\n");
    for (at, record) in prompts.iter().chain(&messages) {
        data += &format!("(data (i32.const {at}) \"{}\")\n", words(record));
    }
    // "hi" at 0x800 and "yo" at 0x804, in the declared encoding; bytes that are not UTF-8.
    data += match encoding {
        "utf8" => "(data (i32.const 0x800) \"hi\") (data (i32.const 0x804) \"yo\")",
        _ => "(data (i32.const 0x800) \"h\\00i\\00y\\00o\\00\")",
    };
    data += " (data (i32.const 0x808) \"\\ff\\fe\")";
    let params = "i32 ".repeat(15);
    format!(
        r#"(component
  (import "maporl:plugin/types@0.1.0" (instance $types
    (type (tuple string string)) (type (list 0))
    (type (record (field "id" string) (field "kind" string) (field "question" string)
      (field "reference" string) (field "fields" 1)))
    (export "task" (type (eq 2)))
    (type (option string))
    (type (record (field "turn" u32) (field "agent" u32) (field "text" string) (field "answer" 4)
      (field "score" f32) (field "correct" bool)))
    (export "utterance" (type (eq 5)))
    (type (list 6))
    (type (record (field "agents" u32) (field "turns" u32) (field "utterances" 7)))
    (export "transcript" (type (eq 8)))
    (type (enum "system" "user" "assistant"))
    (export "role" (type (eq 10)))
    (type (record (field "role" 11) (field "content" string)))
    (export "chat-message" (type (eq 12)))
    (type (list 13))
    (type (record (field "agent" u32) (field "messages" 14)))
    (export "prompt" (type (eq 15)))))
  (alias export $types "task" (type $task))
  (alias export $types "transcript" (type $transcript))
  (alias export $types "prompt" (type $prompt))
  (core module $m
    (memory (export "memory") 4)
    (global $mode (mut i32) (i32.const 0))
    (global $bump (mut i32) (i32.const 0x38000))
    {data}
    ;; A bump allocator over 0x38000..0x40000 for what the host lowers (it wraps around).
    (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      (local.set $p (i32.and
        (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
        (i32.sub (i32.const 0) (local.get 2))))
      (if (i32.gt_u (i32.add (local.get $p) (local.get 3)) (i32.const 0x40000))
        (then (local.set $p (i32.const 0x38000))))
      (global.set $bump (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func (export "configure") (param $text i32) (param $len i32) (result i32)
      (global.set $mode (i32.sub (i32.load8_u (local.get $text)) (i32.const 48)))
      (i32.store8 (i32.const 0x100) (i32.const 0))
      (i32.const 0x100))
    (func (export "decide") (param {params}) (result i32)
      (i32.store8 (i32.const 0x100) (i32.const 0))
      (i32.store (i32.const 0x104) (i32.const 0))
      (i32.store (i32.const 0x108) (i32.const 0))
      (i32.const 0x100))
    (func (export "plan-turn") (param {params}) (result i32)
      (local $i i32)
      (if (i32.eq (global.get $mode) (i32.const 8)) (then
        (loop $fill
          (i32.store (i32.add (i32.const 0x20000) (i32.mul (local.get $i) (i32.const 12)))
            (i32.const 1))
          (i32.store (i32.add (i32.const 0x20004) (i32.mul (local.get $i) (i32.const 12)))
            (i32.const 0x1000))
          (i32.store (i32.add (i32.const 0x20008) (i32.mul (local.get $i) (i32.const 12)))
            (i32.const 0xe000))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $fill (i32.lt_u (local.get $i) (i32.const 0x2000))))))
      (i32.store8 (i32.const 0x100) (i32.const 0))
      (i32.store (i32.const 0x104)
        (i32.load (i32.add (i32.const 0x180) (i32.mul (global.get $mode) (i32.const 8)))))
      (i32.store (i32.const 0x108)
        (i32.load (i32.add (i32.const 0x184) (i32.mul (global.get $mode) (i32.const 8)))))
      (i32.const 0x100)))
  (core instance $i (instantiate $m))
  (alias core export $i "memory" (core memory $memory))
  (alias core export $i "cabi_realloc" (core func $realloc))
  (func $configure (param "settings" string) (result (result (error string)))
    (canon lift (core func $i "configure") (memory $memory) (realloc $realloc) string-encoding=utf8))
  (func $plan-turn (param "task" $task) (param "turn" u32) (param "transcript" $transcript)
    (result (result (list $prompt) (error string)))
    (canon lift (core func $i "plan-turn") (memory $memory) (realloc $realloc)
      string-encoding={encoding}))
  (func $decide (param "task" $task) (param "turn" u32) (param "transcript" $transcript)
    (result (result (list string) (error string)))
    (canon lift (core func $i "decide") (memory $memory) (realloc $realloc) string-encoding=utf8))
  (instance $collaboration
    (export "configure" (func $configure))
    (export "plan-turn" (func $plan-turn))
    (export "decide" (func $decide)))
  (export "maporl:plugin/collaboration@0.1.0" (instance $collaboration)))"#
    )
}

#[test]
fn a_plan_that_lies_about_the_guests_memory_is_refused_as_wasmtime_refuses_it() {
    use maporl::transcript::{ChatMessage, Prompt, Role};
    let (rt, _, cache) = runtime();
    let t = transcript(2, 3, vec![]);
    let well_formed = vec![Prompt {
        agent: 0,
        messages: vec![
            ChatMessage {
                role: Role::User,
                content: "hi".into(),
            },
            ChatMessage {
                role: Role::Assistant,
                content: "yo".into(),
            },
        ],
    }];
    let lies = [
        (1, "list pointer/length out of bounds of memory"),
        (2, "list pointer is not aligned"),
        (3, "list pointer/length out of bounds of memory"),
        (4, "unexpected discriminant: 3"),
        (5, "string pointer/length out of bounds of memory"),
        (6, "string pointer/length out of bounds of memory"),
        (7, "invalid utf-8"),
        // wasmtime's host-call data budget, told as the limit that sets it.
        (8, "larger than limits.max_result_kib = 4096 KiB"),
        (9, "list pointer is not aligned"),
    ];
    for encoding in ["utf8", "utf16"] {
        let path = cache.path().join(format!("lying-{encoding}.wasm"));
        std::fs::write(&path, wat::parse_str(lying_planner(encoding)).unwrap()).unwrap();
        let load = |mode: u32| {
            Protocol::load(&rt, &path, &json!(mode), &Limits::default())
                .unwrap_or_else(|e| panic!("{encoding} mode {mode}: {e}"))
        };
        let plan = load(0).plan_turn(&hostile("q"), 1, &t);
        assert_eq!(plan.unwrap(), well_formed, "{encoding}");
        for (mode, says) in lies {
            // Lifted through wasmtime's code, the text's own checks differ (alignment to
            // 2 first, then UTF-16): only the structural lies are asked of that path.
            if encoding == "utf16" && (5..=7).contains(&mode) {
                continue;
            }
            let err = load(mode)
                .plan_turn(&hostile("q"), 1, &t)
                .expect_err(&format!("{encoding} mode {mode} must fail"));
            let text = err.to_string();
            assert!(
                text.contains(says) && text.contains("`plan-turn`") && text.contains("task-q"),
                "{encoding} mode {mode}: {text}"
            );
        }
    }
}
