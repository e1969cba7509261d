//! `maporl data fetch`: downloads GSM8K and ANLI from their public sources (or a mirror with
//! the same paths), checks every file against its known sha256, and writes it atomically
//! (a temp file in the target directory, verified, then renamed), so an interrupted or
//! corrupt download never leaves a file behind. Files already present with the right hash
//! are not downloaded again. Progress goes to stderr.
//!
//! The host (or mirror) is treated as hostile ([`crate::net`]): a GSM8K file must be exactly
//! its pinned size and the ANLI zip at most [`ANLI_ZIP_MAX`] bytes, checked against the
//! announced `Content-Length` before a byte is written and enforced while streaming (the
//! body is never read past it); the sha256 is computed on the way; every request has a
//! whole-request deadline (`MAPORL_HTTP_TIMEOUT`, plus the file's size at
//! `MAPORL_HTTP_MIN_RATE`); an error body reaches the message escaped and cut short.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};
use tempfile::NamedTempFile;

use crate::net::{self, size_words, Deadline};

/// The datasets [`fetch`] knows.
pub const FETCH_DATASETS: &[&str] = &["gsm8k", "anli"];

/// Environment variable with a mirror base URL (same paths as the public hosts).
pub const MIRROR_ENV: &str = "MAPORL_DATA_MIRROR";

const GSM8K_HOST: &str = "https://raw.githubusercontent.com";
const GSM8K_PATH: &str = "/openai/grade-school-math/master/grade_school_math/data/";
/// (file, sha256, size in bytes) from the upstream repository at commit 3101c7d5.
const GSM8K_FILES: &[(&str, &str, u64)] = &[
    (
        "train.jsonl",
        "17f347dc51477c50d4efb83959dbb7c56297aba886e5544ee2aaed3024813465",
        4_166_206,
    ),
    (
        "test.jsonl",
        "3730d312f6e3440559ace48831e51066acaca737f6eabec99bccb9e4b3c39d14",
        749_738,
    ),
];

const ANLI_HOST: &str = "https://dl.fbaipublicfiles.com";
const ANLI_PATH: &str = "/anli/anli_v1.0.zip";
const ANLI_ZIP_ROOT: &str = "anli_v1.0";
/// The largest ANLI zip downloaded (the real one is under 20 MB).
pub const ANLI_ZIP_MAX: u64 = 256 << 20;
/// (round/split, sha256 when known). Train splits have no pinned hash: they are accepted,
/// their hashes printed and recorded in `anli/SHA256SUMS`.
const ANLI_FILES: &[(&str, Option<&str>)] = &[
    (
        "R1/dev",
        Some("4d6a01499b91046be7aa9daf1d1e716261b0c08698962b23389477c8400064e2"),
    ),
    (
        "R1/test",
        Some("11b257c63a3caa825b80ac86b6d895407c62616d56036482344344099e7d3fa5"),
    ),
    ("R1/train", None),
    (
        "R2/dev",
        Some("7b90cd9c9cb7d8ff12bc31257a56bf219718704c5798faf3b295b9e94b14b889"),
    ),
    (
        "R2/test",
        Some("804dbe173fbe08e6e069db8811016ebe5e065dfd1c47ed741dac6d8816f4fadc"),
    ),
    ("R2/train", None),
    (
        "R3/dev",
        Some("42eca71392a3c90ee0dc83bb2cedb45165279f903a9c706bf11337be11c469bd"),
    ),
    (
        "R3/test",
        Some("fe456c2935f71d7ffe49bd8d95c2b2355f7383f72423c3018fa40479992f0004"),
    ),
    ("R3/train", None),
];
/// Lists what the last ANLI extraction wrote, in `sha256sum` format.
const ANLI_MANIFEST: &str = "SHA256SUMS";
/// Refuse zip members that inflate past this (the largest real one, R3 train, is ~70 MB).
const MAX_MEMBER_BYTES: u64 = 1 << 30;

/// Downloads `dataset` ("gsm8k" or "anli") into `dir/<dataset>/`, verifies the sha256 of
/// every file with a known hash, checks that each file parses, and returns the dataset's
/// files. `base_url` (else the `MAPORL_DATA_MIRROR` environment variable) replaces the
/// scheme and host of the public URLs, keeping their paths.
pub fn fetch(dataset: &str, dir: &Path, base_url: Option<&str>) -> anyhow::Result<Vec<PathBuf>> {
    let mirror = match base_url {
        Some(url) => Some(url.to_string()),
        None => std::env::var(MIRROR_ENV).ok().filter(|s| !s.is_empty()),
    };
    let host = |public: &str| {
        mirror
            .as_deref()
            .unwrap_or(public)
            .trim_end_matches('/')
            .to_string()
    };
    let deadline = Deadline::from_env()?;
    let files = match dataset {
        "gsm8k" => fetch_gsm8k(&dir.join("gsm8k"), &host(GSM8K_HOST), &deadline)?,
        "anli" => fetch_anli(&dir.join("anli"), &host(ANLI_HOST), &deadline)?,
        other => bail!(
            "unknown dataset {other:?}; known: {}",
            FETCH_DATASETS.join(", ")
        ),
    };
    for path in &files {
        let tasks = match dataset {
            "gsm8k" => super::gsm8k(path)?,
            _ => super::anli(path)?,
        };
        tracing::info!("{}: {} records", path.display(), tasks.len());
    }
    Ok(files)
}

fn fetch_gsm8k(dir: &Path, host: &str, deadline: &Deadline) -> anyhow::Result<Vec<PathBuf>> {
    create_dir(dir)?;
    let mut files = Vec::new();
    for &(name, expected, size) in GSM8K_FILES {
        let dest = dir.join(name);
        if matches_hash(&dest, expected)? {
            tracing::info!("{}: present, sha256 ok", dest.display());
        } else {
            let url = format!("{host}{GSM8K_PATH}{name}");
            let (tmp, actual) = download(&url, dir, Size::Exactly(size), deadline)?;
            check_hash(&dest, &url, expected, &actual)?;
            persist(tmp, &dest)?;
            tracing::info!("{}: downloaded, sha256 ok", dest.display());
        }
        files.push(dest);
    }
    Ok(files)
}

fn fetch_anli(dir: &Path, host: &str, deadline: &Deadline) -> anyhow::Result<Vec<PathBuf>> {
    create_dir(dir)?;
    if let Some(files) = anli_present(dir)? {
        tracing::info!("{}: present, sha256 ok", dir.display());
        return Ok(files);
    }
    let url = format!("{host}{ANLI_PATH}");
    let (zip_file, _) = download(&url, dir, Size::AtMost(ANLI_ZIP_MAX), deadline)?;
    let mut archive = zip::ZipArchive::new(
        File::open(zip_file.path()).with_context(|| format!("reopening download of {url}"))?,
    )
    .with_context(|| format!("{url} is not a readable zip archive"))?;

    // Extract everything to temp files and verify it all before renaming any of it.
    let mut extracted = Vec::new();
    for &(split, expected) in ANLI_FILES {
        let member = format!("{ANLI_ZIP_ROOT}/{split}.jsonl");
        let mut entry = match archive.by_name(&member) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) if expected.is_none() => continue,
            Err(zip::result::ZipError::FileNotFound) => bail!("{url}: the zip has no {member}"),
            Err(e) => return Err(e).with_context(|| format!("{url}: reading {member}")),
        };
        let dest = dir.join(format!("{split}.jsonl"));
        let parent = dest.parent().expect("split paths have a round directory");
        create_dir(parent)?;
        let mut tmp = temp_in(parent)?;
        let mut hasher = Sha256::new();
        let mut limited = (&mut entry).take(MAX_MEMBER_BYTES + 1);
        let written = copy_hashing(&mut limited, tmp.as_file_mut(), &mut hasher)
            .with_context(|| format!("{url}: extracting {member}"))?;
        if written > MAX_MEMBER_BYTES {
            bail!("{url}: {member} inflates past {MAX_MEMBER_BYTES} bytes");
        }
        let actual = hex::encode(hasher.finalize());
        match expected {
            Some(expected) => check_hash(&dest, &url, expected, &actual)?,
            None => tracing::warn!(
                "{}: no pinned hash; sha256 {actual} (recorded in {ANLI_MANIFEST})",
                dest.display()
            ),
        }
        extracted.push((split, dest, tmp, actual, expected.is_some()));
    }
    drop(archive);
    drop(zip_file);

    let mut manifest = String::new();
    let mut files = Vec::new();
    for (split, dest, tmp, actual, pinned) in extracted {
        persist(tmp, &dest)?;
        let check = if pinned { ", sha256 ok" } else { "" };
        tracing::info!("{}: extracted{check}", dest.display());
        manifest.push_str(&format!("{actual}  {split}.jsonl\n"));
        files.push(dest);
    }
    let mut tmp = temp_in(dir)?;
    tmp.write_all(manifest.as_bytes())
        .context("writing the ANLI manifest")?;
    persist(tmp, &dir.join(ANLI_MANIFEST))?;
    Ok(files)
}

/// The ANLI files of a previous extraction, when its manifest is there, lists every split
/// with a known hash, and every listed file still has its hash (known hashes win over the
/// manifest's).
fn anli_present(dir: &Path) -> anyhow::Result<Option<Vec<PathBuf>>> {
    let manifest = dir.join(ANLI_MANIFEST);
    let text = match fs::read_to_string(&manifest) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", manifest.display())),
    };
    let mut files = Vec::new();
    for &(split, known) in ANLI_FILES {
        let name = format!("{split}.jsonl");
        let listed = text.lines().find_map(|line| {
            let (hash, file) = line.split_once("  ")?;
            (file == name).then_some(hash)
        });
        let Some(hash) = known.or(listed) else {
            continue; // a train split the zip did not have
        };
        if known.is_some() && listed.is_none() {
            return Ok(None);
        }
        let dest = dir.join(&name);
        if !matches_hash(&dest, hash)? {
            return Ok(None);
        }
        files.push(dest);
    }
    Ok(Some(files))
}

/// The size a download must have.
#[derive(Clone, Copy, Debug)]
enum Size {
    Exactly(u64),
    AtMost(u64),
}

impl Size {
    fn max(self) -> u64 {
        match self {
            Size::Exactly(n) | Size::AtMost(n) => n,
        }
    }
}

/// GETs `url` into a temp file in `dir` (removed on drop unless persisted), and the body's
/// sha256: streamed, never past `size`; a body that announces (`Content-Length`) or turns out
/// another size is refused, before a byte is written when it was announced.
fn download(
    url: &str,
    dir: &Path,
    size: Size,
    deadline: &Deadline,
) -> anyhow::Result<(NamedTempFile, String)> {
    tracing::info!("downloading {url}");
    let max = size.max();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .timeout_global(Some(deadline.for_bytes(max)))
        .user_agent(concat!("maporl/", env!("CARGO_PKG_VERSION")))
        .build()
        .into();
    let mut response = agent
        .get(url)
        .call()
        .map_err(|e| deadline.ureq_error(e, max))
        .with_context(|| format!("GET {url} failed"))?;
    let status = response.status();
    if !status.is_success() {
        let body = net::error_body(&mut response);
        bail!(
            "GET {url}: HTTP {} {}{}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if body.is_empty() {
                String::new()
            } else {
                format!("; the server says: {body}")
            }
        );
    }
    let wrong = |n: u64| match size {
        Size::Exactly(want) => (n != want).then(|| format!("the file is {want} bytes")),
        Size::AtMost(max) => {
            (n > max).then(|| format!("the limit is {max} bytes ({})", size_words(max)))
        }
    };
    let announced = response
        .headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(why) = announced.and_then(&wrong) {
        bail!(
            "GET {url}: the server announces {} bytes (Content-Length), but {why}; refused \
             before writing",
            announced.unwrap_or_default()
        );
    }
    let mut tmp = temp_in(dir)?;
    let mut hasher = Sha256::new();
    let copied = net::copy_capped(
        &mut response.body_mut().as_reader(),
        tmp.as_file_mut(),
        max,
        Some(&mut hasher),
    )
    .map_err(|e| deadline.io_error(e, max))
    .with_context(|| format!("GET {url}: reading the body"))?;
    if copied.over {
        let why = match size {
            Size::Exactly(want) => format!("the file is {want} bytes"),
            Size::AtMost(max) => format!("the limit is {max} bytes ({})", size_words(max)),
        };
        bail!("GET {url}: the server sent more than {max} bytes, but {why}; cut there and refused");
    }
    if let Some(why) = wrong(copied.bytes) {
        bail!(
            "GET {url}: the server sent {} bytes, but {why}; refused",
            copied.bytes
        );
    }
    tmp.as_file_mut()
        .flush()
        .with_context(|| format!("GET {url}: writing {}", tmp.path().display()))?;
    Ok((tmp, hex::encode(hasher.finalize())))
}

fn check_hash(dest: &Path, url: &str, expected: &str, actual: &str) -> anyhow::Result<()> {
    if actual != expected {
        bail!(
            "sha256 mismatch for {} (from {url}): expected {expected}, got {actual}; \
             nothing written",
            dest.display()
        );
    }
    Ok(())
}

/// Whether `path` exists with sha256 `expected`.
fn matches_hash(path: &Path, expected: &str) -> anyhow::Result<bool> {
    match fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(sha256_file(path)? == expected),
        Ok(_) => bail!("{} exists and is not a file", path.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn sha256_file(path: &Path) -> anyhow::Result<String> {
    let mut hasher = Sha256::new();
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    copy_hashing(&mut file, &mut io::sink(), &mut hasher)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

fn copy_hashing(from: &mut impl Read, to: &mut impl Write, hasher: &mut Sha256) -> io::Result<u64> {
    let mut reader = BufReader::with_capacity(1 << 16, from);
    let mut total = 0u64;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(total);
        }
        hasher.update(buf);
        to.write_all(buf)?;
        let n = buf.len();
        total += n as u64;
        reader.consume(n);
    }
}

fn temp_in(dir: &Path) -> anyhow::Result<NamedTempFile> {
    tempfile::Builder::new()
        .prefix(".fetch-")
        .suffix(".part")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))
}

fn persist(tmp: NamedTempFile, dest: &Path) -> anyhow::Result<()> {
    // Temp files are created 0600; the data is public, so make it readable like any file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644))
            .with_context(|| format!("setting permissions of {}", tmp.path().display()))?;
    }
    tmp.as_file()
        .sync_all()
        .with_context(|| format!("syncing {}", tmp.path().display()))?;
    tmp.persist(dest)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming into {}", dest.display()))?;
    Ok(())
}

fn create_dir(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}
