//! `maporl bundle verify`: every check a bundle must pass before it is installed or run —
//! the manifest, the WIT version, each component's sha256 and world, and the signature
//! against the trusted keys.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::manifest::SIGNATURE;
use super::manifest::{sha256_hex, Manifest};
use super::sign::{key_id, SignatureFile, TrustedKeys};
use crate::plugin::{Inspection, Runtime, World};

/// Which bundles may be used: those signed by a key in `trusted_keys`, and unsigned or
/// untrusted ones only when `allow_unsigned` says so.
#[derive(Clone, Debug)]
pub struct TrustPolicy {
    pub trusted_keys: PathBuf,
    pub allow_unsigned: bool,
}

impl TrustPolicy {
    /// The default policy: the default trusted-keys file, unsigned bundles refused.
    pub fn default_policy() -> TrustPolicy {
        TrustPolicy {
            trusted_keys: super::default_trusted_keys(),
            allow_unsigned: false,
        }
    }
}

/// Who signed a bundle, as far as the policy is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Signed by a key of the trusted-keys file (its name there, its id).
    Trusted {
        name: String,
        key_id: String,
    },
    /// Signed correctly, by a key that is not trusted.
    Untrusted {
        key_id: String,
    },
    Unsigned,
}

impl std::fmt::Display for Trust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trust::Trusted { name, key_id } => write!(f, "signed by {name} (key {key_id})"),
            Trust::Untrusted { key_id } => write!(f, "signed by untrusted key {key_id}"),
            Trust::Unsigned => f.write_str("unsigned"),
        }
    }
}

/// A bundle that passed verification.
#[derive(Debug)]
pub struct Verified {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// The exact bytes of `bundle.toml`.
    pub manifest_bytes: Vec<u8>,
    pub trust: Trust,
    /// One per component, in manifest order (empty when the components were only hashed).
    pub inspections: Vec<Inspection>,
}

/// Checks the signature of `DIR/bundle.toml` and whether the policy accepts its signer.
/// A signature that does not match is refused whatever the policy says.
pub fn check_signature(
    dir: &Path,
    manifest_bytes: &[u8],
    policy: &TrustPolicy,
) -> anyhow::Result<Trust> {
    let sig_path = dir.join(SIGNATURE);
    let trust = if sig_path.is_file() {
        let sig = SignatureFile::read(&sig_path)?;
        let key = sig
            .verify(manifest_bytes)
            .with_context(|| format!("{}", sig_path.display()))?;
        let trusted = TrustedKeys::read(&policy.trusted_keys)?;
        match trusted.find(&key) {
            Some(name) => Trust::Trusted {
                name: name.to_string(),
                key_id: key_id(&key),
            },
            None => Trust::Untrusted {
                key_id: key_id(&key),
            },
        }
    } else {
        Trust::Unsigned
    };
    if !policy.allow_unsigned {
        match &trust {
            Trust::Trusted { .. } => {}
            Trust::Untrusted { key_id } => bail!(
                "bundle {} is signed by key {key_id}, which is not in the trusted keys ({}): \
                 add the signer's public key with `maporl bundle trust KEY.pub`, or allow \
                 untrusted bundles explicitly (--allow-unsigned; in a run config \
                 plugins.allow_unsigned = true)",
                dir.display(),
                policy.trusted_keys.display()
            ),
            Trust::Unsigned => bail!(
                "bundle {} is unsigned (no {SIGNATURE}): sign it with `maporl bundle sign`, or \
                 allow unsigned bundles explicitly (--allow-unsigned; in a run config \
                 plugins.allow_unsigned = true)",
                dir.display()
            ),
        }
    }
    Ok(trust)
}

/// Reads `DIR/<file>` and refuses it unless its sha256 is `expected`; returns the bytes'
/// hash.
pub fn check_hash(dir: &Path, file: &str, expected: &str) -> anyhow::Result<String> {
    let path = dir.join(file);
    // A bundle may hold components up to the most any run may raise its cap to; a run that
    // loads one holds it to its own `limits.max_component_mib`.
    let bytes =
        crate::files::read_regular(&path, crate::files::COMPONENT_CAP_MAX, "bundle component")?;
    let actual = sha256_hex(&bytes);
    if actual != expected {
        bail!(
            "{}: sha256 is {actual}, but bundle.toml pins {expected}: the component was changed \
             after the bundle was packed",
            path.display()
        );
    }
    Ok(actual)
}

/// The manifest's WIT version must be one this host runs.
pub fn check_wit(manifest: &Manifest) -> anyhow::Result<()> {
    let v = manifest.wit_version()?;
    crate::plugin::check_wit_version(
        &format!(
            "bundle {} (bundle.toml: wit = {:?})",
            manifest.id(),
            manifest.bundle.wit
        ),
        v,
    )
    .map_err(anyhow::Error::msg)
}

/// Every check: manifest, WIT version, signature and trust, each component's sha256, world,
/// WIT version and that it links against this host. Errors name the bundle, the component
/// and the reason.
pub fn verify(runtime: &Runtime, dir: &Path, policy: &TrustPolicy) -> anyhow::Result<Verified> {
    let fail = |e: anyhow::Error| e.context(format!("bundle {} refused", dir.display()));
    let (manifest, manifest_bytes) = Manifest::read(dir).map_err(fail)?;
    // The signature first: whatever else is wrong, a manifest edited after signing is told
    // as such.
    let trust = check_signature(dir, &manifest_bytes, policy).map_err(fail)?;
    check_wit(&manifest).map_err(fail)?;
    let mut inspections = Vec::new();
    for c in &manifest.components {
        let what = format!("component `{}` ({})", c.name, c.file);
        check_hash(dir, &c.file, &c.sha256)
            .with_context(|| what.clone())
            .map_err(fail)?;
        let world = World::parse(&c.world).expect("checked when parsed");
        let ins = runtime
            .check(&dir.join(&c.file), world)
            .map_err(|e| anyhow::anyhow!("{what}: {}", e.failure))
            .map_err(fail)?;
        if c.source_sha256.is_some() && c.source_sha256 != ins.source_sha256 {
            return Err(fail(anyhow::anyhow!(
                "{what}: bundle.toml says it was built from source sha256 {}, but the \
                 component declares {}",
                c.source_sha256.as_deref().unwrap_or_default(),
                ins.source_sha256.as_deref().unwrap_or("none")
            )));
        }
        inspections.push(ins);
    }
    Ok(Verified {
        dir: dir.to_path_buf(),
        manifest,
        manifest_bytes,
        trust,
        inspections,
    })
}
