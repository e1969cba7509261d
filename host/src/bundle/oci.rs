//! Sharing bundles through an OCI registry, the way wasm components are shared (wkg and the
//! Wasm OCI artifact layout): an OCI image manifest whose config has media type
//! `application/vnd.wasm.config.v0+json`, one `application/wasm` layer per component, and
//! the bundle's `bundle.toml` (and its signature) as layers of their own; every layer's file
//! name in the `org.opencontainers.image.title` annotation. Pushing is the distribution API's
//! monolithic upload (POST, then PUT with the digest); pulling checks every digest and size.
//!
//! Registries are reached over HTTPS, or plain HTTP for loopback hosts (`localhost`,
//! `127.0.0.1`, `[::1]`) and when asked (`insecure`).
//!
//! Logins follow the distribution spec's token flow, as docker, oras and wkg do: a `401`
//! with `WWW-Authenticate: Bearer realm=...,service=...,scope=...` sends us to the realm
//! for a token (with HTTP Basic credentials when we have some, anonymously otherwise; a push
//! asks for `repository:NAME:pull,push`), and the request is retried with
//! `Authorization: Bearer TOKEN`; the token is kept for the rest of the command. A `401` with
//! `WWW-Authenticate: Basic` is retried with the credentials. Credentials come from
//! [`OciOptions::credentials`], else `MAPORL_REGISTRY_USER` + `MAPORL_REGISTRY_PASSWORD`, else
//! `auths.REGISTRY.auth` in `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`
//! (`docker login`). Neither the password nor a token is ever printed.
//!
//! The registry, its token server and any storage it redirects to are treated as hostile
//! ([`crate::net`]): what they say reaches a message only escaped and cut short; every
//! request has a whole-request deadline (`MAPORL_HTTP_TIMEOUT`, plus a layer's declared size
//! at `MAPORL_HTTP_MIN_RATE`); a manifest is read up to [`MAX_MANIFEST`] bytes, lists at most
//! [`MAX_LAYERS`] layers, each declaring a size within its kind's cap (a component's
//! [`COMPONENT_CAP_MAX`], the most a run may raise a plugin's cap to; `bundle.toml`'s and its
//! signature's [`TEXT_MAX`]) and all together
//! within [`MAX_PULL_BYTES`], all checked before a byte is downloaded. A layer streams into
//! a temporary file in the pull's temporary directory, hashed on the way and never read
//! past its declared size; a layer whose size or digest is not the declared one leaves
//! nothing behind.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::files::{COMPONENT_CAP_MAX, TEXT_MAX};
use crate::net::{self, server_text, size_words, Deadline};

use super::manifest::SIGNATURE;
use super::manifest::{check_file_name, sha256_hex, Manifest, MANIFEST};

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const BUNDLE_MANIFEST_MEDIA_TYPE: &str = "application/vnd.maporl.bundle.manifest.v1+toml";
pub const BUNDLE_SIGNATURE_MEDIA_TYPE: &str = "application/vnd.maporl.bundle.signature.v1+toml";
pub const TITLE: &str = "org.opencontainers.image.title";

/// The most a pulled manifest may weigh (4 MiB, as a `bundle.toml`).
pub const MAX_MANIFEST: u64 = TEXT_MAX;
/// The most layers a pulled manifest may list.
pub const MAX_LAYERS: usize = 256;
/// The most a pull's layers may weigh together (1 GiB).
pub const MAX_PULL_BYTES: u64 = 1 << 30;
/// The most a token server's answer may weigh.
const TOKEN_MAX: u64 = 1 << 20;

/// The most a layer of `media_type` may weigh, and what to call it in messages.
fn layer_cap(media_type: &str) -> (u64, &'static str) {
    match media_type {
        WASM_LAYER_MEDIA_TYPE => (COMPONENT_CAP_MAX, "plugin component"),
        BUNDLE_SIGNATURE_MEDIA_TYPE => (TEXT_MAX, "bundle signature"),
        _ => (TEXT_MAX, "bundle manifest"),
    }
}

/// `REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, e.g. `localhost:5000/labs/arith:0.1.0`.
#[derive(Clone, Debug, PartialEq)]
pub struct OciRef {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl OciRef {
    pub fn parse(text: &str) -> anyhow::Result<OciRef> {
        let bad = |why: &str| {
            anyhow::anyhow!(
                "registry reference `{text}`: {why} (expected REGISTRY/REPOSITORY[:TAG] or \
                 REGISTRY/REPOSITORY@sha256:DIGEST, e.g. localhost:5000/labs/arith:0.1.0)"
            )
        };
        let (registry, rest) = text
            .split_once('/')
            .ok_or_else(|| bad("no registry host"))?;
        if !(registry.contains(['.', ':']) || registry == "localhost") {
            return Err(bad(&format!(
                "`{registry}` is not a registry host; name one (e.g. ghcr.io or localhost:5000)"
            )));
        }
        let (name, digest) = match rest.split_once('@') {
            Some((n, d)) => {
                let hexpart = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("only sha256 digests are supported"))?;
                if hexpart.len() != 64 || !hexpart.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad("the digest is not sha256: and 64 hex digits"));
                }
                (n, Some(d.to_ascii_lowercase()))
            }
            None => (rest, None),
        };
        let (repository, tag) = match name.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (name, None),
        };
        let repo_ok = !repository.is_empty()
            && repository.split('/').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
                    })
                    && part.as_bytes()[0].is_ascii_alphanumeric()
            });
        if !repo_ok {
            return Err(bad(&format!(
                "repository `{repository}` must be lower-case path parts of letters, digits, `.`, `_`, `-`"
            )));
        }
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && !t.starts_with(['.', '-']);
            if !ok {
                return Err(bad(&format!("tag `{t}` is not a valid tag")));
            }
        }
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The tag or digest the manifest is fetched by.
    fn reference(&self) -> anyhow::Result<&str> {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .with_context(|| format!("`{self}` names no tag or digest"))
    }

    fn is_loopback(&self) -> bool {
        is_loopback_host(&self.registry)
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// The environment variables a registry login is read from.
pub const USER_ENV: &str = "MAPORL_REGISTRY_USER";
pub const PASSWORD_ENV: &str = "MAPORL_REGISTRY_PASSWORD";

/// How to reach the registry.
#[derive(Clone, Debug, Default)]
pub struct OciOptions {
    /// Plain HTTP even for a registry that is not on loopback.
    pub insecure: bool,
    /// The login to use; `None`: `MAPORL_REGISTRY_USER` + `MAPORL_REGISTRY_PASSWORD`, else
    /// the docker config's, else anonymous.
    pub credentials: Option<Credentials>,
    /// Each request's whole-request deadline; `None`: from `MAPORL_HTTP_TIMEOUT` and
    /// `MAPORL_HTTP_MIN_RATE` ([`Deadline::from_env`]).
    pub deadline: Option<Deadline>,
}

/// A registry login: a user name and a password (or a personal access token).
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
    /// Where they came from, for messages (e.g. `--user`, `MAPORL_REGISTRY_USER`).
    pub source: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"(hidden)")
            .field("source", &self.source)
            .finish()
    }
}

impl Credentials {
    fn basic(&self) -> String {
        format!(
            "Basic {}",
            base64_encode(format!("{}:{}", self.user, self.password).as_bytes())
        )
    }
}

/// The login for `registry`: `given`, else the environment's, else the docker config's.
pub fn find_credentials(
    registry: &str,
    given: Option<&Credentials>,
) -> anyhow::Result<Option<Credentials>> {
    if let Some(c) = given {
        return Ok(Some(c.clone()));
    }
    let user = std::env::var(USER_ENV).ok().filter(|u| !u.is_empty());
    let password = std::env::var(PASSWORD_ENV).ok();
    match (user, password) {
        (Some(user), Some(password)) => {
            return Ok(Some(Credentials {
                user,
                password,
                source: format!("{USER_ENV} and {PASSWORD_ENV}"),
            }))
        }
        (Some(_), None) => bail!("{USER_ENV} is set but {PASSWORD_ENV} is not"),
        _ => {}
    }
    let path = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => match dirs::home_dir() {
            Some(h) => h.join(".docker/config.json"),
            None => return Ok(None),
        },
    };
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let config: Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let want = registry_key(registry);
    let Some(auths) = config["auths"].as_object() else {
        return Ok(None);
    };
    for (key, entry) in auths {
        if registry_key(key) != want {
            continue;
        }
        let Some(auth) = entry["auth"].as_str().filter(|a| !a.is_empty()) else {
            continue;
        };
        let decoded = base64_decode(auth)
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|t| {
                t.split_once(':')
                    .map(|(u, p)| (u.to_string(), p.to_string()))
            });
        let Some((user, password)) = decoded else {
            bail!(
                "{}: auths.{key}.auth is not base64 of USER:PASSWORD",
                path.display()
            );
        };
        return Ok(Some(Credentials {
            user,
            password,
            source: path.display().to_string(),
        }));
    }
    Ok(None)
}

/// A docker config `auths` key or a registry host, as the host it names (Docker Hub's
/// several names as one).
fn registry_key(key: &str) -> String {
    let host = key
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = host.split('/').next().unwrap_or(host).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            "docker.io".to_string()
        }
        _ => host,
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Standard base64, padded or not (Docker's config files have both), around whitespace.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    use base64::Engine as _;
    const LENIENT: GeneralPurpose = GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
    );
    LENIENT.decode(text.trim()).ok()
}

/// A `WWW-Authenticate` challenge: its scheme (lower-case) and its parameters.
fn parse_challenge(header: &str) -> (String, Vec<(String, String)>) {
    let header = header.trim();
    let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = Vec::new();
    let mut chars = rest.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if key.is_empty() || chars.next().is_none() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(chars.next()),
                    c => value.push(c),
                }
            }
        } else {
            value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
        }
        params.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    (scheme.to_ascii_lowercase(), params)
}

fn is_loopback_host(host_port: &str) -> bool {
    let host = match host_port.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host_port,
    };
    // An address, not a name that merely starts like one (`127.evil.example`).
    host == "localhost"
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The `host[:port]` of an absolute http(s) URL.
fn url_authority(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    Some(rest.split(['/', '?', '#']).next().unwrap_or(rest))
}

/// What a push did.
#[derive(Clone, Debug)]
pub struct PushReport {
    pub reference: String,
    /// The manifest's digest (`sha256:...`): pull by it for an exact copy.
    pub digest: String,
    pub layers: usize,
    /// Blobs (layers and the config) in all, and how many were uploaded (the others were
    /// already in the registry).
    pub blobs: usize,
    pub uploaded: usize,
    pub bytes: u64,
    pub seconds: f64,
}

/// What a pull fetched.
#[derive(Clone, Debug)]
pub struct PullReport {
    pub digest: String,
    pub dir: PathBuf,
    pub files: Vec<String>,
    pub bytes: u64,
    pub seconds: f64,
}

struct Client {
    agent: ureq::Agent,
    base: String,
    registry: String,
    repository: String,
    /// The token scope the command needs (`repository:NAME:pull`, or `:pull,push`).
    scope: String,
    insecure: bool,
    credentials: Option<Credentials>,
    /// The `Authorization` header earned for (this registry, `scope`), kept for the command.
    auth: RefCell<Option<String>>,
    deadline: Deadline,
}

impl Client {
    fn new(r: &OciRef, opts: &OciOptions, push: bool) -> anyhow::Result<Client> {
        let scheme = if opts.insecure || r.is_loopback() {
            "http"
        } else {
            "https"
        };
        let deadline = match opts.deadline {
            Some(d) => d,
            None => Deadline::from_env()?,
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(Duration::from_secs(120)))
            // Each request sets its own; this is for any that would not.
            .timeout_global(Some(deadline.base))
            .user_agent(concat!("maporl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        let actions = if push { "pull,push" } else { "pull" };
        Ok(Client {
            agent,
            base: format!("{scheme}://{}", r.registry),
            registry: r.registry.clone(),
            repository: r.repository.clone(),
            scope: format!("repository:{}:{actions}", r.repository),
            insecure: opts.insecure,
            credentials: find_credentials(&r.registry, opts.credentials.as_ref())?,
            auth: RefCell::new(None),
            deadline,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.repository)
    }

    /// An absolute URL for a `Location` header (absolute, or a path on the registry).
    fn location(&self, loc: &str) -> String {
        if loc.starts_with("http://") || loc.starts_with("https://") {
            loc.to_string()
        } else if loc.starts_with('/') {
            format!("{}{loc}", self.base)
        } else {
            format!("{}/{loc}", self.base)
        }
    }

    /// How to give a login, for messages.
    fn how_to_login(&self) -> String {
        format!(
            "{} needs a login: set {USER_ENV} and {PASSWORD_ENV}, pass --user USER \
             --password-stdin, or `docker login {}`",
            self.registry, self.registry
        )
    }

    fn who(&self, c: &Credentials) -> String {
        format!("as {} (credentials from {})", c.user, c.source)
    }

    /// Sends a request; on a `401` answers the registry's challenge (a bearer token from its
    /// realm, or Basic credentials) and sends it once more. `bytes`: the most the body sent
    /// or expected weighs, for the request's deadline (which covers reading the answer's body).
    fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        bytes: u64,
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let mut answered = false;
        let deadline = Some(self.deadline.for_bytes(bytes));
        let shown = server_text(url);
        loop {
            let mut req = ureq::http::Request::builder().method(method).uri(url);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            // The login or token is for the registry only, never for another host a
            // `Location` may point to (e.g. a storage backend).
            if url_authority(url) == url_authority(&self.base) {
                if let Some(a) = self.auth.borrow().as_deref() {
                    req = req.header("Authorization", a);
                }
            }
            let resp = match body {
                Some(b) => {
                    let req = self.agent.configure_request(req.body(b)?);
                    self.agent.run(req.timeout_global(deadline).build())
                }
                None => {
                    let req = self.agent.configure_request(req.body(())?);
                    self.agent.run(req.timeout_global(deadline).build())
                }
            }
            .map_err(|e| self.deadline.ureq_error(e, bytes))
            .with_context(|| format!("{method} {shown}"))?;
            if resp.status().as_u16() != 401 {
                return Ok(resp);
            }
            if answered {
                match &self.credentials {
                    Some(c) => bail!(
                        "{method} {shown}: login refused: {} answered HTTP 401 after logging in {}",
                        self.registry,
                        self.who(c)
                    ),
                    None => bail!("{method} {shown}: HTTP 401: {}", self.how_to_login()),
                }
            }
            let challenge = resp
                .headers()
                .get("www-authenticate")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let header = self
                .answer(&challenge)
                .with_context(|| format!("{method} {shown}: HTTP 401"))?;
            *self.auth.borrow_mut() = Some(header);
            answered = true;
        }
    }

    /// The `Authorization` header that answers a `WWW-Authenticate` challenge.
    fn answer(&self, challenge: &str) -> anyhow::Result<String> {
        let (scheme, params) = parse_challenge(challenge);
        let param = |k: &str| {
            params
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        match scheme.as_str() {
            "basic" => match &self.credentials {
                Some(c) => Ok(c.basic()),
                None => bail!("{}", self.how_to_login()),
            },
            "bearer" => {
                let realm = param("realm").with_context(|| {
                    format!(
                        "{} asked for a bearer token but named no realm",
                        self.registry
                    )
                })?;
                let token = self.token(realm, param("service"), param("scope"))?;
                Ok(format!("Bearer {token}"))
            }
            "" => bail!(
                "{} answered HTTP 401 without a WWW-Authenticate challenge",
                self.registry
            ),
            other => bail!(
                "{} asks for `{}` authentication; only Bearer and Basic are supported",
                self.registry,
                server_text(other)
            ),
        }
    }

    /// A bearer token from the registry's token server (`realm`) for our scope (and the
    /// challenge's, when it names another).
    fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        challenge_scope: Option<&str>,
    ) -> anyhow::Result<String> {
        let realm_host = realm
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .with_context(|| {
                format!(
                    "{}: the token realm `{}` is not a URL",
                    self.registry,
                    server_text(realm)
                )
            })?;
        // Named in messages: the server chose it.
        let realm_host = server_text(realm_host);
        let mut req = self
            .agent
            .get(realm)
            .config()
            .timeout_global(Some(self.deadline.base))
            .build();
        if let Some(s) = service {
            req = req.query("service", s);
        }
        req = req.query("scope", &self.scope);
        if let Some(s) = challenge_scope.filter(|s| *s != self.scope) {
            req = req.query("scope", s);
        }
        if let Some(c) = &self.credentials {
            if realm.starts_with("http://") && !(self.insecure || is_loopback_host(&realm_host)) {
                bail!(
                    "{}: the token server {} is plain HTTP; not sending credentials there \
                     (--insecure to allow it)",
                    self.registry,
                    server_text(realm)
                );
            }
            req = req.header("Authorization", &c.basic());
        }
        let mut resp = req
            .call()
            .map_err(|e| self.deadline.ureq_error(e, 0))
            .with_context(|| format!("{}: asking {realm_host} for a token", self.registry))?;
        let status = resp.status().as_u16();
        if status == 401 || status == 403 {
            match &self.credentials {
                Some(c) => bail!(
                    "login refused: {realm_host} (the token server of {}) answered HTTP \
                     {status} to logging in {}",
                    self.registry,
                    self.who(c)
                ),
                None => bail!(
                    "{} (its token server {realm_host} refused an anonymous token for {})",
                    self.how_to_login(),
                    self.scope
                ),
            }
        }
        if status != 200 {
            bail!(
                "{}: its token server {realm_host} answered HTTP {status}: {}",
                self.registry,
                net::error_body(&mut resp)
            );
        }
        let mut body = Vec::new();
        let read = net::copy_capped(&mut resp.body_mut().as_reader(), &mut body, TOKEN_MAX, None)
            .map_err(|e| self.deadline.io_error(e, 0))
            .with_context(|| format!("{}: reading the token from {realm_host}", self.registry))?;
        if read.over {
            bail!(
                "{}: the token server {realm_host} answered more than {} bytes; refused",
                self.registry,
                size_words(TOKEN_MAX)
            );
        }
        let v: Value = serde_json::from_slice(&body).with_context(|| {
            format!(
                "{}: the token server {realm_host} did not answer JSON",
                self.registry
            )
        })?;
        v["token"]
            .as_str()
            .or(v["access_token"].as_str())
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .with_context(|| {
                format!(
                    "{}: the token server {realm_host} sent no token",
                    self.registry
                )
            })
    }

    fn blob_exists(&self, digest: &str) -> anyhow::Result<bool> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self.send("HEAD", &url, &[], None, 0)?;
        match resp.status().as_u16() {
            403 => {
                self.expect(resp, "HEAD", &url, 200)?;
                Ok(false)
            }
            _ => Ok(resp.status().is_success()),
        }
    }

    fn upload_blob(&self, digest: &str, bytes: &[u8]) -> anyhow::Result<bool> {
        if self.blob_exists(digest)? {
            return Ok(false);
        }
        let url = self.url("blobs/uploads/");
        let resp = self.send("POST", &url, &[], Some(&[]), 0)?;
        let resp = self.expect(resp, "POST", &url, 202)?;
        let loc = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .with_context(|| format!("POST {url}: the registry gave no upload Location"))?;
        let loc = self.location(loc);
        let sep = if loc.contains('?') { '&' } else { '?' };
        let put = format!("{loc}{sep}digest={digest}");
        let resp = self.send(
            "PUT",
            &put,
            &[("Content-Type", "application/octet-stream")],
            Some(bytes),
            bytes.len() as u64,
        )?;
        self.expect(resp, "PUT", &put, 201)?;
        Ok(true)
    }

    fn put_manifest(&self, reference: &str, body: &[u8]) -> anyhow::Result<Option<String>> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self.send(
            "PUT",
            &url,
            &[("Content-Type", MANIFEST_MEDIA_TYPE)],
            Some(body),
            body.len() as u64,
        )?;
        let resp = self.expect(resp, "PUT", &url, 201)?;
        Ok(resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string))
    }

    /// The manifest's bytes (at most [`MAX_MANIFEST`]) and the digest the registry gives it.
    fn get_manifest(&self, reference: &str) -> anyhow::Result<(Vec<u8>, Option<String>)> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self.send("GET", &url, &[("Accept", MANIFEST_MEDIA_TYPE)], None, 0)?;
        let mut resp = self.expect(resp, "GET", &url, 200)?;
        let header = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let over = || {
            format!(
                "GET {url}: the manifest is over the limit of {} ({MAX_MANIFEST} bytes); refused",
                size_words(MAX_MANIFEST)
            )
        };
        if content_length(&resp).is_some_and(|n| n > MAX_MANIFEST) {
            bail!("{}", over());
        }
        let mut body = Vec::new();
        let read = net::copy_capped(
            &mut resp.body_mut().as_reader(),
            &mut body,
            MAX_MANIFEST,
            None,
        )
        .map_err(|e| self.deadline.io_error(e, 0))
        .with_context(|| format!("GET {url}: reading the manifest"))?;
        if read.over {
            bail!("{}", over());
        }
        Ok((body, header))
    }

    /// Streams the blob `digest` into a new file `title` in `dir`: a temporary file there,
    /// hashed on the way, never written past the `size` the manifest declares, renamed into
    /// place once its size and digest are the declared ones (removed otherwise).
    fn download_blob(
        &self,
        digest: &str,
        size: u64,
        dir: &Path,
        title: &str,
    ) -> anyhow::Result<()> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self.send("GET", &url, &[], None, size)?;
        let resp = self.expect(resp, "GET", &url, 200)?;
        if let Some(announced) = content_length(&resp).filter(|n| *n != size) {
            bail!(
                "GET {url}: the registry announces {announced} bytes (Content-Length) for \
                 {title}, but the manifest declares {size}; refused before writing"
            );
        }
        let mut tmp = tempfile::Builder::new()
            .prefix(".layer-")
            .tempfile_in(dir)
            .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        let mut hasher = Sha256::new();
        let copied = net::copy_capped(
            &mut resp.into_body().into_reader(),
            tmp.as_file_mut(),
            size,
            Some(&mut hasher),
        )
        .map_err(|e| self.deadline.io_error(e, size))
        .with_context(|| format!("GET {url}: downloading {title}"))?;
        if copied.over {
            bail!(
                "GET {url}: the registry sent more than the {size} bytes the manifest declares \
                 for {title}; cut there and refused"
            );
        }
        if copied.bytes != size {
            bail!(
                "GET {url}: {title} ended after {} of the {size} bytes the manifest declares; \
                 refused",
                copied.bytes
            );
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != digest {
            bail!("GET {url}: the blob's digest is {actual}, not {digest}: refused");
        }
        let path = dir.join(title);
        tmp.persist(&path)
            .map_err(|e| e.error)
            .with_context(|| format!("renaming a download into {}", path.display()))?;
        Ok(())
    }

    /// Refuses a response whose status is not `want`, with the registry's error text
    /// (escaped and cut short).
    fn expect(
        &self,
        mut resp: ureq::http::Response<ureq::Body>,
        method: &str,
        url: &str,
        want: u16,
    ) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
        let status = resp.status();
        if status.as_u16() == want || (want == 200 && status.is_success()) {
            return Ok(resp);
        }
        let body = net::error_body(&mut resp);
        let hint = match (status.as_u16(), &self.credentials) {
            (401 | 403, Some(c)) => format!(
                " ({} refused access to {} {})",
                self.registry,
                self.repository,
                self.who(c)
            ),
            (401 | 403, None) => format!(" ({})", self.how_to_login()),
            (404, _) if method == "GET" => " (no such repository, tag or blob)".to_string(),
            _ => String::new(),
        };
        bail!(
            "{method} {}: HTTP {} {}{hint}{}",
            server_text(url),
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            if body.is_empty() {
                String::new()
            } else {
                format!(": the registry says: {body}")
            }
        )
    }
}

/// A response's `Content-Length`, when it has a valid one.
fn content_length(resp: &ureq::http::Response<ureq::Body>) -> Option<u64> {
    resp.headers()
        .get("content-length")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn descriptor(media_type: &str, bytes: &[u8], title: &str, extra: &[(&str, &str)]) -> Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(TITLE.into(), title.into());
    for (k, v) in extra {
        annotations.insert((*k).into(), (*v).into());
    }
    json!({
        "mediaType": media_type,
        "digest": format!("sha256:{}", sha256_hex(bytes)),
        "size": bytes.len(),
        "annotations": annotations,
    })
}

/// Pushes the bundle in `dir` (already verified by the caller) to `r`; a reference without
/// a tag is tagged with the bundle's version.
pub fn push(dir: &Path, r: &OciRef, opts: &OciOptions) -> anyhow::Result<PushReport> {
    let started = Instant::now();
    let (manifest, manifest_bytes) = Manifest::read(dir)?;
    let mut r = r.clone();
    if r.digest.is_some() {
        bail!("push to `{r}`: push to a tag, not a digest");
    }
    let tag = r
        .tag
        .get_or_insert_with(|| manifest.bundle.version.clone())
        .clone();
    let mut blobs: Vec<(Value, Vec<u8>)> = Vec::new();
    for c in &manifest.components {
        let path = dir.join(&c.file);
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        if sha256_hex(&bytes) != c.sha256 {
            bail!(
                "{}: its sha256 is not the one bundle.toml pins; verify the bundle",
                path.display()
            );
        }
        let d = descriptor(
            WASM_LAYER_MEDIA_TYPE,
            &bytes,
            &c.file,
            &[
                ("dev.maporl.component.name", &c.name),
                ("dev.maporl.component.world", &c.world),
            ],
        );
        blobs.push((d, bytes));
    }
    let wasm_digests: Vec<Value> = blobs.iter().map(|(d, _)| d["digest"].clone()).collect();
    blobs.push((
        descriptor(BUNDLE_MANIFEST_MEDIA_TYPE, &manifest_bytes, MANIFEST, &[]),
        manifest_bytes.clone(),
    ));
    let sig_path = dir.join(SIGNATURE);
    if sig_path.is_file() {
        let sig = std::fs::read(&sig_path)
            .with_context(|| format!("cannot read {}", sig_path.display()))?;
        blobs.push((
            descriptor(BUNDLE_SIGNATURE_MEDIA_TYPE, &sig, SIGNATURE, &[]),
            sig,
        ));
    }
    // The Wasm OCI artifact config (no creation time, so the same bundle has the same digest).
    let config = serde_json::to_vec(&json!({
        "architecture": "wasm",
        "os": "wasip2",
        "layerDigests": wasm_digests,
        "author": manifest.bundle.authors.join(", "),
        "maporl": {
            "bundle": manifest.bundle.name,
            "version": manifest.bundle.version,
            "wit": manifest.bundle.wit,
        },
    }))?;
    let b = &manifest.bundle;
    let oci_manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {
            "mediaType": WASM_CONFIG_MEDIA_TYPE,
            "digest": format!("sha256:{}", sha256_hex(&config)),
            "size": config.len(),
        },
        "layers": blobs.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>(),
        "annotations": {
            TITLE: b.name,
            "org.opencontainers.image.version": b.version,
            "org.opencontainers.image.description": b.description,
            "org.opencontainers.image.licenses": b.licence,
            "org.opencontainers.image.authors": b.authors.join(", "),
            "dev.maporl.bundle.wit": b.wit,
        },
    });
    let body = serde_json::to_vec_pretty(&oci_manifest)?;
    let digest = format!("sha256:{}", sha256_hex(&body));
    let ctx = || format!("push {} to {r}", manifest.id());
    let client = Client::new(&r, opts, true).with_context(ctx)?;
    let mut uploaded = 0;
    let mut bytes = 0;
    let config_digest = format!("sha256:{}", sha256_hex(&config));
    for (d, data) in blobs
        .iter()
        .map(|(d, b)| (d["digest"].as_str().expect("set above"), b.as_slice()))
        .chain(std::iter::once((config_digest.as_str(), config.as_slice())))
    {
        if client.upload_blob(d, data).with_context(ctx)? {
            uploaded += 1;
            bytes += data.len() as u64;
        }
    }
    let told = client.put_manifest(&tag, &body).with_context(ctx)?;
    if let Some(told) = told.filter(|t| *t != digest) {
        bail!(
            "{}: the registry stored the manifest under digest {}, not {digest}",
            ctx(),
            server_text(&told)
        );
    }
    Ok(PushReport {
        reference: r.to_string(),
        digest,
        layers: blobs.len(),
        blobs: blobs.len() + 1,
        uploaded,
        bytes: bytes + body.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Pulls the bundle at `r` into `out` (created; it must not exist, or be empty), checking
/// every size and digest. The caller verifies the bundle (signature, worlds) afterwards.
/// Every declared size is checked against its cap before any layer is downloaded; the
/// layers stream into a temporary directory beside `out`, which becomes `out` only once
/// every one of them is in and checked, and is removed otherwise.
pub fn pull(r: &OciRef, out: &Path, opts: &OciOptions) -> anyhow::Result<PullReport> {
    let started = Instant::now();
    let ctx = || format!("pull {r}");
    let client = Client::new(r, opts, false).with_context(ctx)?;
    let (body, told) = client.get_manifest(r.reference()?).with_context(ctx)?;
    let digest = format!("sha256:{}", sha256_hex(&body));
    if let Some(want) = &r.digest {
        if *want != digest {
            bail!(
                "{}: the registry sent a manifest with digest {digest}: refused",
                ctx()
            );
        }
    }
    if let Some(told) = told.filter(|t| *t != digest) {
        bail!(
            "{}: the manifest's digest is {digest}, but the registry says {}: refused",
            ctx(),
            server_text(&told)
        );
    }
    let m: Value = serde_json::from_slice(&body)
        .with_context(|| format!("{}: the manifest is not JSON", ctx()))?;
    if let Some(mt) = m["mediaType"]
        .as_str()
        .filter(|mt| *mt != MANIFEST_MEDIA_TYPE)
    {
        bail!(
            "{}: the manifest's media type is {}, not {MANIFEST_MEDIA_TYPE} (an image \
             index or another kind of artifact?)",
            ctx(),
            server_text(mt)
        );
    }
    let config_type = m["config"]["mediaType"].as_str().unwrap_or("(none)");
    if config_type != WASM_CONFIG_MEDIA_TYPE {
        bail!(
            "{}: not a wasm artifact (config media type {}, expected \
             {WASM_CONFIG_MEDIA_TYPE})",
            ctx(),
            server_text(config_type)
        );
    }
    let layers = m["layers"].as_array().cloned().unwrap_or_default();
    if layers.len() > MAX_LAYERS {
        bail!(
            "{}: the manifest lists {} layers, over the limit of {MAX_LAYERS}; refused",
            ctx(),
            layers.len()
        );
    }
    let mut wanted = Vec::new();
    let mut declared_total = 0u64;
    for (i, l) in layers.iter().enumerate() {
        let media = l["mediaType"].as_str().unwrap_or("");
        let title = l["annotations"][TITLE].as_str().unwrap_or("");
        let d = l["digest"].as_str().unwrap_or("");
        let size = l["size"].as_u64();
        // The media type and title are the registry's: named escaped and cut short.
        let at = || {
            format!(
                "{}: layer {} ({}, {})",
                ctx(),
                i + 1,
                server_text(title),
                server_text(media)
            )
        };
        if ![
            WASM_LAYER_MEDIA_TYPE,
            BUNDLE_MANIFEST_MEDIA_TYPE,
            BUNDLE_SIGNATURE_MEDIA_TYPE,
        ]
        .contains(&media)
        {
            bail!("{}: not a layer of a maporl bundle", at());
        }
        if check_file_name(title).is_err() {
            bail!(
                "{}: its title annotation is not a plain file name (letters, digits, `-`, \
                 `_`, `.`; at most 128 of them; not starting with `.`)",
                at()
            );
        }
        let expected_title = match media {
            BUNDLE_MANIFEST_MEDIA_TYPE => Some(MANIFEST),
            BUNDLE_SIGNATURE_MEDIA_TYPE => Some(SIGNATURE),
            _ => None,
        };
        if expected_title.is_some_and(|t| t != title)
            || (expected_title.is_none() && (title == MANIFEST || title == SIGNATURE))
        {
            bail!("{}: the title does not fit the media type", at());
        }
        let (cap, kind) = layer_cap(media);
        let Some(size) = size else {
            bail!("{}: declares no size", at());
        };
        if size > cap {
            bail!(
                "{}: declares {size} bytes, over the limit of {} ({cap} bytes) for a {kind}; \
                 refused before downloading",
                at(),
                size_words(cap)
            );
        }
        if !d.starts_with("sha256:")
            || d.len() != 71
            || !d[7..]
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            bail!(
                "{}: digest {} is not sha256: and 64 lower-case hex digits",
                at(),
                server_text(d)
            );
        }
        if wanted.iter().any(|(t, _, _)| t == title) {
            bail!("{}: two layers have this title", at());
        }
        declared_total += size;
        wanted.push((title.to_string(), d.to_string(), size));
    }
    if declared_total > MAX_PULL_BYTES {
        bail!(
            "{}: the layers declare {declared_total} bytes together, over the limit of {} for \
             a pull; refused before downloading",
            ctx(),
            size_words(MAX_PULL_BYTES)
        );
    }
    if !wanted.iter().any(|(t, _, _)| t == MANIFEST) {
        bail!(
            "{}: the artifact has no bundle.toml layer: not a maporl bundle",
            ctx()
        );
    }
    if out.exists()
        && std::fs::read_dir(out)
            .with_context(|| format!("cannot list {}", out.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{}: {} exists and is not empty; pull into a new directory",
            ctx(),
            out.display()
        );
    }
    let parent = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Removed when dropped: on any error below, nothing is left behind.
    let tmp = tempfile::Builder::new()
        .prefix(".pulling-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temp directory in {}", parent.display()))?;
    for (title, d, size) in &wanted {
        client
            .download_blob(d, *size, tmp.path(), title)
            .with_context(ctx)?;
    }
    // Every component bundle.toml lists must be a layer with the digest it pins.
    let (manifest, _) = Manifest::read(tmp.path()).with_context(ctx)?;
    for c in &manifest.components {
        let layer = wanted.iter().find(|(t, _, _)| *t == c.file);
        match layer {
            Some((_, d, _)) if *d == format!("sha256:{}", c.sha256) => {}
            Some((_, d, _)) => bail!(
                "{}: layer {} has digest {d}, but bundle.toml pins sha256:{}",
                ctx(),
                c.file,
                c.sha256
            ),
            None => bail!(
                "{}: bundle.toml lists {}, which no layer holds",
                ctx(),
                c.file
            ),
        }
    }
    if out.exists() {
        std::fs::remove_dir(out).with_context(|| format!("replacing {}", out.display()))?;
    }
    let kept = tmp.keep();
    std::fs::rename(&kept, out)
        .inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&kept);
        })
        .with_context(|| format!("moving {} to {}", kept.display(), out.display()))?;
    Ok(PullReport {
        digest,
        dir: out.to_path_buf(),
        files: wanted.into_iter().map(|(t, _, _)| t).collect(),
        bytes: declared_total + body.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_addresses_count_as_loopback_and_logins_stay_on_the_registry() {
        for h in ["localhost:5000", "127.0.0.1", "127.0.0.2:80", "[::1]:5000"] {
            assert!(is_loopback_host(h), "{h}");
        }
        for h in [
            "127.evil.example",
            "127.0.0.1.attacker.net:80",
            "ghcr.io",
            "10.0.0.1",
        ] {
            assert!(!is_loopback_host(h), "{h}");
        }
        assert_eq!(url_authority("https://ghcr.io/v2/x?y"), Some("ghcr.io"));
        assert_eq!(url_authority("http://h:5000"), Some("h:5000"));
        assert_ne!(
            url_authority("https://storage.example/blob"),
            url_authority("https://ghcr.io")
        );
    }

    #[test]
    fn references_parse() {
        let r = OciRef::parse("localhost:5000/labs/arith-bundle:0.1.0").unwrap();
        assert_eq!(r.registry, "localhost:5000");
        assert_eq!(r.repository, "labs/arith-bundle");
        assert_eq!(r.tag.as_deref(), Some("0.1.0"));
        assert!(r.is_loopback());
        assert_eq!(r.to_string(), "localhost:5000/labs/arith-bundle:0.1.0");
        let d = format!("ghcr.io/org/x@sha256:{}", "a".repeat(64));
        let r = OciRef::parse(&d).unwrap();
        assert_eq!((r.tag, r.digest.is_some()), (None, true));
        assert!(!OciRef::parse("ghcr.io/org/x:1").unwrap().is_loopback());
        assert!(OciRef::parse("127.0.0.1:5001/x:1").unwrap().is_loopback());
        for bad in [
            "labs/arith:0.1.0",
            "arith",
            "localhost:5000/Labs/x:1",
            "localhost:5000/x:bad tag",
            "localhost:5000/x@md5:00",
        ] {
            let err = OciRef::parse(bad).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn base64_and_challenges() {
        for text in ["", "a", "ab", "abc", "user:pa:ss", "ünïcode"] {
            let enc = base64_encode(text.as_bytes());
            assert_eq!(base64_decode(&enc).unwrap(), text.as_bytes(), "{enc}");
        }
        assert_eq!(base64_encode(b"user:pass"), "dXNlcjpwYXNz");
        assert_eq!(base64_decode("dXNlcjpwYXNz").unwrap(), b"user:pass");
        assert!(base64_decode("not base64!").is_none());
        assert_eq!(
            base64_decode(" dXNlcjpwYQ \n").unwrap(),
            b"user:pa",
            "unpadded"
        );
        let (scheme, params) = parse_challenge(
            r#"Bearer realm="https://ghcr.io/token",service="ghcr.io",scope="repository:o/x:pull,push""#,
        );
        assert_eq!(scheme, "bearer");
        let p: Vec<(&str, &str)> = params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            p,
            [
                ("realm", "https://ghcr.io/token"),
                ("service", "ghcr.io"),
                ("scope", "repository:o/x:pull,push")
            ]
        );
        let (scheme, params) = parse_challenge(r#"Basic realm="a \"quoted\" realm", x=y"#);
        assert_eq!(scheme, "basic");
        assert_eq!(params[0].1, r#"a "quoted" realm"#);
        assert_eq!(params[1], ("x".to_string(), "y".to_string()));
        assert_eq!(registry_key("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(registry_key("GHCR.io"), "ghcr.io");
        let c = Credentials {
            user: "u".into(),
            password: "secret".into(),
            source: "test".into(),
        };
        assert!(!format!("{c:?}").contains("secret"));
    }
}
