//! Reading the files a user points maporl at, or that arrive in a directory someone sent:
//! only regular files, and never more than a stated size. A device (`/dev/zero`), a FIFO
//! (whose open or read would block for ever), a socket or a directory is refused with an
//! error naming it and what it is; a file over its limit is refused before it is read.
//!
//! | what | limit |
//! |---|---|
//! | plugin components (`.wasm`) | a run's plugin: [`COMPONENT_MAX`] = 64 MiB, or its `limits.max_component_mib` (at most [`COMPONENT_CAP_MAX`] = 1 GiB); in a bundle (packed, verified, pulled), [`COMPONENT_CAP_MAX`]: the run that loads it still holds it to its limit |
//! | compiled-component cache entries (`.cwasm`) | [`COMPILED_MAX`] = 512 MiB |
//! | run configs, bundle manifests and signatures, lock and key files | [`TEXT_MAX`] = 4 MiB |
//! | datasets and verifier data (JSONL, CSV) | [`DATASET_MAX`] = 2 GiB |
//!
//! Also the filesystem helpers every module uses: [`write_atomic`] (a file is replaced
//! whole or not at all) and [`expand_home`] (`~/` in paths from configs).

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// Largest plugin component read by default (a run's plugins: `limits.max_component_mib`).
pub const COMPONENT_MAX: u64 = 64 << 20;
/// The most `limits.max_component_mib` may raise a run's plugin component to; also what
/// `maporl plugin check` and `inspect` read.
pub const COMPONENT_CAP_MAX: u64 = 1 << 30;
/// Largest compiled component read back from the cache.
pub const COMPILED_MAX: u64 = 512 << 20;
/// Largest config, manifest, signature, lock or key file read.
pub const TEXT_MAX: u64 = 4 << 20;
/// Largest tokenizer.json read (the largest vocabularies' are some tens of MiB).
pub const TOKENIZER_MAX: u64 = 256 << 20;
/// Largest dataset read.
pub const DATASET_MAX: u64 = 2 << 30;

/// The bytes of the regular file at `path` (symbolic links followed), at most `max` of
/// them; `what` names the file's role in errors ("plugin component", "run config").
pub fn read_regular(path: &Path, max: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let mut file = open_regular(path, max, what)?;
    let len = file.get_ref().metadata().map(|m| m.len()).unwrap_or(0);
    // One byte past `max`, so that a file grown since the check is refused, not cut.
    file.set_limit(max + 1);
    let mut bytes = Vec::with_capacity(len.min(max) as usize);
    file.read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    check_size(path, bytes.len() as u64, max, what)?;
    Ok(bytes)
}

/// The regular file at `path` opened for reading (checked as [`read_regular`] checks it,
/// and read through a reader that stops at `max` bytes), for files read a line at a time.
pub fn open_regular(
    path: &Path,
    max: u64,
    what: &str,
) -> anyhow::Result<std::io::Take<std::fs::File>> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    check_kind(path, &meta, what)?;
    check_size(path, meta.len(), max, what)?;
    let file =
        open_nonblocking(path).with_context(|| format!("cannot open {what} {}", path.display()))?;
    // What was opened is what is read: the path may have been swapped since the check.
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {what} {}", path.display()))?;
    check_kind(path, &meta, what)?;
    check_size(path, meta.len(), max, what)?;
    Ok(file.take(max))
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max: u64, what: &str) -> anyhow::Result<String> {
    String::from_utf8(read_regular(path, max, what)?)
        .map_err(|e| anyhow::anyhow!("{what} {} is not UTF-8 text: {e}", path.display()))
}

/// Opens for reading without blocking on a FIFO (which [`check_kind`] refuses anyway).
fn open_nonblocking(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

fn check_kind(path: &Path, meta: &std::fs::Metadata, what: &str) -> anyhow::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let kind = kind_of(&meta.file_type());
    bail!(
        "{what} {} is {kind}, not a regular file; maporl reads only regular files",
        path.display()
    )
}

fn kind_of(t: &std::fs::FileType) -> &'static str {
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

fn check_size(path: &Path, len: u64, max: u64, what: &str) -> anyhow::Result<()> {
    if len > max {
        bail!(
            "{what} {} is {} bytes, over the limit of {} bytes ({} MiB) for a {what}",
            path.display(),
            len,
            max,
            max >> 20
        );
    }
    Ok(())
}

/// `~/x` -> `$HOME/x`.
pub fn expand_home(path: &str) -> PathBuf {
    match (path.strip_prefix("~/"), dirs::home_dir()) {
        (Some(rest), Some(home)) => home.join(rest),
        _ => PathBuf::from(path),
    }
}

/// Writes `text` to `path` atomically: a temp file in the same directory, then a rename.
pub fn write_atomic(path: &Path, text: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    std::io::Write::write_all(&mut tmp, text)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn atomic_writes_replace_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/config.toml");
        write_atomic(&path, b"a = 1\n").unwrap();
        write_atomic(&path, b"a = 2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a = 2\n");
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1,
            "no temp files left"
        );
    }

    use super::*;

    #[test]
    #[cfg(unix)]
    fn regular_files_within_the_limit_are_read_and_nothing_else_is() {
        let dir = tempfile::tempdir().unwrap();
        let ok = dir.path().join("ok.toml");
        std::fs::write(&ok, b"seed = 1\n").unwrap();
        assert_eq!(read_regular(&ok, 100, "run config").unwrap(), b"seed = 1\n");
        assert_eq!(
            read_regular_text(&ok, 9, "run config").unwrap(),
            "seed = 1\n"
        );
        // One byte over.
        let err = read_regular(&ok, 8, "run config").unwrap_err().to_string();
        assert!(err.contains("9 bytes, over the limit of 8"), "{err}");
        // A large sparse file is refused before a byte is read.
        let big = dir.path().join("big.wasm");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(COMPONENT_MAX + 1)
            .unwrap();
        let err = read_regular(&big, COMPONENT_MAX, "plugin component")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("plugin component") && err.contains("64 MiB"),
            "{err}"
        );
        // Not regular: a directory, a character device, a link to one, a FIFO (which would
        // block an open for ever).
        let link = dir.path().join("zero.wasm");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let fifo = dir.path().join("fifo.wasm");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for (path, kind) in [
            (dir.path().to_path_buf(), "a directory"),
            ("/dev/zero".into(), "a character device"),
            (link, "a character device"),
            (fifo, "a FIFO"),
        ] {
            let err = read_regular(&path, COMPONENT_MAX, "plugin component")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(kind) && err.contains(&path.display().to_string()),
                "{err}"
            );
        }
        let err = read_regular(&dir.path().join("absent"), 10, "run config").unwrap_err();
        assert!(format!("{err:#}").contains("absent"), "{err:#}");
    }
}
