//! Plugin bundles: pack, sign, verify, install, list, remove through the `maporl` binary;
//! references from run configs resolved against the store; `plugins.lock` and the resume
//! check; every tampering case refused with its reason; push and pull through a real OCI
//! registry (Debian's docker-registry) on loopback.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use maporl::bundle::{self, Manifest, NewBundle, PluginLock};
use maporl::config::Config;
use maporl::plugin::{Limits, Protocol, RewardShaper, Verifier};
use support::*;

/// A scratch world for one test: its own bundle store, trusted-keys file and component cache,
/// so nothing touches the user's.
struct Env {
    root: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            root: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    fn store(&self) -> PathBuf {
        self.path("store")
    }

    fn trusted(&self) -> PathBuf {
        self.path("trusted-keys.toml")
    }

    fn maporl(&self, args: &[&str]) -> Output {
        self.maporl_with(args, &[], None)
    }

    /// Runs maporl with more environment variables and, optionally, text on stdin. No
    /// registry login leaks in from the user's environment or docker config.
    fn maporl_with(&self, args: &[&str], envs: &[(&str, &str)], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let mut child = self
            .command(args, envs)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running maporl");
        let mut pipe = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes()).unwrap();
        }
        drop(pipe);
        child.wait_with_output().expect("running maporl")
    }

    /// The maporl command [`Env::maporl_with`] runs.
    fn command(&self, args: &[&str], envs: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_maporl"));
        cmd.args(args)
            .current_dir(self.root.path())
            .env("MAPORL_BUNDLES", self.store())
            .env("MAPORL_TRUSTED_KEYS", self.trusted())
            .env("MAPORL_CACHE_DIR", self.path("cache"))
            .env("MAPORL_PLUGINS", plugins_dir())
            .env("DOCKER_CONFIG", self.path("docker"))
            .env_remove("MAPORL_REGISTRY_USER")
            .env_remove("MAPORL_REGISTRY_PASSWORD")
            .env_remove("MAPORL_HTTP_TIMEOUT")
            .env_remove("MAPORL_HTTP_MIN_RATE")
            .envs(envs.iter().copied());
        cmd
    }

    /// Runs maporl, asserts success, returns stdout and stderr together.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.maporl(args);
        let text = text(&out);
        assert!(out.status.success(), "maporl {args:?} failed:\n{text}");
        text
    }

    /// Runs maporl, asserts failure, returns stdout and stderr together.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.maporl(args);
        let text = text(&out);
        assert!(
            !out.status.success(),
            "maporl {args:?} should fail:\n{text}"
        );
        text
    }

    /// A bundle source directory `NAME-VERSION` with the given reference plugins and a
    /// bundle.toml listing them (the debate protocol gets a default setting).
    fn source(&self, name: &str, version: &str, plugins: &[&str]) -> PathBuf {
        let dir = self.path(&format!("{name}-{version}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut manifest = format!(
            "[bundle]\nname = \"{name}\"\nversion = \"{version}\"\n\
             description = \"The reference debate, verifier and shaper\"\n\
             licence = \"Apache-2.0\"\nauthors = [\"maporl tests\"]\n"
        );
        for p in plugins {
            let file = format!("{p}.wasm");
            std::fs::copy(plugin(p), dir.join(&file)).unwrap();
            manifest.push_str(&format!("\n[[component]]\nfile = \"{file}\"\n"));
            if *p == "debate" {
                manifest.push_str("[component.settings]\nearly_stop = true\npeers = 1\n");
            }
        }
        std::fs::write(dir.join("bundle.toml"), manifest).unwrap();
        dir
    }

    /// A key pair `keys/NAME.{key,pub}`; trusted when `trust`.
    fn key(&self, name: &str, trust: bool) -> (PathBuf, PathBuf) {
        let prefix = self.path(&format!("keys/{name}"));
        let out = self.ok(&[
            "bundle",
            "keygen",
            "--out",
            prefix.to_str().unwrap(),
            "--name",
            name,
        ]);
        assert!(out.contains("secret key"), "{out}");
        let (key, public) = (prefix.with_extension("key"), prefix.with_extension("pub"));
        if trust {
            let out = self.ok(&["bundle", "trust", public.to_str().unwrap()]);
            assert!(out.contains(&format!("as {name}")), "{out}");
        }
        (key, public)
    }

    /// A packed bundle of debate, gsm8k and influence, signed with `key` when given.
    fn signed(&self, name: &str, version: &str, key: Option<&Path>) -> PathBuf {
        let dir = self.source(name, version, &["debate", "gsm8k", "influence"]);
        self.ok(&["bundle", "pack", dir.to_str().unwrap()]);
        if let Some(key) = key {
            self.ok(&[
                "bundle",
                "sign",
                dir.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ]);
        }
        dir
    }

    /// A run config using this env's store and trusted keys, plus `extra` TOML.
    fn config(&self, plugins: &str, extra: &str) -> Config {
        let text = format!(
            "[plugins]\nstore = {:?}\ntrusted_keys = {:?}\n{extra}\n{plugins}",
            self.store().display().to_string(),
            self.trusted().display().to_string()
        );
        Config::parse(&text, &[]).unwrap_or_else(|e| panic!("{e:#}\n{text}"))
    }
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Signs `dir` again with `key` (as someone holding a trusted key would after editing it).
fn resign(dir: &Path, key: &Path) {
    let key = bundle::read_signing_key(key).unwrap();
    let bytes = std::fs::read(dir.join("bundle.toml")).unwrap();
    std::fs::write(
        dir.join("bundle.toml.sig"),
        bundle::sign(&key, &bytes).to_toml(),
    )
    .unwrap();
}

fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut Manifest)) {
    let (mut m, _) = Manifest::read(dir).unwrap();
    edit(&mut m);
    std::fs::write(dir.join("bundle.toml"), m.to_toml()).unwrap();
}

const PLUGINS: &str = "[plugins.protocol]\npath = \"arith/debate@^0.1\"\n\
                       [plugins.protocol.settings]\npeers = 2\n\
                       [plugins.verifier]\npath = \"arith/gsm8k@^0.1\"\n\
                       [plugins.shaper]\npath = \"arith/influence@^0.1\"\n";

#[test]
fn round_trip_pack_sign_verify_install_list_resolve_remove() {
    let env = Env::new();
    let dir = env.source("arith", "0.1.0", &["debate", "gsm8k", "influence"]);
    let out = env.ok(&["bundle", "pack", s(&dir)]);
    assert!(out.contains("packed arith@0.1.0"), "{out}");
    assert!(out.contains("maporl:plugin@0.2.0"), "{out}");
    let (m, _) = Manifest::read(&dir).unwrap();
    let worlds: Vec<_> = m
        .components
        .iter()
        .map(|c| (c.name.as_str(), c.world.as_str()))
        .collect();
    assert_eq!(
        worlds,
        [
            ("debate", "protocol"),
            ("gsm8k", "verifier"),
            ("influence", "reward-shaper")
        ]
    );
    for c in &m.components {
        assert_eq!(
            c.sha256,
            bundle::sha256_hex(&std::fs::read(dir.join(&c.file)).unwrap())
        );
    }
    assert_eq!(m.bundle.licence, "Apache-2.0");
    assert_eq!(m.bundle.wit, "maporl:plugin@0.2.0");

    let (key, _) = env.key("lab-a", true);
    let out = env.ok(&["bundle", "sign", s(&dir), "--key", s(&key)]);
    assert!(out.contains("signed arith@0.1.0"), "{out}");
    let out = env.ok(&["bundle", "verify", s(&dir)]);
    assert!(
        out.contains("ok: bundle arith@0.1.0") && out.contains("signed by lab-a"),
        "{out}"
    );
    let out = env.ok(&["bundle", "inspect", s(&dir)]);
    assert!(
        out.contains("trusted as lab-a")
            && out.contains("arith/debate@0.1.0  world protocol")
            && out.contains("sha256 ok")
            && out.contains(r#"default settings: {"early_stop":true,"peers":1}"#),
        "{out}"
    );

    let out = env.ok(&["bundle", "install", s(&dir)]);
    assert!(out.contains("installed arith@0.1.0"), "{out}");
    assert!(env.store().join("arith/0.1.0/debate.wasm").is_file());
    assert!(env.store().join("arith/0.1.0/bundle.toml.sig").is_file());
    // Installing the same bundle again is a no-op; an installed bundle verifies by name.
    env.ok(&["bundle", "install", s(&dir)]);
    env.ok(&["bundle", "verify", "arith@^0.1"]);
    let out = env.ok(&["bundle", "list"]);
    assert!(
        out.contains("arith@0.1.0  signed  maporl:plugin@0.2.0")
            && out.contains("arith/gsm8k@0.1.0  verifier"),
        "{out}"
    );
    // The built-in reference plugins are listed with the sha256 each is pinned to.
    for b in maporl::plugin::builtin::all() {
        assert!(
            out.lines()
                .any(|l| l.contains(b.name) && l.trim_end().ends_with(b.sha256)),
            "{} not listed: {out}",
            b.name
        );
    }

    // A run config names the plugins by reference; settings merge over the defaults.
    let config = env.config(PLUGINS, "");
    let [protocol, verifier, shaper] = bundle::resolve_plugins(&config).unwrap();
    assert_eq!(protocol.path, env.store().join("arith/0.1.0/debate.wasm"));
    assert_eq!(
        protocol.settings,
        serde_json::json!({"early_stop": true, "peers": 2})
    );
    let b = protocol.bundle.as_ref().unwrap();
    assert_eq!(
        (b.name.as_str(), b.version.to_string()),
        ("arith", "0.1.0".into())
    );
    assert_eq!(b.sha256, m.components[0].sha256);
    assert_eq!(verifier.settings, serde_json::json!({}));
    assert!(shaper.path.ends_with("influence.wasm"));
    // ... and they load as the run would load them.
    let (rt, _, _c) = runtime();
    Protocol::load(&rt, &protocol.path, &protocol.settings, &Limits::default()).unwrap();
    Verifier::load(&rt, &verifier.path, &verifier.settings, &Limits::default()).unwrap();
    RewardShaper::load(&rt, &shaper.path, &shaper.settings, &Limits::default()).unwrap();
    // A path still works next to references.
    let mixed = env.config(
        "[plugins.protocol]\npath = \"arith/debate\"\n[plugins.verifier]\npath = \"exact_match.wasm\"\n",
        "",
    );
    let [_, path, _] = bundle::resolve_plugins(&mixed).unwrap();
    assert!(
        path.bundle.is_none() && path.path.to_string_lossy().ends_with("exact_match.wasm"),
        "{path:?}"
    );
    // A reference to the wrong world, or a component the bundle lacks, is refused by name.
    let wrong = env.config("[plugins.verifier]\npath = \"arith/debate\"\n", "");
    let err = format!("{:#}", bundle::resolve_plugins(&wrong).unwrap_err());
    assert!(
        err.contains("targets world `protocol`, not world `verifier`"),
        "{err}"
    );
    let missing = env.config("[plugins.verifier]\npath = \"arith/anli\"\n", "");
    let err = format!("{:#}", bundle::resolve_plugins(&missing).unwrap_err());
    assert!(
        err.contains("has no component `anli`") && err.contains("gsm8k (verifier)"),
        "{err}"
    );
    // A malformed reference is an error naming the key, before anything is resolved.
    let bad = Config::parse("[plugins.protocol]\npath = \"arith/debate@banana\"\n", &[]).unwrap();
    let err = format!("{:#}", bundle::resolve_plugins(&bad).unwrap_err());
    assert!(
        err.contains("plugins.protocol.path") && err.contains("banana"),
        "{err}"
    );

    let out = env.ok(&["bundle", "remove", "arith"]);
    assert!(out.contains("removed arith@0.1.0"), "{out}");
    assert!(env.ok(&["bundle", "list"]).contains("no bundles installed"));
    let err = format!("{:#}", bundle::resolve_plugins(&config).unwrap_err());
    assert!(
        err.contains("no bundle `arith` is installed") && err.contains("arith/debate@^0.1"),
        "{err}"
    );
    let out = env.fails(&["bundle", "remove", "arith"]);
    assert!(out.contains("no bundle `arith` is installed"), "{out}");
}

#[test]
fn a_changed_byte_in_a_component_is_refused() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    let file = dir.join("gsm8k.wasm");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();
    for cmd in ["verify", "install"] {
        let out = env.fails(&["bundle", cmd, s(&dir)]);
        assert!(
            out.contains("component `gsm8k` (gsm8k.wasm)")
                && out.contains("the component was changed after the bundle was packed"),
            "{cmd}: {out}"
        );
    }
    assert!(!env.store().join("arith").exists(), "nothing installed");
    assert!(env
        .ok(&["bundle", "inspect", s(&dir)])
        .contains("sha256 MISMATCH"));
    // Signing does not launder it: sign refuses a bundle whose files do not match.
    let out = env.fails(&["bundle", "sign", s(&dir), "--key", s(&key)]);
    assert!(out.contains("refusing to sign"), "{out}");

    // The same tampering inside the store is caught when a run resolves the reference.
    let clean = env.signed("arith2", "0.1.0", Some(&key));
    env.ok(&["bundle", "install", s(&clean)]);
    let installed = env.store().join("arith2/0.1.0/debate.wasm");
    let mut bytes = std::fs::read(&installed).unwrap();
    let at = bytes.len() - 10;
    bytes[at] ^= 0x80;
    std::fs::write(&installed, &bytes).unwrap();
    let config = env.config("[plugins.protocol]\npath = \"arith2/debate\"\n", "");
    let err = format!("{:#}", bundle::resolve_plugins(&config).unwrap_err());
    assert!(
        err.contains("arith2@0.1.0 is damaged or tampered with")
            && err.contains("changed after the bundle was packed"),
        "{err}"
    );
}

#[test]
fn a_manifest_edited_after_signing_is_refused() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    // Someone raises a default setting after the signature.
    let path = dir.join("bundle.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replacen("peers = 1", "peers = 9", 1);
    assert_ne!(text, edited);
    std::fs::write(&path, edited).unwrap();
    for cmd in ["verify", "install"] {
        let out = env.fails(&["bundle", cmd, s(&dir), "--allow-unsigned"]);
        assert!(
            out.contains("the signature does not match bundle.toml")
                && out.contains("the manifest was changed after it was signed"),
            "{cmd}: {out}"
        );
    }
    assert!(env.ok(&["bundle", "inspect", s(&dir)]).contains("INVALID"));
}

/// A component that declares its source has it recorded beside its sha256 by `pack`; a
/// manifest that names another source for it is refused, signed or not.
#[test]
fn pack_records_a_declared_source_and_verify_holds_the_manifest_to_it() {
    let env = Env::new();
    let (rt, _, _c) = runtime();
    let dir = env.source("arith", "0.1.0", &["gsm8k"]);
    let source = "5".repeat(64);
    let bytes = std::fs::read(dir.join("gsm8k.wasm")).unwrap();
    std::fs::write(
        dir.join("gsm8k.wasm"),
        maporl::plugin::source::with_section(&bytes, "maporl:source", source.as_bytes()),
    )
    .unwrap();
    let packed = bundle::pack(&rt, &dir, &NewBundle::default()).unwrap();
    assert_eq!(
        packed.components[0].source_sha256.as_deref(),
        Some(source.as_str())
    );
    let text = std::fs::read_to_string(dir.join("bundle.toml")).unwrap();
    assert!(
        text.contains(&format!("source_sha256 = \"{source}\"")),
        "{text}"
    );
    let policy = bundle::TrustPolicy {
        trusted_keys: env.trusted(),
        allow_unsigned: true,
    };
    bundle::verify(&rt, &dir, &policy).unwrap();
    edit_manifest(&dir, |m| {
        m.components[0].source_sha256 = Some("6".repeat(64))
    });
    let err = format!("{:#}", bundle::verify(&rt, &dir, &policy).unwrap_err());
    assert!(
        err.contains("bundle.toml says it was built from source sha256 666")
            && err.contains(&format!("the component declares {source}")),
        "{err}"
    );
    // What the manifest says is checked before it is shown.
    edit_manifest(&dir, |m| {
        m.components[0].source_sha256 = Some("\x1b[2Jfake".into())
    });
    let err = format!("{:#}", bundle::verify(&rt, &dir, &policy).unwrap_err());
    assert!(
        err.contains("is not 64 lower-case hex digits") && !err.contains('\x1b'),
        "{err:?}"
    );
}

/// A bundle may carry a component over the default 64 MiB (a Python verifier on sympy is
/// about 78 MB): it packs, verifies and installs; a run that loads it holds it to its own
/// `limits.max_component_mib`, refusing it by default with the setting to raise and loading
/// it with the cap raised.
#[test]
fn a_bundle_may_carry_a_component_over_64_mib_which_a_run_loads_with_its_cap_raised() {
    let env = Env::new();
    let (rt, _, _c) = runtime();
    let dir = env.source("big", "0.1.0", &["gsm8k"]);
    let bytes = std::fs::read(dir.join("gsm8k.wasm")).unwrap();
    // 65 MiB of custom section: still the same verifier, over the default cap.
    let padded = maporl::plugin::source::with_section(&bytes, "padding", &vec![0u8; 65 << 20]);
    std::fs::write(dir.join("gsm8k.wasm"), &padded).unwrap();
    bundle::pack(&rt, &dir, &NewBundle::default()).unwrap();
    let policy = bundle::TrustPolicy {
        trusted_keys: env.trusted(),
        allow_unsigned: true,
    };
    let verified = bundle::verify(&rt, &dir, &policy).unwrap();
    let store = bundle::Store::new(env.store());
    let installed = store.install(&verified, false).unwrap().join("gsm8k.wasm");
    assert_eq!(std::fs::read(&installed).unwrap().len(), padded.len());

    let err = Verifier::load(&rt, &installed, &serde_json::json!({}), &Limits::default())
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("limits.max_component_mib"), "{err}");
    let raised = Limits {
        max_component_mib: 128,
        ..Limits::default()
    };
    let mut v = Verifier::load(&rt, &installed, &serde_json::json!({}), &raised).unwrap();
    let verdicts = v
        .score(&task("t", "gsm8k", "q", "7"), &["\\boxed{7}".into()])
        .unwrap();
    assert!(verdicts[0].correct);
}

#[test]
fn a_component_of_the_wrong_world_is_refused() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    // The manifest claims the verifier is a protocol; hashes match, the signature is good.
    edit_manifest(&dir, |m| m.components[1].world = "protocol".into());
    resign(&dir, &key);
    let out = env.fails(&["bundle", "verify", s(&dir)]);
    assert!(
        out.contains("component `gsm8k` (gsm8k.wasm)")
            && out.contains("targets world `verifier`")
            && out.contains("not world `protocol`"),
        "{out}"
    );
    env.fails(&["bundle", "install", s(&dir)]);
    // pack catches the same lie in a hand-written manifest.
    let src = env.source("other", "0.1.0", &["gsm8k"]);
    let path = src.join("bundle.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(
            "file = \"gsm8k.wasm\"",
            "file = \"gsm8k.wasm\"\nworld = \"protocol\"",
        ),
    )
    .unwrap();
    let out = env.fails(&["bundle", "pack", s(&src)]);
    assert!(
        out.contains("says world `protocol`, but the component targets world `verifier`"),
        "{out}"
    );
}

#[test]
fn a_wit_major_version_bump_is_refused() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    let bumped = with_wit_version(&std::fs::read(dir.join("debate.wasm")).unwrap(), "1.0.0");
    std::fs::write(dir.join("debate.wasm"), &bumped).unwrap();
    // The component is rebuilt against maporl:plugin@1.0.0 and the manifest honestly says so.
    edit_manifest(&dir, |m| {
        m.bundle.wit = "maporl:plugin@1.0.0".into();
        m.components[0].sha256 = bundle::sha256_hex(&bumped);
    });
    resign(&dir, &key);
    let out = env.fails(&["bundle", "verify", s(&dir)]);
    assert!(
        out.contains("wit = \"maporl:plugin@1.0.0\"")
            && out.contains("is built against maporl:plugin@1.0.0")
            && out.contains("which this host does not link")
            && out.contains("maporl:plugin 0.1.0, 0.2.0"),
        "{out}"
    );
    // The manifest hides the bump: the component itself is refused.
    edit_manifest(&dir, |m| m.bundle.wit = "maporl:plugin@0.2.0".into());
    resign(&dir, &key);
    let out = env.fails(&["bundle", "install", s(&dir)]);
    assert!(
        out.contains("component `debate` (debate.wasm)")
            && out.contains("maporl:plugin@1.0.0")
            && out.contains("does not link"),
        "{out}"
    );
    // And pack will not pack it.
    let src = env.source("bumped", "0.1.0", &["debate"]);
    std::fs::write(src.join("debate.wasm"), &bumped).unwrap();
    let out = env.fails(&["bundle", "pack", s(&src)]);
    assert!(out.contains("maporl:plugin@1.0.0"), "{out}");
}

#[test]
fn unsigned_or_untrusted_bundles_are_refused_unless_allowed() {
    let env = Env::new();
    let unsigned = env.signed("plain", "0.1.0", None);
    let out = env.fails(&["bundle", "verify", s(&unsigned)]);
    assert!(
        out.contains("is unsigned") && out.contains("--allow-unsigned"),
        "{out}"
    );
    env.fails(&["bundle", "install", s(&unsigned)]);
    let out = env.ok(&["bundle", "install", s(&unsigned), "--allow-unsigned"]);
    assert!(
        out.contains("installed plain@0.1.0") && out.contains("warning: plain@0.1.0 is unsigned"),
        "{out}"
    );

    let (stranger, stranger_pub) = env.key("stranger", false);
    let untrusted = env.signed("strange", "0.1.0", Some(&stranger));
    let out = env.fails(&["bundle", "verify", s(&untrusted)]);
    assert!(
        out.contains("is signed by key") && out.contains("not in the trusted keys"),
        "{out}"
    );
    env.ok(&["bundle", "install", s(&untrusted), "--allow-unsigned"]);

    // Run configs: refused unless plugins.allow_unsigned = true.
    for (name, allowed) in [("plain", false), ("strange", false), ("plain", true)] {
        let config = env.config(
            &format!("[plugins.protocol]\npath = \"{name}/debate@0.1\"\n"),
            if allowed { "allow_unsigned = true" } else { "" },
        );
        let result = bundle::resolve_plugins(&config);
        if allowed {
            let [p, _, _] = result.unwrap();
            assert_eq!(p.bundle.unwrap().trust, bundle::Trust::Unsigned);
        } else {
            let err = format!("{:#}", result.unwrap_err());
            assert!(
                err.contains("plugins.allow_unsigned = true") && err.contains(name),
                "{err}"
            );
        }
    }
    // Trusting the stranger's key makes its bundle acceptable.
    env.ok(&["bundle", "trust", s(&stranger_pub)]);
    let config = env.config("[plugins.protocol]\npath = \"strange/debate\"\n", "");
    let [p, _, _] = bundle::resolve_plugins(&config).unwrap();
    assert!(
        matches!(p.bundle.unwrap().trust, bundle::Trust::Trusted { name, .. } if name == "stranger")
    );
}

#[test]
fn version_requirements_resolve_to_the_highest_match() {
    let env = Env::new();
    let (rt, _, _c) = runtime();
    let store = bundle::Store::new(env.store());
    let policy = bundle::TrustPolicy {
        trusted_keys: env.trusted(),
        allow_unsigned: true,
    };
    for v in ["0.1.0", "0.1.5", "0.2.0", "1.0.0-rc.1"] {
        let dir = env.source("arith", v, &["debate"]);
        bundle::pack(&rt, &dir, &NewBundle::default()).unwrap();
        let verified = bundle::verify(&rt, &dir, &policy).unwrap();
        store.install(&verified, false).unwrap();
    }
    for (req, want) in [
        ("^0.1", "0.1.5"),
        ("0.1", "0.1.5"),
        ("=0.1.0", "0.1.0"),
        ("<0.1.5", "0.1.0"),
        (">=0.1, <1", "0.2.0"),
        ("*", "0.2.0"),
        ("^1.0.0-rc.1", "1.0.0-rc.1"),
    ] {
        let config = env.config(
            &format!("[plugins.protocol]\npath = \"arith/debate@{req}\"\n"),
            "allow_unsigned = true",
        );
        let [p, _, _] = bundle::resolve_plugins(&config).unwrap();
        assert_eq!(p.bundle.unwrap().version.to_string(), want, "{req}");
        assert!(p.path.starts_with(env.store().join("arith").join(want)));
    }
    let config = env.config(
        "[plugins.protocol]\npath = \"arith/debate@^0.3\"\n",
        "allow_unsigned = true",
    );
    let err = format!("{:#}", bundle::resolve_plugins(&config).unwrap_err());
    assert!(
        err.contains("no installed version of bundle `arith` matches `^0.3`")
            && err.contains("0.1.0, 0.1.5, 0.2.0"),
        "{err}"
    );
    // Several versions: remove wants one named, or --all.
    let out = env.fails(&["bundle", "remove", "arith"]);
    assert!(out.contains("several versions"), "{out}");
    let out = env.ok(&["bundle", "remove", "arith@0.1.5"]);
    assert!(out.contains("removed arith@0.1.5"), "{out}");
    let config = env.config(
        "[plugins.protocol]\npath = \"arith/debate@^0.1\"\n",
        "allow_unsigned = true",
    );
    let [p, _, _] = bundle::resolve_plugins(&config).unwrap();
    assert_eq!(p.bundle.unwrap().version.to_string(), "0.1.0");
    env.ok(&["bundle", "remove", "arith", "--all"]);
    assert!(!env.store().join("arith").exists());
}

fn lock_of(config: &Config) -> PluginLock {
    let (rt, _, _c) = runtime();
    let [p, v, s] = bundle::resolve_plugins(config).unwrap();
    let protocol = Protocol::load(&rt, &p.path, &p.settings, &Limits::default()).unwrap();
    let verifier = Verifier::load(&rt, &v.path, &v.settings, &Limits::default()).unwrap();
    let shaper = RewardShaper::load(&rt, &s.path, &s.settings, &Limits::default()).unwrap();
    PluginLock {
        protocol: bundle::LockedPlugin::new(&p, protocol.identity()).unwrap(),
        verifier: bundle::LockedPlugin::new(&v, verifier.identity()).unwrap(),
        shaper: bundle::LockedPlugin::new(&s, shaper.identity()).unwrap(),
        verifier_checkpoint: None,
    }
}

#[test]
fn plugins_lock_pins_exact_versions_and_resume_refuses_a_change() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let v010 = env.signed("arith", "0.1.0", Some(&key));
    env.ok(&["bundle", "install", s(&v010)]);
    // No protocol settings: 0.1.1's protocol (round-robin) takes different ones. The
    // verifier and shaper are pinned, so only the protocol moves.
    let plugins = PLUGINS
        .replace("[plugins.protocol.settings]\npeers = 2\n", "")
        .replace("gsm8k@^0.1", "gsm8k@=0.1.0")
        .replace("influence@^0.1", "influence@=0.1.0");
    let config = env.config(&plugins, "");
    let run = env.path("run");
    let lock = lock_of(&config);
    lock.write(&run).unwrap();
    let text = std::fs::read_to_string(run.join("plugins.lock")).unwrap();
    let (m, _) = Manifest::read(&v010).unwrap();
    assert!(
        text.contains("reference = \"arith/debate@^0.1\"")
            && text.contains("bundle = \"arith\"")
            && text.contains("version = \"0.1.0\"")
            && text.contains("file = \"debate.wasm\"")
            && text.contains(&format!("sha256 = \"{}\"", m.components[0].sha256)),
        "{text}"
    );
    // Same plugins: resuming is fine.
    assert!(bundle::check_lock(&run, &lock_of(&config), false)
        .unwrap()
        .is_empty());

    // 0.1.1 ships another protocol under the same name: `^0.1` now picks it up.
    let v011 = env.source("arith", "0.1.1", &["gsm8k", "influence"]);
    std::fs::copy(plugin("round_robin"), v011.join("debate.wasm")).unwrap();
    let text = std::fs::read_to_string(v011.join("bundle.toml")).unwrap();
    std::fs::write(
        v011.join("bundle.toml"),
        format!("{text}\n[[component]]\nfile = \"debate.wasm\"\n"),
    )
    .unwrap();
    env.ok(&["bundle", "pack", s(&v011)]);
    env.ok(&["bundle", "sign", s(&v011), "--key", s(&key)]);
    env.ok(&["bundle", "install", s(&v011)]);
    let now = lock_of(&config);
    assert_eq!(now.protocol.version.as_deref(), Some("0.1.1"));
    let err = bundle::check_lock(&run, &now, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("protocol plugin `arith/debate@^0.1`")
            && err.contains(&format!(
                "arith@0.1.0 component debate (sha256 {})",
                lock.protocol.sha256
            ))
            && err.contains(&format!(
                "arith@0.1.1 component debate (sha256 {})",
                now.protocol.sha256
            ))
            && err.contains("--allow-plugin-change"),
        "{err}"
    );
    assert!(
        !err.contains("verifier plugin"),
        "unchanged plugins are not named: {err}"
    );
    let changes = bundle::check_lock(&run, &now, true).unwrap();
    assert_eq!(changes.len(), 1, "{changes:?}");
    // Pinning the exact version resumes with the original plugins.
    let pinned = env.config(&plugins.replace("debate@^0.1", "debate@=0.1.0"), "");
    assert!(bundle::check_lock(&run, &lock_of(&pinned), false)
        .unwrap()
        .is_empty());
    // A new version with the very same bytes is still a change of version, and is named.
    let moved = env.config(
        &plugins
            .replace("debate@^0.1", "debate@=0.1.0")
            .replace("gsm8k@=0.1.0", "gsm8k@^0.1"),
        "",
    );
    let err = bundle::check_lock(&run, &lock_of(&moved), false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("verifier plugin `arith/gsm8k@^0.1`: the run started with arith@0.1.0")
            && err.contains("now arith@0.1.1 component gsm8k")
            && !err.contains("protocol plugin"),
        "{err}"
    );
}

/// Debian's docker-registry (distribution 2.8) serving on a free loopback port with its
/// storage in a temp dir; killed on drop.
struct Registry {
    child: std::process::Child,
    addr: String,
    storage: PathBuf,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        Registry::start_with("")
    }

    /// With more configuration (e.g. an `auth:` section).
    fn start_with(extra_config: &str) -> Registry {
        let bin = std::env::var_os("MAPORL_TEST_REGISTRY")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"));
        assert!(
            bin.is_file(),
            "{} is missing: the OCI tests need a real registry. Install Debian's package \
             (`apt-get install docker-registry`; `cargo xtask test` does it when run as root), \
             or set MAPORL_TEST_REGISTRY to a distribution `registry` binary",
            bin.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.path().join("storage");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{extra_config}",
                storage.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(&bin)
            .arg("serve")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let registry = Registry {
            child,
            addr,
            storage,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into();
        loop {
            // 401: up, and asking for a login.
            let up = agent
                .get(&format!("http://{}/v2/", registry.addr))
                .call()
                .is_ok_and(|r| r.status() == 200 || r.status() == 401);
            if up {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the registry did not come up on {} within 30 s; its log:\n{}",
                registry.addr,
                std::fs::read_to_string(registry._dir.path().join("registry.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        registry
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seconds(out: &str, after: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with(after)).unwrap();
    let end = line.rfind(" s)").unwrap();
    let start = line[..end].rfind(' ').unwrap() + 1;
    line[start..end].trim_start_matches('(').parse().unwrap()
}

#[test]
fn push_and_pull_through_a_real_oci_registry() {
    let registry = Registry::start();
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    let reference = format!("{}/labs/arith:0.1.0", registry.addr);

    let started = std::time::Instant::now();
    let out = env.ok(&["bundle", "push", &reference, s(&dir)]);
    let push_wall = started.elapsed().as_secs_f64();
    assert!(out.contains("5 layers, 6 of 6 blobs uploaded"), "{out}");
    let digest = out
        .lines()
        .find_map(|l| l.strip_prefix("digest: "))
        .unwrap()
        .to_string();
    let push_s = seconds(&out, "pushed");
    // Pushing again uploads nothing and gives the same digest.
    let again = env.ok(&["bundle", "push", &reference, s(&dir)]);
    assert!(
        again.contains("0 of 6 blobs uploaded") && again.contains(&digest),
        "{again}"
    );
    // Without a tag, the bundle's version is the tag.
    let untagged = format!("{}/labs/arith", registry.addr);
    assert!(env
        .ok(&["bundle", "push", &untagged, s(&dir)])
        .contains(&format!("to {reference}")));

    // The layout is the Wasm OCI artifact's: wasm config, application/wasm layers, titles.
    let url = format!("http://{}/v2/labs/arith/manifests/0.1.0", registry.addr);
    let mut resp = ureq::get(&url)
        .header("Accept", bundle::oci::MANIFEST_MEDIA_TYPE)
        .call()
        .unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&resp.body_mut().read_to_vec().unwrap()).unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    let layers: Vec<(String, String)> = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["mediaType"].as_str().unwrap().to_string(),
                l["annotations"]["org.opencontainers.image.title"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    let expect = [
        ("application/wasm", "debate.wasm"),
        ("application/wasm", "gsm8k.wasm"),
        ("application/wasm", "influence.wasm"),
        (bundle::oci::BUNDLE_MANIFEST_MEDIA_TYPE, "bundle.toml"),
        (bundle::oci::BUNDLE_SIGNATURE_MEDIA_TYPE, "bundle.toml.sig"),
    ];
    assert_eq!(
        layers,
        expect.map(|(a, b)| (a.to_string(), b.to_string())).to_vec()
    );
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.version"],
        "0.1.0"
    );

    // Pull, verify and install into a second store; the files are the ones pushed.
    let store2 = env.path("store2");
    let started = std::time::Instant::now();
    let out = env.ok(&[
        "bundle",
        "pull",
        &reference,
        "--out",
        "pulled",
        "--install",
        "--store",
        s(&store2),
    ]);
    assert!(
        out.contains(&digest)
            && out.contains("signed by lab")
            && out.contains("installed arith@0.1.0"),
        "{out}"
    );
    let pull_wall = started.elapsed().as_secs_f64();
    let pull_s = seconds(&out, "pulled");
    for f in [
        "bundle.toml",
        "bundle.toml.sig",
        "debate.wasm",
        "gsm8k.wasm",
        "influence.wasm",
    ] {
        assert_eq!(
            std::fs::read(env.path("pulled").join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f}"
        );
        assert!(store2.join("arith/0.1.0").join(f).is_file());
    }
    // By digest.
    let by_digest = format!("{}/labs/arith@{digest}", registry.addr);
    env.ok(&["bundle", "pull", &by_digest, "--out", "by-digest"]);
    // Pulling into a directory that is not empty is refused.
    let out = env.fails(&["bundle", "pull", &reference, "--out", "pulled"]);
    assert!(out.contains("exists and is not empty"), "{out}");
    // A tag that does not exist.
    let out = env.fails(&[
        "bundle",
        "pull",
        &format!("{}/labs/arith:9.9.9", registry.addr),
        "--out",
        "nope",
    ]);
    assert!(out.contains("HTTP 404"), "{out}");

    // An unsigned bundle travels, but is refused on arrival unless allowed.
    let plain = env.signed("plain", "0.2.0", None);
    let plain_ref = format!("{}/labs/plain:0.2.0", registry.addr);
    let out = env.ok(&["bundle", "push", &plain_ref, s(&plain)]);
    assert!(out.contains("warning: plain@0.2.0 is unsigned"), "{out}");
    let out = env.fails(&["bundle", "pull", &plain_ref, "--out", "plain-pulled"]);
    assert!(out.contains("is unsigned"), "{out}");
    assert!(
        out.contains("failed verification") && !env.path("plain-pulled").exists(),
        "a refused bundle is not left behind: {out}"
    );
    env.ok(&[
        "bundle",
        "pull",
        &plain_ref,
        "--out",
        "plain-pulled-2",
        "--allow-unsigned",
    ]);

    // A blob changed inside the registry's storage is refused on pull.
    let (m, _) = Manifest::read(&dir).unwrap();
    let sha = &m.components[1].sha256;
    let blob = registry
        .storage
        .join("docker/registry/v2/blobs/sha256")
        .join(&sha[..2])
        .join(sha)
        .join("data");
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let out = env.fails(&["bundle", "pull", &reference, "--out", "tampered"]);
    assert!(out.contains(&format!("not sha256:{sha}: refused")), "{out}");
    assert!(!env.path("tampered").exists(), "nothing left behind");
    eprintln!(
        "arith@0.1.0 ({} bytes of components): push {push_s:.3} s (the command, verify \
         included: {push_wall:.3} s); pull {pull_s:.3} s (the command, verify and install \
         included: {pull_wall:.3} s)",
        m.components
            .iter()
            .map(|c| std::fs::metadata(dir.join(&c.file)).unwrap().len())
            .sum::<u64>()
    );
}

#[test]
fn eval_with_bundle_references_writes_the_plugins_lock() {
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    env.ok(&["bundle", "install", s(&dir)]);
    let run = env.path("run");
    let config = repo().join("configs/smollm2-arith.toml");
    let sets = [
        format!("model.path={}", smollm2().display()),
        format!("run_dir={}", run.display()),
        "data.count=2".into(),
        "debate.turns=2".into(),
        "generation.max_new_tokens=8".into(),
        "plugins.protocol.path=arith/debate@^0.1".into(),
        "plugins.verifier.path=arith/gsm8k@=0.1.0".into(),
        "plugins.shaper.path=arith/influence".into(),
        format!("plugins.store={}", env.store().display()),
    ];
    let mut args = vec!["eval", "--config", s(&config)];
    for set in &sets {
        args.extend(["--set", set]);
    }
    env.ok(&args);
    let lock = PluginLock::read(&run)
        .unwrap()
        .expect("eval writes plugins.lock");
    let (m, _) = Manifest::read(&dir).unwrap();
    for ((role, locked), c) in lock.roles().into_iter().zip(&m.components) {
        assert_eq!(locked.bundle.as_deref(), Some("arith"), "{role}");
        assert_eq!(locked.version.as_deref(), Some("0.1.0"), "{role}");
        assert_eq!(locked.file.as_deref(), Some(c.file.as_str()), "{role}");
        assert_eq!(locked.sha256, c.sha256, "{role}");
    }
    assert_eq!(lock.shaper.reference, "arith/influence");
    // The transcripts carry the same hashes.
    let first = std::fs::read_to_string(run.join("transcripts.jsonl")).unwrap();
    let record: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    assert_eq!(record["plugins"]["protocol"], lock.protocol.sha256.as_str());
    assert!(bundle::check_lock(&run, &lock, false).unwrap().is_empty());
}

const USER: (&str, &str) = ("MAPORL_REGISTRY_USER", "lab");
const PASSWORD: (&str, &str) = ("MAPORL_REGISTRY_PASSWORD", "s3cret pass");
const WRONG: (&str, &str) = ("MAPORL_REGISTRY_PASSWORD", "not-the-password");

#[test]
fn push_and_pull_through_a_registry_that_needs_a_basic_login() {
    let env = Env::new();
    // The registry's htpasswd auth takes bcrypt hashes only.
    let htpasswd = env.path("htpasswd");
    let hash = bcrypt::hash(PASSWORD.1, 4).unwrap();
    std::fs::write(&htpasswd, format!("lab:{hash}\n")).unwrap();
    let registry = Registry::start_with(&format!(
        "auth:\n  htpasswd:\n    realm: maporl-test\n    path: {}\n",
        htpasswd.display()
    ));
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    let reference = format!("{}/labs/arith:0.1.0", registry.addr);
    let push = ["bundle", "push", reference.as_str(), s(&dir)];

    // Without a login: refused, naming the registry and how to log in.
    let out = env.fails(&push);
    assert!(
        out.contains(&format!("{} needs a login", registry.addr))
            && out.contains("MAPORL_REGISTRY_USER")
            && out.contains("--password-stdin")
            && out.contains("docker login"),
        "{out}"
    );
    // A wrong password: "login refused", and the password is not printed.
    let o = env.maporl_with(&push, &[USER, WRONG], None);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(
        out.contains("login refused")
            && out.contains(&registry.addr)
            && out.contains("as lab")
            && !out.contains(WRONG.1),
        "{out}"
    );
    // With the login in the environment: pushed.
    let o = env.maporl_with(&push, &[USER, PASSWORD], None);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("6 of 6 blobs uploaded") && !out.contains(PASSWORD.1),
        "{out}"
    );
    // Pull: anonymously refused; with --user and --password-stdin, the same files.
    let out = env.fails(&["bundle", "pull", &reference, "--out", "anon"]);
    assert!(
        out.contains(&format!("{} needs a login", registry.addr)),
        "{out}"
    );
    assert!(!env.path("anon").exists());
    let o = env.maporl_with(
        &[
            "bundle",
            "pull",
            &reference,
            "--out",
            "pulled",
            "--user",
            "lab",
            "--password-stdin",
        ],
        &[],
        Some(&format!("{}\n", PASSWORD.1)),
    );
    let out = text(&o);
    assert!(o.status.success() && out.contains("signed by lab"), "{out}");
    for f in ["bundle.toml", "bundle.toml.sig", "gsm8k.wasm"] {
        assert_eq!(
            std::fs::read(env.path("pulled").join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f}"
        );
    }
    // The login `docker login` leaves in the docker config.
    std::fs::create_dir_all(env.path("docker")).unwrap();
    let auth = base64(format!("lab:{}", PASSWORD.1).as_bytes());
    std::fs::write(
        env.path("docker/config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "{auth}"}}}}}}"#,
            registry.addr
        ),
    )
    .unwrap();
    env.ok(&["bundle", "pull", &reference, "--out", "from-docker-config"]);
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() {
                A[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

type Headers = Vec<(String, String)>;

/// One HTTP/1.1 request read off a connection: the request line, the headers (names in
/// lower case) and the body (Content-Length only: all ureq sends).
fn read_request(
    conn: &mut std::io::BufReader<std::net::TcpStream>,
) -> Option<(String, Headers, Vec<u8>)> {
    use std::io::{BufRead, Read};
    let mut line = String::new();
    conn.read_line(&mut line).ok()?;
    let request_line = line.trim_end().to_string();
    if request_line.is_empty() {
        return None;
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        conn.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let len = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    conn.read_exact(&mut body).ok()?;
    Some((request_line, headers, body))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() + 1 {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// What the token server was asked: the service, the scopes, and the Authorization header.
#[derive(Clone, Debug)]
struct TokenRequest {
    service: String,
    scopes: Vec<String>,
    authorization: Option<String>,
}

/// A registry's token server (`GET /token?service=..&scope=..`) and a reverse proxy in front
/// of a registry that answers `401` + a Bearer challenge unless the request carries a token
/// the token server issued for a scope that covers it (pull for GET and HEAD, push else).
/// Pushing needs the login lab / "s3cret pass"; pulling is anonymous.
struct BearerFront {
    addr: String,
    asked: std::sync::Arc<std::sync::Mutex<Vec<TokenRequest>>>,
}

impl BearerFront {
    fn start(registry: &str) -> BearerFront {
        use std::collections::HashMap;
        use std::io::Write;
        use std::net::TcpListener;
        use std::sync::{Arc, Mutex};
        let token_listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let token_addr = token_listener.local_addr().unwrap().to_string();
        let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = proxy.local_addr().unwrap().to_string();
        let asked: Arc<Mutex<Vec<TokenRequest>>> = Arc::default();
        let issued: Arc<Mutex<HashMap<String, Vec<String>>>> = Arc::default();
        let login = format!("Basic {}", base64(format!("lab:{}", PASSWORD.1).as_bytes()));
        {
            let (asked, issued) = (asked.clone(), issued.clone());
            std::thread::spawn(move || {
                for conn in token_listener.incoming() {
                    let mut conn = std::io::BufReader::new(conn.unwrap());
                    let Some((line, headers, _)) = read_request(&mut conn) else {
                        continue;
                    };
                    let target = line.split(' ').nth(1).unwrap_or("");
                    let query = target.split_once('?').map_or("", |(_, q)| q);
                    let mut req = TokenRequest {
                        service: String::new(),
                        scopes: Vec::new(),
                        authorization: header(&headers, "authorization").map(str::to_string),
                    };
                    for pair in query.split('&') {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        match k {
                            "service" => req.service = percent_decode(v),
                            "scope" => req.scopes.push(percent_decode(v)),
                            _ => {}
                        }
                    }
                    let wants_push = req.scopes.iter().any(|s| s.ends_with(",push"));
                    let logged_in = req.authorization.as_deref() == Some(login.as_str());
                    let refused = (wants_push || req.authorization.is_some()) && !logged_in;
                    let response = if refused {
                        "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_string()
                    } else {
                        let mut issued = issued.lock().unwrap();
                        let token = format!("tok-{}", issued.len() + 1);
                        issued.insert(token.clone(), req.scopes.clone());
                        let body = format!(r#"{{"token": "{token}", "expires_in": 300}}"#);
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    asked.lock().unwrap().push(req);
                    let _ = conn.get_mut().write_all(response.as_bytes());
                }
            });
        }
        let registry = registry.to_string();
        std::thread::spawn(move || {
            for conn in proxy.incoming() {
                let (issued, registry, token_addr) =
                    (issued.clone(), registry.clone(), token_addr.clone());
                std::thread::spawn(move || {
                    let mut conn = std::io::BufReader::new(conn.unwrap());
                    let Some((line, headers, body)) = read_request(&mut conn) else {
                        return;
                    };
                    let mut parts = line.split(' ');
                    let (method, target) = (parts.next().unwrap(), parts.next().unwrap());
                    let path = target.split('?').next().unwrap();
                    let repo = path
                        .strip_prefix("/v2/")
                        .and_then(|p| p.split_once("/manifests/").or(p.split_once("/blobs/")))
                        .map_or("", |(r, _)| r);
                    let actions = if matches!(method, "GET" | "HEAD") {
                        "pull"
                    } else {
                        "pull,push"
                    };
                    let needed = format!("repository:{repo}:{actions}");
                    let granted = header(&headers, "authorization")
                        .and_then(|a| a.strip_prefix("Bearer "))
                        .and_then(|t| issued.lock().unwrap().get(t).cloned())
                        .is_some_and(|scopes| scopes.contains(&needed));
                    let out = conn.get_mut();
                    if !granted {
                        let _ = write!(
                            out,
                            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer \
                             realm=\"http://{token_addr}/token\",service=\"maporl-test\",\
                             scope=\"{needed}\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        );
                        return;
                    }
                    let mut upstream = std::net::TcpStream::connect(&registry).unwrap();
                    let mut request = format!("{line}\r\n");
                    for (k, v) in &headers {
                        if k != "authorization" && k != "connection" {
                            request.push_str(&format!("{k}: {v}\r\n"));
                        }
                    }
                    request.push_str("connection: close\r\n\r\n");
                    upstream.write_all(request.as_bytes()).unwrap();
                    upstream.write_all(&body).unwrap();
                    let _ = std::io::copy(&mut upstream, out);
                });
            }
        });
        BearerFront { addr, asked }
    }

    fn take_asked(&self) -> Vec<TokenRequest> {
        std::mem::take(&mut *self.asked.lock().unwrap())
    }
}

#[test]
fn push_and_pull_through_a_registry_that_wants_bearer_tokens() {
    let registry = Registry::start();
    let front = BearerFront::start(&registry.addr);
    let env = Env::new();
    let (key, _) = env.key("lab", true);
    let dir = env.signed("arith", "0.1.0", Some(&key));
    let reference = format!("{}/labs/arith:0.1.0", front.addr);
    let push = ["bundle", "push", reference.as_str(), s(&dir)];

    // Pushing needs a login the token server accepts.
    let out = env.fails(&push);
    assert!(
        out.contains(&format!("{} needs a login", front.addr))
            && out.contains("MAPORL_REGISTRY_USER"),
        "{out}"
    );
    front.take_asked();
    let o = env.maporl_with(&push, &[USER, WRONG], None);
    let out = text(&o);
    assert!(
        !o.status.success() && out.contains("login refused") && !out.contains(WRONG.1),
        "{out}"
    );
    front.take_asked();
    let o = env.maporl_with(&push, &[USER, PASSWORD], None);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("6 of 6 blobs uploaded"), "{out}");
    // One token for the whole push, for pull,push on the repository, with the login.
    let asked = front.take_asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].service, "maporl-test");
    assert_eq!(asked[0].scopes[0], "repository:labs/arith:pull,push");
    assert!(asked[0]
        .authorization
        .as_deref()
        .unwrap()
        .starts_with("Basic "));

    // Pulling is anonymous: one token, scope pull, no credentials sent.
    let out = env.ok(&["bundle", "pull", &reference, "--out", "pulled"]);
    assert!(out.contains("signed by lab"), "{out}");
    let asked = front.take_asked();
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].service, "maporl-test");
    assert_eq!(asked[0].scopes, ["repository:labs/arith:pull"]);
    assert_eq!(asked[0].authorization, None);
    for f in [
        "bundle.toml",
        "bundle.toml.sig",
        "debate.wasm",
        "gsm8k.wasm",
    ] {
        assert_eq!(
            std::fs::read(env.path("pulled").join(f)).unwrap(),
            std::fs::read(dir.join(f)).unwrap(),
            "{f}"
        );
    }
}

/// Two labs with trusted keys publish bundles of the same name: the name stays with the
/// lab that first installed it unless a change is allowed explicitly, or the run config
/// names the signer; build metadata does not order versions; plugins.lock and `bundle
/// list` name the signer.
#[test]
fn a_bundle_name_is_bound_to_its_signer() {
    let env = Env::new();
    let (key_a, _) = env.key("lab-a", true);
    let (key_b, _) = env.key("lab-b", true);
    let a1 = env.signed("arith", "0.1.0", Some(&key_a));
    let id_a = bundle::signer_of(&a1).unwrap();
    env.ok(&["bundle", "install", s(&a1)]);
    // Lab B's newer release, and its release differing only in build metadata: refused.
    let b2 = env.signed("arith", "0.2.0", Some(&key_b));
    let id_b = bundle::signer_of(&b2).unwrap();
    assert_ne!(id_a, id_b);
    let b1 = env.signed("arith", "0.1.0+lab-b", Some(&key_b));
    for dir in [&b2, &b1] {
        let err = env.fails(&["bundle", "install", s(dir)]);
        assert!(
            err.contains(&id_a) && err.contains(&id_b) && err.contains("--allow-signer-change"),
            "{err}"
        );
    }
    // The store still resolves arith to lab A's release.
    const PLUGINS: &str = "[plugins.protocol]\npath = \"arith/debate\"\n";
    let [p, _, _] = bundle::resolve_plugins(&env.config(PLUGINS, "")).unwrap();
    let b = p.bundle.unwrap();
    assert_eq!(
        (b.version.to_string(), b.signer.as_str()),
        ("0.1.0".into(), id_a.as_str())
    );
    // Lab A's 0.1.1 outranks its 0.1.0.
    env.ok(&[
        "bundle",
        "install",
        s(&env.signed("arith", "0.1.1", Some(&key_a))),
    ]);
    let [p, _, _] = bundle::resolve_plugins(&env.config(PLUGINS, "")).unwrap();
    assert_eq!(p.bundle.unwrap().version.to_string(), "0.1.1");

    // Allowed explicitly, lab B takes the name over; its release is then the one found.
    let out = env.ok(&["bundle", "install", s(&b2), "--allow-signer-change"]);
    assert!(out.contains("installed arith@0.2.0"), "{out}");
    let [p, _, _] = bundle::resolve_plugins(&env.config(PLUGINS, "")).unwrap();
    let b = p.bundle.unwrap();
    assert_eq!(
        (b.version.to_string(), b.signer.as_str()),
        ("0.2.0".into(), id_b.as_str())
    );
    // A run config that names lab A keeps lab A's releases, whatever the store's binding.
    let pinned = env.config(PLUGINS, &format!("[plugins.signers]\narith = {id_a:?}\n"));
    let [p, _, _] = bundle::resolve_plugins(&pinned).unwrap();
    let b = p.bundle.unwrap();
    assert_eq!(
        (b.version.to_string(), b.signer.as_str()),
        ("0.1.1".into(), id_a.as_str())
    );
    let nobody = env.config(PLUGINS, "[plugins.signers]\narith = \"00000000deadbeef\"\n");
    let err = format!("{:#}", bundle::resolve_plugins(&nobody).unwrap_err());
    assert!(
        err.contains("00000000deadbeef") && err.contains(&id_b),
        "{err}"
    );

    // bundle list names each release's signer.
    let listed = env.ok(&["bundle", "list"]);
    assert!(listed.contains(&format!("signer {id_a}")), "{listed}");
    assert!(listed.contains(&format!("signer {id_b}")), "{listed}");
}

#[test]
fn versions_order_by_precedence_with_build_metadata_ignored() {
    let v = |s: &str| semver::Version::parse(s).unwrap();
    let mut all = [
        v("0.2.0"),
        v("0.1.0+zzz"),
        v("0.1.1-rc.1"),
        v("0.1.0+aaa"),
        v("0.1.1"),
    ];
    all.sort_by(bundle::by_precedence);
    let shown: Vec<String> = all.iter().map(|v| v.to_string()).collect();
    assert_eq!(
        shown,
        ["0.1.0+aaa", "0.1.0+zzz", "0.1.1-rc.1", "0.1.1", "0.2.0"]
    );
}

// A hostile registry (and token server) on loopback, written here: what it says reaches the
// terminal escaped and cut short, sizes are checked before a byte is written, a layer streams
// to disk, and a server that trickles is cut off at the whole-request deadline.

use maporl::bundle::oci::{
    BUNDLE_MANIFEST_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, TITLE, WASM_CONFIG_MEDIA_TYPE,
    WASM_LAYER_MEDIA_TYPE,
};
use support::hostile::{self, Answer, HOSTILE_TEXT};

fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", bundle::sha256_hex(bytes))
}

/// An OCI manifest of a wasm artifact with `layers`: (media type, title, digest, size).
fn oci_manifest(layers: &[(&str, &str, String, u64)]) -> Vec<u8> {
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|(media, title, digest, size)| {
            serde_json::json!({
                "mediaType": media, "digest": digest, "size": size,
                "annotations": { TITLE: title },
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": { "mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": digest_of(b"{}"), "size": 2 },
        "layers": layers,
    }))
    .unwrap()
}

/// One wasm layer holding `wasm`, then a bundle.toml layer holding `toml`.
fn two_layers(wasm: &[u8], toml: &[u8]) -> Vec<(&'static str, &'static str, String, u64)> {
    vec![
        (
            WASM_LAYER_MEDIA_TYPE,
            "a.wasm",
            digest_of(wasm),
            wasm.len() as u64,
        ),
        (
            BUNDLE_MANIFEST_MEDIA_TYPE,
            "bundle.toml",
            digest_of(toml),
            toml.len() as u64,
        ),
    ]
}

/// A registry answering every manifest request with `manifest` and every blob request with
/// `blob(digest)`.
fn hostile_registry(
    manifest: Answer,
    blob: impl Fn(&str) -> Answer + Send + Sync + 'static,
) -> hostile::Server {
    hostile::Server::start(move |r| {
        if r.path().contains("/manifests/") {
            manifest.clone()
        } else if let Some((_, digest)) = r.path().split_once("/blobs/") {
            blob(digest)
        } else {
            Answer::new(404, "")
        }
    })
}

/// A registry serving `manifest` and the blobs in `blobs`, by digest.
fn registry_serving(manifest: Vec<u8>, blobs: Vec<Vec<u8>>) -> hostile::Server {
    let blobs: std::collections::HashMap<String, Vec<u8>> =
        blobs.into_iter().map(|b| (digest_of(&b), b)).collect();
    hostile_registry(
        Answer::new(200, manifest).header("Content-Type", MANIFEST_MEDIA_TYPE),
        move |d| match blobs.get(d) {
            Some(b) => Answer::new(200, b.clone()),
            None => Answer::new(404, ""),
        },
    )
}

/// A registry that wants a bearer token from its token server (on the same address), which
/// answers with `token`.
fn registry_with_token_server(token: Answer) -> hostile::Server {
    hostile::Server::start(move |r| {
        if r.path() == "/token" {
            return token.clone();
        }
        let host = r.header("host").unwrap_or("");
        Answer::new(401, "").header(
            "WWW-Authenticate",
            format!("Bearer realm=\"http://{host}/token\",service=\"hostile\""),
        )
    })
}

/// Nothing of a refused pull is left: no `pulled`, no temporary directory beside it.
fn assert_nothing_left(env: &Env, what: &str) {
    assert!(!env.path("pulled").exists(), "{what}: `pulled` was left");
    let temps: Vec<String> = std::fs::read_dir(env.root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(temps.is_empty(), "{what}: left {temps:?}");
}

fn pull_from(env: &Env, server: &hostile::Server, envs: &[(&str, &str)]) -> (bool, String) {
    let reference = format!("{}/labs/hostile:1.0", server.addr);
    let out = env.maporl_with(
        &["bundle", "pull", &reference, "--out", "pulled"],
        envs,
        None,
    );
    (out.status.success(), text(&out))
}

fn blob_requests(server: &hostile::Server) -> usize {
    server
        .requests()
        .iter()
        .filter(|(_, t)| t.contains("/blobs/"))
        .count()
}

#[test]
fn a_hostile_registrys_words_reach_the_terminal_escaped_and_cut_short() {
    let env = Env::new();
    let long = "A".repeat(30_000);
    let megabyte: Vec<u8> = HOSTILE_TEXT
        .as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(1 << 20)
        .collect();
    let (wasm, toml) = (b"\0asm not really".to_vec(), b"[bundle]\n".to_vec());
    let good = oci_manifest(&two_layers(&wasm, &toml));
    let with_layer =
        |media: &str, title: &str, digest: &str| oci_manifest(&[(media, title, digest.into(), 10)]);
    let mut bad_media: serde_json::Value = serde_json::from_slice(&good).unwrap();
    bad_media["mediaType"] = HOSTILE_TEXT.into();
    let mut bad_config: serde_json::Value = serde_json::from_slice(&good).unwrap();
    bad_config["config"]["mediaType"] = format!("{HOSTILE_TEXT}{long}").into();
    // (what, the registry, what the error must say, whether the server's text shows, escaped)
    let cases: Vec<(&str, hostile::Server, &str, bool)> = vec![
        (
            "an error body",
            hostile_registry(Answer::new(404, hostile::hostile_body(100_000)), |_| {
                Answer::new(404, "")
            }),
            "HTTP 404",
            true,
        ),
        (
            "a megabyte of escape sequences",
            hostile_registry(Answer::new(500, megabyte.clone()), |_| Answer::new(404, "")),
            "HTTP 500",
            true,
        ),
        (
            "a token server's error",
            registry_with_token_server(Answer::new(500, hostile::hostile_body(50_000))),
            "token server",
            true,
        ),
        (
            "a token server's error, unframed",
            registry_with_token_server(Answer::new(503, megabyte.clone()).unframed()),
            "token server",
            true,
        ),
        (
            "an unknown authentication scheme",
            hostile::Server::start({
                let long = long.clone();
                move |_| Answer::new(401, "").header("WWW-Authenticate", format!("X{long}"))
            }),
            "authentication",
            false,
        ),
        (
            "a bearer realm that is no URL",
            hostile::Server::start({
                let long = long.clone();
                move |_| {
                    Answer::new(401, "")
                        .header("WWW-Authenticate", format!("Bearer realm=\"{long}\""))
                }
            }),
            "is not a URL",
            false,
        ),
        (
            "the manifest's media type",
            registry_serving(serde_json::to_vec(&bad_media).unwrap(), vec![]),
            "media type",
            true,
        ),
        (
            "the config's media type",
            registry_serving(serde_json::to_vec(&bad_config).unwrap(), vec![]),
            "not a wasm artifact",
            true,
        ),
        (
            "a layer's title",
            registry_serving(
                with_layer(WASM_LAYER_MEDIA_TYPE, HOSTILE_TEXT, &digest_of(b"x")),
                vec![],
            ),
            "title annotation",
            true,
        ),
        (
            "a layer's media type",
            registry_serving(
                with_layer(&format!("{HOSTILE_TEXT}{long}"), "a.wasm", &digest_of(b"x")),
                vec![],
            ),
            "not a layer of a maporl bundle",
            true,
        ),
        (
            "a layer's digest",
            registry_serving(
                with_layer(
                    WASM_LAYER_MEDIA_TYPE,
                    "a.wasm",
                    &format!("sha256:{HOSTILE_TEXT}{long}"),
                ),
                vec![],
            ),
            "is not sha256",
            true,
        ),
        (
            "a Docker-Content-Digest header",
            hostile_registry(
                Answer::new(200, good.clone())
                    .header("Docker-Content-Digest", format!("sha256:{long}")),
                |_| Answer::new(404, ""),
            ),
            "the registry says sha256:AAAA",
            false,
        ),
        (
            "a blob's error body",
            hostile_registry(Answer::new(200, good.clone()), |_| {
                Answer::new(403, hostile::hostile_body(100_000))
            }),
            "HTTP 403",
            true,
        ),
    ];
    for (what, server, says, shown) in cases {
        let (ok, out) = pull_from(&env, &server, &[]);
        eprintln!("--- {what}:\n{out}");
        assert!(!ok, "{what}: the pull succeeded:\n{out}");
        assert!(out.contains(says), "{what}: no {says:?} in:\n{out}");
        hostile::assert_terminal_safe(&out, 3000);
        if shown {
            // Shown, escaped: not dropped.
            assert!(out.contains("\\u{1b}"), "{what}: {out}");
        }
        assert!(
            !out.contains(&"A".repeat(400)),
            "{what}: the text is not cut short:\n{out}"
        );
        assert_nothing_left(&env, what);
    }
}

#[test]
fn layers_and_manifests_over_their_declared_size_or_cap_are_refused_leaving_nothing() {
    use maporl::files::{COMPONENT_CAP_MAX, COMPONENT_MAX, TEXT_MAX};
    let env = Env::new();
    let toml = b"[bundle]\n".to_vec();
    let toml_layer = (
        BUNDLE_MANIFEST_MEDIA_TYPE,
        "bundle.toml",
        digest_of(&toml),
        toml.len() as u64,
    );
    fn fake(n: usize) -> String {
        format!("sha256:{:064x}", n + 1)
    }
    fn wasm_of(title: &str, size: u64, n: usize) -> (&'static str, &str, String, u64) {
        (WASM_LAYER_MEDIA_TYPE, title, fake(n), size)
    }
    let thousand: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let thousand_layers = two_layers(&thousand, &toml);
    let titles: Vec<String> = (0..300).map(|i| format!("c{i}.wasm")).collect();
    let many: Vec<_> = titles
        .iter()
        .enumerate()
        .map(|(i, t)| wasm_of(t, 10, i))
        .chain([toml_layer.clone()])
        .collect();
    let heavy: Vec<_> = titles[..17]
        .iter()
        .enumerate()
        .map(|(i, t)| wasm_of(t, COMPONENT_MAX, i))
        .chain([toml_layer.clone()])
        .collect();
    let no_size = {
        let mut v: serde_json::Value =
            serde_json::from_slice(&oci_manifest(&thousand_layers)).unwrap();
        v["layers"][0].as_object_mut().unwrap().remove("size");
        serde_json::to_vec(&v).unwrap()
    };
    let serve_thousand = |answer: Answer| {
        hostile_registry(
            Answer::new(200, oci_manifest(&thousand_layers)),
            move |_| answer.clone(),
        )
    };
    let ten_mib = vec![b'x'; 10 << 20];
    // (what, the registry, what the error must say, whether a blob may be asked for)
    let cases: Vec<(&str, hostile::Server, &str, bool)> = vec![
        (
            "a component over 1 GiB",
            registry_serving(
                oci_manifest(&[
                    wasm_of("a.wasm", COMPONENT_CAP_MAX + 1, 1),
                    toml_layer.clone(),
                ]),
                vec![],
            ),
            "over the limit of 1 GiB",
            false,
        ),
        (
            "a bundle.toml over 4 MiB",
            registry_serving(
                oci_manifest(&[(
                    BUNDLE_MANIFEST_MEDIA_TYPE,
                    "bundle.toml",
                    fake(2),
                    TEXT_MAX + 1,
                )]),
                vec![],
            ),
            "over the limit of 4 MiB",
            false,
        ),
        (
            "layers over 1 GiB together",
            registry_serving(oci_manifest(&heavy), vec![]),
            "over the limit of 1 GiB for a pull",
            false,
        ),
        (
            "300 layers",
            registry_serving(oci_manifest(&many), vec![]),
            "over the limit of 256",
            false,
        ),
        (
            "a layer with no size",
            registry_serving(no_size, vec![]),
            "declares no size",
            false,
        ),
        (
            "a blob announcing 10 MiB where 1000 bytes are declared",
            serve_thousand(Answer::new(200, ten_mib.clone())),
            "Content-Length",
            true,
        ),
        (
            "a blob sending 10 MiB, unframed, where 1000 bytes are declared",
            serve_thousand(Answer::new(200, ten_mib.clone()).unframed()),
            "more than the 1000 bytes",
            true,
        ),
        (
            "a blob one byte longer than declared, unframed",
            serve_thousand(Answer::new(200, [&thousand[..], b"!"].concat()).unframed()),
            "more than the 1000 bytes",
            true,
        ),
        (
            "a blob shorter than declared",
            serve_thousand(Answer::new(200, &thousand[..600]).unframed()),
            "ended after 600 of the 1000 bytes",
            true,
        ),
        (
            "a blob of the declared size with another digest",
            serve_thousand(Answer::new(200, vec![0u8; 1000])),
            "digest",
            true,
        ),
        (
            "a manifest announcing 5 MiB",
            hostile_registry(Answer::new(200, vec![b' '; 5 << 20]), |_| {
                Answer::new(404, "")
            }),
            "over the limit of 4 MiB",
            false,
        ),
        (
            "a manifest of 5 MiB, unframed",
            hostile_registry(Answer::new(200, vec![b' '; 5 << 20]).unframed(), |_| {
                Answer::new(404, "")
            }),
            "over the limit of 4 MiB",
            false,
        ),
    ];
    for (what, server, says, blobs_asked) in cases {
        let (ok, out) = pull_from(&env, &server, &[]);
        eprintln!("--- {what}:\n{out}");
        assert!(!ok, "{what}: the pull succeeded:\n{out}");
        assert!(out.contains(says), "{what}: no {says:?} in:\n{out}");
        if !blobs_asked {
            assert_eq!(
                blob_requests(&server),
                0,
                "{what}: refused only after downloading:\n{out}"
            );
        }
        hostile::assert_terminal_safe(&out, 3000);
        assert_nothing_left(&env, what);
    }
}

#[test]
#[cfg(target_os = "linux")]
fn a_large_layer_streams_to_disk_in_bounded_memory() {
    let env = Env::new();
    // Not a bundle.toml: the pull fails after the layer before it is in.
    let toml = b"this is [[ not toml".to_vec();
    let mut peak = Vec::new();
    for size in [1024usize, 48 << 20] {
        let wasm: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let manifest = oci_manifest(&two_layers(&wasm, &toml));
        let (wasm_digest, toml_body) = (digest_of(&wasm), toml.clone());
        // The second layer comes a while after the first, so the command lives on after
        // the large one is in, and its peak memory is read then.
        let server = hostile_registry(Answer::new(200, manifest), move |d| {
            if d == wasm_digest {
                Answer::new(200, wasm.clone())
            } else {
                Answer::new(200, toml_body.clone()).after(std::time::Duration::from_millis(300))
            }
        });
        let reference = format!("{}/labs/hostile:1.0", server.addr);
        let (out, bytes) = hostile::output_and_peak_memory(
            &mut env.command(&["bundle", "pull", &reference, "--out", "pulled"], &[]),
        );
        let out_text = text(&out);
        assert!(!out.status.success(), "{out_text}");
        assert!(out_text.contains("bundle.toml"), "{out_text}");
        assert_eq!(blob_requests(&server), 2, "both layers were downloaded");
        assert_nothing_left(&env, "a large layer");
        peak.push(bytes);
    }
    eprintln!(
        "peak resident memory of `maporl bundle pull`: {} MiB with a 1 KiB layer, {} MiB with a \
         48 MiB one",
        peak[0] >> 20,
        peak[1] >> 20
    );
    assert!(
        peak[1] < peak[0] + (16 << 20),
        "a 48 MiB layer raised the peak memory from {} to {} MiB: it was not streamed",
        peak[0] >> 20,
        peak[1] >> 20
    );
}

#[test]
fn a_trickling_registry_is_cut_off_at_the_whole_request_deadline() {
    use std::time::{Duration, Instant};
    let env = Env::new();
    let gap = Duration::from_millis(100);
    let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let toml = b"[bundle]\n".to_vec();
    let manifest = oci_manifest(&two_layers(&big, &toml));
    const DEADLINE: &str = "deadline of 2.";
    // (what trickles, the registry, what the error must say)
    let cases: Vec<(&str, hostile::Server, &str)> = vec![
        (
            "the manifest's status line and headers",
            hostile_registry(Answer::new(200, manifest.clone()).trickle_all(gap), |_| {
                Answer::new(404, "")
            }),
            DEADLINE,
        ),
        (
            "the manifest's body",
            hostile_registry(Answer::new(200, manifest.clone()).trickle_body(gap), |_| {
                Answer::new(404, "")
            }),
            DEADLINE,
        ),
        (
            // What arrived of the error body is shown; the rest never comes.
            "an error body",
            hostile_registry(
                Answer::new(404, hostile::hostile_body(10_000)).trickle_body(gap),
                |_| Answer::new(404, ""),
            ),
            "HTTP 404",
        ),
        (
            "the token server's answer",
            registry_with_token_server(
                Answer::new(200, r#"{"token": "t"}"#.repeat(100)).trickle_all(gap),
            ),
            DEADLINE,
        ),
        (
            "a layer",
            hostile_registry(Answer::new(200, manifest.clone()), move |_| {
                Answer::new(200, big.clone()).trickle_body(gap)
            }),
            "deadline of 2.1 s",
        ),
    ];
    let envs = [
        ("MAPORL_HTTP_TIMEOUT", "2"),
        ("MAPORL_HTTP_MIN_RATE", "1000000"),
    ];
    for (what, server, says) in cases {
        let started = Instant::now();
        let (ok, out) = pull_from(&env, &server, &envs);
        let took = started.elapsed();
        eprintln!("--- {what} ({took:?}):\n{out}");
        assert!(!ok, "{what}: the pull succeeded:\n{out}");
        assert!(out.contains(says), "{what}: no {says:?} in:\n{out}");
        if says.starts_with("deadline") {
            assert!(out.contains("MAPORL_HTTP_TIMEOUT=2"), "{what}: {out}");
        }
        // The deadline is 2 s (plus 0.1 s for the layer's 100 000 bytes); generous for a
        // loaded machine, far below the minute a trickle lasts.
        assert!(
            took < Duration::from_secs(20),
            "{what}: took {took:?}:\n{out}"
        );
        hostile::assert_terminal_safe(&out, 3000);
        assert_nothing_left(&env, what);
    }
}
