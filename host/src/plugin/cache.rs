//! The cache of compiled components, tamper-evident.
//!
//! Loading a cached `.cwasm` runs native code, so nothing may stand in for the component it
//! claims to be. The trust model:
//!
//! - The cache directory belongs to the user running maporl, who alone may write it: it is
//!   created with mode 0700, and a directory owned by someone else, or writable by group or
//!   others, is not used at all (components are then compiled in memory on every load, and
//!   the run says why once).
//! - Beside the entries lives a secret key, `cache.key`: 32 random bytes, mode 0600, made on
//!   first use (a key file owned by someone else, readable by others or of the wrong size
//!   makes the cache unusable, as above).
//! - Every entry carries an HMAC-SHA256 under that key over the source component's sha256,
//!   the engine's compatibility key and the compiled bytes. An entry whose MAC does not
//!   verify (planted, copied from another component's entry, truncated, made under another
//!   key) is never deserialized: the component is compiled again and the entry replaced.
//!
//! What this does not defend against: someone who can write as the user (they can change
//! the binary itself), or read the key (the same user).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const KEY_FILE: &str = "cache.key";
const MAC_LEN: usize = 32;

/// A usable cache directory and its key.
pub(crate) struct CompiledCache {
    dir: PathBuf,
    key: [u8; 32],
}

impl CompiledCache {
    /// Opens (creating if need be) the cache at `dir`; an error says why it cannot be
    /// trusted.
    pub(crate) fn open(dir: &Path) -> Result<CompiledCache, String> {
        create_private_dir(dir)?;
        check_private(dir, "directory")?;
        let key = read_or_make_key(&dir.join(KEY_FILE))?;
        Ok(CompiledCache {
            dir: dir.to_path_buf(),
            key,
        })
    }

    /// The entry's file for a component and engine.
    pub(crate) fn path(&self, source_sha256: &str, engine_key: &str) -> PathBuf {
        self.dir.join(format!("{source_sha256}-{engine_key}.cwasm"))
    }

    /// The compiled bytes cached for this component and engine, if an entry is there and
    /// its MAC verifies; a bad entry is removed.
    pub(crate) fn get(&self, source_sha256: &str, engine_key: &str) -> Option<Vec<u8>> {
        let path = self.path(source_sha256, engine_key);
        if !path.exists() {
            return None;
        }
        let verified = crate::files::read_regular(&path, crate::files::COMPILED_MAX, "cache entry")
            .ok()
            .and_then(|mut bytes| {
                let split = bytes.len().checked_sub(MAC_LEN)?;
                let mac = bytes.split_off(split);
                let expected = self.mac(source_sha256, engine_key, &bytes);
                constant_time_eq(&mac, &expected).then_some(bytes)
            });
        if verified.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        verified
    }

    /// Writes an entry atomically, MAC appended.
    pub(crate) fn put(
        &self,
        source_sha256: &str,
        engine_key: &str,
        bytes: &[u8],
    ) -> anyhow::Result<()> {
        let path = self.path(source_sha256, engine_key);
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(bytes)?;
        tmp.write_all(&self.mac(source_sha256, engine_key, bytes))?;
        tmp.persist(&path)?;
        Ok(())
    }

    fn mac(&self, source_sha256: &str, engine_key: &str, bytes: &[u8]) -> [u8; 32] {
        let mut message = Vec::with_capacity(bytes.len() + 128);
        message.extend_from_slice(b"maporl compiled component v1\0");
        message.extend_from_slice(source_sha256.as_bytes());
        message.push(0);
        message.extend_from_slice(engine_key.as_bytes());
        message.push(0);
        message.extend_from_slice(bytes);
        hmac_sha256(&self.key, &message)
    }
}

/// HMAC-SHA256 (RFC 2104) with a key of at most one block.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| -> [u8; 64] { block.map(|k| k ^ byte) };
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn create_private_dir(dir: &Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// Refuses a path owned by another user or open to group or others (writes; for the key,
/// reads too).
fn check_private(path: &Path, what: &str) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me {
            return Err(format!(
                "the cache {what} {} belongs to user {}, not to this user ({me})",
                path.display(),
                meta.uid()
            ));
        }
        let open_bits = if what == "key" { 0o077 } else { 0o022 };
        if meta.mode() & open_bits != 0 {
            return Err(format!(
                "the cache {what} {} has mode {:o}: others could {} it",
                path.display(),
                meta.mode() & 0o7777,
                if what == "key" {
                    "read or change"
                } else {
                    "write into"
                }
            ));
        }
        if what == "key" && !meta.is_file() {
            return Err(format!(
                "the cache key {} is not a regular file",
                path.display()
            ));
        }
    }
    Ok(())
}

fn read_or_make_key(path: &Path) -> Result<[u8; 32], String> {
    if !path.exists() {
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| format!("no randomness for the cache key: {e}"))?;
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        match options.open(path) {
            Ok(mut f) => f
                .write_all(&key)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
            // Another process made it first: read theirs.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
    }
    check_private(path, "key")?;
    let bytes = crate::files::read_regular(path, 64, "cache key").map_err(|e| format!("{e:#}"))?;
    bytes
        .try_into()
        .map_err(|_| format!("the cache key {} is not 32 bytes", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn entries_verify_only_for_their_component_engine_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("components");
        let cache = CompiledCache::open(&root).unwrap();
        cache.put("aaaa", "e1", b"compiled A").unwrap();
        assert_eq!(cache.get("aaaa", "e1").unwrap(), b"compiled A");
        // Another component's entry copied under this name: refused and removed.
        cache.put("bbbb", "e1", b"compiled B").unwrap();
        std::fs::copy(cache.path("bbbb", "e1"), cache.path("aaaa", "e1")).unwrap();
        assert!(cache.get("aaaa", "e1").is_none());
        assert!(!cache.path("aaaa", "e1").exists());
        // Planted bytes, a flipped byte, a truncation.
        std::fs::write(cache.path("aaaa", "e1"), b"native code").unwrap();
        assert!(cache.get("aaaa", "e1").is_none());
        let mut entry = std::fs::read(cache.path("bbbb", "e1")).unwrap();
        entry[0] ^= 1;
        std::fs::write(cache.path("bbbb", "e1"), &entry).unwrap();
        assert!(cache.get("bbbb", "e1").is_none());
        cache.put("cccc", "e1", b"C").unwrap();
        let entry = std::fs::read(cache.path("cccc", "e1")).unwrap();
        std::fs::write(cache.path("cccc", "e1"), &entry[..10]).unwrap();
        assert!(cache.get("cccc", "e1").is_none());
        // The key persists; a new key (another user's cache, a deleted key) verifies nothing.
        cache.put("dddd", "e1", b"D").unwrap();
        assert_eq!(
            CompiledCache::open(&root)
                .unwrap()
                .get("dddd", "e1")
                .unwrap(),
            b"D"
        );
        std::fs::remove_file(root.join(KEY_FILE)).unwrap();
        assert!(CompiledCache::open(&root)
            .unwrap()
            .get("dddd", "e1")
            .is_none());
    }

    #[test]
    #[cfg(unix)]
    fn a_cache_others_can_write_or_read_the_key_of_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("components");
        CompiledCache::open(&root).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&root), mode(&root.join(KEY_FILE))), (0o700, 0o600));
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = CompiledCache::open(&root).err().unwrap();
        assert!(
            err.contains("mode 777") && err.contains("write into"),
            "{err}"
        );
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::set_permissions(root.join(KEY_FILE), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let err = CompiledCache::open(&root).err().unwrap();
        assert!(
            err.contains("cache key") && err.contains("mode 644"),
            "{err}"
        );
    }
}
