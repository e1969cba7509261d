//! Plugins in JavaScript (plugins/js, built with the JavaScript SDK, plugins/sdk-js), on
//! both engines the SDK builds with (componentize-js on SpiderMonkey, componentize-qjs on
//! QuickJS), against the Rust reference plugins: the same plans, decisions, verdicts and
//! rewards call for call, with default and non-default settings; the same transcripts from a
//! whole `maporl eval`; errors that say what the JavaScript code threw, and where;
//! `console.log` in the plugin log; and a plugin identity that survives a rebuild.

mod support;

use std::path::PathBuf;
use std::sync::Arc;

use maporl::plugin::{Limits, Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier};
use maporl::transcript::Transcript;
use serde_json::json;
use support::polyglot::{same_debates, same_eval};
use support::*;

const ENGINES: [&str; 2] = ["spidermonkey", "quickjs"];

fn js(engine: &str) -> impl Fn(&str) -> PathBuf {
    let dir = js_plugins_dir(engine);
    move |name: &str| dir.join(format!("{name}.wasm"))
}

/// A runtime whose compiled-component cache lasts across tests and runs (a SpiderMonkey
/// component takes seconds to compile), and whose plugin log is captured.
fn cached_runtime() -> (Runtime, Captured) {
    let captured: Captured = Arc::default();
    let sink = captured.clone();
    let rt = Runtime::new(RuntimeOptions {
        cache_dir: Some(repo().join("plugins/target/js/compiled")),
        log: Arc::new(move |o: &maporl::plugin::LogOrigin<'_>, l, m| {
            sink.lock().unwrap().push((o.plugin.into(), l, m.into()))
        }),
        ..Default::default()
    })
    .expect("runtime");
    (rt, captured)
}

#[test]
fn js_plugins_give_the_rust_plugins_results_call_for_call() {
    let (rt, _) = cached_runtime();
    for engine in ENGINES {
        let other = js(engine);
        same_debates(&rt, &other, json!({}), json!({"gamma": 0.3}));
        same_debates(
            &rt,
            &other,
            json!({"peers": 1, "show_scores": true, "system": "Be brief.", "early_stop": true}),
            json!({"gamma": 0.55, "alpha_0": 0.5, "alpha_1": 2.0, "beta_0": 2.0, "beta_1": 0.25}),
        );
    }
}

/// A whole `maporl eval` on the quickstart's config writes the same transcripts, rewards and
/// report with the JavaScript plugins as with the Rust ones; only the plugins' hashes differ.
#[test]
fn an_eval_with_the_js_plugins_writes_the_rust_plugins_transcripts() {
    for engine in ENGINES {
        same_eval(&js(engine), engine);
    }
}

/// What the JavaScript code threw is the world's error, with the plugin, the error and the
/// source line (not the bundle's): never a bare trap. A bad setting is refused by name at
/// load; what a plugin returns is checked field by field.
#[test]
fn js_errors_become_the_worlds_error_with_their_message_and_line() {
    let (rt, _) = cached_runtime();
    let limits = Limits::default();
    for engine in ENGINES {
        let p = js(engine);
        let err = Verifier::load(&rt, &p("gsm8k"), &json!({"strict": true}), &limits)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("gsm8k-js: unknown setting `strict` (the settings: none)"),
            "{engine}: {err}"
        );
        let err = RewardShaper::load(&rt, &p("influence"), &json!({"gamma": "high"}), &limits)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("setting `gamma` must be a number, got \"high\""),
            "{engine}: {err}"
        );
        let err = RewardShaper::load(&rt, &p("influence"), &json!({"gamma": 3}), &limits)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("influence-js: gamma = 3: expected a number in [0, 1]"),
            "{engine}: {err}"
        );

        let mut v = Verifier::load(&rt, &p("gsm8k"), &json!({}), &limits).unwrap();
        let err = v
            .score(&task("t9", "gsm8k", "q", "seven"), &["\\boxed{7}".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("the reference `seven` is not an integer") && err.contains("t9"),
            "{engine}: {err}"
        );
        // A PluginError the SDK's helper throws: its message as it is.
        let mut pr = Protocol::load(&rt, &p("debate"), &json!({}), &limits).unwrap();
        let err = pr
            .plan_turn(&task("t8", "gsm8k", "q", ""), 2, &Transcript::new(2, 3))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("debate-js: task `t8`: agent 0 has no utterance at turn 1"),
            "{engine}: {err}"
        );

        let mut h = Verifier::load(&rt, &p("hostile"), &json!({}), &limits).unwrap();
        let mut fails = |question: &str| {
            h.score(&task("t-h", "qa", question, "a"), &["a".into()])
                .unwrap_err()
                .to_string()
        };
        // A TypeError thrown by the engine, at its line in app.js (SpiderMonkey points at
        // the property read, QuickJS at the start of its statement).
        let err = fails("throw");
        assert!(
            err.contains("hostile-js: TypeError: ")
                && err.contains("null")
                && (err.contains("(at app.js:39)") || err.contains("(at app.js:37)"))
                && err.contains("t-h"),
            "{engine}: {err}"
        );
        let err = fails("throw-value");
        assert!(
            err.contains("hostile-js: threw {\"code\":7}"),
            "{engine}: {err}"
        );
        let err = fails("wrong-shape");
        assert!(
            err.contains("hostile-js: verdict 0's `score` must be a number, got \"1\""),
            "{engine}: {err}"
        );
        // The plugin still answers after its errors.
        let ok = h
            .score(&task("t-ok", "qa", "fine", "a"), &["a".into(), "b".into()])
            .unwrap();
        assert!(ok[0].correct && !ok[1].correct, "{engine}");
    }
}

/// In a real component `console.log` reaches the plugin log, a line per call.
#[test]
fn in_a_component_console_log_is_the_plugin_log() {
    let (rt, logged) = cached_runtime();
    for engine in ENGINES {
        logged.lock().unwrap().clear();
        let mut v =
            Verifier::load(&rt, &js(engine)("hostile"), &json!({}), &Limits::default()).unwrap();
        let verdicts = v
            .score(
                &task("t-print", "qa", "print", "a"),
                &["a".into(), "b".into()],
            )
            .unwrap();
        assert!(verdicts[0].correct && !verdicts[1].correct, "{engine}");
        let lines: Vec<(maporl::plugin::LogLevel, String)> = logged
            .lock()
            .unwrap()
            .iter()
            .map(|(_, level, line)| (*level, line.clone()))
            .collect();
        assert_eq!(
            lines,
            [
                (
                    maporl::plugin::LogLevel::Info,
                    "hello from JavaScript".to_string()
                ),
                (
                    maporl::plugin::LogLevel::Info,
                    "a second line 2".to_string()
                ),
            ],
            "{engine}"
        );
    }
}

/// The JavaScript SDK ships the contract it builds against; it is this host's.
#[test]
fn the_js_sdk_ships_this_hosts_contract() {
    assert_eq!(
        std::fs::read_to_string(repo().join("plugins/sdk-js/maporl-plugin/wit/maporl.wit"))
            .unwrap(),
        maporl::plugin::WIT,
        "copy wit/maporl.wit to plugins/sdk-js/maporl-plugin/wit/"
    );
}

/// Neither engine builds the same bytes twice; the SDK's build records the source's sha256
/// in the component. A rebuild has another sha256 and the same source, and the plugin's
/// randomness is the same: on SpiderMonkey WASI's, which the host seeds from the source (cut
/// the section off and the two builds, seeded from their bytes, draw differently); on
/// QuickJS, which has no WASI randomness, `Math.random` seeded by the build from the source.
/// Either way an edited source draws differently.
#[test]
fn a_rebuild_of_the_same_source_keeps_the_plugins_identity_and_seed() {
    let (rt, _) = cached_runtime();
    let dir = tempfile::tempdir().unwrap();
    let app = repo().join("plugins/js/hostile/app.js");
    // The same plugin with one more comment line, importing the SDK by its absolute path.
    let edited = dir.path().join("edited.js");
    let sdk = repo().join("plugins/sdk-js/maporl-plugin/index.js");
    std::fs::write(
        &edited,
        std::fs::read_to_string(&app)
            .unwrap()
            .replace("../../sdk-js/maporl-plugin/index.js", sdk.to_str().unwrap())
            + "// edited\n",
    )
    .unwrap();
    let build = |app: &std::path::Path, engine: &str, out: &str| {
        let out = dir.path().join(out);
        let status = std::process::Command::new("node")
            .arg(repo().join("plugins/sdk-js/maporl-plugin/build.mjs"))
            .arg(app)
            .args(["--world", "verifier", "--engine", engine, "-o"])
            .arg(&out)
            .status()
            .unwrap();
        assert!(status.success(), "{engine}");
        out
    };
    let draw = |path: &std::path::Path| {
        let mut v = Verifier::load(&rt, path, &json!({}), &Limits::default()).unwrap();
        let verdicts = v
            .score(&task("t-random", "qa", "random", "a"), &["a".into()])
            .unwrap();
        (v.identity().clone(), verdicts[0].answer.clone().unwrap())
    };
    for engine in ENGINES {
        let first = js(engine)("hostile");
        let second = build(&app, engine, &format!("hostile-{engine}.wasm"));
        let (a, drawn_a) = draw(&first);
        let (b, drawn_b) = draw(&second);
        assert_ne!(a.sha256, b.sha256, "{engine} built the same bytes twice");
        let source = a.source_sha256.clone().expect("the SDK records the source");
        assert_eq!(
            b.source_sha256.as_deref(),
            Some(source.as_str()),
            "{engine}"
        );
        assert_eq!(drawn_a, drawn_b, "{engine}");
        assert_eq!(drawn_a.len(), 16, "{engine}: {drawn_a}");

        let (c, drawn_c) = draw(&build(&edited, engine, &format!("edited-{engine}.wasm")));
        assert_ne!(
            c.source_sha256.as_deref(),
            Some(source.as_str()),
            "{engine}"
        );
        assert_ne!(
            drawn_c, drawn_a,
            "{engine}: an edited source draws the same"
        );

        if engine == "spidermonkey" {
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
            assert_ne!(
                drawn_a, drawn_b,
                "the seed follows the bytes without the section"
            );
        }
    }
}
