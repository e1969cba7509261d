//! Files that are not what they claim: a plugin path, a bundle's component or manifest, a
//! run config or a dataset that is a device, a FIFO, a directory or far too large. Every
//! command that reads one on a user's behalf refuses it quickly, naming the file and what
//! it is, instead of reading without end or hanging.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
