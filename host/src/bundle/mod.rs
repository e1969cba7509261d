//! Plugin bundles: a set of components plus a `bundle.toml` manifest (name, version,
//! description, licence, authors, WIT version; per component its file, world, sha256 and
//! default settings), optionally signed with ed25519 over the manifest, which pins every
//! component's hash.
//!
//! - [`pack`] fills in a manifest from the components; [`verify`] checks hashes, worlds,
//!   the WIT version and the signature against a [`TrustPolicy`];
//! - a [`Store`] holds installed bundles (`<root>/<name>/<version>/`);
//! - run configs name a plugin as `bundle/component@version-req` ([`resolve_plugin`]), and a
//!   run's [`PluginLock`] pins what was used ([`check_lock`] refuses to resume with other
//!   plugins);
//! - [`oci`] pushes and pulls bundles to and from OCI registries.

mod lock;
mod manifest;
pub mod oci;
mod reference;
mod sign;
mod store;
mod verify;

use std::path::PathBuf;

pub use lock::{check_lock, LockedCheckpoint, LockedPlugin, PluginLock, LOCK_FILE};
pub use manifest::{
    check_name, pack, parse_wit, sha256_hex, BundleInfo, ComponentEntry, Manifest, NewBundle,
    MANIFEST, SIGNATURE,
};
pub use reference::{
    config_policy, config_store, resolve_plugin, resolve_plugins, Reference, ResolvedBundle,
    ResolvedPlugin,
};
pub use sign::{
    key_id, keygen, read_public_key, read_signing_key, sign, SignatureFile, TrustedKey, TrustedKeys,
};
pub use store::{
    by_precedence, is_bundle_dir, signer_of, split_name_version, Installed, Store, UNSIGNED,
};
pub use verify::{check_signature, verify, Trust, TrustPolicy, Verified};

/// `$MAPORL_BUNDLES`, else `<data dir>/maporl/bundles` (`~/.local/share/maporl/bundles` on
/// Linux).
pub fn default_store_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("MAPORL_BUNDLES") {
        return PathBuf::from(dir);
    }
    data_dir().join("bundles")
}

/// `$MAPORL_TRUSTED_KEYS`, else `<config dir>/maporl/trusted-keys.toml`
/// (`~/.config/maporl/trusted-keys.toml` on Linux).
pub fn default_trusted_keys() -> PathBuf {
    if let Some(file) = std::env::var_os("MAPORL_TRUSTED_KEYS") {
        return PathBuf::from(file);
    }
    dirs::config_dir()
        .map(|d| d.join("maporl"))
        .unwrap_or_else(data_dir)
        .join("trusted-keys.toml")
}

fn data_dir() -> PathBuf {
    dirs::data_dir()
        .map(|d| d.join("maporl"))
        .unwrap_or_else(|| PathBuf::from(".maporl"))
}
