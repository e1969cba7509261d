//! `maporl plugin ...`: inspect, check, scaffold and call plugin components.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Subcommand, ValueEnum};
use serde::Deserialize;

use maporl::plugin::{
    self, Limits, Protocol, RewardShaper, Runtime, RuntimeOptions, Verifier, World,
};
use maporl::transcript::{Task, Transcript};

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Print a component's world, WIT version, imports, exports, size and sha256.
    Inspect {
        /// A component file, or `builtin:NAME` for a built-in reference plugin.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check that a component implements a world at a compatible WIT version and links
    /// against this host.
    Check {
        /// A component file, or `builtin:NAME` for a built-in reference plugin.
        file: PathBuf,
        /// protocol, verifier or reward-shaper.
        #[arg(long)]
        world: String,
    },
    /// Create a plugin that builds with one command and passes its own test: a Rust crate
    /// on the Rust SDK, with `--lang python` a Python module on the Python SDK, with `--lang
    /// js` a JavaScript module on the JavaScript SDK.
    New {
        kind: Kind,
        /// The plugin's name, e.g. `my-protocol`.
        name: String,
        /// The directory to create it in (default: ./NAME).
        #[arg(long)]
        path: Option<PathBuf>,
        /// The language to write it in.
        #[arg(long, value_enum, default_value = "rust")]
        lang: Lang,
    },
    /// Run one call of a plugin, for plugin authors who are debugging. `--example FUNC`
    /// prints a valid --input for FUNC instead (a two-agent debate on one arithmetic task).
    Call {
        /// A component file, or `builtin:NAME` for a built-in reference plugin.
        #[arg(required_unless_present = "example")]
        file: Option<PathBuf>,
        /// The WIT function: configure, plan-turn, decide, extract, score or shape.
        #[arg(required_unless_present = "example")]
        func: Option<String>,
        /// The call's arguments as JSON (or @FILE): {"settings": {...}, "task": {...},
        /// "turn": 1, "transcript": {...}, "text": "...", "responses": [...], "limits":
        /// {...}}, as the function needs.
        #[arg(long, required_unless_present = "example")]
        input: Option<String>,
        /// Print an --input that FUNC takes, and nothing else.
        #[arg(long, value_name = "FUNC", conflicts_with_all = ["file", "func", "input"])]
        example: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Protocol,
    Verifier,
    RewardShaper,
}

impl Kind {
    /// The kind's world, its section in a run config's `[plugins]`, and a function to call.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Kind::Protocol => ("protocol", "protocol", "plan-turn"),
            Kind::Verifier => ("verifier", "verifier", "score"),
            Kind::RewardShaper => ("reward-shaper", "shaper", "shape"),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
    Js,
}

pub fn run(cmd: PluginCommand) -> anyhow::Result<()> {
    match cmd {
        PluginCommand::Inspect { file, json } => {
            let runtime = Runtime::new(RuntimeOptions::default())?;
            let ins = plugin::inspect(&runtime, &file)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&ins)?);
            } else {
                println!("file:        {}", ins.file);
                println!("size:        {} bytes", ins.size);
                println!("sha256:      {}", ins.sha256);
                if let Some(source) = &ins.source_sha256 {
                    println!("source:      sha256 {source} (as its build declares it)");
                }
                println!(
                    "world:       {}",
                    ins.world
                        .as_deref()
                        .unwrap_or("(none: not a maporl plugin)")
                );
                match ins.wit_version.as_deref() {
                    Some(v) => println!(
                        "wit version: {v} ({} on this host, which links {})",
                        if maporl::plugin::links_wit_version(v) {
                            "runs"
                        } else {
                            "does not run"
                        },
                        maporl::plugin::wit_versions()
                    ),
                    None => println!("wit version: (unknown)"),
                }
                println!("imports:");
                for i in &ins.imports {
                    println!("  {i}");
                }
                println!("exports:");
                for e in &ins.exports {
                    println!("  {}", e.name);
                    for f in &e.functions {
                        println!("    {f}");
                    }
                }
            }
            Ok(())
        }
        PluginCommand::Check { file, world } => {
            let world = World::parse(&world).map_err(anyhow::Error::msg)?;
            let runtime = Runtime::new(RuntimeOptions::default())?;
            let ins = runtime.check(&file, world)?;
            println!(
                "ok: {} implements world {world} (WIT {}), sha256 {}",
                file.display(),
                ins.wit_version.as_deref().unwrap_or("?"),
                ins.sha256
            );
            if let Some(source) = &ins.source_sha256 {
                println!("  built from source sha256 {source} (its seed and resume follow it)");
            }
            print!("{}", needs(&ins));
            Ok(())
        }
        PluginCommand::New {
            kind,
            name,
            path,
            lang,
        } => {
            let dir = path.unwrap_or_else(|| PathBuf::from(&name));
            match lang {
                Lang::Rust => {
                    scaffold(kind, &name, &dir)?;
                    print!("{}", next_steps(kind, &name, &dir));
                }
                Lang::Python => {
                    scaffold_python(kind, &name, &dir)?;
                    print!("{}", next_steps_python(kind, &name, &dir));
                }
                Lang::Js => {
                    scaffold_js(kind, &name, &dir)?;
                    print!("{}", next_steps_js(kind, &name, &dir));
                }
            }
            Ok(())
        }
        PluginCommand::Call {
            example: Some(func),
            ..
        } => {
            println!("{}", example(&func)?);
            Ok(())
        }
        PluginCommand::Call {
            file: Some(file),
            func: Some(func),
            input: Some(input),
            ..
        } => call(&file, &func, &input),
        PluginCommand::Call { .. } => {
            bail!("`maporl plugin call` takes FILE FUNC --input JSON, or --example FUNC")
        }
    }
}

/// What a checked component needs of a run's `limits` beyond the defaults: its size
/// against `max_component_mib`, its memory at start against `memory_mib`.
fn needs(ins: &plugin::Inspection) -> String {
    let mib = |b: u64| b.div_ceil(1 << 20);
    let defaults = Limits::default();
    let mut out = String::new();
    if let Some(memory) = ins.initial_memory {
        out.push_str(&format!(
            "initial memory: {:.1} MiB of linear memory and tables before its first call\n",
            memory as f64 / f64::from(1 << 20)
        ));
        if mib(memory) >= defaults.memory_mib {
            out.push_str(&format!(
                "needs: limits.memory_mib above {} (default {}), e.g. \
                 [plugins.WORLD.limits] memory_mib = {}\n",
                mib(memory),
                defaults.memory_mib,
                mib(memory) * 2
            ));
        }
    }
    if mib(ins.size) > defaults.max_component_mib {
        out.push_str(&format!(
            "needs: limits.max_component_mib = {} at least (default {}): the component is \
             {:.1} MiB\n",
            mib(ins.size),
            defaults.max_component_mib,
            ins.size as f64 / f64::from(1 << 20)
        ));
    }
    out
}

/// What to do after `plugin new`: the whole loop from building the component to a run that
/// uses it.
fn next_steps(kind: Kind, name: &str, dir: &Path) -> String {
    let (world, section, func) = kind.names();
    let lib = name.replace('-', "_");
    let d = dir.display();
    let wasm = format!("{d}/target/wasm32-wasip2/release/{lib}.wasm");
    format!(
        "created {d}, a {world} plugin. Next:\n\
         \x20 cd {d} && cargo test                                # its own tests, natively\n\
         \x20 cargo build --release --target wasm32-wasip2        # the component (in {d})\n\
         \x20 maporl plugin check {wasm} --world {world}\n\
         \x20 maporl plugin call --example {func} > input.json    # a valid input to edit\n\
         \x20 maporl plugin call {wasm} {func} --input @input.json\n\
         \x20 maporl train --config configs/quickstart.toml --set plugins.{section}.path={wasm}\n\
         (settings: --set 'plugins.{section}.settings={{...}}'; the guide: \
         docs/guides/write-a-protocol.md; limits: docs/security.md)\n"
    )
}

/// What to do after `plugin new --lang python`: the same loop, built with the Python SDK.
fn next_steps_python(kind: Kind, name: &str, dir: &Path) -> String {
    let (world, section, func) = kind.names();
    let d = dir.display();
    let wasm = format!("{d}/{}.wasm", name.replace('-', "_"));
    format!(
        "created {d}, a {world} plugin in Python. Next:\n\
         \x20 cd {d} && python3 -m unittest                        # its own tests, natively\n\
         \x20 python3 -m pip install componentize-py==0.25.1        # once: the build tool\n\
         \x20 python3 -m maporl_plugin build app.py --world {world} -o {wasm}   # (in {d})\n\
         \x20 maporl plugin check {wasm} --world {world}\n\
         \x20 maporl plugin call --example {func} > input.json    # a valid input to edit\n\
         \x20 maporl plugin call {wasm} {func} --input @input.json\n\
         \x20 maporl train --config configs/quickstart.toml --set plugins.{section}.path={wasm}\n\
         (settings: --set 'plugins.{section}.settings={{...}}'; the guide: \
         docs/guides/python-plugins.md; limits: docs/security.md)\n"
    )
}

/// What to do after `plugin new --lang js`: the same loop, built with the JavaScript SDK.
fn next_steps_js(kind: Kind, name: &str, dir: &Path) -> String {
    let (world, section, func) = kind.names();
    let d = dir.display();
    let wasm = format!("{d}/{}.wasm", name.replace('-', "_"));
    format!(
        "created {d}, a {world} plugin in JavaScript. Next:\n\
         \x20 cd {d} && npm test                    # its own tests, natively (Node.js 20+)\n\
         \x20 npm install                                         # once: the build tools\n\
         \x20 npm run build                                       # the component (in {d})\n\
         \x20                                                     # (`npm run build:quickjs`: on QuickJS)\n\
         \x20 maporl plugin check {wasm} --world {world}\n\
         \x20 maporl plugin call --example {func} > input.json    # a valid input to edit\n\
         \x20 maporl plugin call {wasm} {func} --input @input.json\n\
         \x20 maporl train --config configs/quickstart.toml --set plugins.{section}.path={wasm}\n\
         (settings: --set 'plugins.{section}.settings={{...}}'; the guide: \
         docs/guides/js-plugins.md; limits: docs/security.md)\n"
    )
}

/// A valid `--input` for `func`: settings, a task, a two-agent transcript of two turns (one
/// agent right at turn 1, both right at turn 2), and what the function takes besides.
fn example(func: &str) -> anyhow::Result<String> {
    let task = serde_json::json!({
        "id": "arith-0-0", "kind": "arith", "question": "What is 71 + 47?", "reference": "118",
        "fields": []
    });
    let said = |turn: u32, agent: u32, answer: &str| {
        serde_json::json!({
            "turn": turn, "agent": agent,
            "text": format!("71 + 47: 1 + 7 = 8, 7 + 4 = 11, so {answer}.\nAnswer: \\boxed{{{answer}}}"),
            "answer": answer, "score": if answer == "118" { 1.0 } else { 0.0 },
            "correct": answer == "118"
        })
    };
    let transcript = serde_json::json!({
        "agents": 2, "turns": 3,
        "utterances": [said(1, 0, "118"), said(1, 1, "108"), said(2, 0, "118"), said(2, 1, "118")]
    });
    let input = match func {
        "configure" => serde_json::json!({"settings": {}}),
        "plan-turn" | "decide" => serde_json::json!({
            "settings": {}, "task": task, "turn": 3, "transcript": transcript
        }),
        "extract" => serde_json::json!({
            "settings": {}, "task": task, "text": "7 + 1 = 8, so 118.\nAnswer: \\boxed{118}"
        }),
        "score" => serde_json::json!({
            "settings": {}, "task": task,
            "responses": ["so 118.\nAnswer: \\boxed{118}", "so 108.\nAnswer: \\boxed{108}"]
        }),
        "shape" => serde_json::json!({"settings": {}, "task": task, "transcript": transcript}),
        other => bail!(
            "no function `{other}` in any world; the functions are configure, plan-turn, \
             decide, extract, score and shape"
        ),
    };
    Ok(serde_json::to_string_pretty(&input)?)
}

/// The files of a new plugin crate, per kind: (path in the crate, template text).
fn templates(kind: Kind) -> [(&'static str, &'static str); 4] {
    macro_rules! kind_templates {
        ($dir:literal) => {
            [
                (
                    "Cargo.toml",
                    include_str!(concat!(
                        "../../../plugins/templates/",
                        $dir,
                        "/Cargo.toml.tmpl"
                    )),
                ),
                (
                    "src/lib.rs",
                    include_str!(concat!(
                        "../../../plugins/templates/",
                        $dir,
                        "/src/lib.rs.tmpl"
                    )),
                ),
                (
                    "README.md",
                    include_str!(concat!(
                        "../../../plugins/templates/",
                        $dir,
                        "/README.md.tmpl"
                    )),
                ),
                (
                    ".gitignore",
                    include_str!(concat!("../../../plugins/templates/", $dir, "/.gitignore")),
                ),
            ]
        };
    }
    match kind {
        Kind::Protocol => kind_templates!("protocol"),
        Kind::Verifier => kind_templates!("verifier"),
        Kind::RewardShaper => kind_templates!("reward-shaper"),
    }
}

/// The plugin SDK (`plugins/sdk`), as `plugin new` vendors it: its own files, with the
/// host's WIT beside them in `wit/` (in the repository the SDK reads the top-level `wit/`).
fn sdk_files() -> Vec<(&'static str, String)> {
    macro_rules! sdk {
        ($($file:literal),*) => {
            vec![$(($file, include_str!(concat!("../../../plugins/sdk/", $file)).to_string())),*]
        };
    }
    let mut files = sdk!(
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "src/allocator.rs",
        "src/answers.rs",
        "src/prompts.rs",
        "src/settings.rs",
        "src/transcript.rs",
        "src/vote.rs"
    );
    for (file, text) in &mut files {
        if *file == "src/lib.rs" {
            // The SDK's WIT paths, `"../../wit"` and `"../../wit/since_v0.1.0"` in this
            // repository, are its own `wit/` in the vendored copy.
            *text = text.replace(r#""../../wit"#, r#""wit"#);
        }
    }
    files.push(("wit/maporl.wit", plugin::WIT.to_string()));
    // The frozen 0.1.0, for `--features maporl-plugin/since-v0-1-0` (a plugin that must
    // also load in hosts from before 0.2.0).
    files.push((
        "wit/since_v0.1.0/maporl.wit",
        plugin::WIT_V0_1_0.to_string(),
    ));
    files
}

/// Checks a new plugin's name (a-z, 0-9, - and _, starting with a letter) and that `dir` is
/// new or empty; the name as an identifier (`-` as `_`).
fn check_new(name: &str, dir: &Path) -> anyhow::Result<String> {
    let valid = !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("plugin name `{name}` must start with a lower-case letter and use only a-z, 0-9, - and _");
    }
    if dir.exists()
        && dir
            .read_dir()
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} already exists and is not empty; choose another --path",
            dir.display()
        );
    }
    Ok(name.replace('-', "_"))
}

/// Writes a new plugin crate for `kind` named `name` into `dir`, with the host's WIT.
pub fn scaffold(kind: Kind, name: &str, dir: &Path) -> anyhow::Result<()> {
    let lib_name = check_new(name, dir)?;
    let templates = templates(kind)
        .into_iter()
        .map(|(file, text)| (file, fill(text, name, &lib_name, kind)));
    write_files(dir, templates)?;
    write_files(&dir.join("vendor/maporl-plugin"), sdk_files())
}

/// The Python SDK (plugins/sdk-python/maporl_plugin), file by file, as `plugin new --lang
/// python` vendors it; its contract is this host's `wit/maporl.wit`.
fn python_sdk_files() -> Vec<(&'static str, String)> {
    macro_rules! sdk {
        ($($file:literal),* $(,)?) => {
            vec![$((
                concat!("maporl_plugin/", $file),
                include_str!(concat!("../../../plugins/sdk-python/maporl_plugin/", $file))
                    .to_string(),
            )),*]
        };
    }
    let mut files = sdk!(
        "__init__.py",
        "__main__.py",
        "answers.py",
        "build.py",
        "host.py",
        "prompts.py",
        "reward.py",
        "text.py",
        "transcript.py",
        "types.py",
        "worlds.py",
    );
    files.push(("maporl_plugin/wit/maporl.wit", plugin::WIT.to_string()));
    files
}

/// The files of a new Python plugin, per kind: (path, template text).
fn python_templates(kind: Kind) -> [(&'static str, &'static str); 4] {
    macro_rules! kind_templates {
        ($dir:literal) => {
            [
                (
                    "app.py",
                    include_str!(concat!(
                        "../../../plugins/templates/python/",
                        $dir,
                        "/app.py.tmpl"
                    )),
                ),
                (
                    "test_app.py",
                    include_str!(concat!(
                        "../../../plugins/templates/python/",
                        $dir,
                        "/test_app.py.tmpl"
                    )),
                ),
                (
                    ".gitignore",
                    include_str!(concat!(
                        "../../../plugins/templates/python/",
                        $dir,
                        "/.gitignore"
                    )),
                ),
                (
                    "README.md",
                    include_str!("../../../plugins/templates/python/README.md.tmpl"),
                ),
            ]
        };
    }
    match kind {
        Kind::Protocol => kind_templates!("protocol"),
        Kind::Verifier => kind_templates!("verifier"),
        Kind::RewardShaper => kind_templates!("reward-shaper"),
    }
}

/// Writes a new Python plugin for `kind` named `name` into `dir`, with the Python SDK.
pub fn scaffold_python(kind: Kind, name: &str, dir: &Path) -> anyhow::Result<()> {
    let lib_name = check_new(name, dir)?;
    let templates = python_templates(kind)
        .into_iter()
        .map(|(file, text)| (file, fill(text, name, &lib_name, kind)));
    write_files(dir, templates.chain(python_sdk_files()))
}

/// The JavaScript SDK (plugins/sdk-js/maporl-plugin), file by file, as `plugin new --lang
/// js` vendors it; its contract is this host's `wit/maporl.wit`.
fn js_sdk_files() -> Vec<(&'static str, String)> {
    macro_rules! sdk {
        ($($file:literal),* $(,)?) => {
            vec![$((
                concat!("maporl-plugin/", $file),
                include_str!(concat!("../../../plugins/sdk-js/maporl-plugin/", $file))
                    .to_string(),
            )),*]
        };
    }
    let mut files = sdk!(
        "answers.js",
        "build.mjs",
        "component.js",
        "host.js",
        "index.js",
        "prompts.js",
        "reward.js",
        "text.js",
        "transcript.js",
        "types.js",
        "worlds.js",
    );
    files.push(("maporl-plugin/wit/maporl.wit", plugin::WIT.to_string()));
    files
}

/// The files of a new JavaScript plugin, per kind: (path, template text).
fn js_templates(kind: Kind) -> [(&'static str, &'static str); 5] {
    macro_rules! kind_templates {
        ($dir:literal) => {
            [
                (
                    "app.js",
                    include_str!(concat!(
                        "../../../plugins/templates/js/",
                        $dir,
                        "/app.js.tmpl"
                    )),
                ),
                (
                    "app.test.js",
                    include_str!(concat!(
                        "../../../plugins/templates/js/",
                        $dir,
                        "/app.test.js.tmpl"
                    )),
                ),
                (
                    "package.json",
                    include_str!("../../../plugins/templates/js/package.json.tmpl"),
                ),
                (
                    ".gitignore",
                    include_str!("../../../plugins/templates/js/.gitignore"),
                ),
                (
                    "README.md",
                    include_str!("../../../plugins/templates/js/README.md.tmpl"),
                ),
            ]
        };
    }
    match kind {
        Kind::Protocol => kind_templates!("protocol"),
        Kind::Verifier => kind_templates!("verifier"),
        Kind::RewardShaper => kind_templates!("reward-shaper"),
    }
}

/// Writes a new JavaScript plugin for `kind` named `name` into `dir`, with the JavaScript SDK.
pub fn scaffold_js(kind: Kind, name: &str, dir: &Path) -> anyhow::Result<()> {
    let lib_name = check_new(name, dir)?;
    let templates = js_templates(kind)
        .into_iter()
        .map(|(file, text)| (file, fill(text, name, &lib_name, kind)));
    write_files(dir, templates.chain(js_sdk_files()))
}

/// A template's text with the plugin's name, its identifier and its world filled in.
fn fill(template: &str, name: &str, lib_name: &str, kind: Kind) -> String {
    template
        .replace("{{name}}", name)
        .replace("{{lib_name}}", lib_name)
        .replace("{{world}}", kind.names().0)
}

/// Writes each (path in `dir`, text), making the directories it needs.
fn write_files(
    dir: &Path,
    files: impl IntoIterator<Item = (&'static str, String)>,
) -> anyhow::Result<()> {
    for (file, text) in files {
        let target = dir.join(file);
        std::fs::create_dir_all(target.parent().expect("files are inside dir"))
            .with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(&target, text).with_context(|| format!("writing {}", target.display()))?;
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallInput {
    #[serde(default = "empty_object")]
    settings: serde_json::Value,
    task: Option<Task>,
    turn: Option<u32>,
    transcript: Option<Transcript>,
    text: Option<String>,
    responses: Option<Vec<String>>,
    #[serde(default)]
    limits: Limits,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

fn call(file: &Path, func: &str, input: &str) -> anyhow::Result<()> {
    let text = match input.strip_prefix('@') {
        Some(path) => {
            std::fs::read_to_string(path).with_context(|| format!("reading --input file {path}"))?
        }
        None => input.to_string(),
    };
    let input: CallInput = serde_json::from_str(&text).context("parsing --input")?;
    let runtime = Runtime::new(RuntimeOptions::default())?;
    let ins =
        plugin::inspect(&runtime, file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let world = ins
        .world
        .as_deref()
        .map(World::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?
        .with_context(|| {
            format!(
                "{} is not a maporl plugin (it exports no maporl world)",
                file.display()
            )
        })?;
    let need = |what: &str| format!("`{func}` needs \"{what}\" in --input");
    let task = || input.task.clone().with_context(|| need("task"));
    let (output, fuel) = match (world, func) {
        (World::Protocol, "plan-turn" | "decide") => {
            let mut p = Protocol::load(&runtime, file, &input.settings, &input.limits)?;
            let (task, turn) = (task()?, input.turn.with_context(|| need("turn"))?);
            let transcript = input
                .transcript
                .clone()
                .with_context(|| need("transcript"))?;
            let out = if func == "plan-turn" {
                serde_json::to_value(p.plan_turn(&task, turn, &transcript)?)?
            } else {
                serde_json::to_value(p.decide(&task, turn, &transcript)?)?
            };
            (out, p.fuel_used())
        }
        (World::Verifier, "extract" | "score") => {
            let mut v = Verifier::load(&runtime, file, &input.settings, &input.limits)?;
            let task = task()?;
            let out = if func == "extract" {
                let text = input.text.clone().with_context(|| need("text"))?;
                serde_json::to_value(v.extract(&task, &text)?)?
            } else {
                let responses = input.responses.clone().with_context(|| need("responses"))?;
                serde_json::to_value(v.score(&task, &responses)?)?
            };
            (out, v.fuel_used())
        }
        (World::RewardShaper, "shape") => {
            let mut s = RewardShaper::load(&runtime, file, &input.settings, &input.limits)?;
            let transcript = input
                .transcript
                .clone()
                .with_context(|| need("transcript"))?;
            (
                serde_json::to_value(s.shape(&task()?, &transcript)?)?,
                s.fuel_used(),
            )
        }
        (world, "configure") => {
            match world {
                World::Protocol => {
                    Protocol::load(&runtime, file, &input.settings, &input.limits).map(|_| ())?
                }
                World::Verifier => {
                    Verifier::load(&runtime, file, &input.settings, &input.limits).map(|_| ())?
                }
                World::RewardShaper => {
                    RewardShaper::load(&runtime, file, &input.settings, &input.limits)
                        .map(|_| ())?
                }
            }
            (serde_json::json!("configured"), 0)
        }
        (world, _) => bail!(
            "{} implements world {world}, whose functions are {}; `{func}` is not one of them",
            file.display(),
            world.functions().join(", ")
        ),
    };
    println!("{}", serde_json::to_string_pretty(&output)?);
    eprintln!("fuel used: {fuel}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example is a valid input: it parses as `call` parses its --input, and holds
    /// what its function needs (a transcript that is the turn's, a task, responses, text).
    #[test]
    fn every_example_input_parses_and_holds_what_its_function_needs() {
        for (func, needs) in [
            ("configure", &[][..]),
            ("plan-turn", &["task", "turn", "transcript"][..]),
            ("decide", &["task", "turn", "transcript"][..]),
            ("extract", &["task", "text"][..]),
            ("score", &["task", "responses"][..]),
            ("shape", &["task", "transcript"][..]),
        ] {
            let text = example(func).unwrap();
            let input: CallInput = serde_json::from_str(&text).unwrap();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            for key in needs {
                assert!(value.get(key).is_some(), "{func} needs {key}");
            }
            if let Some(t) = &input.transcript {
                assert_eq!(t.utterances.len(), 4);
                assert!(t
                    .utterances
                    .iter()
                    .all(|u| u.turn <= t.turns && u.agent < t.agents));
            }
        }
        assert!(example("plan")
            .unwrap_err()
            .to_string()
            .contains("plan-turn"));
    }

    #[test]
    fn the_vendored_sdk_reads_its_own_copy_of_the_wit() {
        let files = sdk_files();
        let lib = &files.iter().find(|(f, _)| *f == "src/lib.rs").unwrap().1;
        // The current contract and the frozen 0.1.0, each the vendored crate's own copy.
        assert_eq!(lib.matches(r#""wit","#).count(), 1, "{lib}");
        assert_eq!(lib.matches(r#""wit/since_v0.1.0","#).count(), 1, "{lib}");
        assert!(!lib.contains("../"), "nothing outside the vendored crate");
        let file = |name: &str| &files.iter().find(|(f, _)| *f == name).unwrap().1;
        assert_eq!(file("wit/maporl.wit"), plugin::WIT);
        assert_eq!(file("wit/since_v0.1.0/maporl.wit"), plugin::WIT_V0_1_0);
        let manifest = &files.iter().find(|(f, _)| *f == "Cargo.toml").unwrap().1;
        assert!(
            !manifest.contains(".workspace"),
            "the SDK's manifest must stand alone"
        );
    }

    #[test]
    fn every_source_file_of_the_sdk_is_vendored() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(&src)
            .unwrap()
            .map(|e| format!("src/{}", e.unwrap().file_name().to_string_lossy()))
            .collect();
        on_disk.sort();
        let mut vendored: Vec<String> = sdk_files()
            .into_iter()
            .map(|(f, _)| f.to_string())
            .filter(|f| f.starts_with("src/"))
            .collect();
        vendored.sort();
        assert_eq!(
            vendored, on_disk,
            "sdk_files() must list every file of plugins/sdk/src"
        );
    }
}
