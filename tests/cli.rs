//! The `maporl` binary, driven as a user would.

mod support;

use std::process::{Command, Output};

use support::*;

fn maporl(args: &[&str]) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(args)
        .env("MAPORL_CACHE_DIR", cache.path())
        .env("MAPORL_PLUGINS", plugins_dir())
        .output()
        .expect("running maporl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn inspect_shows_world_version_exports_and_hash() {
    let file = plugin("debate");
    let out = maporl(&["plugin", "inspect", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("world:       protocol"), "{text}");
    assert!(
        text.contains("wit version: 0.2.0 (runs on this host, which links 0.1.0, 0.2.0)"),
        "{text}"
    );
    assert!(text.contains("maporl:plugin/collaboration@0.2.0"), "{text}");
    assert!(text.contains("plan-turn(task: record"), "{text}");
    use sha2::Digest;
    let sha = hex::encode(sha2::Sha256::digest(std::fs::read(&file).unwrap()));
    assert!(text.contains(&sha), "{text}");

    let out = maporl(&["plugin", "inspect", "--json", file.to_str().unwrap()]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["world"], "protocol");
    assert_eq!(json["sha256"], sha);

    // A component built against a contract this host does not link is described, and says so.
    let dir = tempfile::tempdir().unwrap();
    let newer = dir.path().join("debate-0.3.0.wasm");
    std::fs::write(
        &newer,
        with_wit_version(&std::fs::read(&file).unwrap(), "0.3.0"),
    )
    .unwrap();
    let out = maporl(&["plugin", "inspect", newer.to_str().unwrap()]);
    assert!(
        stdout(&out)
            .contains("wit version: 0.3.0 (does not run on this host, which links 0.1.0, 0.2.0)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn check_accepts_the_right_world_and_refuses_another() {
    let file = plugin("anli");
    let ok = maporl(&[
        "plugin",
        "check",
        file.to_str().unwrap(),
        "--world",
        "verifier",
    ]);
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).starts_with("ok: "), "{}", stdout(&ok));
    let bad = maporl(&[
        "plugin",
        "check",
        file.to_str().unwrap(),
        "--world",
        "protocol",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    let err = stderr(&bad);
    assert!(
        err.starts_with("error: plugin ") && err.contains("targets world `verifier`"),
        "{err}"
    );
    let unknown = maporl(&[
        "plugin",
        "check",
        file.to_str().unwrap(),
        "--world",
        "judge",
    ]);
    assert!(stderr(&unknown).contains("unknown world `judge`"));
}

#[test]
fn call_runs_one_function_and_prints_json() {
    let file = plugin("gsm8k");
    let input = r#"{"task": {"id": "q1", "question": "2+2?", "reference": "4"},
                    "responses": ["so \\boxed{4}", "maybe \\boxed{5}", "no idea"]}"#;
    let out = maporl(&[
        "plugin",
        "call",
        file.to_str().unwrap(),
        "score",
        "--input",
        input,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let verdicts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(verdicts[0]["answer"], "4");
    assert_eq!(verdicts[0]["correct"], true);
    assert_eq!(verdicts[1]["score"], 0.0);
    assert!(verdicts[2]["answer"].is_null());
    assert!(stderr(&out).contains("fuel used: "));

    let out = maporl(&[
        "plugin",
        "call",
        file.to_str().unwrap(),
        "shape",
        "--input",
        "{}",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("configure, extract, score"),
        "{}",
        stderr(&out)
    );
    let out = maporl(&[
        "plugin",
        "call",
        file.to_str().unwrap(),
        "score",
        "--input",
        r#"{"task": {"id": "q"}}"#,
    ]);
    assert!(stderr(&out).contains("parsing --input"), "{}", stderr(&out));
}

#[test]
fn scripted_runs_debates_through_the_reference_plugins() {
    let out = maporl(&["scripted", "--tasks", "3", "--seed", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("scripted stand-in agents (not LLMs)"),
        "{text}"
    );
    assert_eq!(text.matches("== task").count(), 3, "{text}");
    assert!(text.contains("| majority accuracy |"), "{text}");
    for turn in 1..=3 {
        assert!(text.contains(&format!("turn {turn} team answer")), "{text}");
    }
    assert_eq!(
        stdout(&maporl(&["scripted", "--tasks", "3", "--seed", "4"])),
        text,
        "deterministic"
    );
    // The old name says where the command went, and where the main job is.
    let old = maporl(&["demo", "--tasks", "3"]);
    assert!(!old.status.success());
    assert!(
        stderr(&old).contains("`maporl demo` is now `maporl scripted`")
            && stderr(&old).contains("cargo xtask demo"),
        "{}",
        stderr(&old)
    );
}

#[test]
fn scaffolded_plugins_build_pass_their_tests_and_check() {
    let work = tempfile::tempdir().unwrap();
    let target = work.path().join("target");
    for (kind, name, world) in [
        ("protocol", "my-protocol", "protocol"),
        ("verifier", "my-verifier", "verifier"),
        ("reward-shaper", "my-shaper", "reward-shaper"),
    ] {
        let dir = work.path().join(name);
        let out = maporl(&["plugin", "new", kind, name, "--path", dir.to_str().unwrap()]);
        assert!(out.status.success(), "{}", stderr(&out));
        // It prints the whole loop: test, build, check, an example input, a call, a run.
        let func = match kind {
            "protocol" => "plan-turn",
            "verifier" => "score",
            _ => "shape",
        };
        let steps = stdout(&out);
        for step in [
            "cargo test".to_string(),
            "cargo build --release --target wasm32-wasip2".to_string(),
            format!("--world {world}"),
            format!("maporl plugin call --example {func}"),
            "maporl train --config configs/quickstart.toml --set plugins.".to_string(),
        ] {
            assert!(steps.contains(&step), "{step}:\n{steps}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("vendor/maporl-plugin/wit/maporl.wit")).unwrap(),
            maporl::plugin::WIT,
            "the scaffold vendors the SDK with the host's WIT"
        );
        let cargo = |args: &[&str]| {
            let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(args)
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "cargo {args:?} in {name}: {}",
                stderr(&out)
            );
        };
        cargo(&["build", "--release", "--target", "wasm32-wasip2"]);
        cargo(&["test"]);
        let wasm = target.join(format!(
            "wasm32-wasip2/release/{}.wasm",
            name.replace('-', "_")
        ));
        let out = maporl(&["plugin", "check", wasm.to_str().unwrap(), "--world", world]);
        assert!(out.status.success(), "{}", stderr(&out));
        // Built against the frozen 0.1.0 instead (the SDK's feature), it checks and runs
        // too: a plugin author can still target hosts from before 0.2.0.
        if kind == "verifier" {
            let old_target = work.path().join("target-0.1.0");
            let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args(["build", "--release", "--target", "wasm32-wasip2"])
                .args(["--features", "maporl-plugin/since-v0-1-0"])
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", &old_target)
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", stderr(&out));
            let old = old_target.join("wasm32-wasip2/release/my_verifier.wasm");
            let out = maporl(&["plugin", "check", old.to_str().unwrap(), "--world", world]);
            assert!(
                out.status.success() && stdout(&out).contains("(WIT 0.1.0)"),
                "{}{}",
                stdout(&out),
                stderr(&out)
            );
            let example = stdout(&maporl(&["plugin", "call", "--example", "score"]));
            let called = maporl(&[
                "plugin",
                "call",
                old.to_str().unwrap(),
                "score",
                "--input",
                &example,
            ]);
            let now = maporl(&[
                "plugin",
                "call",
                wasm.to_str().unwrap(),
                "score",
                "--input",
                &example,
            ]);
            assert!(called.status.success(), "{}", stderr(&called));
            assert_eq!(
                stdout(&called),
                stdout(&now),
                "0.1.0 and 0.2.0 builds score alike"
            );
        }
        // The printed example is an input the new plugin takes.
        let example = maporl(&["plugin", "call", "--example", func]);
        assert!(example.status.success(), "{}", stderr(&example));
        let called = maporl(&[
            "plugin",
            "call",
            wasm.to_str().unwrap(),
            func,
            "--input",
            &stdout(&example),
        ]);
        assert!(
            called.status.success(),
            "{kind} {func}: {}",
            stderr(&called)
        );
        if kind == "verifier" {
            // The SDK's glue in a real component: typed settings reach the plugin, and a
            // misspelt key fails `configure` by name.
            let call = |func: &str, input: &str| {
                maporl(&[
                    "plugin",
                    "call",
                    wasm.to_str().unwrap(),
                    func,
                    "--input",
                    input,
                ])
            };
            let task = r#""task": {"id": "t", "kind": "qa", "question": "q", "reference": "Paris", "fields": []}"#;
            let responses = r#""responses": ["\\boxed{paris}"]"#;
            let strict = call("score", &format!("{{{task}, {responses}}}"));
            assert!(
                stdout(&strict).contains(r#""correct": false"#),
                "{}",
                stderr(&strict)
            );
            let lenient = call(
                "score",
                &format!(r#"{{"settings": {{"ignore_case": true}}, {task}, {responses}}}"#),
            );
            assert!(
                stdout(&lenient).contains(r#""correct": true"#),
                "{}",
                stderr(&lenient)
            );
            let typo = call("configure", r#"{"settings": {"ignore_cas": true}}"#);
            assert!(!typo.status.success());
            assert!(
                stderr(&typo).contains(
                    "my-verifier: unknown setting `ignore_cas` (did you mean `ignore_case`?)"
                ),
                "{}",
                stderr(&typo)
            );
        }
    }
    let again = maporl(&[
        "plugin",
        "new",
        "verifier",
        "my-verifier",
        "--path",
        work.path().join("my-verifier").to_str().unwrap(),
    ]);
    assert!(
        stderr(&again).contains("already exists"),
        "{}",
        stderr(&again)
    );
    let bad = maporl(&["plugin", "new", "verifier", "My Verifier"]);
    assert!(stderr(&bad).contains("must start with a lower-case letter"));
}

/// `scripts/gpu-smollm2.sh run` with the parts folder `parts` and the stash `stash`.
fn gpu_smollm2_run(parts: &std::path::Path, stash: &std::path::Path) -> Output {
    Command::new("bash")
        .arg(support::repo().join("scripts/gpu-smollm2.sh"))
        .arg("run")
        .env("PARTS", parts)
        .env("STASH", stash)
        .env("OUT", stash.join("out"))
        .output()
        .unwrap()
}

#[test]
fn the_gpu_run_names_a_part_that_is_missing_or_damaged_before_unpacking() {
    // Two parts and their sums; the call carries only the last, the stash is empty.
    let dir = tempfile::tempdir().unwrap();
    let (parts, stash) = (dir.path().join("parts"), dir.path().join("stash"));
    std::fs::create_dir_all(&parts).unwrap();
    std::fs::create_dir_all(&stash).unwrap();
    let sum = |p: &std::path::Path| {
        let out = Command::new("sha256sum").arg(p).output().unwrap();
        String::from_utf8(out.stdout).unwrap()[..64].to_string()
    };
    let (p0, p1) = (stash.join("part-0"), parts.join("part-1"));
    std::fs::write(&p0, b"the first part").unwrap();
    std::fs::write(&p1, b"the second part").unwrap();
    let sums = format!("{}  part-0\n{}  part-1\n", sum(&p0), sum(&p1));
    std::fs::write(parts.join("SHA256SUMS"), sums).unwrap();
    std::fs::remove_file(&p0).unwrap();
    let out = gpu_smollm2_run(&parts, &stash);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(": part-0 ("), "{}", stderr(&out));
    assert!(stash.join("part-1").exists(), "the carried part is kept");
    // The first part stashed, but not the bytes the sums were made of.
    std::fs::write(&p0, b"the first parT").unwrap();
    let out = gpu_smollm2_run(&parts, &stash);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("part-0: FAILED") && stderr(&out).contains("damaged"),
        "{}",
        stderr(&out)
    );
    // Whole and right, but not an archive: it says so, and runs nothing.
    std::fs::write(&p0, b"the first part").unwrap();
    let out = gpu_smollm2_run(&parts, &stash);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot unpack"), "{}", stderr(&out));
    assert!(!stash.join("out").exists(), "nothing ran");
}

#[test]
fn the_gpu_check_stops_at_once_without_a_gpu() {
    let out_dir = tempfile::tempdir().unwrap();
    for smi in ["/nonexistent/nvidia-smi", "false"] {
        let out = Command::new("bash")
            .arg(support::repo().join("scripts/gpu-check.sh"))
            .env("NVIDIA_SMI", smi)
            .env("OUT", out_dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("no NVIDIA GPU here"),
            "{}",
            stderr(&out)
        );
        assert!(
            !out_dir.path().join("build.log").exists(),
            "it stopped before building"
        );
    }
}

/// `scripts/fair_table.py` over the summaries in `dir`: its output.
fn fair_table(dir: &std::path::Path) -> String {
    let out = Command::new("python3")
        .arg(support::repo().join("scripts/fair_table.py"))
        .arg(dir)
        .output()
        .expect("running python3");
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
}

#[test]
fn a_fair_table_row_keeps_its_intervals_when_another_row_gains_a_seed() {
    let dir = tempfile::tempdir().unwrap();
    // Three turns' credits for 60 questions, different for each row and seed.
    let write = |row: &str, seed: u32| {
        let credits: serde_json::Map<String, serde_json::Value> = (0..60u32)
            .map(|q| {
                let h = |t: u32| {
                    let mix = q.wrapping_mul(2654435761)
                        ^ seed.wrapping_mul(40503)
                        ^ (t * 97)
                        ^ (row.len() as u32 * 7919);
                    let x = mix.wrapping_mul(2246822519);
                    f64::from(x >> 31)
                };
                (
                    format!("arith-0-{q}"),
                    serde_json::json!([h(1), h(2), h(3)]),
                )
            })
            .collect();
        let summary = serde_json::json!({
            "build": "test", "cpu": "test CPU", "credits": credits,
            "models": {"fair-model": "00"}, "rates": [[1, "corrected_by_peers", 0, 0]], "turns": 3,
        });
        let path = dir.path().join(format!("{row}-seed{seed}.json"));
        std::fs::write(path, summary.to_string()).unwrap();
    };
    for row in ["off-the-shelf", "maporl", "maporl-alpha"] {
        write(row, 0);
    }
    let lines = |table: &str, label: &str| -> Vec<String> {
        let rows = table
            .lines()
            .filter(|l| l.starts_with(&format!("| {label} |")));
        rows.map(String::from).collect()
    };
    let before = fair_table(dir.path());
    write("maporl-alpha", 1);
    let after = fair_table(dir.path());
    let maporl = lines(&before, "MAPoRL, rule verifier");
    assert!(
        maporl.len() >= 2 && maporl.iter().any(|l| l.contains('[')),
        "{before}"
    );
    assert_eq!(
        maporl,
        lines(&after, "MAPoRL, rule verifier"),
        "{before}\n{after}"
    );
    let alpha = "MAPoRL + alpha_1 = 2";
    assert_ne!(lines(&before, alpha), lines(&after, alpha), "{after}");
    assert!(
        lines(&after, alpha).iter().any(|l| l.contains("| 0,1 |")),
        "{after}"
    );
}

/// Seed 0's summary of each row, on `model`: every one of 40 questions with the row's
/// credits at turns 1-3.
fn write_uniform_summaries(dir: &std::path::Path, model: &str, rows: &[(&str, [f64; 3])]) {
    for (row, credit) in rows {
        let credits: serde_json::Map<String, serde_json::Value> = (0..40)
            .map(|q| (format!("arith-0-{q}"), serde_json::json!(credit)))
            .collect();
        let summary = serde_json::json!({
            "build": "test", "cpu": "test CPU", "credits": credits,
            "models": {model: "00"}, "rates": [[1, "corrected_by_peers", 0, 0]],
            "turns": 3,
        });
        std::fs::write(dir.join(format!("{row}-seed0.json")), summary.to_string()).unwrap();
    }
}

#[test]
fn a_row_at_128_steps_is_compared_with_maporl_at_128_steps() {
    let dir = tempfile::tempdir().unwrap();
    // MAPoRL at 32 steps and at 128 share nothing, so a 128-step row compared with the 32-step
    // MAPoRL (or not compared at all) shows in the table.
    let rows: [(&str, [f64; 3]); 4] = [
        ("off-the-shelf", [0.0, 0.0, 0.0]),
        ("maporl", [0.0, 0.0, 1.0]),
        ("maporl-long", [1.0, 1.0, 1.0]),
        ("maporl-current-long", [1.0, 0.0, 1.0]),
    ];
    write_uniform_summaries(dir.path(), "fair-model", &rows);
    let table = fair_table(dir.path());
    let long = table
        .split("MAPoRL, 128 steps, minus")
        .nth(1)
        .unwrap_or_else(|| panic!("no table of the 128-step rows:\n{table}"));
    let long = long.split("\n\n").next().unwrap();
    let cell = |d: f64| format!("{d:+.3} [{d:+.3}, {d:+.3}] {{{d:+.3}, {d:+.3}}}");
    let want = format!(
        "| MAPoRL without influence, 128 steps | 0 | {} | {} | {} |",
        cell(0.0),
        cell(1.0),
        cell(0.0)
    );
    assert!(long.contains(&want), "{want}\n{table}");
    assert_eq!(
        long.matches("\n| ").count(),
        1,
        "one 128-step row besides MAPoRL's:\n{table}"
    );
}

#[test]
fn each_cross_domain_row_is_paired_with_the_untrained_team_on_its_own_family() {
    let dir = tempfile::tempdir().unwrap();
    // Every question's credit at turns 1-3, the same for all 40 questions of a row: the
    // untrained team is always wrong on subtraction and always right on addition, so a row
    // paired with the wrong family's team shows it.
    let rows: [(&str, [f64; 3]); 6] = [
        ("cross-domain-before", [0.0, 0.0, 0.0]),
        ("cross-domain-reverse-before", [1.0, 1.0, 1.0]),
        ("cross-domain", [0.0, 1.0, 1.0]),
        ("cross-domain-reverse", [1.0, 1.0, 0.0]),
        ("cross-domain-same", [1.0, 0.0, 1.0]),
        ("cross-domain-reverse-same", [0.0, 0.0, 1.0]),
    ];
    write_uniform_summaries(dir.path(), "fair-model-x2", &rows);
    let table = fair_table(dir.path());
    let paired = table
        .split("row minus its untrained team")
        .nth(1)
        .unwrap_or_else(|| panic!("no paired table:\n{table}"));
    let paired = paired.split("\n\n").next().unwrap();
    let cell = |d: f64| format!("{d:+.3} [{d:+.3}, {d:+.3}] {{{d:+.3}, {d:+.3}}}");
    for (label, diff) in [
        ("MAPoRL on addition, on subtraction", [0.0, 1.0, 1.0]),
        ("MAPoRL on subtraction, on addition", [0.0, 0.0, -1.0]),
        ("MAPoRL on addition, on addition", [0.0, -1.0, 0.0]),
        ("MAPoRL on subtraction, on subtraction", [0.0, 0.0, 1.0]),
    ] {
        let want = format!(
            "| cross-domain: {label} | 0 | {} | {} | {} |",
            cell(diff[0]),
            cell(diff[1]),
            cell(diff[2])
        );
        assert!(paired.contains(&want), "{want}\n{table}");
    }
    assert!(!paired.contains("untrained"), "{table}");
}

/// `plugin new --lang python`: each kind's scaffold passes its own tests natively and vendors
/// the Python SDK with this host's contract; the reward shaper builds, checks, answers the
/// printed example, and trains a step of the quickstart in place of `influence`.
#[test]
fn python_scaffolds_pass_their_tests_and_a_shaper_builds_and_trains() {
    let work = tempfile::tempdir().unwrap();
    for (kind, name, world) in [
        ("protocol", "my-protocol", "protocol"),
        ("verifier", "my-verifier", "verifier"),
        ("reward-shaper", "my-shaper", "reward-shaper"),
    ] {
        let dir = work.path().join(name);
        let out = maporl(&[
            "plugin",
            "new",
            kind,
            name,
            "--lang",
            "python",
            "--path",
            dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let steps = stdout(&out);
        for step in [
            "python3 -m unittest".to_string(),
            format!("python3 -m maporl_plugin build app.py --world {world}"),
            format!(
                "maporl plugin check {}/{}.wasm --world {world}",
                dir.display(),
                name.replace('-', "_")
            ),
            "componentize-py==0.25.1".to_string(),
        ] {
            assert!(steps.contains(&step), "{step}:\n{steps}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("maporl_plugin/wit/maporl.wit")).unwrap(),
            maporl::plugin::WIT
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("maporl_plugin/worlds.py")).unwrap(),
            std::fs::read_to_string(repo().join("plugins/sdk-python/maporl_plugin/worlds.py"))
                .unwrap(),
        );
        let tests = Command::new("python3")
            .args(["-m", "unittest", "-v"])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            tests.status.success() && stderr(&tests).contains("Ran 1 test"),
            "{name}: {}",
            stderr(&tests)
        );
    }
    let dir = work.path().join("my-shaper");
    let wasm = dir.join("my_shaper.wasm");
    let built = Command::new("python3")
        .args([
            "-m",
            "maporl_plugin",
            "build",
            "app.py",
            "--world",
            "reward-shaper",
            "-o",
        ])
        .arg(&wasm)
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", stderr(&built));
    a_built_shaper_checks_answers_and_trains(work.path(), &wasm);
}

/// `plugin new --lang js`: each kind's scaffold passes its own tests natively (`node
/// --test`) and vendors the JavaScript SDK with this host's contract; the reward shaper builds
/// (with the repository's build tools in place of its `npm install`), checks, answers the
/// printed example, and trains a step of the quickstart in place of `influence`.
#[test]
fn js_scaffolds_pass_their_tests_and_a_shaper_builds_and_trains() {
    let work = tempfile::tempdir().unwrap();
    for (kind, name, world) in [
        ("protocol", "my-protocol", "protocol"),
        ("verifier", "my-verifier", "verifier"),
        ("reward-shaper", "my-shaper", "reward-shaper"),
    ] {
        let dir = work.path().join(name);
        let out = maporl(&[
            "plugin",
            "new",
            kind,
            name,
            "--lang",
            "js",
            "--path",
            dir.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let steps = stdout(&out);
        for step in [
            "npm test".to_string(),
            "npm install".to_string(),
            "npm run build".to_string(),
            format!(
                "maporl plugin check {}/{}.wasm --world {world}",
                dir.display(),
                name.replace('-', "_")
            ),
        ] {
            assert!(steps.contains(&step), "{step}:\n{steps}");
        }
        let package = std::fs::read_to_string(dir.join("package.json")).unwrap();
        assert!(
            package.contains(&format!(
                "build.mjs app.js --world {world} -o {}.wasm",
                name.replace('-', "_")
            )),
            "{package}"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("maporl-plugin/wit/maporl.wit")).unwrap(),
            maporl::plugin::WIT
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("maporl-plugin/worlds.js")).unwrap(),
            std::fs::read_to_string(repo().join("plugins/sdk-js/maporl-plugin/worlds.js")).unwrap(),
        );
        let tests = Command::new("node")
            .arg("--test")
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            tests.status.success() && stdout(&tests).contains("# pass 1"),
            "{name}: {}{}",
            stdout(&tests),
            stderr(&tests)
        );
    }
    let dir = work.path().join("my-shaper");
    std::os::unix::fs::symlink(
        repo().join("plugins/sdk-js/node_modules"),
        dir.join("node_modules"),
    )
    .unwrap();
    let wasm = dir.join("my_shaper.wasm");
    let built = Command::new("npm")
        .args(["run", "build:quickjs"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        built.status.success() && wasm.is_file(),
        "{}{} (are the SDK's packages installed? `npm ci --prefix plugins/sdk-js`)",
        stdout(&built),
        stderr(&built)
    );
    a_built_shaper_checks_answers_and_trains(work.path(), &wasm);
}

/// A reward shaper a scaffold built passes `plugin check`, answers `plugin call --example
/// shape`, and trains a step of the quickstart (a tiny random model, in `work`) in place of
/// `influence`, with `bonus` set.
fn a_built_shaper_checks_answers_and_trains(work: &std::path::Path, wasm: &std::path::Path) {
    let out = maporl(&[
        "plugin",
        "check",
        wasm.to_str().unwrap(),
        "--world",
        "reward-shaper",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let example = stdout(&maporl(&["plugin", "call", "--example", "shape"]));
    let called = maporl(&[
        "plugin",
        "call",
        wasm.to_str().unwrap(),
        "shape",
        "--input",
        &example,
    ]);
    assert!(called.status.success(), "{}", stderr(&called));
    assert!(stdout(&called).contains("\"score\""), "{}", stdout(&called));

    let model = work.join("tiny-qwen2");
    std::fs::create_dir(&model).unwrap();
    write_tiny_qwen2(&model);
    let run = work.join("run");
    let out = maporl(&[
        "train",
        "--config",
        repo().join("configs/quickstart.toml").to_str().unwrap(),
        "--set",
        &format!("model.path={}", model.display()),
        "--set",
        &format!("run_dir={}", run.display()),
        "--set",
        "train.steps=1",
        "--set",
        "debate.batch_size=2",
        "--set",
        "data.held_out=0",
        "--set",
        "generation.max_new_tokens=8",
        "--set",
        &format!("plugins.shaper.path={}", wasm.display()),
        "--set",
        "plugins.shaper.settings={bonus=0.5}",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    assert!(metrics.contains("score"), "{metrics}");
}
