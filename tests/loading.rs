//! Loading components: world and WIT-version checks, clear errors for bad files, and the
//! on-disk cache of compiled components.

mod support;

use maporl::plugin::{
    Failure, Limits, Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier, World,
};
use serde_json::json;
use support::*;

fn load_error(err: maporl::plugin::PluginError) -> String {
    assert_eq!(err.function, "load", "{err}");
    match &err.failure {
        Failure::Load(msg) => msg.clone(),
        other => panic!("expected a load failure, got {other:?}"),
    }
}

#[test]
fn a_component_of_another_world_is_refused_naming_both_worlds() {
    let (rt, _, _c) = runtime();
    let err = Protocol::load(&rt, &plugin("gsm8k"), &json!({}), &Limits::default())
        .err()
        .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("gsm8k.wasm") && text.contains("world protocol"),
        "{text}"
    );
    let msg = load_error(err);
    assert!(msg.contains("targets world `verifier`"), "{msg}");
    let err = RewardShaper::load(&rt, &plugin("debate"), &json!({}), &Limits::default())
        .err()
        .unwrap();
    assert!(load_error(err).contains("targets world `protocol`"));
}

/// A copy of the built component `name` whose WIT version is `version`.
fn with_version(name: &str, version: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let bytes = with_wit_version(&std::fs::read(plugin(name)).unwrap(), version);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}-{version}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

#[test]
fn a_newer_minor_or_another_major_wit_version_is_refused() {
    let (rt, _, _c) = runtime();
    for version in ["0.3.0", "1.1.0", "0.0.1"] {
        let (_d, path) = with_version("exact_match", version);
        let err = Verifier::load(&rt, &path, &json!({}), &Limits::default())
            .err()
            .unwrap();
        let msg = load_error(err);
        assert!(msg.contains(&format!("maporl:plugin@{version}")), "{msg}");
        assert!(
            msg.contains("which this host does not link")
                && msg.contains("maporl:plugin 0.1.0, 0.2.0"),
            "{msg}"
        );
    }
}

#[test]
fn a_patch_newer_plugin_is_accepted() {
    let (rt, _, _c) = runtime();
    let (_d, path) = with_version("exact_match", "0.2.7");
    let mut v = Verifier::load(&rt, &path, &json!({}), &Limits::default())
        .expect("0.2.7 loads on a 0.2.0 host");
    let verdicts = v
        .score(
            &task("t", "qa", "Capital of France?", "Paris"),
            &["\\boxed{paris}".into()],
        )
        .unwrap();
    assert!(verdicts[0].correct);
}

#[test]
fn files_that_are_not_components_get_clear_errors() {
    let (rt, _, _c) = runtime();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.wasm");
    let err = Verifier::load(&rt, &missing, &json!({}), &Limits::default())
        .err()
        .unwrap();
    assert!(load_error(err).contains("nope.wasm"));

    let module = dir.path().join("module.wasm");
    std::fs::write(&module, b"\0asm\x01\0\0\0").unwrap();
    let err = Verifier::load(&rt, &module, &json!({}), &Limits::default())
        .err()
        .unwrap();
    assert!(load_error(err).contains("wasm32-wasip2"));

    let text = dir.path().join("text.wasm");
    std::fs::write(&text, "hello").unwrap();
    let err = Verifier::load(&rt, &text, &json!({}), &Limits::default())
        .err()
        .unwrap();
    assert!(load_error(err).contains("not a WebAssembly file"));
}

/// A component that imports `wasi:http` (as a default componentize-js build does) is refused
/// by name with how to build it without, in every world; the same component without the
/// import gets the usual "no world" refusal.
#[test]
fn a_component_that_imports_wasi_http_is_refused_saying_how_to_build_without() {
    let (rt, _, _c) = runtime();
    let dir = tempfile::tempdir().unwrap();
    // A component (layer 1) with one instance type (no exports) and, when `name` is given,
    // an import of that instance under `name`.
    let component = |name: Option<&str>| {
        let mut b = b"\0asm\x0d\0\x01\0".to_vec();
        b.extend_from_slice(&[0x07, 0x03, 0x01, 0x42, 0x00]);
        if let Some(name) = name {
            let mut import = vec![0x01, 0x00, name.len() as u8];
            import.extend_from_slice(name.as_bytes());
            import.extend_from_slice(&[0x05, 0x00]);
            b.push(0x0a);
            b.push(import.len() as u8);
            b.extend_from_slice(&import);
        }
        b
    };
    let http = dir.path().join("http.wasm");
    std::fs::write(&http, component(Some("wasi:http/types@0.2.10"))).unwrap();
    for world in World::ALL {
        let err = match world {
            World::Protocol => Protocol::load(&rt, &http, &json!({}), &Limits::default()).err(),
            World::Verifier => Verifier::load(&rt, &http, &json!({}), &Limits::default()).err(),
            World::RewardShaper => {
                RewardShaper::load(&rt, &http, &json!({}), &Limits::default()).err()
            }
        };
        let msg = load_error(err.unwrap());
        assert!(
            msg.contains("imports `wasi:http/types@0.2.10`")
                && msg.contains("--disable http fetch-event"),
            "{world:?}: {msg}"
        );
    }
    let plain = dir.path().join("plain.wasm");
    std::fs::write(&plain, component(None)).unwrap();
    let err = Verifier::load(&rt, &plain, &json!({}), &Limits::default()).err();
    let msg = load_error(err.unwrap());
    assert!(msg.contains("does not implement world `verifier`"), "{msg}");
}

#[test]
fn bad_settings_are_refused_at_load_naming_the_key() {
    let (rt, _, _c) = runtime();
    let err = Protocol::load(
        &rt,
        &plugin("debate"),
        &json!({"peerz": 1}),
        &Limits::default(),
    )
    .err()
    .unwrap();
    assert_eq!(err.function, "configure");
    assert!(err.to_string().contains("peerz"), "{err}");
}

/// The compiled components in a cache directory.
fn cache_entries(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    out.sort();
    out
}

#[test]
fn a_cache_entry_planted_for_another_component_is_never_run() {
    let cache = tempfile::tempdir().unwrap();
    let options = || RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeOptions::default()
    };
    let first = Runtime::new(options()).unwrap();
    for name in ["gsm8k", "anli"] {
        Verifier::load(&first, &plugin(name), &json!({}), &Limits::default()).unwrap();
    }
    let sha = |name: &str| {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(plugin(name)).unwrap()))
    };
    let entry = |name: &str| {
        cache_entries(cache.path())
            .into_iter()
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(&sha(name))
            })
            .unwrap()
    };
    let t = task("a1", "anli", "premise / hypothesis", "neutral");
    let texts = ["Answer: \\boxed{Neutral}".to_string()];
    // gsm8k's compiled code under anli's name (what a planted file would be), then a file
    // of bytes that are no compiled code at all: anli is compiled again each time, and runs
    // as anli.
    for plant in [
        std::fs::read(entry("gsm8k")).unwrap(),
        b"\x7fELF planted".to_vec(),
    ] {
        std::fs::write(entry("anli"), &plant).unwrap();
        let rt = Runtime::new(options()).unwrap();
        let mut v = Verifier::load(&rt, &plugin("anli"), &json!({}), &Limits::default()).unwrap();
        assert_eq!(
            rt.compile_counts(),
            (1, 0),
            "the planted entry was not used"
        );
        assert_eq!(
            v.score(&t, &texts).unwrap()[0].answer.as_deref(),
            Some("neutral")
        );
    }
    // A cache directory others can write into is not used at all.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let before = cache_entries(cache.path());
        let rt = Runtime::new(options()).unwrap();
        Verifier::load(&rt, &plugin("anli"), &json!({}), &Limits::default()).unwrap();
        assert_eq!(rt.compile_counts(), (1, 0));
        assert_eq!(cache_entries(cache.path()), before, "nothing written there");
    }
}

#[test]
fn a_second_load_comes_from_the_cache() {
    let cache = tempfile::tempdir().unwrap();
    let options = || RuntimeOptions {
        cache_dir: Some(cache.path().to_path_buf()),
        ..RuntimeOptions::default()
    };
    let first = Runtime::new(options()).unwrap();
    Verifier::load(&first, &plugin("gsm8k"), &json!({}), &Limits::default()).unwrap();
    assert_eq!(first.compile_counts(), (1, 0));
    assert_eq!(cache_entries(cache.path()).len(), 1, "one .cwasm file");

    let second = Runtime::new(options()).unwrap();
    let mut v = Verifier::load(&second, &plugin("gsm8k"), &json!({}), &Limits::default()).unwrap();
    assert_eq!(second.compile_counts(), (0, 1), "no recompilation");
    let verdict = &v
        .score(&task("t", "gsm8k", "q", "12"), &["so \\boxed{12}".into()])
        .unwrap()[0];
    assert!(verdict.correct);

    // A corrupted cache entry is recompiled, not trusted.
    let entry = cache_entries(cache.path()).remove(0);
    std::fs::write(&entry, b"garbage").unwrap();
    let third = Runtime::new(options()).unwrap();
    Verifier::load(&third, &plugin("gsm8k"), &json!({}), &Limits::default()).unwrap();
    assert_eq!(third.compile_counts(), (1, 0));
}

#[test]
fn check_reports_world_version_and_hash() {
    let (rt, _, _c) = runtime();
    let ins = rt.check(&plugin("influence"), World::RewardShaper).unwrap();
    assert_eq!(ins.world.as_deref(), Some("reward-shaper"));
    assert_eq!(ins.wit_version.as_deref(), Some("0.2.0"));
    let bytes = std::fs::read(plugin("influence")).unwrap();
    use sha2::Digest;
    assert_eq!(ins.sha256, hex::encode(sha2::Sha256::digest(&bytes)));
    let shape = ins
        .exports
        .iter()
        .find(|e| e.name == "maporl:plugin/reward-shaping@0.2.0")
        .expect("exports reward-shaping");
    assert!(
        shape.functions.iter().any(|f| f.starts_with("shape(")),
        "{:?}",
        shape.functions
    );
    assert!(rt.check(&plugin("influence"), World::Verifier).is_err());
}
