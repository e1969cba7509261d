//! The reference plugins travel inside the binary: a `maporl` copied out of the checkout
//! (as `cargo install` would put it) resolves every reference name, the README's
//! (`final-only`) and the file's (`final_only.wasm`), and a run records the same sha256 in
//! `plugins.lock` as a run that loads the built files from a directory.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::*;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The binary, copied into a directory of its own, far from the checkout.
fn copied_binary(dir: &Path) -> PathBuf {
    let bin = dir.join("bin/maporl");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_maporl"), &bin).unwrap();
    bin
}

/// `bin ARGS` from `cwd`, with no plugin directory in the environment.
fn run(bin: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env_remove("MAPORL_PLUGINS")
        .env("MAPORL_CACHE_DIR", cwd.join("cache"))
        .output()
        .unwrap()
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

#[test]
fn a_copied_binary_runs_the_reference_plugins_it_carries() {
    let dir = tempfile::tempdir().unwrap();
    let bin = copied_binary(dir.path());
    let cwd = dir.path().join("elsewhere");
    std::fs::create_dir_all(&cwd).unwrap();

    // `maporl scripted` debates through debate, gsm8k and influence.
    let out = run(&bin, &cwd, &["scripted", "--tasks", "3", "--turns", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("majority accuracy"), "{}", text(&out));

    // Each built-in inspects under both of its names, with the built file's sha256.
    for (name, file) in [
        ("final-only", "final_only.wasm"),
        ("round-robin", "round_robin.wasm"),
        ("exact-match", "exact_match.wasm"),
        ("debate", "debate.wasm"),
    ] {
        let expected = sha256_of(&plugins_dir().join(file));
        for alias in [name.to_string(), file.to_string()] {
            let out = run(
                &bin,
                &cwd,
                &["plugin", "inspect", "--json", &format!("builtin:{alias}")],
            );
            assert!(out.status.success(), "{alias}: {}", text(&out));
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(json["sha256"], expected, "{alias}");
        }
    }

    // `bundle list` shows them, pinned.
    let out = run(
        &bin,
        &cwd,
        &[
            "bundle",
            "list",
            "--store",
            cwd.join("store").to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    let listed = text(&out);
    assert!(
        listed.contains(&sha256_of(&plugins_dir().join("final_only.wasm"))),
        "{listed}"
    );

    // A name that is no reference plugin is a clear error naming the built-ins.
    let out = run(&bin, &cwd, &["plugin", "inspect", "builtin:final-onl"]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("`final-onl`") && text(&out).contains("final-only (reward-shaper)"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_run_locks_the_same_sha256_from_the_binary_as_from_the_built_files() {
    let dir = tempfile::tempdir().unwrap();
    let bin = copied_binary(dir.path());
    let model = dir.path().join("tiny-qwen2");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    let config = repo().join("configs/smollm2-arith.toml");
    let eval = |run_dir: &Path, plugins: Option<&Path>| {
        let mut cmd = Command::new(&bin);
        cmd.args(["eval", "--config", config.to_str().unwrap()]);
        for set in [
            format!("model.path={}", model.display()),
            format!("run_dir={}", run_dir.display()),
            "data.count=2".into(),
            "debate.turns=2".into(),
            "generation.max_new_tokens=4".into(),
            // The README's names for the shaper; the file's name for the verifier.
            "plugins.shaper.path=final-only".into(),
            "plugins.shaper.settings={}".into(),
            "plugins.verifier.path=exact_match.wasm".into(),
            "plugins.verifier.settings={}".into(),
        ] {
            cmd.args(["--set", &set]);
        }
        cmd.current_dir(dir.path())
            .env("MAPORL_CACHE_DIR", dir.path().join("cache"));
        match plugins {
            Some(p) => cmd.env("MAPORL_PLUGINS", p),
            None => cmd.env_remove("MAPORL_PLUGINS"),
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let lock: toml::Table =
            toml::from_str(&std::fs::read_to_string(run_dir.join("plugins.lock")).unwrap())
                .unwrap();
        lock
    };
    let built_in = eval(&dir.path().join("builtin"), None);
    let from_dir = eval(&dir.path().join("dir"), Some(plugins_dir()));
    for (slot, file) in [
        ("protocol", "debate.wasm"),
        ("verifier", "exact_match.wasm"),
        ("shaper", "final_only.wasm"),
    ] {
        let sha = sha256_of(&plugins_dir().join(file));
        assert_eq!(
            built_in[slot]["sha256"].as_str(),
            Some(sha.as_str()),
            "{slot}"
        );
        assert_eq!(
            from_dir[slot]["sha256"].as_str(),
            Some(sha.as_str()),
            "{slot}"
        );
        assert_eq!(
            built_in[slot]["path"].as_str(),
            Some(format!("builtin:{file}").as_str()),
            "{slot}"
        );
        assert_eq!(
            from_dir[slot]["path"].as_str(),
            Some(plugins_dir().join(file).to_str().unwrap()),
            "{slot}"
        );
    }
}
