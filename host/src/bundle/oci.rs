//! Sharing bundles through an OCI registry, the way wasm components are shared (wkg and the
//! Wasm OCI artifact layout): an OCI image manifest whose config has media type
//! `application/vnd.wasm.config.v0+json`, one `application/wasm` layer per component, and
//! the bundle's `bundle.toml` (and its signature) as layers of their own; every layer's file
//! name in the `org.opencontainers.image.title` annotation. Pushing is the distribution API's
//! monolithic upload (POST, then PUT with the digest); pulling checks every digest and size.
//!
//! Registries are reached over HTTPS, or plain HTTP for loopback hosts (`localhost`,
//! `127.0.0.1`, `[::1]`) and when asked (`insecure`). Registries that require a login are
//! not supported yet.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use super::manifest::{check_file_name, sha256_hex, Manifest, MANIFEST};
use super::sign::SIGNATURE;

pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
pub const BUNDLE_MANIFEST_MEDIA_TYPE: &str = "application/vnd.maporl.bundle.manifest.v1+toml";
pub const BUNDLE_SIGNATURE_MEDIA_TYPE: &str = "application/vnd.maporl.bundle.signature.v1+toml";
pub const TITLE: &str = "org.opencontainers.image.title";

/// The most a pulled manifest or blob may weigh.
const MAX_MANIFEST: u64 = 4 << 20;
const MAX_BLOB: u64 = 1 << 30;

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
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => self.registry.as_str(),
        };
        matches!(host, "localhost" | "127.0.0.1" | "[::1]") || host.starts_with("127.")
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

/// How to reach the registry.
#[derive(Clone, Debug, Default)]
pub struct OciOptions {
    /// Plain HTTP even for a registry that is not on loopback.
    pub insecure: bool,
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
    repository: String,
}

impl Client {
    fn new(r: &OciRef, opts: &OciOptions) -> Client {
        let scheme = if opts.insecure || r.is_loopback() {
            "http"
        } else {
            "https"
        };
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_per_read(Some(Duration::from_secs(120)))
            .user_agent(concat!("maporl/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            agent,
            base: format!("{scheme}://{}", r.registry),
            repository: r.repository.clone(),
        }
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

    fn blob_exists(&self, digest: &str) -> anyhow::Result<bool> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self
            .agent
            .head(&url)
            .call()
            .with_context(|| format!("HEAD {url}"))?;
        Ok(resp.status().is_success())
    }

    fn upload_blob(&self, digest: &str, bytes: &[u8]) -> anyhow::Result<bool> {
        if self.blob_exists(digest)? {
            return Ok(false);
        }
        let url = self.url("blobs/uploads/");
        let resp = self
            .agent
            .post(&url)
            .send_empty()
            .with_context(|| format!("POST {url}"))?;
        let resp = expect(resp, "POST", &url, 202)?;
        let loc = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .with_context(|| format!("POST {url}: the registry gave no upload Location"))?;
        let loc = self.location(loc);
        let sep = if loc.contains('?') { '&' } else { '?' };
        let put = format!("{loc}{sep}digest={digest}");
        let resp = self
            .agent
            .put(&put)
            .header("Content-Type", "application/octet-stream")
            .send(bytes)
            .with_context(|| format!("PUT {put}"))?;
        expect(resp, "PUT", &put, 201)?;
        Ok(true)
    }

    fn put_manifest(&self, reference: &str, body: &[u8]) -> anyhow::Result<Option<String>> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self
            .agent
            .put(&url)
            .header("Content-Type", MANIFEST_MEDIA_TYPE)
            .send(body)
            .with_context(|| format!("PUT {url}"))?;
        let resp = expect(resp, "PUT", &url, 201)?;
        Ok(resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string))
    }

    fn get_manifest(&self, reference: &str) -> anyhow::Result<(Vec<u8>, Option<String>)> {
        let url = self.url(&format!("manifests/{reference}"));
        let resp = self
            .agent
            .get(&url)
            .header("Accept", MANIFEST_MEDIA_TYPE)
            .call()
            .with_context(|| format!("GET {url}"))?;
        let mut resp = expect(resp, "GET", &url, 200)?;
        let header = resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_MANIFEST)
            .read_to_vec()
            .with_context(|| format!("GET {url}: reading the manifest"))?;
        Ok((body, header))
    }

    fn get_blob(&self, digest: &str, size: u64) -> anyhow::Result<Vec<u8>> {
        let url = self.url(&format!("blobs/{digest}"));
        let resp = self
            .agent
            .get(&url)
            .call()
            .with_context(|| format!("GET {url}"))?;
        let resp = expect(resp, "GET", &url, 200)?;
        let mut bytes = Vec::new();
        resp.into_body()
            .into_reader()
            .take(size.min(MAX_BLOB) + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("GET {url}: reading the blob"))?;
        if bytes.len() as u64 != size {
            bail!(
                "GET {url}: the blob is {} bytes, but the manifest says {size}",
                bytes.len()
            );
        }
        let actual = format!("sha256:{}", sha256_hex(&bytes));
        if actual != digest {
            bail!("GET {url}: the blob's digest is {actual}, not {digest}: refused");
        }
        Ok(bytes)
    }
}

/// Refuses a response whose status is not `want`, with the registry's error text.
fn expect(
    mut resp: ureq::http::Response<ureq::Body>,
    method: &str,
    url: &str,
    want: u16,
) -> anyhow::Result<ureq::http::Response<ureq::Body>> {
    let status = resp.status();
    if status.as_u16() == want || (want == 200 && status.is_success()) {
        return Ok(resp);
    }
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_string()
        .unwrap_or_default();
    let hint = match status.as_u16() {
        401 | 403 => " (registries that need a login are not supported yet)",
        404 if method == "GET" => " (no such repository, tag or blob)",
        _ => "",
    };
    bail!(
        "{method} {url}: HTTP {} {}{hint}{}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        if body.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", body.trim())
        }
    )
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
    let client = Client::new(&r, opts);
    let ctx = || format!("push {} to {r}", manifest.id());
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
            "{}: the registry stored the manifest under digest {told}, not {digest}",
            ctx()
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
/// every digest and size. The caller verifies the bundle (signature, worlds) afterwards.
pub fn pull(r: &OciRef, out: &Path, opts: &OciOptions) -> anyhow::Result<PullReport> {
    let started = Instant::now();
    let ctx = || format!("pull {r}");
    let client = Client::new(r, opts);
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
            "{}: the manifest's digest is {digest}, but the registry says {told}: refused",
            ctx()
        );
    }
    let m: Value = serde_json::from_slice(&body)
        .with_context(|| format!("{}: the manifest is not JSON", ctx()))?;
    if let Some(mt) = m["mediaType"]
        .as_str()
        .filter(|mt| *mt != MANIFEST_MEDIA_TYPE)
    {
        bail!(
            "{}: the manifest's media type is {mt}, not {MANIFEST_MEDIA_TYPE} (an image \
             index or another kind of artifact?)",
            ctx()
        );
    }
    let config_type = m["config"]["mediaType"].as_str().unwrap_or("(none)");
    if config_type != WASM_CONFIG_MEDIA_TYPE {
        bail!(
            "{}: not a wasm artifact (config media type {config_type}, expected \
             {WASM_CONFIG_MEDIA_TYPE})",
            ctx()
        );
    }
    let layers = m["layers"].as_array().cloned().unwrap_or_default();
    let mut wanted = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let media = l["mediaType"].as_str().unwrap_or("");
        let title = l["annotations"][TITLE].as_str().unwrap_or("");
        let d = l["digest"].as_str().unwrap_or("");
        let size = l["size"].as_u64();
        let at = || format!("{}: layer {} ({media})", ctx(), i + 1);
        if ![
            WASM_LAYER_MEDIA_TYPE,
            BUNDLE_MANIFEST_MEDIA_TYPE,
            BUNDLE_SIGNATURE_MEDIA_TYPE,
        ]
        .contains(&media)
        {
            bail!("{}: not a layer of a maporl bundle", at());
        }
        check_file_name(title).with_context(|| format!("{}: its title annotation", at()))?;
        let expected_title = match media {
            BUNDLE_MANIFEST_MEDIA_TYPE => Some(MANIFEST),
            BUNDLE_SIGNATURE_MEDIA_TYPE => Some(SIGNATURE),
            _ => None,
        };
        if expected_title.is_some_and(|t| t != title)
            || (expected_title.is_none() && (title == MANIFEST || title == SIGNATURE))
        {
            bail!("{}: title {title:?} does not fit its media type", at());
        }
        let Some(size) = size.filter(|s| *s <= MAX_BLOB) else {
            bail!("{}: no size, or larger than 1 GiB", at());
        };
        if !d.starts_with("sha256:") || d.len() != 71 {
            bail!("{}: digest {d:?} is not sha256", at());
        }
        if wanted.iter().any(|(t, _, _)| t == title) {
            bail!("{}: two layers named {title:?}", at());
        }
        wanted.push((title.to_string(), d.to_string(), size));
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
    let tmp = tempfile::Builder::new()
        .prefix(".pulling-")
        .tempdir_in(parent)
        .with_context(|| format!("creating a temp directory in {}", parent.display()))?;
    let mut total = 0;
    for (title, d, size) in &wanted {
        let bytes = client.get_blob(d, *size).with_context(ctx)?;
        total += bytes.len() as u64;
        std::fs::write(tmp.path().join(title), &bytes)
            .with_context(|| format!("writing {}", tmp.path().join(title).display()))?;
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
        .with_context(|| format!("moving {} to {}", kept.display(), out.display()))?;
    Ok(PullReport {
        digest,
        dir: out.to_path_buf(),
        files: wanted.into_iter().map(|(t, _, _)| t).collect(),
        bytes: total + body.len() as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
