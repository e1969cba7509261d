//! Plugins in Python (plugins/python, built with the Python SDK on componentize-py) against
//! the Rust reference plugins: the same plans, decisions, verdicts and rewards, call for call,
//! on debates that reach the SDK's edge cases, with default and non-default settings; the
//! same transcripts and rewards from a whole `maporl eval`; and errors that say what the
//! Python code raised.

mod support;

use maporl::plugin::{Limits, Protocol, RewardShaper, Verifier};
use maporl::transcript::Transcript;
use serde_json::json;
use support::polyglot::{same_debates, same_eval};
use support::*;

fn python(name: &str) -> std::path::PathBuf {
    python_plugins_dir().join(format!("{name}.wasm"))
}

/// A runtime whose compiled-component cache lasts across tests and runs: a Python component
/// (18 MB) takes seconds to compile, and each test loads all three.
fn cached_runtime() -> maporl::plugin::Runtime {
    maporl::plugin::Runtime::new(maporl::plugin::RuntimeOptions {
        cache_dir: Some(repo().join("plugins/target/python/compiled")),
        ..Default::default()
    })
    .expect("runtime")
}

#[test]
fn python_plugins_give_the_rust_plugins_results_call_for_call() {
    let rt = cached_runtime();
    same_debates(&rt, &python, json!({}), json!({"gamma": 0.3}));
    same_debates(
        &rt,
        &python,
        json!({"peers": 1, "show_scores": true, "system": "Be brief.", "early_stop": true}),
        json!({"gamma": 0.55, "alpha_0": 0.5, "alpha_1": 2.0, "beta_0": 2.0, "beta_1": 0.25}),
    );
}

/// A whole `maporl eval` on the quickstart's config (a tiny random model, so that it runs in
/// seconds) writes the same transcripts, rewards and report with the Python plugins as with
/// the Rust ones; only the plugins' hashes differ.
#[test]
fn an_eval_with_the_python_plugins_writes_the_rust_plugins_transcripts() {
    same_eval(&python, "python");
}

/// What the Python code raised is the world's error, with the plugin, the exception and
/// where: never a bare trap. A bad setting is refused by name at load.
#[test]
fn python_exceptions_become_the_worlds_error_with_their_message() {
    let rt = cached_runtime();
    let limits = Limits::default();
    let err = Verifier::load(&rt, &python("gsm8k"), &json!({"strict": true}), &limits)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("gsm8k-py: unknown setting `strict`"), "{err}");
    let err = RewardShaper::load(
        &rt,
        &python("influence"),
        &json!({"gamma": "high"}),
        &limits,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("setting `gamma` must be a number, got \"high\""),
        "{err}"
    );
    let err = RewardShaper::load(&rt, &python("influence"), &json!({"gamma": 3}), &limits)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("gamma = 3: expected a number in [0, 1]"),
        "{err}"
    );

    let mut v = Verifier::load(&rt, &python("gsm8k"), &json!({}), &limits).unwrap();
    let err = v
        .score(&task("t9", "gsm8k", "q", "seven"), &["\\boxed{7}".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the reference `seven` is not an integer") && err.contains("t9"),
        "{err}"
    );
    // A PluginError the SDK's helper raises: its message as it is.
    let mut p = Protocol::load(&rt, &python("debate"), &json!({}), &limits).unwrap();
    let broken = Transcript::new(2, 3); // turn 2 with no turn-1 utterances
    let err = p
        .plan_turn(&task("t8", "gsm8k", "q", ""), 2, &broken)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("debate-py: task `t8`: agent 0 has no utterance at turn 1"),
        "{err}"
    );
    let mut s = RewardShaper::load(&rt, &python("influence"), &json!({}), &limits).unwrap();
    let mut t = Transcript::new(2, 3);
    t.utterances.push(utterance(1, 5, Some("7"), 1.0, true));
    let err = s
        .shape(&task("t7", "gsm8k", "q", "7"), &t)
        .unwrap_err()
        .to_string();
    assert!(err.contains("influence-py: agent 5 out of range"), "{err}");
}

/// The Python SDK ships the contract it builds against; it is this host's.
#[test]
fn the_python_sdk_ships_this_hosts_contract() {
    assert_eq!(
        std::fs::read_to_string(repo().join("plugins/sdk-python/maporl_plugin/wit/maporl.wit"))
            .unwrap(),
        maporl::plugin::WIT,
        "copy wit/maporl.wit to plugins/sdk-python/maporl_plugin/wit/"
    );
}

/// A Python component (about 18 MB) is over a cap set below its size, refused before it is
/// read with the setting to raise; at a cap above, it loads. `plugin check` says how much
/// memory it starts with.
#[test]
fn the_component_cap_is_a_setting_and_check_says_what_a_plugin_needs() {
    let rt = cached_runtime();
    let path = python("gsm8k");
    let size = std::fs::metadata(&path).unwrap().len();
    let mib = size.div_ceil(1 << 20);
    let low = Limits {
        max_component_mib: mib - 1,
        ..Limits::default()
    };
    let err = Verifier::load(&rt, &path, &json!({}), &low)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("limits.max_component_mib raised, at most 1024"),
        "{err}"
    );
    let enough = Limits {
        max_component_mib: mib,
        ..Limits::default()
    };
    Verifier::load(&rt, &path, &json!({}), &enough).expect("loads at its size");

    // `plugin check`'s "initial memory: N MiB" for a component.
    let initial_memory = |file: &str| -> f64 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_maporl"))
            .args(["plugin", "check", file, "--world", "verifier"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        text.split("initial memory: ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"))
    };
    let memory = initial_memory(path.to_str().unwrap());
    // CPython's heap is snapshotted into the component: megabytes, under the default cap.
    assert!((4.0..64.0).contains(&memory), "{memory} MiB");
    // A Rust reference plugin starts far smaller.
    let rust = initial_memory("builtin:gsm8k");
    assert!(rust < memory, "{rust} MiB against {memory} MiB");
}

/// In a real component: `print` reaches the plugin log line by line, an unexpected exception
/// is the call's error with its type, message and line, and a module not imported at build
/// time fails the call saying which (the instance is replaced; the next call works).
#[test]
fn in_a_component_print_is_logged_and_exceptions_are_errors() {
    let (rt, logged, _cache) = runtime();
    let path = python("hostile");
    let mut v = Verifier::load(&rt, &path, &json!({}), &Limits::default()).unwrap();
    let verdicts = v
        .score(
            &task("t-print", "qa", "print", "a"),
            &["a".into(), "b".into()],
        )
        .unwrap();
    assert!(verdicts[0].correct && !verdicts[1].correct);
    let lines: Vec<String> = logged
        .lock()
        .unwrap()
        .iter()
        .map(|(_, _, line)| line.clone())
        .collect();
    assert!(
        lines.contains(&"hello from Python".to_string())
            && lines.contains(&"a second line 2".to_string()),
        "{lines:?}"
    );
    let err = v
        .score(&task("t-div", "qa", "divide", "a"), &["a".into()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("hostile-py: ZeroDivisionError: division by zero (at app.py:")
            && err.contains("in score)")
            && err.contains("t-div"),
        "{err}"
    );
    let err = v
        .score(&task("t-imp", "qa", "late-import", "a"), &["a".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("csv"), "{err}");
    let ok = v
        .score(&task("t-ok", "qa", "fine", "a"), &["a".into()])
        .unwrap();
    assert!(ok[0].correct);
}

/// A plugin written without the SDK: an exception reaches componentize-py's runtime, which
/// prints the traceback and panics with a generic message. The error reads the traceback: the
/// exception, its message and the innermost frame, not "threw an unexpected exception".
#[test]
fn an_exception_no_sdk_caught_is_read_from_the_traceback() {
    let (rt, _, _cache) = runtime();
    let mut v = Verifier::load(&rt, &python("bare"), &json!({}), &Limits::default()).unwrap();
    let err = v
        .score(&task("t-raise", "arith", "raise", "5"), &["5".into()])
        .unwrap_err();
    assert_eq!(
        err.failure,
        maporl::plugin::Failure::Panic(
            "uncaught Python exception KeyError: 'arith' (at app.py:16, in lookup)".into()
        ),
        "{err}"
    );
    assert!(err.to_string().contains("t-raise"), "{err}");
    // The instance is replaced; the next call works.
    let ok = v
        .score(&task("t-ok", "arith", "fine", "5"), &["5".into()])
        .unwrap();
    assert!(ok[0].correct);
}

/// componentize-py never builds the same bytes twice; the SDK's build records the source's
/// sha256 in the component. A rebuild has another sha256 and the same source, and the plugin's
/// randomness (seeded from the source) is the same; with the section cut off, the two builds
/// are seeded from their bytes and draw differently: the section is what keeps the seed.
#[test]
fn a_rebuild_of_the_same_source_keeps_the_plugins_identity_and_seed() {
    let rt = cached_runtime();
    let first = python("hostile");
    let dir = tempfile::tempdir().unwrap();
    let second = dir.path().join("hostile.wasm");
    let status = std::process::Command::new("python3")
        .current_dir(repo().join("plugins/sdk-python"))
        .args(["-m", "maporl_plugin", "build"])
        .arg(repo().join("plugins/python/hostile/app.py"))
        .args(["--world", "verifier", "-o", second.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let draw = |path: &std::path::Path| {
        let mut v = Verifier::load(&rt, path, &json!({}), &Limits::default()).unwrap();
        let verdicts = v
            .score(&task("t-random", "qa", "random", "a"), &["a".into()])
            .unwrap();
        (v.identity().clone(), verdicts[0].answer.clone().unwrap())
    };
    let (a, drawn_a) = draw(&first);
    let (b, drawn_b) = draw(&second);
    assert_ne!(
        a.sha256, b.sha256,
        "componentize-py built the same bytes twice"
    );
    let source = a.source_sha256.clone().expect("the SDK records the source");
    assert_eq!(b.source_sha256.as_deref(), Some(source.as_str()));
    assert_eq!(drawn_a, drawn_b);
    assert_eq!(drawn_a.len(), 16, "{drawn_a}");

    // The section is the SDK's last 80 bytes: 1 id, 1 size, 1 + 13 name, 64 digits.
    let cut = |path: &std::path::Path, to: &str| {
        let bytes = std::fs::read(path).unwrap();
        let (kept, section) = bytes.split_at(bytes.len() - 80);
        assert!(section.ends_with(source.as_bytes()));
        let out = dir.path().join(to);
        std::fs::write(&out, kept).unwrap();
        out
    };
    let (a, drawn_a) = draw(&cut(&first, "a.wasm"));
    let (b, drawn_b) = draw(&cut(&second, "b.wasm"));
    assert_eq!((a.source_sha256, b.source_sha256), (None, None));
    assert_ne!(drawn_a, drawn_b);
}

/// A verifier on HF math-verify (sympy and an ANTLR LaTeX parser underneath; 50-80 MB,
/// about 74 MiB of memory at start): refused under a component cap below its size with the
/// setting to raise, loaded with its caps raised, and grading by mathematical equality under
/// the default fuel and deadline.
#[test]
fn a_math_verify_verifier_loads_with_raised_caps_and_grades_by_equality() {
    let rt = cached_runtime();
    let path = python("math-verify");
    // Its size varies between builds of the same source and packages (50.7 MB and 78.6 MB
    // were seen), so the cap refused is one below its size, not the default.
    let mib = std::fs::metadata(&path).unwrap().len().div_ceil(1 << 20);
    let under = Limits {
        max_component_mib: mib - 1,
        ..Limits::default()
    };
    let err = Verifier::load(&rt, &path, &json!({}), &under)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("limits.max_component_mib raised"), "{err}");
    let raised = Limits {
        max_component_mib: 128,
        memory_mib: 256,
        ..Limits::default()
    };
    let mut v = Verifier::load(&rt, &path, &json!({}), &raised).unwrap();
    let graded = |v: &mut Verifier, reference: &str, responses: &[&str]| -> Vec<bool> {
        let responses: Vec<String> = responses.iter().map(|r| r.to_string()).collect();
        v.score(&task("t-math", "math", "q", reference), &responses)
            .unwrap()
            .iter()
            .map(|v| v.correct)
            .collect()
    };
    assert_eq!(
        graded(
            &mut v,
            "\\frac{1}{2}",
            &[
                "The answer is \\boxed{0.5}",
                "so 1/2",
                "$\\frac{2}{4}$",
                "\\boxed{2}",
                "1/3",
                "no idea"
            ]
        ),
        [true, true, true, false, false, false]
    );
    assert_eq!(
        graded(&mut v, "x + 1", &["$1 + x$", "$x - 1$"]),
        [true, false]
    );
}
