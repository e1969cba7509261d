//! The contract keeps its promises (wit/maporl.wit, "Versioning"): every released version
//! is kept in `wit/since_vX.Y.Z/`, never edited; the host links each of them, the current
//! one last (with the same interface wherever the minor is the same); and components built
//! against an older version load and run beside current ones, with the same results.

mod support;

use maporl::plugin::{Limits, Protocol, RewardShaper, Verifier};
use sha2::{Digest, Sha256};
use support::*;

/// Every released version and the sha256 of its frozen copy. Releasing a version adds a
/// line here and a copy under `wit/since_vX.Y.Z/`; nothing here is ever changed.
const FROZEN: &[(&str, &str)] = &[
    (
        "0.1.0",
        "831281887dc4d31be7ee1cc87ba96ef6cd3b07ee4d3e7b8d28e54a9b4f806bfa",
    ),
    (
        "0.2.0",
        "c5929e92da2a72929120073c31acc1db587085eb1a344e593e2d5a5ac543bcc9",
    ),
];

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
        assert!(
            maporl::plugin::WIT_VERSIONS.contains(&then),
            "{version} is released but the host does not link it (plugin::WIT_VERSIONS): \
             every plugin built against it would stop loading"
        );
        assert!(
            now >= then,
            "{version}: the current version {now:?} is older than a released one"
        );
        if (then.0, then.1) == (now.0, now.1) {
            assert_eq!(
                interface(&frozen),
                interface(&current),
                "the interface changed since {version} without a minor version bump"
            );
        }
    }
    assert_eq!(
        maporl::plugin::WIT_VERSIONS.len(),
        FROZEN.len(),
        "the host links a version that is not frozen"
    );
    assert_eq!(maporl::plugin::WIT_VERSION, now);
    assert_eq!(
        maporl::plugin::WIT_VERSIONS.last(),
        Some(&now),
        "wit/maporl.wit's version must be the newest the host links"
    );
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

/// The reference plugins built against 0.1.0 (the SDK's feature `since-v0-1-0`, as `cargo
/// xtask plugins` builds them) load beside the same sources built against the current
/// version, and a scripted debate through either gives the same plans, verdicts, decisions
/// and rewards, call for call; mixing the versions in one debate changes nothing either.
#[test]
fn reference_plugins_built_against_0_1_0_run_beside_the_current_ones() {
    let (rt, _logged, _cache) = runtime();
    let old = |name: &str| plugins_since_v0_1_0_dir().join(format!("{name}.wasm"));
    let current = maporl::plugin::wit_version();
    assert_ne!(
        current, "0.1.0",
        "this test needs a contract newer than 0.1.0"
    );
    for (name, world) in [
        ("debate", "protocol"),
        ("gsm8k", "verifier"),
        ("influence", "reward-shaper"),
    ] {
        let then = maporl::plugin::inspect(&rt, &old(name)).unwrap();
        let now = maporl::plugin::inspect(&rt, &plugin(name)).unwrap();
        assert_eq!(then.wit_version.as_deref(), Some("0.1.0"), "{name}");
        assert_eq!(now.wit_version.as_deref(), Some(current.as_str()), "{name}");
        assert_eq!(then.world.as_deref(), Some(world));
        assert!(
            then.imports
                .iter()
                .all(|i| !i.starts_with("maporl:plugin/") || i.ends_with("@0.1.0")),
            "{name}: {:?}",
            then.imports
        );
        assert_ne!(
            then.sha256, now.sha256,
            "{name}: the two builds are one file"
        );
    }
    let settings = serde_json::json!({});
    let limits = Limits::default();
    let protocol = |p: std::path::PathBuf| Protocol::load(&rt, &p, &settings, &limits).unwrap();
    let verifier = |p: std::path::PathBuf| Verifier::load(&rt, &p, &settings, &limits).unwrap();
    let shaper = |p: std::path::PathBuf| RewardShaper::load(&rt, &p, &settings, &limits).unwrap();
    let (mut p_old, mut p_new) = (protocol(old("debate")), protocol(plugin("debate")));
    let (mut v_old, mut v_new) = (verifier(old("gsm8k")), verifier(plugin("gsm8k")));
    let (mut s_old, mut s_new) = (shaper(old("influence")), shaper(plugin("influence")));

    let task = task(
        "gsm8k-7",
        "gsm8k",
        "Tom has 3 apples and buys 4 more. How many apples does he have?",
        "7",
    );
    let mut transcript = maporl::transcript::Transcript::new(3, 3);
    for turn in 1..=3u32 {
        let plan = p_old.plan_turn(&task, turn, &transcript).unwrap();
        assert_eq!(
            plan,
            p_new.plan_turn(&task, turn, &transcript).unwrap(),
            "turn {turn}"
        );
        assert_eq!(plan.len(), 3, "turn {turn}");
        // Agent 2 is wrong at turn 1 and comes round; agent 1 never gives an answer.
        let responses: Vec<String> = plan
            .iter()
            .map(|p| match (p.agent, turn) {
                (1, _) => "I cannot tell.".to_string(),
                (2, 1) => "3 + 4 = 8, so \\boxed{8}".to_string(),
                _ => format!("3 + 4 = 7 (turn {turn}), so \\boxed{{7}}"),
            })
            .collect();
        let verdicts = v_old.score(&task, &responses).unwrap();
        assert_eq!(
            verdicts,
            v_new.score(&task, &responses).unwrap(),
            "turn {turn}"
        );
        add_turn(&mut transcript, turn, &plan, &responses, &verdicts);
        let decided = p_old.decide(&task, turn, &transcript).unwrap();
        assert_eq!(decided, p_new.decide(&task, turn, &transcript).unwrap());
        // Turn 1 ties 7 and 8 (agent 1 gives no answer); then 7 holds.
        let want: &[&str] = if turn == 1 { &["7", "8"] } else { &["7"] };
        assert_eq!(decided, want, "turn {turn}");
    }
    let rewards = s_old.shape(&task, &transcript).unwrap();
    assert_eq!(rewards, s_new.shape(&task, &transcript).unwrap());
    assert_eq!(rewards.len(), 9);
    // The wrong turn-1 answer is rewarded below the right ones.
    let at = |t: u32, a: u32| {
        rewards
            .iter()
            .find(|r| r.turn == t && r.agent == a)
            .unwrap()
    };
    assert!(at(1, 2).total < at(1, 0).total, "{rewards:?}");
}

/// `host.limits` (contract 0.2.0) tells a plugin the limits its run set, with the judge
/// budget as it stands; a 0.1.0 plugin, which cannot import it, runs in the same host.
#[test]
fn a_current_plugin_reads_its_limits_from_the_host() {
    let (rt, _logged, _cache) = runtime();
    let limits = Limits {
        fuel: 123_456_789,
        deadline_ms: 4_321,
        memory_mib: 48,
        max_prompt_bytes: 777,
        max_result_kib: 96,
        max_answer_bytes: 55,
        max_abs_reward: 2.5,
        max_reward_parts: 7,
        max_part_name_bytes: 9,
        max_component_mib: 64,
    };
    let mut v = Verifier::load(
        &rt,
        &plugin("hostile_verifier"),
        &serde_json::json!({}),
        &limits,
    )
    .unwrap();
    let err = v
        .score(&task("t-limits", "arith", "limits", "1"), &["1".into()])
        .unwrap_err()
        .to_string();
    let want = format!(
        "limits: fuel=123456789 deadline-ms=4321 memory-bytes={} max-result-bytes={} \
         max-prompt-bytes=777 max-answer-bytes=55 max-abs-reward=2.5 max-reward-parts=7 \
         max-part-name-bytes=9 judge-responses-left={}",
        48u64 << 20,
        96 << 10,
        maporl::plugin::JUDGE_MAX_RESPONSES_PER_CALL
    );
    assert!(err.contains(&want), "{err}\nwanted: {want}");
    assert!(err.contains("t-limits"), "{err}");

    // With a learned verifier, what `judge` would still take falls as it judges: within a
    // call, and over the calls on one task.
    struct Half;
    impl maporl::plugin::Judge for Half {
        fn judge(&self, _: &str, responses: &[String]) -> Result<Vec<f32>, String> {
            Ok(vec![0.5; responses.len()])
        }
    }
    let (rt, _logged, _cache) = runtime_with(0, Some(std::sync::Arc::new(Half)));
    let mut v = Verifier::load(
        &rt,
        &plugin("hostile_verifier"),
        &serde_json::json!({}),
        &Limits::default(),
    )
    .unwrap();
    let per_call = maporl::plugin::JUDGE_MAX_RESPONSES_PER_CALL;
    let task = task("t-budget", "arith", "limits-after-judge", "1");
    for (call, left) in [(1, per_call - 3), (2, per_call - 3)] {
        let err = v
            .score(&task, &["1".into(), "2".into(), "3".into()])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("judge-responses-left={left}")),
            "call {call}: {err}"
        );
    }
    // Near the per-debate bound, the debate's budget is what is left.
    let per_debate = maporl::plugin::JUDGE_MAX_RESPONSES_PER_DEBATE;
    let judge_1000 = task_named("t-budget", "judge-1000");
    let mut judged = 6;
    while per_debate - judged >= per_call {
        v.score(&judge_1000, &["1".into()]).unwrap();
        judged += 1000;
    }
    let err = v.score(&task, &["1".into()]).unwrap_err().to_string();
    assert!(
        err.contains(&format!("judge-responses-left={}", per_debate - judged - 1)),
        "{judged} judged: {err}"
    );
}

fn task_named(id: &str, question: &str) -> maporl::transcript::Task {
    task(id, "arith", question, "1")
}
