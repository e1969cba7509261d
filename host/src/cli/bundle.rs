//! `maporl bundle ...`: pack, inspect, verify, sign, install, list, remove, push and pull
//! plugin bundles.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use maporl::bundle::{
    self, oci, Manifest, NewBundle, SignatureFile, Store, Trust, TrustPolicy, TrustedKeys,
    MANIFEST, SIGNATURE,
};
use maporl::plugin::{printable, Runtime, RuntimeOptions};

#[derive(Subcommand)]
pub enum BundleCommand {
    /// Make DIR a bundle: inspect every component listed in DIR/bundle.toml (or, with
    /// --name and --version, every *.wasm in DIR) and fill in its world, sha256 and the
    /// bundle's WIT version.
    Pack {
        dir: PathBuf,
        #[command(flatten)]
        meta: PackMeta,
    },
    /// Show a bundle's manifest, components and signature (a directory, or an installed
    /// NAME[@VERSION-REQ]).
    Inspect {
        bundle: String,
        /// Print bundle.toml as JSON instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Check a bundle: each component's sha256, world, WIT version and that it links against
    /// this host; the manifest's WIT version; the signature and whether its key is trusted.
    Verify {
        bundle: String,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// Verify a bundle and install it into the local store.
    Install {
        dir: PathBuf,
        /// Replace an installed bundle of the same name and version.
        #[arg(long)]
        force: bool,
        /// Install although another key signed the installed releases of this name (the
        /// name is then bound to this bundle's signer).
        #[arg(long)]
        allow_signer_change: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        trust: TrustArgs,
    },
    /// List the installed bundles.
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove an installed bundle: NAME (its only version) or NAME@VERSION.
    Remove {
        spec: String,
        /// Remove every installed version of NAME.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Make an ed25519 key pair: PREFIX.key (secret, mode 0600) and PREFIX.pub.
    Keygen {
        /// The path prefix of the two files, e.g. keys/my-lab.
        #[arg(long)]
        out: PathBuf,
        /// A name for the key (shown to people who trust it).
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Sign a packed bundle's bundle.toml (which pins every component's sha256) with a
    /// secret key from `keygen`; writes bundle.toml.sig.
    Sign {
        dir: PathBuf,
        /// The secret key file (PREFIX.key).
        #[arg(long)]
        key: PathBuf,
    },
    /// Add a public key (PREFIX.pub) to the trusted-keys file.
    Trust {
        key: PathBuf,
        /// The name to trust it under (default: the key's own name).
        #[arg(long)]
        name: Option<String>,
        /// The trusted-keys file (default: $MAPORL_TRUSTED_KEYS, else
        /// ~/.config/maporl/trusted-keys.toml).
        #[arg(long)]
        trusted_keys: Option<PathBuf>,
    },
    /// Push a bundle (a directory, or an installed NAME[@VERSION-REQ]) to an OCI registry,
    /// e.g. `maporl bundle push localhost:5000/labs/arith:0.1.0 ./arith`. Without a tag,
    /// the bundle's version is the tag.
    Push {
        reference: String,
        bundle: String,
        #[command(flatten)]
        registry: RegistryArgs,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Pull a bundle from an OCI registry into a directory (checking every digest), verify
    /// it, and optionally install it.
    Pull {
        reference: String,
        /// Where to put it (default: ./REPOSITORY-NAME-TAG).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Install it into the store after verifying it.
        #[arg(long)]
        install: bool,
        /// With --install: replace an installed bundle of the same name and version.
        #[arg(long)]
        force: bool,
        /// With --install: install although another key signed the installed releases of
        /// this name.
        #[arg(long)]
        allow_signer_change: bool,
        #[command(flatten)]
        registry: RegistryArgs,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        trust: TrustArgs,
    },
}

#[derive(Args)]
pub struct PackMeta {
    /// The bundle's name (lower-case letters, digits, `-`, `_`).
    #[arg(long)]
    name: Option<String>,
    /// The bundle's semver version.
    #[arg(long)]
    version: Option<String>,
    /// A line saying what the bundle is for.
    #[arg(long)]
    description: Option<String>,
    /// An SPDX licence expression, e.g. Apache-2.0.
    #[arg(long, alias = "license")]
    licence: Option<String>,
    /// An author (repeatable).
    #[arg(long = "author")]
    authors: Vec<String>,
}

#[derive(Args)]
pub struct StoreArgs {
    /// The bundle store (default: $MAPORL_BUNDLES, else ~/.local/share/maporl/bundles).
    #[arg(long)]
    store: Option<PathBuf>,
}

#[derive(Args)]
pub struct TrustArgs {
    /// The trusted-keys file (default: $MAPORL_TRUSTED_KEYS, else
    /// ~/.config/maporl/trusted-keys.toml).
    #[arg(long)]
    trusted_keys: Option<PathBuf>,
    /// Accept a bundle that is unsigned or signed by an untrusted key.
    #[arg(long)]
    allow_unsigned: bool,
}

#[derive(Args)]
pub struct RegistryArgs {
    /// Plain HTTP to a registry that is not on loopback.
    #[arg(long)]
    insecure: bool,
    /// Log in to the registry as USER, the password (or access token) read from stdin with
    /// --password-stdin, else from $MAPORL_REGISTRY_PASSWORD. Without --user: the login in
    /// $MAPORL_REGISTRY_USER + $MAPORL_REGISTRY_PASSWORD, else in ~/.docker/config.json
    /// (`docker login`), else anonymous.
    #[arg(long)]
    user: Option<String>,
    /// Read the password for --user from stdin (one line).
    #[arg(long, requires = "user")]
    password_stdin: bool,
}

impl RegistryArgs {
    fn options(&self) -> anyhow::Result<oci::OciOptions> {
        let credentials = match &self.user {
            None => None,
            Some(user) => {
                let (password, source) = if self.password_stdin {
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .context("reading the registry password from stdin")?;
                    (
                        line.trim_end_matches(['\r', '\n']).to_string(),
                        "--user and --password-stdin",
                    )
                } else {
                    let p = std::env::var(oci::PASSWORD_ENV).with_context(|| {
                        format!(
                            "--user {user}: give the password on stdin with --password-stdin, \
                             or in {}",
                            oci::PASSWORD_ENV
                        )
                    })?;
                    (p, "--user and MAPORL_REGISTRY_PASSWORD")
                };
                Some(oci::Credentials {
                    user: user.clone(),
                    password,
                    source: source.to_string(),
                })
            }
        };
        Ok(oci::OciOptions {
            insecure: self.insecure,
            credentials,
            deadline: None,
        })
    }
}

impl StoreArgs {
    fn store(&self) -> Store {
        match &self.store {
            Some(dir) => Store::new(dir),
            None => Store::default_store(),
        }
    }

    /// A bundle directory, or an installed `NAME[@REQ]` (the highest matching version).
    fn locate(&self, bundle: &str) -> anyhow::Result<PathBuf> {
        let path = Path::new(bundle);
        if bundle::is_bundle_dir(path) {
            return Ok(path.to_path_buf());
        }
        let manifest = path.join(MANIFEST);
        if manifest.exists() {
            // There, but not a regular file (a FIFO, a device): say what it is.
            maporl::files::read_regular(&manifest, maporl::files::TEXT_MAX, "bundle manifest")?;
        }
        let (name, req) = bundle::split_name_version(bundle);
        let looks_installed = bundle::check_name("bundle", name).is_ok() && !path.exists();
        if !looks_installed {
            bail!(
                "{bundle} is not a bundle directory: {} does not exist (run `maporl bundle \
                 pack {bundle}` first)",
                manifest.display()
            );
        }
        let req = match req {
            None => semver::VersionReq::STAR,
            Some(r) => semver::VersionReq::parse(r)
                .with_context(|| format!("{bundle}: `{r}` is not a version requirement"))?,
        };
        let store = self.store();
        let found = store.find(name, &req).with_context(|| {
            format!("{bundle} is neither a bundle directory nor an installed bundle")
        })?;
        Ok(found.dir)
    }
}

impl TrustArgs {
    fn policy(&self) -> TrustPolicy {
        TrustPolicy {
            trusted_keys: self
                .trusted_keys
                .clone()
                .unwrap_or_else(bundle::default_trusted_keys),
            allow_unsigned: self.allow_unsigned,
        }
    }
}

fn runtime() -> anyhow::Result<Runtime> {
    Runtime::new(RuntimeOptions::default())
}

pub fn run(cmd: BundleCommand) -> anyhow::Result<()> {
    match cmd {
        BundleCommand::Pack { dir, meta } => {
            let new = NewBundle {
                name: meta.name,
                version: meta.version,
                description: meta.description,
                licence: meta.licence,
                authors: meta.authors,
            };
            let m = bundle::pack(&runtime()?, &dir, &new)
                .with_context(|| format!("cannot pack {}", dir.display()))?;
            println!(
                "packed {} in {} ({}, {} component{}):",
                m.id(),
                dir.display(),
                m.bundle.wit,
                m.components.len(),
                if m.components.len() == 1 { "" } else { "s" }
            );
            for c in &m.components {
                println!("  {:<16} {:<14} {}  {}", c.name, c.world, c.sha256, c.file);
            }
            println!(
                "unsigned: sign it with `maporl bundle sign {} --key KEY` (keys: `maporl bundle keygen`)",
                dir.display()
            );
            Ok(())
        }
        BundleCommand::Inspect {
            bundle,
            json,
            store,
            trust,
        } => {
            let dir = store.locate(&bundle)?;
            inspect(&dir, json, &trust.policy())
        }
        BundleCommand::Verify {
            bundle,
            store,
            trust,
        } => {
            let dir = store.locate(&bundle)?;
            let v = bundle::verify(&runtime()?, &dir, &trust.policy())?;
            print_verified(&v, &trust.policy());
            Ok(())
        }
        BundleCommand::Install {
            dir,
            force,
            allow_signer_change,
            store,
            trust,
        } => {
            let policy = trust.policy();
            let v = bundle::verify(&runtime()?, &dir, &policy)?;
            print_verified(&v, &policy);
            let store = store.store();
            let dest = store.install_with(&v, force, allow_signer_change)?;
            println!("installed {} into {}", v.manifest.id(), dest.display());
            Ok(())
        }
        BundleCommand::List { store } => {
            // The reference plugins every binary carries, under the names a run config gives.
            use maporl::plugin::builtin;
            println!(
                "built in  maporl {}  reference plugins (a run config names them bare: \
                 `debate`, `final-only.wasm`)",
                builtin::VERSION
            );
            for b in builtin::all() {
                println!("  {:<12} {:<13} {}", b.name, b.world.to_string(), b.sha256);
            }
            let store = store.store();
            let all = store.list()?;
            if all.is_empty() {
                println!("no bundles installed in {}", store.root.display());
            }
            for i in all {
                let m = &i.manifest;
                println!(
                    "{}  {}  {}{}",
                    m.id(),
                    if i.signed { "signed" } else { "unsigned" },
                    m.bundle.wit,
                    if m.bundle.description.is_empty() {
                        String::new()
                    } else {
                        format!("  {}", printable(&m.bundle.description))
                    }
                );
                println!("  signer {}", i.signer);
                for c in &m.components {
                    println!(
                        "  {}/{}@{}  {}  {}",
                        m.bundle.name, c.name, m.bundle.version, c.world, c.sha256
                    );
                }
            }
            Ok(())
        }
        BundleCommand::Remove { spec, all, store } => {
            let (name, version) = bundle::split_name_version(&spec);
            let removed = store.store().remove(name, version, all)?;
            for v in removed {
                println!("removed {name}@{v}");
            }
            Ok(())
        }
        BundleCommand::Keygen { out, name } => {
            let (secret, public, id) = bundle::keygen(&out, &name)?;
            println!(
                "key {id}: secret key {} (keep it private), public key {}",
                secret.display(),
                public.display()
            );
            println!(
                "sign with `maporl bundle sign DIR --key {}`; others trust it with \
                 `maporl bundle trust {}`",
                secret.display(),
                public.display()
            );
            Ok(())
        }
        BundleCommand::Sign { dir, key } => {
            let signing = bundle::read_signing_key(&key)?;
            let (manifest, bytes) = Manifest::read(&dir)?;
            // Sign only what is consistent: every component must have the hash it pins.
            for c in &manifest.components {
                bundle_check_hash(&dir, &c.file, &c.sha256).with_context(|| {
                    format!(
                        "refusing to sign {}: re-pack it (`maporl bundle pack`)",
                        dir.display()
                    )
                })?;
            }
            let sig = bundle::sign(&signing, &bytes);
            let path = dir.join(SIGNATURE);
            maporl::files::write_atomic(&path, sig.to_toml().as_bytes())?;
            println!(
                "signed {} with key {}: {}",
                manifest.id(),
                sig.key_id,
                path.display()
            );
            Ok(())
        }
        BundleCommand::Trust {
            key,
            name,
            trusted_keys,
        } => {
            let (public, key_name) = bundle::read_public_key(&key)?;
            let name = name.unwrap_or(key_name);
            let name = if name.is_empty() {
                bundle::key_id(&public)
            } else {
                name
            };
            let file = trusted_keys.unwrap_or_else(bundle::default_trusted_keys);
            if TrustedKeys::add(&file, &public, &name)? {
                println!(
                    "trusted key {} as {name} in {}",
                    bundle::key_id(&public),
                    file.display()
                );
            } else {
                println!(
                    "key {} is already trusted in {}",
                    bundle::key_id(&public),
                    file.display()
                );
            }
            Ok(())
        }
        BundleCommand::Push {
            reference,
            bundle,
            registry,
            store,
        } => {
            let r = oci::OciRef::parse(&reference)?;
            let dir = store.locate(&bundle)?;
            // Push only what verifies (the signature is checked if there is one, but an
            // unsigned bundle may be pushed: whoever installs it decides whom to trust).
            let policy = TrustPolicy {
                trusted_keys: bundle::default_trusted_keys(),
                allow_unsigned: true,
            };
            let v = bundle::verify(&runtime()?, &dir, &policy)?;
            if v.trust == Trust::Unsigned {
                tracing::warn!(
                    "{} is unsigned; others will need --allow-unsigned to use it",
                    v.manifest.id()
                );
            }
            let report = oci::push(&dir, &r, &registry.options()?)?;
            println!(
                "pushed {} to {} ({} layers, {} of {} blobs uploaded, {} bytes, {:.2} s)\ndigest: {}",
                v.manifest.id(),
                report.reference,
                report.layers,
                report.uploaded,
                report.blobs,
                report.bytes,
                report.seconds,
                report.digest
            );
            Ok(())
        }
        BundleCommand::Pull {
            reference,
            out,
            install,
            force,
            allow_signer_change,
            registry,
            store,
            trust,
        } => {
            let r = oci::OciRef::parse(&reference)?;
            let out = out.unwrap_or_else(|| {
                let last = r.repository.rsplit('/').next().unwrap_or("bundle");
                PathBuf::from(match &r.tag {
                    Some(t) => format!("{last}-{t}"),
                    None => last.to_string(),
                })
            });
            let report = oci::pull(&r, &out, &registry.options()?)?;
            println!(
                "pulled {r} into {}: {} files, {} bytes ({:.2} s)\ndigest: {}",
                out.display(),
                report.files.len(),
                report.bytes,
                report.seconds,
                report.digest
            );
            let policy = trust.policy();
            // What fails verification is not left where it could be used by mistake (the
            // pull made `out`, new or empty, for it).
            let v = match bundle::verify(&runtime()?, &out, &policy) {
                Ok(v) => v,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&out);
                    return Err(e.context(format!(
                        "pulled {r}, but it failed verification; {} was removed",
                        out.display()
                    )));
                }
            };
            print_verified(&v, &policy);
            if install {
                let dest = store.store().install_with(&v, force, allow_signer_change)?;
                println!("installed {} into {}", v.manifest.id(), dest.display());
            }
            Ok(())
        }
    }
}

fn bundle_check_hash(dir: &Path, file: &str, sha256: &str) -> anyhow::Result<()> {
    let path = dir.join(file);
    let bytes =
        maporl::files::read_regular(&path, maporl::files::COMPONENT_CAP_MAX, "bundle component")?;
    let actual = bundle::sha256_hex(&bytes);
    if actual != sha256 {
        bail!(
            "{}: sha256 is {actual}, but bundle.toml pins {sha256}",
            path.display()
        );
    }
    Ok(())
}

fn print_verified(v: &bundle::Verified, policy: &TrustPolicy) {
    println!(
        "ok: bundle {} ({}): {} component{}, {}, {}",
        v.manifest.id(),
        v.dir.display(),
        v.manifest.components.len(),
        if v.manifest.components.len() == 1 {
            ""
        } else {
            "s"
        },
        v.manifest.bundle.wit,
        v.trust
    );
    for (c, ins) in v.manifest.components.iter().zip(&v.inspections) {
        println!(
            "  {:<16} world {:<14} WIT {:<6} sha256 {} ok",
            c.name,
            c.world,
            ins.wit_version.as_deref().unwrap_or("?"),
            c.sha256
        );
    }
    if !matches!(v.trust, Trust::Trusted { .. }) {
        tracing::warn!(
            "{} is {}; accepted only because unsigned bundles are allowed \
             (trusted keys: {})",
            v.manifest.id(),
            v.trust,
            policy.trusted_keys.display()
        );
    }
}

fn inspect(dir: &Path, json: bool, policy: &TrustPolicy) -> anyhow::Result<()> {
    let (m, bytes) = Manifest::read(dir)?;
    let sig_path = dir.join(SIGNATURE);
    let signature = if sig_path.is_file() {
        match SignatureFile::read(&sig_path).and_then(|s| s.verify(&bytes)) {
            Ok(key) => {
                let trusted = TrustedKeys::read(&policy.trusted_keys)?;
                match trusted.find(&key) {
                    Some(name) => {
                        format!("valid, by key {} (trusted as {name})", bundle::key_id(&key))
                    }
                    None => format!(
                        "valid, by key {} (NOT in the trusted keys {})",
                        bundle::key_id(&key),
                        policy.trusted_keys.display()
                    ),
                }
            }
            Err(e) => format!("INVALID: {e:#}"),
        }
    } else {
        "none (unsigned)".to_string()
    };
    if json {
        let mut value = serde_json::to_value(&m)?;
        value["signature"] = signature.into();
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    let b = &m.bundle;
    println!("bundle:      {}", b.name);
    println!("version:     {}", b.version);
    // Free text from whoever packed the bundle: escaped for the terminal.
    println!("description: {}", printable(&b.description));
    println!("licence:     {}", printable(&b.licence));
    println!("authors:     {}", printable(&b.authors.join(", ")));
    println!("wit:         {}", b.wit);
    println!("signature:   {signature}");
    println!("components:");
    for c in &m.components {
        let read = maporl::files::read_regular(
            &dir.join(&c.file),
            maporl::files::COMPONENT_CAP_MAX,
            "bundle component",
        );
        let state = match read {
            Ok(data) if bundle::sha256_hex(&data) == c.sha256 => {
                format!("{} bytes, sha256 ok", data.len())
            }
            Ok(_) => "sha256 MISMATCH (changed after packing)".to_string(),
            Err(e) => format!("unreadable: {e:#}"),
        };
        println!(
            "  {}/{}@{}  world {}  file {}  ({state})",
            b.name, c.name, b.version, c.world, c.file
        );
        println!("    sha256 {}", c.sha256);
        if !c.settings.is_empty() {
            println!(
                "    default settings: {}",
                serde_json::to_string(&c.settings)?
            );
        }
    }
    Ok(())
}
