//! The contract keeps its promises (wit/maporl.wit, "Versioning"): every released version
//! is kept in `wit/since_vX.Y.Z/`, never edited; the current version is a semver successor
//! of each (same major, no lower minor, and the same interface where the minor is the
//! same); and the host loads and runs a component built against each frozen copy.

mod support;

use maporl::plugin::{Limits, Verifier};
use sha2::{Digest, Sha256};
use support::*;

/// Every released version and the sha256 of its frozen copy. Releasing a version adds a
/// line here and a copy under `wit/since_vX.Y.Z/`; nothing here is ever changed.
const FROZEN: &[(&str, &str)] = &[(
    "0.1.0",
    "831281887dc4d31be7ee1cc87ba96ef6cd3b07ee4d3e7b8d28e54a9b4f806bfa",
)];

/// The version in a WIT file's `package maporl:plugin@X.Y.Z;` line.
fn package_version(wit: &str) -> (u64, u64, u64) {
    let line = wit
        .lines()
        .find_map(|l| l.trim().strip_prefix("package maporl:plugin@"))
        .expect("a package line");
    let v: Vec<u64> = line
        .trim_end_matches(';')
        .split('.')
        .map(|n| n.parse().expect("a numeric version"))
        .collect();
    (v[0], v[1], v[2])
}

/// The WIT without comments, blank lines and the package's patch number: what a plugin is
/// built against.
fn interface(wit: &str) -> Vec<String> {
    wit.lines()
        .map(|l| l.split("//").next().unwrap().trim().to_string())
        .filter(|l| !l.is_empty() && !l.starts_with("package "))
        .collect()
}

#[test]
fn every_released_version_is_frozen_and_the_current_one_succeeds_it() {
    let wit = repo().join("wit");
    let current = std::fs::read_to_string(wit.join("maporl.wit")).unwrap();
    let now = package_version(&current);
    let mut dirs: Vec<String> = std::fs::read_dir(&wit)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("since_v"))
        .collect();
    dirs.sort();
    let mut listed: Vec<String> = FROZEN.iter().map(|(v, _)| format!("since_v{v}")).collect();
    listed.sort();
    assert_eq!(
        dirs, listed,
        "wit/since_v*/ and FROZEN must name the same versions"
    );
    for (version, sha256) in FROZEN {
        let path = wit.join(format!("since_v{version}/maporl.wit"));
        let frozen = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            hex::encode(Sha256::digest(frozen.as_bytes())),
            *sha256,
            "{} was edited: a released version is frozen",
            path.display()
        );
        let then = package_version(&frozen);
        assert_eq!(format!("{}.{}.{}", then.0, then.1, then.2), *version);
        assert_eq!(
            then.0, now.0,
            "{version}: a new major version drops the old plugins"
        );
        assert!(
            (now.1, now.2) >= (then.1, then.2),
            "{version}: the current version {now:?} is older than a released one"
        );
        if then.1 == now.1 {
            assert_eq!(
                interface(&frozen),
                interface(&current),
                "the interface changed since {version} without a minor version bump"
            );
        }
    }
}

/// A component built only from a frozen copy, with raw bindings
/// (plugins/testing/frozen-v0-1-0): loads, configures, logs through the host, scores.
#[test]
fn a_component_built_against_each_frozen_version_loads_and_runs() {
    let (rt, logged, _cache) = runtime();
    let path = plugin("frozen_v0_1_0");
    let seen = maporl::plugin::inspect(&rt, &path).unwrap();
    assert_eq!(seen.wit_version.as_deref(), Some("0.1.0"));
    assert_eq!(seen.world.as_deref(), Some("verifier"));
    let mut v =
        Verifier::load(&rt, &path, &serde_json::json!({}), &Limits::default()).expect("loads");
    assert!(
        logged
            .lock()
            .unwrap()
            .iter()
            .any(|(_, _, line)| line.contains("built against maporl:plugin@0.1.0")),
        "{:?}",
        logged.lock().unwrap()
    );
    let verdicts = v
        .score(
            &task("t1", "arith", "What is 2 + 3?", "5"),
            &["5".into(), " 6 ".into(), "".into()],
        )
        .unwrap();
    let got: Vec<(Option<&str>, f32, bool)> = verdicts
        .iter()
        .map(|v| (v.answer.as_deref(), v.score, v.correct))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some("5"), 1.0, true),
            (Some("6"), 0.0, false),
            (None, 0.0, false)
        ]
    );
}
