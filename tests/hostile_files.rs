//! Files that are not what they claim: a plugin path, a bundle's component or manifest, a
//! run config or a dataset that is a device, a FIFO, a directory or far too large. Every
//! command that reads one on a user's behalf refuses it quickly, naming the file and what
//! it is, instead of reading without end or hanging.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

/// Runs `maporl ARGS`, killing it after 30 s; returns (success, output).
fn maporl(args: &[&str]) -> (bool, String) {
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(args)
        .env("MAPORL_CACHE_DIR", cache.path())
        .env("MAPORL_PLUGINS", plugins_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("maporl {args:?} hung (killed after 30 s)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// The impostors: (path, what the error must call it). A FIFO, /dev/zero by a link, a
/// directory, and a sparse file over the component limit.
fn impostors(dir: &Path, name: &str) -> Vec<(PathBuf, &'static str)> {
    let fifo = dir.join(format!("fifo-{name}"));
    mkfifo(&fifo);
    let zero = dir.join(format!("zero-{name}"));
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let sub = dir.join(format!("dir-{name}"));
    std::fs::create_dir(&sub).unwrap();
    let big = dir.join(format!("big-{name}"));
    std::fs::File::create(&big)
        .unwrap()
        .set_len(maporl::files::DATASET_MAX + 1)
        .unwrap();
    vec![
        (fifo, "FIFO"),
        (zero, "character device"),
        (sub, "directory"),
        (big, "over the limit"),
    ]
}

fn refused(args: &[&str], path: &Path, kind: &str) {
    let (ok, text) = maporl(args);
    assert!(!ok, "maporl {args:?} accepted {}: {text}", path.display());
    assert!(
        text.contains(kind) && text.contains(path.file_name().unwrap().to_str().unwrap()),
        "maporl {args:?}: the error does not name {} as {kind}: {text}",
        path.display()
    );
}

#[test]
fn plugin_files_that_are_not_regular_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (path, kind) in impostors(dir.path(), "plugin.wasm") {
        let p = path.to_str().unwrap();
        refused(&["plugin", "inspect", p], &path, kind);
        refused(&["plugin", "check", p, "--world", "protocol"], &path, kind);
    }
}

#[test]
fn bundles_with_impostor_components_or_manifests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir(&bundle).unwrap();
    std::fs::copy(plugin("gsm8k"), bundle.join("gsm8k.wasm")).unwrap();
    let b = bundle.to_str().unwrap();
    let (ok, text) = maporl(&["bundle", "pack", b, "--name", "lab", "--version", "0.1.0"]);
    assert!(ok, "{text}");
    let (ok, text) = maporl(&["bundle", "inspect", b]);
    assert!(ok, "{text}");
    // The component replaced by each impostor in turn.
    let component = bundle.join("gsm8k.wasm");
    let original = std::fs::read(&component).unwrap();
    let others = dir.path().join("others");
    std::fs::create_dir(&others).unwrap();
    for (path, kind) in impostors(&others, "c.wasm") {
        std::fs::remove_file(&component).unwrap();
        std::os::unix::fs::symlink(&path, &component).unwrap();
        let (ok, text) = maporl(&["bundle", "verify", b, "--allow-unsigned"]);
        assert!(!ok, "{kind}: {text}");
        assert!(
            text.contains("gsm8k.wasm") && text.contains(kind),
            "{kind}: {text}"
        );
        let (_, text) = maporl(&["bundle", "inspect", b]);
        assert!(text.contains("gsm8k.wasm"), "{kind}: {text}");
    }
    std::fs::remove_file(&component).unwrap();
    std::fs::write(&component, original).unwrap();
    // The manifest as a FIFO.
    let manifest = bundle.join("bundle.toml");
    std::fs::remove_file(&manifest).unwrap();
    mkfifo(&manifest);
    refused(&["bundle", "inspect", b], &manifest, "FIFO");
    refused(
        &["bundle", "verify", b, "--allow-unsigned"],
        &manifest,
        "FIFO",
    );
}

#[test]
fn configs_and_datasets_that_are_not_regular_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for (path, kind) in impostors(dir.path(), "config.toml") {
        refused(&["eval", "--config", path.to_str().unwrap()], &path, kind);
    }
    let config = repo().join("configs/smollm2-arith.toml");
    for (path, kind) in impostors(dir.path(), "data.jsonl") {
        let data = format!("data.path={}", path.display());
        refused(
            &[
                "eval",
                "--config",
                config.to_str().unwrap(),
                "--set",
                "data.source=jsonl",
                "--set",
                &data,
                "--set",
                "data.fields={question = \"q\", reference = \"a\"}",
            ],
            &path,
            kind,
        );
    }
}

/// Runs `maporl ARGS` to its end; returns (exit code, or None when a signal ended it; the
/// output; the process's peak resident memory in MiB). The peak is the kernel's VmHWM of the
/// process, read every millisecond while it runs: it is maporl's own (an rusage's maxrss
/// would count the test process it was forked from, before the exec).
fn measured(args: &[&str]) -> (Option<i32>, String, u64) {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_maporl"))
        .args(args)
        .env("MAPORL_CACHE_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    let started = Instant::now();
    let status = loop {
        if let Ok(text) = std::fs::read_to_string(&status_file) {
            let hwm = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            // Before the exec the process is a copy of this one: only the new image counts.
            if text
                .lines()
                .any(|l| l.starts_with("Name:") && l.contains("maporl"))
            {
                peak_kib = peak_kib.max(hwm.unwrap_or(0));
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("maporl {args:?} ran past 120 s");
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let text = format!(
        "{}{}",
        std::fs::read_to_string(out).unwrap_or_default(),
        std::fs::read_to_string(err).unwrap_or_default()
    );
    (status.code(), text, peak_kib / 1024)
}

/// A model whose config.json claims sizes no checkpoint has is refused before anything is
/// allocated from it: each absurd key in turn (a context of 3e9 positions, a vocabulary of
/// 2^40, a width of 0, a million layers, an absurd head size) ends the command with an
/// error naming the key and the file, an exit status of 1 (not an abort), and little memory.
#[test]
fn a_model_config_that_claims_absurd_sizes_is_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_qwen2(&model);
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    let config = repo().join("configs/smollm2-arith.toml");
    for (key, value) in [
        ("max_position_embeddings", json!(3_000_000_000u64)),
        ("vocab_size", json!(1u64 << 40)),
        ("hidden_size", json!(0)),
        ("num_hidden_layers", json!(1_000_000)),
        ("head_dim", json!(1u64 << 30)),
        ("intermediate_size", json!(1u64 << 33)),
    ] {
        let mut bad = good.clone();
        bad[key] = value.clone();
        std::fs::write(model.join("config.json"), bad.to_string()).unwrap();
        let set_model = format!("model.path={}", model.display());
        let run_dir = format!("run_dir={}", dir.path().join("run").display());
        let (code, text, peak) = measured(&[
            "eval",
            "--config",
            config.to_str().unwrap(),
            "--set",
            &set_model,
            "--set",
            &run_dir,
            "--set",
            "data.count=1",
        ]);
        assert_eq!(code, Some(1), "{key} = {value}: {text}");
        assert!(
            text.contains(&format!("{key} = {value}")) && text.contains("config.json"),
            "{key}: {text}"
        );
        assert!(
            peak < 400,
            "{key} = {value}: peak resident memory {peak} MiB"
        );
        assert!(
            !dir.path().join("run").exists(),
            "{key}: a refused run wrote its directory"
        );
    }
}

/// A dataset is read a line at a time keeping only the fields the config uses: a 64 MB
/// JSONL file whose records carry a large field nobody reads costs about the tasks' memory
/// and one line, not many times the file, for each way a record can hide the bulk (a long
/// array, a wide object, a long string, all of it in one record: that one took 1.14 GB
/// when records were parsed whole, 87 MB now, measured by hand).
#[test]
fn a_dataset_costs_the_memory_of_its_tasks_not_of_its_unused_fields() {
    let dir = tempfile::tempdir().unwrap();
    let config = repo().join("configs/smollm2-arith.toml");
    let bulk: [(&str, String); 4] = [
        ("array", format!("[{}0]", "0,".repeat(32 << 10))),
        (
            "object",
            format!(
                "{{{}\"z\":0}}",
                (0..4096)
                    .map(|i| format!("\"k{i}\":[1,2,3],"))
                    .collect::<String>()
            ),
        ),
        ("string", format!("\"{}\"", "x".repeat(64 << 10))),
        // One record carrying the whole bulk: parsed whole, its array alone took 1.13 GB.
        ("one-record", format!("[{}0]", "0,".repeat(32 << 20))),
    ];
    for (shape, unused) in bulk {
        let data = dir.path().join(format!("{shape}.jsonl"));
        let mut text = String::new();
        let mut n = 0;
        while text.len() < 64 << 20 {
            text.push_str(&format!(
                "{{\"q\": \"What is {n} + 1?\", \"unused\": {unused}, \"a\": \"{}\"}}\n",
                n + 1
            ));
            n += 1;
        }
        std::fs::write(&data, &text).unwrap();
        let set_data = format!("data.path={}", data.display());
        // The model does not exist: the command reads the whole dataset, then stops there.
        let (code, output, peak) = measured(&[
            "eval",
            "--config",
            config.to_str().unwrap(),
            "--set",
            "data.source=jsonl",
            "--set",
            &set_data,
            "--set",
            "data.fields={question = \"q\", reference = \"a\"}",
            "--set",
            "data.count=0",
            "--set",
            "model.path=/nonexistent/model",
        ]);
        assert_eq!(code, Some(1), "{shape}: {output}");
        assert!(output.contains("/nonexistent/model"), "{shape}: {output}");
        assert!(
            peak < 250,
            "{shape}: {n} records of a 64 MB file took {peak} MiB"
        );
    }
}
