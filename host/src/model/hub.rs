//! Models by hub name: `hf:ORG/NAME` or `hf:ORG/NAME@REVISION` (a branch, tag or commit;
//! default `main`) in `model.path`, `[[agents]] model` or `[verifier] model`.
//!
//! [`resolve_model`] downloads what [`super::load`] reads from a Hugging Face folder into the
//! Hugging Face cache, laid out exactly as `huggingface_hub` lays it out, and returns the
//! snapshot folder, which then loads like any local folder:
//!
//! ```text
//! $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
//!   models--ORG--NAME/
//!     blobs/<etag>                      the files' bytes, named by their ETag
//!     snapshots/<commit>/<file>         relative symlinks to ../../blobs/<etag> (copies where
//!                                       symlinks fail)
//!     refs/<revision>                   the commit a branch or tag resolved to
//!     .no_exist/<commit>/<file>         an optional file the hub does not have
//! ```
//!
//! Files: `config.json`, `tokenizer.json`, `tokenizer_config.json`, `generation_config.json`
//! and `special_tokens_map.json` when the repository has them, and the weights:
//! `model.safetensors`, else `model.safetensors.index.json` and the shards it names.
//!
//! Requests are the hub's own: `HEAD {endpoint}/{org}/{name}/resolve/{revision}/{file}`
//! without following absolute redirects, reading `X-Repo-Commit`, `X-Linked-Etag` or `ETag`,
//! and `X-Linked-Size` or `Content-Length`; then `GET` from the redirect's `Location` (the
//! CDN) or the same URL. The first file pins the commit and every other file is asked for at
//! that commit, so a branch that moves mid-download cannot mix two commits. Every blob is
//! fetched before any snapshot link or ref is written. The links then go in one by one, each
//! made under a temporary name and renamed over its final one (two processes linking the same
//! file both succeed; nothing is ever written through a link), so a snapshot folder is
//! complete only once all its files are in: the cache is used only after every file the
//! loader needs is checked to be there. A blob downloads into `blobs/<etag>.incomplete`, continues from where an
//! interrupted download stopped (`Range: bytes=N-`; a server answering 200 starts it over),
//! is checked against its sha256 when the ETag is one (LFS files), and is renamed into place.
//! Two processes fetching the same blob take turns on `.locks/models--ORG--NAME/<etag>.lock`.
//!
//! Caching: once `refs/<revision>` names a commit whose snapshot holds every file, that
//! snapshot is used with no request at all, for a branch as for a commit. A branch is
//! therefore not revalidated: to pick up newer commits, name the commit (`@<sha>`) or delete
//! `refs/<revision>`.
//!
//! Environment: `HF_HOME`, `HF_HUB_CACHE`, `HF_ENDPOINT` (default `https://huggingface.co`),
//! `HF_TOKEN` (else `HF_TOKEN_PATH`, else the file `$HF_HOME/token`; sent as
//! `Authorization: Bearer` to the endpoint's host only, never to a CDN elsewhere) and
//! `HF_HUB_OFFLINE=1` (the cache only; an error if the files are not there).
//!
//! Nothing from the server becomes a path unchecked: ETags, commits and shard names with
//! `/`, `\`, `..` or NUL are refused, as are ETags over 128 characters, indexes naming more
//! than 4096 shards, sizes over the maximum ([`Hub::max_file_bytes`]: `MAPORL_HUB_MAX_FILE_BYTES`,
//! default [`MAX_FILE_BYTES`], 64 GiB) and bodies longer than announced (a file whose size
//! is not announced is cut at the maximum and refused). A body streams to disk and is never
//! read past its announced size. Every request has a whole-request deadline
//! (`MAPORL_HTTP_TIMEOUT`, plus the file's size at `MAPORL_HTTP_MIN_RATE`; see
//! [`crate::net`]): a server trickling its answer is cut off there, and the next run resumes
//! what arrived. What the hub or its CDN says (error headers and bodies, header values)
//! reaches a message escaped and cut short ([`crate::net::server_text`]).
//!
//! A shared or group-writable cache may hold symbolic links planted by someone else: the
//! folders written in (`models--ORG--NAME`, `blobs`, `snapshots/<commit>`, `refs`,
//! `.no_exist/<commit>`, `.locks/models--ORG--NAME`) must be real folders, else the download
//! is refused naming the link; files are opened with `O_NOFOLLOW`, a link planted as
//! `<etag>.incomplete` is replaced, and everything else is written under a fresh name and
//! renamed into place.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::files::{expand_home, write_atomic};
use crate::net::{self, server_text, Deadline};

/// The prefix that marks a model path as a hub name.
pub const PREFIX: &str = "hf:";
/// The hub `HF_ENDPOINT` replaces.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// The revision of `hf:ORG/NAME` without `@REVISION`.
pub const DEFAULT_REVISION: &str = "main";
/// The largest file accepted from the hub by default (64 GiB).
pub const MAX_FILE_BYTES: u64 = 64 << 30;
/// The environment variable that replaces [`MAX_FILE_BYTES`].
pub const MAX_FILE_BYTES_ENV: &str = "MAPORL_HUB_MAX_FILE_BYTES";

/// Files the loader reads; a repository without one is refused.
const REQUIRED: &[&str] = &["config.json", "tokenizer.json", "tokenizer_config.json"];
/// Files fetched when the repository has them (a 404 is recorded in `.no_exist`).
const OPTIONAL: &[&str] = &["generation_config.json", "special_tokens_map.json"];
const WEIGHTS: &str = "model.safetensors";
const WEIGHTS_INDEX: &str = "model.safetensors.index.json";
/// The largest shard index read into memory.
const MAX_INDEX_BYTES: u64 = 64 << 20;
const MAX_REDIRECTS: usize = 5;
/// Longest organization or name the hub allows.
const MAX_NAME_LEN: usize = 96;
const MAX_REVISION_LEN: usize = 255;
/// The longest ETag accepted: real ones are 40 or 64 hex digits (about 40 characters when
/// quoted), and `<etag>.incomplete` must remain a valid file name.
const MAX_ETAG_LEN: usize = 128;
/// The most shards a `model.safetensors.index.json` may name.
const MAX_SHARDS: usize = 4096;

/// Whether `path` names a hub model (`hf:...`).
pub fn is_hub_path(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// The local path of a config's model string: for `hf:ORG/NAME[@REVISION]` the snapshot
/// folder in the Hugging Face cache (downloaded first when not there, configured by the
/// `HF_*` environment variables); otherwise the path itself, `~/` expanded.
pub fn resolve_model(path: &str) -> Result<PathBuf> {
    if !is_hub_path(path) {
        return Ok(expand_home(path));
    }
    let model = HubModel::parse(path)?;
    Hub::from_env()?
        .snapshot(&model)
        .with_context(|| format!("model {model}"))
}

/// A parsed `hf:ORG/NAME[@REVISION]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubModel {
    pub org: String,
    pub name: String,
    pub revision: String,
}

impl HubModel {
    /// Parses `hf:ORG/NAME` or `hf:ORG/NAME@REVISION`. Each part may hold ASCII letters,
    /// digits, `-`, `_` and `.`, but no `..`, and may not start or end with `.` or `-`;
    /// ORG and NAME hold no `--` either (the cache folder is `models--ORG--NAME`).
    pub fn parse(path: &str) -> Result<HubModel> {
        let syntax = "expected hf:ORG/NAME or hf:ORG/NAME@REVISION";
        let spec = path
            .strip_prefix(PREFIX)
            .ok_or_else(|| anyhow!("{path:?} is not a hub model name: {syntax}"))?;
        let (repo, revision) = match spec.split_once('@') {
            Some((repo, rev)) => (repo, Some(rev)),
            None => (spec, None),
        };
        let Some((org, name)) = repo.split_once('/') else {
            bail!("bad hub model {path:?}: no `/` between organization and name; {syntax}");
        };
        if name.contains('/') {
            bail!(
                "bad hub model {path:?}: the name {name:?} has a `/` (only one `/`, between \
                 organization and name); {syntax}"
            );
        }
        let check = |what: &str, part: &str, max: usize, dashes: bool| {
            check_part(what, part, max, dashes)
                .map_err(|why| anyhow!("bad hub model {path:?}: {why}; {syntax}"))
        };
        check("organization", org, MAX_NAME_LEN, false)?;
        check("name", name, MAX_NAME_LEN, false)?;
        let revision = match revision {
            Some(rev) => {
                check("revision", rev, MAX_REVISION_LEN, true)?;
                rev
            }
            None => DEFAULT_REVISION,
        };
        Ok(HubModel {
            org: org.into(),
            name: name.into(),
            revision: revision.into(),
        })
    }

    /// `ORG/NAME`.
    pub fn repo_id(&self) -> String {
        format!("{}/{}", self.org, self.name)
    }

    /// The repository's folder in the cache: `models--ORG--NAME`.
    pub fn folder(&self) -> String {
        format!("models--{}--{}", self.org, self.name)
    }
}

impl std::fmt::Display for HubModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PREFIX}{}/{}@{}", self.org, self.name, self.revision)
    }
}

/// Why `part` is no valid organization, name or revision.
fn check_part(what: &str, part: &str, max: usize, dashes_ok: bool) -> Result<(), String> {
    if part.is_empty() {
        return Err(format!("the {what} is empty"));
    }
    if part.len() > max {
        return Err(format!(
            "the {what} is {} characters long, over the hub's {max}",
            part.len()
        ));
    }
    if let Some(c) = part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "the {what} {part:?} has the character {c:?} (allowed: ASCII letters, digits, \
             `-`, `_`, `.`)"
        ));
    }
    if part.contains("..") {
        return Err(format!("the {what} {part:?} contains `..`"));
    }
    if !dashes_ok && part.contains("--") {
        return Err(format!("the {what} {part:?} contains `--`"));
    }
    if part.starts_with(['.', '-']) || part.ends_with(['.', '-']) {
        return Err(format!(
            "the {what} {part:?} starts or ends with `.` or `-`"
        ));
    }
    Ok(())
}

/// Where the cache is, which hub to ask, with which token.
#[derive(Clone, Debug)]
pub struct Hub {
    /// The hub cache folder (holding `models--ORG--NAME/`).
    pub cache: PathBuf,
    /// The hub's base URL, no trailing `/`.
    pub endpoint: String,
    pub token: Option<String>,
    /// Use the cache only.
    pub offline: bool,
    /// The largest file accepted (announced or sent).
    pub max_file_bytes: u64,
    /// Each request's whole-request deadline.
    pub deadline: Deadline,
}

impl Hub {
    /// From the process's `HF_*` environment variables (see [`Hub::from_vars`]).
    pub fn from_env() -> Result<Hub> {
        Hub::from_vars(|key| std::env::var(key).ok())
    }

    /// As `huggingface_hub` reads its settings, from `var` (empty counts as unset):
    /// cache `HF_HUB_CACHE`, else `HF_HOME/hub` (`HF_HOME` defaulting to
    /// `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`); endpoint `HF_ENDPOINT`;
    /// token `HF_TOKEN`, else the file at `HF_TOKEN_PATH`, else `HF_HOME/token`; offline when
    /// `HF_HUB_OFFLINE` is `1`, `ON`, `YES` or `TRUE`. maporl's own: the largest file
    /// `MAPORL_HUB_MAX_FILE_BYTES` (default 64 GiB), the deadline of each request
    /// `MAPORL_HTTP_TIMEOUT` and `MAPORL_HTTP_MIN_RATE` ([`Deadline::from_vars`]); a value
    /// that is not a positive number is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Hub> {
        let var = |key: &str| var(key).filter(|v| !v.trim().is_empty());
        let home = match (var("HF_HOME"), var("XDG_CACHE_HOME")) {
            (Some(home), _) => expand_home(&home),
            (None, Some(xdg)) => expand_home(&xdg).join("huggingface"),
            (None, None) => expand_home("~/.cache/huggingface"),
        };
        let cache = var("HF_HUB_CACHE")
            .map(|c| expand_home(&c))
            .unwrap_or_else(|| home.join("hub"));
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
            .trim()
            .trim_end_matches('/')
            .to_string();
        let token = var("HF_TOKEN")
            .or_else(|| {
                let file = var("HF_TOKEN_PATH")
                    .map(|p| expand_home(&p))
                    .unwrap_or_else(|| home.join("token"));
                fs::read_to_string(file).ok()
            })
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_uppercase().as_str(),
                "1" | "ON" | "YES" | "TRUE"
            )
        });
        let max_file_bytes = match var(MAX_FILE_BYTES_ENV) {
            None => MAX_FILE_BYTES,
            Some(v) => match v.trim().parse::<u64>() {
                Ok(n) if n > 0 => n,
                _ => bail!(
                    "{MAX_FILE_BYTES_ENV}={}: expected the largest file to accept from the hub, \
                     in bytes, a positive whole number (default {MAX_FILE_BYTES})",
                    server_text(&v)
                ),
            },
        };
        Ok(Hub {
            cache,
            endpoint,
            token,
            offline,
            max_file_bytes,
            deadline: Deadline::from_vars(var)?,
        })
    }

    /// The snapshot folder of `model`, from the cache when it is complete there (no
    /// request), else downloaded (unless offline).
    pub fn snapshot(&self, model: &HubModel) -> Result<PathBuf> {
        let repo = self.cache.join(model.folder());
        let cached = cached_commit(&repo, &model.revision)?;
        let missing = match &cached {
            Some(commit) => match missing_file(&repo, commit)? {
                None => return Ok(repo.join("snapshots").join(commit)),
                Some(file) => format!("snapshots/{commit}/ has no {file}"),
            },
            None => format!(
                "no refs/{} nor snapshots/{}",
                model.revision, model.revision
            ),
        };
        if self.offline {
            bail!(
                "HF_HUB_OFFLINE is set and {model} is not in the cache at {} ({missing}); \
                 unset HF_HUB_OFFLINE to download it",
                repo.display()
            );
        }
        self.download(model)
    }

    fn download(&self, model: &HubModel) -> Result<PathBuf> {
        let client = Client::new(
            &self.endpoint,
            self.token.as_deref(),
            self.deadline,
            self.max_file_bytes,
        )?;
        let url = |revision: &str, file: &str| {
            format!(
                "{}/{}/{}/resolve/{revision}/{file}",
                self.endpoint, model.org, model.name
            )
        };
        let folder = model.folder();

        // Every file's metadata and blob first; the snapshot only once all are in.
        let config_url = url(&model.revision, REQUIRED[0]);
        let pinned = is_full_commit(&model.revision).then_some(model.revision.as_str());
        let mut first = client
            .head(&config_url, REQUIRED[0], pinned)?
            .ok_or_else(|| not_found(model, REQUIRED[0], &config_url))?;
        let commit = first.commit.clone();
        if first.location == config_url {
            // Its bytes too come from the commit, not from a branch that may have moved.
            first.location = url(&commit, REQUIRED[0]);
        }
        let mut fetched: Vec<(String, Meta)> = vec![(REQUIRED[0].into(), first)];
        let mut absent: Vec<String> = Vec::new();
        let mut wanted: Vec<(String, bool)> = REQUIRED[1..]
            .iter()
            .map(|f| (f.to_string(), true))
            .chain(OPTIONAL.iter().map(|f| (f.to_string(), false)))
            .collect();
        wanted.push((WEIGHTS.into(), false));
        let mut i = 0;
        while i < wanted.len() {
            let (file, required) = wanted[i].clone();
            i += 1;
            let file_url = url(&commit, &file);
            match client.head(&file_url, &file, Some(&commit))? {
                Some(meta) => fetched.push((file, meta)),
                None if file == WEIGHTS => {
                    absent.push(WEIGHTS.into());
                    wanted.push((WEIGHTS_INDEX.into(), true));
                }
                None if required => {
                    if file == WEIGHTS_INDEX {
                        bail!(
                            "{} at commit {commit} has neither {WEIGHTS} nor {WEIGHTS_INDEX} \
                             (maporl loads safetensors weights)",
                            model.repo_id()
                        );
                    }
                    return Err(not_found(model, &file, &file_url));
                }
                None => absent.push(file),
            }
        }
        let blobs = real_dirs(&self.cache, &[&folder, "blobs"])?;
        let locks = real_dirs(&self.cache, &[".locks", &folder])?;
        let mut shards = BTreeSet::new();
        for (file, meta) in &fetched {
            fetch_blob(&client, &blobs, &locks, file, meta)?;
            if file == WEIGHTS_INDEX {
                shards = shard_names(&blobs.join(&meta.etag), file)?;
            }
        }
        for shard in shards {
            let shard_url = url(&commit, &shard);
            let meta = client
                .head(&shard_url, &shard, Some(&commit))?
                .ok_or_else(|| not_found(model, &shard, &shard_url))?;
            fetch_blob(&client, &blobs, &locks, &shard, &meta)?;
            fetched.push((shard, meta));
        }

        let snapshot = real_dirs(&self.cache, &[&folder, "snapshots", &commit])?;
        for (file, meta) in &fetched {
            link(&blobs, &meta.etag, &snapshot.join(file))?;
        }
        if !absent.is_empty() {
            let no_exist = real_dirs(&self.cache, &[&folder, ".no_exist", &commit])?;
            for file in &absent {
                let marker = no_exist.join(file);
                if !fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file()) {
                    // A fresh file renamed into place: nothing there is written through.
                    write_atomic(&marker, b"")?;
                }
            }
        }
        if model.revision != commit {
            let refs = real_dirs(&self.cache, &[&folder, "refs"])?;
            write_atomic(&refs.join(&model.revision), commit.as_bytes())?;
        }
        Ok(snapshot)
    }
}

fn not_found(model: &HubModel, file: &str, url: &str) -> anyhow::Error {
    anyhow!(
        "{} has no {file} at revision {} (HTTP 404 from {url})",
        model.repo_id(),
        model.revision
    )
}

/// The commit `revision` stands for in the cache: itself when it is a full commit hash,
/// else what `refs/<revision>` holds.
fn cached_commit(repo: &Path, revision: &str) -> Result<Option<String>> {
    if is_full_commit(revision) {
        return Ok(Some(revision.to_string()));
    }
    let file = repo.join("refs").join(revision);
    let text = match fs::read_to_string(&file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    let commit = text.trim();
    if !is_commit(commit) {
        bail!("{} does not hold a commit hash", file.display());
    }
    Ok(Some(commit.to_string()))
}

/// The first file the loader needs that the snapshot of `commit` lacks (files the hub does
/// not have are marked in `.no_exist/<commit>/`).
fn missing_file(repo: &Path, commit: &str) -> Result<Option<String>> {
    let snapshot = repo.join("snapshots").join(commit);
    let no_exist = repo.join(".no_exist").join(commit);
    let have = |file: &str| snapshot.join(file).is_file();
    let absent = |file: &str| no_exist.join(file).is_file();
    if let Some(file) = REQUIRED.iter().find(|f| !have(f)) {
        return Ok(Some(file.to_string()));
    }
    if let Some(file) = OPTIONAL.iter().find(|f| !have(f) && !absent(f)) {
        return Ok(Some(file.to_string()));
    }
    if have(WEIGHTS) {
        return Ok(None);
    }
    if !absent(WEIGHTS) {
        return Ok(Some(WEIGHTS.into()));
    }
    if !have(WEIGHTS_INDEX) {
        return Ok(Some(WEIGHTS_INDEX.into()));
    }
    let shards = shard_names(&snapshot.join(WEIGHTS_INDEX), WEIGHTS_INDEX)?;
    Ok(shards.into_iter().find(|s| !have(s)))
}

/// The shard files `model.safetensors.index.json` names, each checked to be a plain file
/// name.
fn shard_names(index: &Path, file: &str) -> Result<BTreeSet<String>> {
    let len = fs::metadata(index)
        .with_context(|| format!("reading {}", index.display()))?
        .len();
    if len > MAX_INDEX_BYTES {
        bail!("{file} is {len} bytes, over the limit of {MAX_INDEX_BYTES} for a shard index");
    }
    let text = fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{file} is not valid JSON"))?;
    let map = value
        .get("weight_map")
        .and_then(serde_json::Value::as_object)
        .ok_or_else(|| anyhow!("{file} has no `weight_map` object"))?;
    let mut shards = BTreeSet::new();
    for shard in map.values() {
        let shard = shard
            .as_str()
            .ok_or_else(|| anyhow!("{file}: a `weight_map` value is not a string"))?;
        if let Err(why) = check_file_name(shard) {
            bail!(
                "{file} names the shard {}, refused: {why}",
                server_text(shard)
            );
        }
        shards.insert(shard.to_string());
    }
    if shards.is_empty() {
        bail!("{file} names no shards");
    }
    if shards.len() > MAX_SHARDS {
        bail!(
            "{file} names {} shards, over the limit of {MAX_SHARDS}; refused",
            shards.len()
        );
    }
    Ok(shards)
}

/// Why `name` (from the server) cannot be a file name directly inside a cache folder.
fn check_file_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 255 {
        return Err("it is longer than 255 bytes");
    }
    if name.contains(['/', '\\']) {
        return Err("it has a `/` or `\\`");
    }
    if name.contains('\0') {
        return Err("it has a NUL byte");
    }
    if name.contains("..") || name.starts_with('.') {
        return Err("it has `..` or starts with `.`");
    }
    if name.chars().any(char::is_control) {
        return Err("it has a control character");
    }
    Ok(())
}

fn is_commit(s: &str) -> bool {
    (7..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_full_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// What a HEAD on a file's resolve URL told.
#[derive(Clone, Debug)]
struct Meta {
    commit: String,
    /// Normalized (no `W/`, no quotes) and checked to be a safe file name.
    etag: String,
    size: Option<u64>,
    /// Where to GET the bytes: the CDN a redirect pointed at, or the resolve URL.
    location: String,
}

/// HTTP to the hub and its CDN; never follows redirects on its own.
struct Client {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
    deadline: Deadline,
    max_file_bytes: u64,
}

impl Client {
    fn new(
        endpoint: &str,
        token: Option<&str>,
        deadline: Deadline,
        max_file_bytes: u64,
    ) -> Result<Client> {
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
            bail!(
                "HF_ENDPOINT {} is not an http(s) URL",
                server_text(endpoint)
            );
        }
        if let Some(t) = token {
            if t.chars().any(|c| c.is_control() || !c.is_ascii()) {
                bail!("the Hugging Face token (HF_TOKEN or the token file) has characters an HTTP header cannot carry");
            }
        }
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            .accept_encoding("identity")
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            // Each request sets its own; this is for any that would not.
            .timeout_global(Some(deadline.base))
            .user_agent(concat!("maporl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Ok(Client {
            agent,
            endpoint: endpoint.to_string(),
            token: token.map(String::from),
            deadline,
            max_file_bytes,
        })
    }

    /// One request, with a deadline for the whole of it (reading the body included) that
    /// allows for a body of `bytes`.
    fn call(
        &self,
        method: &str,
        url: &str,
        range: Option<u64>,
        bytes: u64,
    ) -> Result<ureq::http::Response<ureq::Body>> {
        let limit = Some(self.deadline.for_bytes(bytes));
        let mut request = match method {
            "HEAD" => self.agent.head(url),
            _ => self.agent.get(url),
        }
        .config()
        .timeout_global(limit)
        .build();
        // The token goes to the hub only, never to a CDN on another host.
        if let Some(token) = &self.token {
            if origin(url).eq_ignore_ascii_case(origin(&self.endpoint)) {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
        }
        if let Some(from) = range {
            request = request.header("Range", format!("bytes={from}-"));
        }
        request
            .call()
            .map_err(|e| self.deadline.ureq_error(e, bytes))
            .with_context(|| format!("{method} {} failed", server_text(url)))
    }

    /// HEAD `url` as `huggingface_hub` does: relative redirects (a renamed repository) are
    /// followed, an absolute one (the CDN) is not: its `Location` is where the bytes are.
    /// `None`: the file does not exist (404). `commit`: the commit the server must answer.
    fn head(&self, url: &str, file: &str, commit: Option<&str>) -> Result<Option<Meta>> {
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            // A redirect's target is the server's: named escaped and cut short.
            let shown = server_text(&current);
            let response = self.call("HEAD", &current, None, 0)?;
            let status = response.status().as_u16();
            let location = header(&response, "location");
            if (300..400).contains(&status) {
                let Some(location) = &location else {
                    bail!("HEAD {shown}: HTTP {status} without a Location");
                };
                if location.starts_with('/') && !location.starts_with("//") {
                    current = join_location(&current, location)?;
                    continue;
                }
            } else if status == 404 {
                let code = header(&response, "x-error-code").unwrap_or_default();
                if code.is_empty() || code == "EntryNotFound" {
                    return Ok(None);
                }
                return Err(http_error("HEAD", &current, &response, ""));
            } else if !(200..300).contains(&status) {
                return Err(http_error("HEAD", &current, &response, ""));
            }
            let answered = header(&response, "x-repo-commit").ok_or_else(|| {
                anyhow!(
                    "HEAD {shown}: no X-Repo-Commit header; is HF_ENDPOINT ({}) a Hugging \
                     Face hub?",
                    server_text(&self.endpoint)
                )
            })?;
            if !is_commit(&answered) {
                bail!(
                    "HEAD {shown}: refusing X-Repo-Commit {:?}: not a commit hash",
                    server_text(&answered)
                );
            }
            if let Some(commit) = commit {
                if answered != commit {
                    bail!(
                        "HEAD {shown}: asked for commit {commit}, the server answered {answered}"
                    );
                }
            }
            let raw = header(&response, "x-linked-etag")
                .or_else(|| header(&response, "etag"))
                .ok_or_else(|| anyhow!("HEAD {shown}: no ETag for {file}"))?;
            let etag = normalize_etag(&raw);
            let raw = server_text(&raw);
            if etag.len() > MAX_ETAG_LEN {
                bail!(
                    "HEAD {shown}: refusing the ETag for {file}: it is {} characters long, \
                     over the limit of {MAX_ETAG_LEN} (it names the blob file)",
                    etag.len()
                );
            }
            if let Err(why) = check_file_name(&etag) {
                bail!("HEAD {shown}: refusing the ETag {raw:?} for {file}: {why} (it names the blob file)");
            }
            if etag.ends_with(".incomplete") || etag.ends_with(".lock") {
                bail!("HEAD {shown}: refusing the ETag {raw:?} for {file}");
            }
            let size_header =
                header(&response, "x-linked-size").or_else(|| header(&response, "content-length"));
            let size = match size_header {
                Some(s) => Some(s.trim().parse::<u64>().map_err(|_| {
                    anyhow!(
                        "HEAD {shown}: {file} has the size {:?}, not a number",
                        server_text(&s)
                    )
                })?),
                None => None,
            };
            let max = self.max_file_bytes;
            if let Some(size) = size.filter(|&s| s > max) {
                bail!(
                    "HEAD {shown}: {file} is announced at {size} bytes, over the limit of \
                     {max} bytes ({}; {MAX_FILE_BYTES_ENV}); refused before downloading",
                    net::size_words(max)
                );
            }
            let location = match location.filter(|_| (300..400).contains(&status)) {
                Some(l) => join_location(&current, &l)?,
                None => current.clone(),
            };
            return Ok(Some(Meta {
                commit: answered,
                etag,
                size,
                location,
            }));
        }
        bail!("HEAD {url}: more than {MAX_REDIRECTS} redirects")
    }

    /// GET `url` (from byte `from` on when non-zero), following redirects; the deadline
    /// allows for a body of `bytes`.
    fn get(&self, url: &str, from: u64, bytes: u64) -> Result<ureq::http::Response<ureq::Body>> {
        let mut current = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let response = self.call("GET", &current, (from > 0).then_some(from), bytes)?;
            let status = response.status().as_u16();
            if (300..400).contains(&status) {
                let location = header(&response, "location").ok_or_else(|| {
                    anyhow!(
                        "GET {}: HTTP {status} without a Location",
                        server_text(&current)
                    )
                })?;
                current = join_location(&current, &location)?;
                continue;
            }
            return Ok(response);
        }
        bail!("GET {url}: more than {MAX_REDIRECTS} redirects")
    }
}

fn header(response: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The error for an answer with a failing status: the hub's error code and message
/// (`X-Error-Code`, `X-Error-Message`) and `body` (the start of an error body, already
/// escaped, or empty), all escaped and cut short.
fn http_error(
    method: &str,
    url: &str,
    response: &ureq::http::Response<ureq::Body>,
    body: &str,
) -> anyhow::Error {
    let status = response.status();
    let code = header(response, "x-error-code");
    let message = header(response, "x-error-message");
    let hint = match status.as_u16() {
        401 | 403 => {
            "; the repository does not exist, or is private or gated: set HF_TOKEN (or put a \
             token in $HF_HOME/token) with access to it"
        }
        404 => "; no such repository or revision",
        _ => "",
    };
    let detail = [code, message]
        .into_iter()
        .flatten()
        .map(|t| server_text(&t))
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    let detail = if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    };
    let body = if body.is_empty() {
        String::new()
    } else {
        format!("; the server says: {body}")
    };
    anyhow!(
        "{method} {}: HTTP {} {}{detail}{hint}{body}",
        server_text(url),
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
}

/// `W/"abc"` -> `abc`, as `huggingface_hub` normalizes ETags.
fn normalize_etag(raw: &str) -> String {
    let raw = raw.trim();
    raw.strip_prefix("W/")
        .unwrap_or(raw)
        .trim_matches('"')
        .to_string()
}

/// `scheme://host[:port]` of `url`.
fn origin(url: &str) -> &str {
    let after = url.find("://").map_or(0, |i| i + 3);
    match url[after..].find(['/', '?', '#']) {
        Some(end) => &url[..after + end],
        None => url,
    }
}

/// The URL a `Location` header points at, from `base`.
fn join_location(base: &str, location: &str) -> Result<String> {
    let location = location.trim();
    if location.starts_with("https://") || location.starts_with("http://") {
        Ok(location.to_string())
    } else if let Some(rest) = location.strip_prefix("//") {
        let scheme = base.split("://").next().unwrap_or("https");
        Ok(format!("{scheme}://{rest}"))
    } else if location.starts_with('/') {
        Ok(format!("{}{location}", origin(base)))
    } else {
        bail!(
            "{}: unsupported redirect to {:?}",
            server_text(base),
            server_text(location)
        )
    }
}

/// Makes sure `blobs/<etag>` holds `file`'s bytes: downloads into `<etag>.incomplete`
/// (continuing a previous attempt), streaming and never past the announced size (or the
/// maximum, when none was announced), checks size and sha256, renames into place. A body
/// longer than announced, or over the maximum, or with another sha256, is refused and its
/// `.incomplete` file removed; one cut short (a dropped connection, the deadline) keeps it,
/// for the next run to resume.
fn fetch_blob(client: &Client, blobs: &Path, locks: &Path, file: &str, meta: &Meta) -> Result<()> {
    let blob = blobs.join(&meta.etag);
    // A blob is a regular file maporl renamed into place, never a link to somewhere else.
    let sized = |path: &Path| {
        fs::symlink_metadata(path)
            .ok()
            .filter(|m| m.is_file() && meta.size.is_none_or(|s| s == m.len()))
            .is_some()
    };
    if sized(&blob) {
        return Ok(());
    }
    let _lock = lock(&locks.join(format!("{}.lock", meta.etag)))?;
    if sized(&blob) {
        return Ok(()); // another process fetched it while this one waited
    }
    let part = blobs.join(format!("{}.incomplete", meta.etag));
    if fs::symlink_metadata(&part).is_ok_and(|m| !m.is_file()) {
        // Not what an interrupted download leaves (a link planted in a shared cache, say):
        // removed, never written through.
        fs::remove_file(&part).with_context(|| {
            format!(
                "{} is not a regular file; removing it failed",
                part.display()
            )
        })?;
    }
    let mut out = open_no_follow(
        OpenOptions::new().create(true).read(true).append(true),
        &part,
    )?;
    // A download that fails before its first byte (an error answer, the deadline) leaves no
    // empty `.incomplete` behind.
    let mut empty_part = RemoveIfEmpty(Some(&part));
    let part_meta = out
        .metadata()
        .with_context(|| format!("reading {}", part.display()))?;
    if !part_meta.is_file() {
        bail!("{} is not a regular file; refused", part.display());
    }
    let max = client.max_file_bytes;
    let mut have = part_meta.len();
    if meta.size.is_some_and(|s| have > s) || have > max {
        out.set_len(0)?;
        have = 0;
    }
    // The server's URL (a CDN's, from a redirect), for messages.
    let shown = server_text(&meta.location);
    if meta.size != Some(have) || have == 0 {
        // The deadline allows for the whole file: a server may ignore the range.
        let mut response = client.get(&meta.location, have, meta.size.unwrap_or(max))?;
        let status = response.status().as_u16();
        match status {
            206 if have > 0 => {
                let range = header(&response, "content-range").unwrap_or_default();
                let start = range
                    .strip_prefix("bytes ")
                    .and_then(|r| r.split('-').next())
                    .and_then(|s| s.trim().parse::<u64>().ok());
                if start != Some(have) {
                    bail!(
                        "GET {shown}: asked for {file} from byte {have}, got Content-Range {:?}",
                        server_text(&range)
                    );
                }
                progress(format_args!(
                    "downloading {file}: resuming at byte {have} of {}",
                    size_text(meta.size)
                ));
            }
            200 => {
                if have > 0 {
                    progress(format_args!(
                        "downloading {file}: the server ignored the range, starting over"
                    ));
                    out.set_len(0)?;
                    have = 0;
                }
                progress(format_args!(
                    "downloading {file} ({})",
                    size_text(meta.size)
                ));
            }
            416 if have > 0 => {
                // What is there does not fit the file: start over.
                drop(out);
                fs::remove_file(&part).with_context(|| format!("removing {}", part.display()))?;
                empty_part.0 = None;
                drop(_lock);
                return fetch_blob(client, blobs, locks, file, meta);
            }
            _ => {
                let body = net::error_body(&mut response);
                return Err(http_error("GET", &meta.location, &response, &body));
            }
        }
        let remaining = meta.size.unwrap_or(max).saturating_sub(have);
        let announced =
            header(&response, "content-length").and_then(|l| l.trim().parse::<u64>().ok());
        // Checked before a byte of the body is written.
        if let Some(announced) = announced {
            let refused = match meta.size {
                Some(_) => (announced != remaining).then(|| format!("{remaining} were announced")),
                None => (announced > remaining).then(|| {
                    format!(
                        "the limit is {max} bytes ({}; {MAX_FILE_BYTES_ENV})",
                        net::size_words(max)
                    )
                }),
            };
            if let Some(why) = refused {
                drop(out);
                let _ = fs::remove_file(&part);
                bail!(
                    "GET {shown}: the server sends {announced} bytes of {file} where {why}; \
                     refused before writing"
                );
            }
        }
        let copied = net::copy_capped(
            &mut response.body_mut().as_reader(),
            &mut out,
            remaining,
            None,
        )
        .map_err(|e| client.deadline.io_error(e, remaining))
        .with_context(|| {
            format!(
                "GET {shown}: downloading {file} stopped; run again to resume from {}",
                part.display()
            )
        })?;
        if copied.over {
            drop(out);
            let _ = fs::remove_file(&part);
            match meta.size {
                Some(_) => bail!(
                    "GET {shown}: the server sent more than the {remaining} bytes announced for \
                     {file}; cut there and refused"
                ),
                None => bail!(
                    "GET {shown}: {file} is over the limit of {max} bytes ({}; \
                     {MAX_FILE_BYTES_ENV}); cut there and refused",
                    net::size_words(max)
                ),
            }
        }
        have += copied.bytes;
        if let Some(size) = meta.size.filter(|&s| s != have) {
            bail!(
                "GET {shown}: {file} ended at byte {have} of {size}; run again to resume from {}",
                part.display()
            );
        }
    }
    out.sync_all()
        .with_context(|| format!("syncing {}", part.display()))?;
    if is_sha256(&meta.etag) {
        out.seek(SeekFrom::Start(0))?;
        let mut hasher = Sha256::new();
        copy(&mut out, &mut HashWriter(&mut hasher))
            .with_context(|| format!("reading {}", part.display()))?;
        let actual = hex::encode(hasher.finalize());
        if actual != meta.etag {
            drop(out);
            let _ = fs::remove_file(&part);
            bail!(
                "sha256 mismatch for {file} (from {shown}): expected {}, got {actual}; the \
                 download is deleted",
                meta.etag
            );
        }
    }
    drop(out);
    fs::rename(&part, &blob)
        .with_context(|| format!("renaming {} into {}", part.display(), blob.display()))?;
    Ok(())
}

/// Removes the file at its path, when it is there and empty, on drop (under the blob's
/// lock: declared after it).
struct RemoveIfEmpty<'a>(Option<&'a Path>);

impl Drop for RemoveIfEmpty<'_> {
    fn drop(&mut self) {
        if let Some(path) = self.0 {
            if fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0) {
                let _ = fs::remove_file(path);
            }
        }
    }
}

fn size_text(size: Option<u64>) -> String {
    match size {
        Some(s) if s >= 1 << 20 => format!("{:.1} MiB", s as f64 / (1u64 << 20) as f64),
        Some(s) => format!("{s} bytes"),
        None => "size unknown".into(),
    }
}

fn progress(line: std::fmt::Arguments) {
    tracing::info!("hub: {line}");
}

struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn copy(from: &mut impl Read, to: &mut impl Write) -> io::Result<u64> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        total += n as u64;
    }
}

/// `base`/`parts`..., each folder created when missing and checked to be a real folder, not
/// a symbolic link (`base` itself, the cache, may be one): a link planted in a shared cache
/// would send what is written inside it elsewhere.
fn real_dirs(base: &Path, parts: &[&str]) -> Result<PathBuf> {
    fs::create_dir_all(base).with_context(|| format!("creating {}", base.display()))?;
    let mut dir = base.to_path_buf();
    for part in parts {
        dir.push(part);
        match fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("creating {}", dir.display())),
        }
        let meta =
            fs::symlink_metadata(&dir).with_context(|| format!("reading {}", dir.display()))?;
        if meta.file_type().is_symlink() {
            bail!(
                "{} is a symbolic link, not a folder of the cache; refused (writing through it \
                 could change files elsewhere; remove it to download again)",
                dir.display()
            );
        }
        if !meta.is_dir() {
            bail!("{} is not a folder; refused", dir.display());
        }
    }
    Ok(dir)
}

/// Opens `path` without following a symbolic link there (`O_NOFOLLOW` on unix): a link
/// planted in a shared cache would otherwise have maporl create, write or empty its target.
fn open_no_follow(options: &mut OpenOptions, path: &Path) -> Result<File> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW);
    }
    options.open(path).map_err(|e| {
        if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            anyhow!(
                "{} is a symbolic link, not a file maporl made; refused (remove it to go on)",
                path.display()
            )
        } else {
            anyhow::Error::new(e).context(format!("opening {}", path.display()))
        }
    })
}

/// An exclusive lock on `path` (created; its folder must exist), held until the file is
/// dropped.
fn lock(path: &Path) -> Result<File> {
    let file = open_no_follow(
        OpenOptions::new().create(true).truncate(false).write(true),
        path,
    )?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a file descriptor this function owns; released on close.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error())
                .with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// A name for a temporary entry in a snapshot folder: starts with `.`, which no file from
/// the hub does, and unique to this process and call.
fn temp_name(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    dir.join(format!(".maporl-tmp-{}-{n}-{nanos}", std::process::id()))
}

/// Whether a failed `symlink` means the file system has none (then the blob is copied).
#[cfg(unix)]
fn symlinks_unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || e.raw_os_error()
            .is_some_and(|c| c == libc::EPERM || c == libc::ENOTSUP || c == libc::EOPNOTSUPP)
}

/// `snapshot_file` -> `../../blobs/<etag>` (a copy of the blob where the file system has no
/// symlinks). The entry is made under a temporary name and renamed over `snapshot_file`:
/// whatever is there (the same link, just made by another process; a stale file; a link
/// planted elsewhere) is replaced, never opened for writing.
fn link(blobs: &Path, etag: &str, snapshot_file: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = snapshot_file
            .parent()
            .ok_or_else(|| anyhow!("{} has no folder", snapshot_file.display()))?;
        let target = Path::new("../../blobs").join(etag);
        let mut tries = 0;
        loop {
            let tmp = temp_name(dir);
            match std::os::unix::fs::symlink(&target, &tmp) {
                Ok(()) => {
                    return fs::rename(&tmp, snapshot_file)
                        .inspect_err(|_| {
                            let _ = fs::remove_file(&tmp);
                        })
                        .with_context(|| {
                            format!("renaming a new link into {}", snapshot_file.display())
                        });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 100 => tries += 1,
                Err(e) if symlinks_unsupported(&e) => break,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("linking {} in {}", target.display(), dir.display())
                    })
                }
            }
        }
    }
    copy_blob(&blobs.join(etag), snapshot_file)
}

/// `blob`'s bytes into a fresh temporary file renamed over `snapshot_file`.
fn copy_blob(blob: &Path, snapshot_file: &Path) -> Result<()> {
    let dir = snapshot_file
        .parent()
        .ok_or_else(|| anyhow!("{} has no folder", snapshot_file.display()))?;
    let mut from = File::open(blob).with_context(|| format!("opening {}", blob.display()))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".maporl-tmp-")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    copy(&mut from, tmp.as_file_mut())
        .and_then(|_| tmp.as_file().sync_all())
        .with_context(|| format!("copying {} to {}", blob.display(), snapshot_file.display()))?;
    tmp.persist(snapshot_file)
        .map_err(|e| e.error)
        .with_context(|| format!("renaming a copy into {}", snapshot_file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(path: &str) -> String {
        format!("{:#}", HubModel::parse(path).unwrap_err())
    }

    #[test]
    fn parses_names_and_revisions() {
        let m = HubModel::parse("hf:Qwen/Qwen2.5-0.5B-Instruct").unwrap();
        assert_eq!(
            (m.org.as_str(), m.name.as_str(), m.revision.as_str()),
            ("Qwen", "Qwen2.5-0.5B-Instruct", "main")
        );
        assert_eq!(m.folder(), "models--Qwen--Qwen2.5-0.5B-Instruct");
        assert_eq!(m.repo_id(), "Qwen/Qwen2.5-0.5B-Instruct");
        let m = HubModel::parse("hf:HuggingFaceTB/SmolLM2-135M_x@v1.0").unwrap();
        assert_eq!(m.revision, "v1.0");
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let m = HubModel::parse(&format!("hf:a/b@{sha}")).unwrap();
        assert_eq!(m.revision, sha);
        assert_eq!(m.to_string(), format!("hf:a/b@{sha}"));
    }

    #[test]
    fn refuses_bad_names_naming_the_bad_part() {
        for (path, says) in [
            ("hf:../x", "organization \"..\""),
            ("hf:a/b/c", "only one `/`"),
            ("hf:org/", "the name is empty"),
            ("hf:/name", "the organization is empty"),
            ("hf:gpt2", "no `/`"),
            ("hf:", "no `/`"),
            ("hf:org/na me", "the name \"na me\" has the character ' '"),
            ("hf:org/-name", "starts or ends"),
            ("hf:org/name.", "starts or ends"),
            ("hf:.org/name", "starts or ends"),
            ("hf:org/a..b", "contains `..`"),
            ("hf:org/a--b", "contains `--`"),
            ("hf:org/name@", "the revision is empty"),
            (
                "hf:org/name@../main",
                "the revision \"../main\" has the character '/'",
            ),
            ("hf:org/name@a..b", "revision \"a..b\" contains `..`"),
            ("hf:org/name@-x", "starts or ends"),
            (
                "hf:org/name@x\0",
                "the revision \"x\\0\" has the character '\\0'",
            ),
            ("hf:org/näme", "has the character 'ä'"),
            ("org/name", "is not a hub model name"),
        ] {
            let e = err(path);
            assert!(e.contains(says), "{path:?}: {e}");
            if path.starts_with(PREFIX) {
                assert!(e.contains("hf:ORG/NAME"), "{path:?}: {e}");
            }
        }
        let long = format!("hf:org/{}", "a".repeat(97));
        assert!(err(&long).contains("over the hub's 96"), "{}", err(&long));
        assert!(HubModel::parse(&format!("hf:org/{}", "a".repeat(96))).is_ok());
    }

    #[test]
    fn etags_and_file_names_from_the_server_are_checked() {
        assert_eq!(normalize_etag("W/\"abc\""), "abc");
        assert_eq!(normalize_etag("\"abc\""), "abc");
        for bad in ["", "../x", "a/b", "a\\b", "..", ".hidden", "a\0b", "a\nb"] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_file_name("model-00001-of-00002.safetensors").is_ok());
    }

    #[test]
    #[cfg(unix)]
    fn linking_replaces_what_is_there_and_never_writes_through_it() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models--o--n");
        let blobs = repo.join("blobs");
        let snapshot = repo.join("snapshots").join("c0ffee");
        fs::create_dir_all(&blobs).unwrap();
        fs::create_dir_all(&snapshot).unwrap();
        let bytes = b"the weights, which must survive".to_vec();
        fs::write(blobs.join("etag1"), &bytes).unwrap();
        let file = snapshot.join("model.safetensors");
        let target = Path::new("../../blobs/etag1");
        let check = |what: &str| {
            assert_eq!(
                fs::read(blobs.join("etag1")).unwrap(),
                bytes,
                "{what}: the blob"
            );
            assert_eq!(fs::read(&file).unwrap(), bytes, "{what}: the snapshot file");
            let names: Vec<_> = fs::read_dir(&snapshot)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(
                names,
                ["model.safetensors"],
                "{what}: no temporary entry left"
            );
        };
        // What a second process finds when the first one has just made the link.
        symlink(target, &file).unwrap();
        link(&blobs, "etag1", &file).unwrap();
        assert_eq!(fs::read_link(&file).unwrap(), target);
        check("over the same link");
        // A stale regular file.
        fs::remove_file(&file).unwrap();
        fs::write(&file, b"stale").unwrap();
        link(&blobs, "etag1", &file).unwrap();
        assert_eq!(fs::read_link(&file).unwrap(), target);
        check("over a stale file");
        // The copy made where symlinks fail replaces the link, too, without following it
        // (`fs::copy` there used to empty the blob).
        copy_blob(&blobs.join("etag1"), &file).unwrap();
        assert!(fs::symlink_metadata(&file).unwrap().is_file());
        check("a copy over the link");
        // Processes racing on the same entry all succeed, and the blob keeps its bytes.
        fs::remove_file(&file).unwrap();
        std::thread::scope(|scope| {
            for _ in 0..8 {
                scope.spawn(|| {
                    for _ in 0..50 {
                        link(&blobs, "etag1", &file).unwrap();
                    }
                });
            }
        });
        check("after racing links");
    }

    #[test]
    fn an_index_with_too_many_shards_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(WEIGHTS_INDEX);
        let write = |n: usize| {
            let map: serde_json::Map<String, serde_json::Value> = (0..n)
                .map(|i| (format!("t{i}"), format!("model-{i:05}.safetensors").into()))
                .collect();
            fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
        };
        write(MAX_SHARDS);
        assert_eq!(
            shard_names(&index, WEIGHTS_INDEX).unwrap().len(),
            MAX_SHARDS
        );
        write(MAX_SHARDS + 1);
        let e = format!("{:#}", shard_names(&index, WEIGHTS_INDEX).unwrap_err());
        assert!(e.contains("4097 shards, over the limit of 4096"), "{e}");
    }

    #[test]
    #[cfg(unix)]
    fn cache_folders_that_are_links_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("hub");
        let victim = dir.path().join("victim");
        fs::create_dir_all(&victim).unwrap();
        assert_eq!(
            real_dirs(&cache, &["models--o--n", "blobs"]).unwrap(),
            cache.join("models--o--n/blobs")
        );
        std::os::unix::fs::symlink(&victim, cache.join("models--o--n/snapshots")).unwrap();
        let e = format!(
            "{:#}",
            real_dirs(&cache, &["models--o--n", "snapshots", "c0ffee"]).unwrap_err()
        );
        assert!(
            e.contains(&cache.join("models--o--n/snapshots").display().to_string())
                && e.contains("symbolic link"),
            "{e}"
        );
        assert!(!victim.join("c0ffee").exists());
    }

    #[test]
    fn urls_and_redirects() {
        assert_eq!(origin("http://127.0.0.1:9/a/b?c"), "http://127.0.0.1:9");
        assert_eq!(origin("https://huggingface.co"), "https://huggingface.co");
        assert_eq!(
            join_location("https://h.co/a/b", "/c/d?x=1").unwrap(),
            "https://h.co/c/d?x=1"
        );
        assert_eq!(
            join_location("https://h.co/a", "https://cdn.x/y").unwrap(),
            "https://cdn.x/y"
        );
        assert_eq!(
            join_location("https://h.co/a", "//cdn.x/y").unwrap(),
            "https://cdn.x/y"
        );
        assert!(join_location("https://h.co/a", "file:///etc/passwd").is_err());
    }

    #[test]
    fn settings_come_from_the_hf_variables() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("hf");
        fs::create_dir_all(&home).unwrap();
        fs::write(home.join("token"), "hf_file\n").unwrap();
        let vars = |pairs: &'static [(&'static str, &'static str)], home: PathBuf| {
            move |k: &str| match k {
                "HF_HOME" => Some(home.to_string_lossy().into_owned()),
                _ => pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string()),
            }
        };
        let hub = Hub::from_vars(vars(&[], home.clone())).unwrap();
        assert_eq!(hub.cache, home.join("hub"));
        assert_eq!(hub.endpoint, DEFAULT_ENDPOINT);
        assert_eq!(hub.token.as_deref(), Some("hf_file"));
        assert!(!hub.offline);
        let hub = Hub::from_vars(vars(
            &[
                ("HF_HUB_CACHE", "/c/hub"),
                ("HF_ENDPOINT", "http://mirror:8/"),
                ("HF_TOKEN", "hf_env"),
                ("HF_HUB_OFFLINE", "1"),
                ("MAPORL_HUB_MAX_FILE_BYTES", "1000"),
                ("MAPORL_HTTP_TIMEOUT", "7"),
            ],
            home.clone(),
        ))
        .unwrap();
        assert_eq!(hub.cache, PathBuf::from("/c/hub"));
        assert_eq!(hub.endpoint, "http://mirror:8");
        assert_eq!(hub.token.as_deref(), Some("hf_env"));
        assert!(hub.offline);
        assert_eq!(hub.max_file_bytes, 1000);
        assert_eq!(hub.deadline.base, Duration::from_secs(7));
        for (value, offline) in [("true", true), ("YES", true), ("0", false), ("", false)] {
            let hub =
                Hub::from_vars(|k| (k == "HF_HUB_OFFLINE").then(|| value.to_string())).unwrap();
            assert_eq!(hub.offline, offline, "{value:?}");
            assert_eq!(hub.max_file_bytes, MAX_FILE_BYTES);
            assert_eq!(hub.deadline, Deadline::default());
        }
        for (key, value) in [
            (MAX_FILE_BYTES_ENV, "0"),
            (MAX_FILE_BYTES_ENV, "64G"),
            ("MAPORL_HTTP_TIMEOUT", "never"),
            ("MAPORL_HTTP_MIN_RATE", "-5"),
        ] {
            let e = Hub::from_vars(|k| (k == key).then(|| value.to_string()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{e}");
        }
    }
}
