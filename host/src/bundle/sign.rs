//! Signatures: ed25519 over the exact bytes of `bundle.toml`, which pins every component's
//! sha256; key pairs (`maporl bundle keygen`); the trusted-keys file.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::manifest::sha256_hex;

/// `bundle.toml.sig`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureFile {
    /// Always "ed25519".
    pub algorithm: String,
    /// The signer's public key, hex (32 bytes).
    pub public_key: String,
    /// The signer's key id (see [`key_id`]), to look it up in a trusted-keys file.
    pub key_id: String,
    /// sha256 of the signed `bundle.toml`, hex (for people; the signature is what counts).
    pub manifest_sha256: String,
    /// The ed25519 signature of the bytes of `bundle.toml`, hex (64 bytes).
    pub signature: String,
}

/// A key file written by `keygen`: the secret one holds both halves.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFile {
    pub algorithm: String,
    #[serde(default)]
    pub name: String,
    pub key_id: String,
    pub public_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key: Option<String>,
}

/// The trusted-keys file: `[[key]]` entries with a name and a public key.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedKeys {
    #[serde(rename = "key", default)]
    pub keys: Vec<TrustedKey>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedKey {
    pub name: String,
    /// hex (32 bytes).
    pub public_key: String,
}

/// The first 16 hex digits of the sha256 of the public key.
pub fn key_id(public: &VerifyingKey) -> String {
    sha256_hex(public.as_bytes())[..16].to_string()
}

fn parse_public(hex_key: &str) -> anyhow::Result<VerifyingKey> {
    let bytes: [u8; 32] = hex::decode(hex_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("public key {hex_key:?} is not 64 hex digits"))?;
    VerifyingKey::from_bytes(&bytes)
        .map_err(|e| anyhow::anyhow!("public key {hex_key:?} is not a valid ed25519 key: {e}"))
}

/// Makes a key pair from the OS's randomness; writes `PREFIX.key` (secret, mode 0600) and
/// `PREFIX.pub`. Refuses to overwrite either.
pub fn keygen(prefix: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf, String)> {
    let secret_path = with_suffix(prefix, "key");
    let public_path = with_suffix(prefix, "pub");
    for p in [&secret_path, &public_path] {
        if p.exists() {
            bail!(
                "{} exists; keygen does not overwrite keys (remove it, or choose another --out)",
                p.display()
            );
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed)
        .map_err(|e| anyhow::anyhow!("no randomness from the operating system: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    let public = key.verifying_key();
    let id = key_id(&public);
    let mut file = KeyFile {
        algorithm: "ed25519".into(),
        name: name.to_string(),
        key_id: id.clone(),
        public_key: hex::encode(public.as_bytes()),
        secret_key: Some(hex::encode(seed)),
    };
    if let Some(dir) = secret_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    write_private(
        &secret_path,
        &format!(
            "# maporl bundle signing key: SECRET, keep it to yourself\n{}",
            toml::to_string(&file)?
        ),
    )?;
    file.secret_key = None;
    std::fs::write(
        &public_path,
        format!(
            "# maporl bundle public key: give it to whoever installs your bundles\n\
             # (`maporl bundle trust {}`)\n{}",
            public_path.display(),
            toml::to_string(&file)?
        ),
    )
    .with_context(|| format!("writing {}", public_path.display()))?;
    Ok((secret_path, public_path, id))
}

fn with_suffix(prefix: &Path, ext: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(".");
    s.push(ext);
    PathBuf::from(s)
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn read_key_file(path: &Path) -> anyhow::Result<KeyFile> {
    let text = crate::files::read_regular_text(path, crate::files::TEXT_MAX, "key file")?;
    let file: KeyFile = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("key file {} is not a maporl key", path.display()))?;
    if file.algorithm != "ed25519" {
        bail!(
            "key file {}: algorithm {:?}, expected \"ed25519\"",
            path.display(),
            file.algorithm
        );
    }
    Ok(file)
}

/// Reads a secret key written by [`keygen`].
pub fn read_signing_key(path: &Path) -> anyhow::Result<SigningKey> {
    let file = read_key_file(path)?;
    let secret = file.secret_key.with_context(|| {
        format!(
            "{} holds no secret key (is it the .pub file? sign with the .key file)",
            path.display()
        )
    })?;
    let seed: [u8; 32] = hex::decode(&secret)
        .ok()
        .and_then(|b| b.try_into().ok())
        .with_context(|| format!("{}: secret_key is not 64 hex digits", path.display()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Reads a public key file (`.pub`; a `.key` file works too).
pub fn read_public_key(path: &Path) -> anyhow::Result<(VerifyingKey, String)> {
    let file = read_key_file(path)?;
    let key = parse_public(&file.public_key).with_context(|| path.display().to_string())?;
    Ok((key, file.name))
}

/// Signs the bytes of a manifest.
pub fn sign(key: &SigningKey, manifest: &[u8]) -> SignatureFile {
    let public = key.verifying_key();
    SignatureFile {
        algorithm: "ed25519".into(),
        public_key: hex::encode(public.as_bytes()),
        key_id: key_id(&public),
        manifest_sha256: sha256_hex(manifest),
        signature: hex::encode(key.sign(manifest).to_bytes()),
    }
}

impl SignatureFile {
    pub fn read(path: &Path) -> anyhow::Result<SignatureFile> {
        let text = crate::files::read_regular_text(path, crate::files::TEXT_MAX, "signature")?;
        toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("{} is not a maporl bundle signature", path.display()))
    }

    pub fn to_toml(&self) -> String {
        format!(
            "# ed25519 signature of the exact bytes of bundle.toml\n{}",
            toml::to_string(self).expect("a signature serializes")
        )
    }

    /// Checks the signature against `manifest`; returns the signer's key.
    pub fn verify(&self, manifest: &[u8]) -> anyhow::Result<VerifyingKey> {
        if self.algorithm != "ed25519" {
            bail!(
                "signature algorithm {:?} is not supported (only ed25519)",
                self.algorithm
            );
        }
        let key = parse_public(&self.public_key)?;
        if key_id(&key) != self.key_id {
            bail!(
                "the signature's key_id {} is not the id of its public key ({})",
                self.key_id,
                key_id(&key)
            );
        }
        let bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .context("the signature is not 128 hex digits")?;
        let sig = Signature::from_bytes(&bytes);
        key.verify(manifest, &sig).map_err(|_| {
            let now = sha256_hex(manifest);
            if now != self.manifest_sha256 {
                anyhow::anyhow!(
                    "the signature does not match bundle.toml: the manifest was changed after \
                     it was signed (signed sha256 {}, now {now})",
                    self.manifest_sha256
                )
            } else {
                anyhow::anyhow!(
                    "the signature does not match bundle.toml: the signature itself is corrupt \
                     or was forged"
                )
            }
        })?;
        Ok(key)
    }
}

impl TrustedKeys {
    /// Reads the trusted-keys file; a missing file trusts no key.
    pub fn read(path: &Path) -> anyhow::Result<TrustedKeys> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TrustedKeys::default()),
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot read trusted keys {}", path.display()))
            }
        };
        let keys: TrustedKeys = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("in trusted keys {}", path.display()))?;
        for k in &keys.keys {
            parse_public(&k.public_key)
                .with_context(|| format!("in trusted keys {}: key {:?}", path.display(), k.name))?;
        }
        Ok(keys)
    }

    /// The name under which `key` is trusted, if it is.
    pub fn find(&self, key: &VerifyingKey) -> Option<&str> {
        let hex_key = hex::encode(key.as_bytes());
        self.keys
            .iter()
            .find(|k| k.public_key.eq_ignore_ascii_case(&hex_key))
            .map(|k| k.name.as_str())
    }

    /// Adds `key` under `name` to the file at `path` (created if missing); false when it
    /// was already there.
    pub fn add(path: &Path, key: &VerifyingKey, name: &str) -> anyhow::Result<bool> {
        let mut keys = TrustedKeys::read(path)?;
        if keys.find(key).is_some() {
            return Ok(false);
        }
        keys.keys.push(TrustedKey {
            name: name.to_string(),
            public_key: hex::encode(key.as_bytes()),
        });
        let text = format!(
            "# Public keys whose signed bundles maporl installs and runs.\n{}",
            toml::to_string_pretty(&keys)?
        );
        crate::files::write_atomic(path, text.as_bytes())?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_tamper() {
        let dir = tempfile::tempdir().unwrap();
        let (secret, public, id) = keygen(&dir.path().join("lab"), "lab").unwrap();
        let key = read_signing_key(&secret).unwrap();
        let (pubkey, name) = read_public_key(&public).unwrap();
        assert_eq!(name, "lab");
        assert_eq!(key_id(&pubkey), id);
        assert!(read_signing_key(&public).is_err(), "the .pub has no secret");
        let sig = sign(&key, b"manifest");
        let again: SignatureFile = toml::from_str(&sig.to_toml()).unwrap();
        assert_eq!(again.verify(b"manifest").unwrap(), pubkey);
        let err = again.verify(b"manifesT").unwrap_err().to_string();
        assert!(err.contains("changed after it was signed"), "{err}");
        let mut forged = again.clone();
        forged.signature.replace_range(0..2, "00");
        if forged.signature != again.signature {
            let err = forged.verify(b"manifest").unwrap_err().to_string();
            assert!(err.contains("corrupt"), "{err}");
        }
        assert!(keygen(&dir.path().join("lab"), "lab")
            .unwrap_err()
            .to_string()
            .contains("does not overwrite"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&secret).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn trusted_keys_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trusted.toml");
        assert!(TrustedKeys::read(&path).unwrap().keys.is_empty());
        let key = SigningKey::from_bytes(&[7; 32]).verifying_key();
        assert!(TrustedKeys::add(&path, &key, "seven").unwrap());
        assert!(!TrustedKeys::add(&path, &key, "seven").unwrap());
        let keys = TrustedKeys::read(&path).unwrap();
        assert_eq!(keys.find(&key), Some("seven"));
        let other = SigningKey::from_bytes(&[8; 32]).verifying_key();
        assert_eq!(keys.find(&other), None);
    }
}
