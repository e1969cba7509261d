//! The local store of installed bundles: `<root>/<name>/<version>/` holding `bundle.toml`,
//! its signature when signed, and the component files. Installs are atomic (a temp
//! directory in the store, then a rename).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::manifest::SIGNATURE;
use super::manifest::{check_name, Manifest, MANIFEST};
use super::verify::Verified;

/// An installed bundle.
#[derive(Clone, Debug)]
pub struct Installed {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub version: semver::Version,
    pub signed: bool,
    /// Who signed it: the signature's key id, or [`UNSIGNED`].
    pub signer: String,
}

/// The signer of a bundle without a signature.
pub const UNSIGNED: &str = "unsigned";

/// Beside a bundle's versions: the signer its name is bound to (the key that first
/// installed it), so that another lab's release of the same name is never picked silently.
const SIGNER_FILE: &str = ".signer";

/// Who signed the bundle in `dir`: its signature's key id, or [`UNSIGNED`].
pub fn signer_of(dir: &Path) -> anyhow::Result<String> {
    let sig = dir.join(SIGNATURE);
    if !sig.exists() {
        return Ok(UNSIGNED.to_string());
    }
    Ok(super::sign::SignatureFile::read(&sig)?.key_id)
}

/// Orders versions by semver precedence, build metadata ignored (`1.0.0+a` and `1.0.0+b`
/// are the same release), then by build metadata only to make the order total.
pub fn by_precedence(a: &semver::Version, b: &semver::Version) -> std::cmp::Ordering {
    (a.major, a.minor, a.patch, &a.pre)
        .cmp(&(b.major, b.minor, b.patch, &b.pre))
        .then_with(|| a.build.cmp(&b.build))
}

/// A bundle store rooted at a directory.
#[derive(Clone, Debug)]
pub struct Store {
    pub root: PathBuf,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    /// The store at `$MAPORL_BUNDLES`, else in the user's data dir
    /// (`~/.local/share/maporl/bundles` on Linux).
    pub fn default_store() -> Store {
        Store::new(super::default_store_dir())
    }

    /// Copies a verified bundle into the store. An installed bundle of the same name and
    /// version is replaced only with `force` (or when it is byte-identical). The first
    /// install of a name binds it to its signer; a bundle of that name by another signer is
    /// refused unless `allow_signer_change`, which moves the binding.
    pub fn install(&self, bundle: &Verified, force: bool) -> anyhow::Result<PathBuf> {
        self.install_with(bundle, force, false)
    }

    /// [`install`](Self::install), allowing a change of signer explicitly.
    pub fn install_with(
        &self,
        bundle: &Verified,
        force: bool,
        allow_signer_change: bool,
    ) -> anyhow::Result<PathBuf> {
        let m = &bundle.manifest;
        let signer = signer_of(&bundle.dir)?;
        let bound = self.bound_signer(&m.bundle.name)?;
        if let Some(bound) = bound.as_deref().filter(|b| *b != signer) {
            if !allow_signer_change {
                bail!(
                    "bundle `{}` is bound to signer {bound} (the key that first installed it), \
                     but {} is signed by {signer}: refusing a change of signer. If that lab now \
                     publishes `{}`, install with --allow-signer-change",
                    m.bundle.name,
                    m.id(),
                    m.bundle.name
                );
            }
        }
        let dest = self.install_files(bundle, force)?;
        if bound.as_deref() != Some(signer.as_str()) {
            crate::files::write_atomic(
                &self.root.join(&m.bundle.name).join(SIGNER_FILE),
                format!("{signer}\n").as_bytes(),
            )?;
        }
        Ok(dest)
    }

    /// The signer `name` is bound to, if any install bound it.
    pub fn bound_signer(&self, name: &str) -> anyhow::Result<Option<String>> {
        check_name("bundle name", name)?;
        let path = self.root.join(name).join(SIGNER_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = crate::files::read_regular_text(&path, 1024, "bundle signer binding")?;
        Ok(Some(text.trim().to_string()))
    }

    fn install_files(&self, bundle: &Verified, force: bool) -> anyhow::Result<PathBuf> {
        let m = &bundle.manifest;
        let dest = self.root.join(&m.bundle.name).join(&m.bundle.version);
        if dest.exists() {
            let same = std::fs::read(dest.join(MANIFEST)).ok().as_deref()
                == Some(bundle.manifest_bytes.as_slice())
                && m.components
                    .iter()
                    .all(|c| super::verify::check_hash(&dest, &c.file, &c.sha256).is_ok())
                && std::fs::read(dest.join(SIGNATURE)).ok()
                    == std::fs::read(bundle.dir.join(SIGNATURE)).ok();
            if same {
                return Ok(dest);
            }
            if !force {
                bail!(
                    "{} is already installed at {} with different contents: remove it first \
                     (`maporl bundle remove {}`) or install with --force",
                    m.id(),
                    dest.display(),
                    m.id()
                );
            }
        }
        let parent = dest.parent().expect("dest has a parent");
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating the store directory {}", parent.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".installing-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a temp directory in {}", parent.display()))?;
        let mut files: Vec<&str> = vec![MANIFEST];
        if bundle.dir.join(SIGNATURE).is_file() {
            files.push(SIGNATURE);
        }
        files.extend(m.components.iter().map(|c| c.file.as_str()));
        for f in files {
            let from = bundle.dir.join(f);
            std::fs::copy(&from, tmp.path().join(f)).with_context(|| {
                format!("copying {} into {}", from.display(), tmp.path().display())
            })?;
        }
        // The manifest copied must be the one verified.
        if std::fs::read(tmp.path().join(MANIFEST))? != bundle.manifest_bytes {
            bail!(
                "{} changed while it was being installed",
                bundle.dir.join(MANIFEST).display()
            );
        }
        for c in &m.components {
            super::verify::check_hash(tmp.path(), &c.file, &c.sha256)
                .context("a component changed while it was being installed")?;
        }
        if dest.exists() {
            std::fs::remove_dir_all(&dest)
                .with_context(|| format!("removing the old {}", dest.display()))?;
        }
        let kept = tmp.keep();
        std::fs::rename(&kept, &dest)
            .with_context(|| format!("moving {} to {}", kept.display(), dest.display()))?;
        Ok(dest)
    }

    /// Every installed version of `name`, lowest first.
    pub fn versions(&self, name: &str) -> anyhow::Result<Vec<Installed>> {
        check_name("bundle name", name)?;
        let dir = self.root.join(name);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot list {}", dir.display())),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let Some(version) = entry
                .file_name()
                .to_str()
                .and_then(|v| semver::Version::parse(v).ok())
            else {
                continue; // temp directories of installs in progress, stray files
            };
            let path = entry.path();
            let (manifest, _) = Manifest::read(&path)
                .with_context(|| format!("installed bundle {name}@{version} is damaged"))?;
            if manifest.bundle.name != name || manifest.version() != version {
                bail!(
                    "installed bundle at {} says it is {}: the store is damaged; remove that \
                     directory",
                    path.display(),
                    manifest.id()
                );
            }
            out.push(Installed {
                signed: path.join(SIGNATURE).is_file(),
                signer: signer_of(&path)
                    .with_context(|| format!("installed bundle {name}@{version} is damaged"))?,
                dir: path,
                manifest,
                version,
            });
        }
        out.sort_by(|a, b| by_precedence(&a.version, &b.version));
        Ok(out)
    }

    /// Every installed bundle, by name then version.
    pub fn list(&self) -> anyhow::Result<Vec<Installed>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => {
                return Err(e).with_context(|| format!("cannot list {}", self.root.display()))
            }
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| check_name("", n).is_ok())
            .collect();
        names.sort();
        let mut out = Vec::new();
        for n in names {
            out.extend(self.versions(&n)?);
        }
        Ok(out)
    }

    /// The highest installed version of `name` that `req` accepts.
    pub fn find(&self, name: &str, req: &semver::VersionReq) -> anyhow::Result<Installed> {
        self.find_signed(name, req, None)
    }

    /// The highest installed version of `name` that `req` accepts and `signer` signed
    /// (by semver precedence, build metadata ignored). Without `signer`, the one the name is
    /// bound to, else the one every installed version shares (several signers and no
    /// binding is refused as ambiguous).
    pub fn find_signed(
        &self,
        name: &str,
        req: &semver::VersionReq,
        signer: Option<&str>,
    ) -> anyhow::Result<Installed> {
        let mut all = self.versions(name)?;
        if all.is_empty() {
            bail!(
                "no bundle `{name}` is installed in {} (install it with `maporl bundle install \
                 DIR` or `maporl bundle pull REF --install`)",
                self.root.display()
            );
        }
        let signer = match signer {
            Some(s) => Some(s.to_string()),
            None => self.bound_signer(name)?,
        };
        let signer = match signer {
            Some(s) => Some(s),
            None => {
                let mut signers: Vec<&str> = all.iter().map(|i| i.signer.as_str()).collect();
                signers.sort_unstable();
                signers.dedup();
                if signers.len() > 1 {
                    bail!(
                        "bundle `{name}` is installed from several signers ({}) and none is \
                         bound: name the one to use in the run config (plugins.signers = {{ \
                         {name} = \"KEY_ID\" }})",
                        signers.join(", ")
                    );
                }
                None
            }
        };
        if let Some(s) = &signer {
            let others: Vec<String> = all
                .iter()
                .filter(|i| &i.signer != s)
                .map(|i| format!("{} by {}", i.version, i.signer))
                .collect();
            all.retain(|i| &i.signer == s);
            if all.is_empty() {
                bail!(
                    "no installed version of bundle `{name}` is signed by {s} (installed: {})",
                    others.join(", ")
                );
            }
        }
        let listed = all
            .iter()
            .map(|i| i.version.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        all.into_iter()
            .rev()
            .find(|i| req.matches(&i.version))
            .with_context(|| {
                format!(
                    "no installed version of bundle `{name}` matches `{req}` (installed: {listed})"
                )
            })
    }

    /// Removes `name@version`, or `name` when it has a single version installed (or every
    /// version with `all`); returns the versions removed.
    pub fn remove(
        &self,
        name: &str,
        version: Option<&str>,
        all: bool,
    ) -> anyhow::Result<Vec<semver::Version>> {
        let installed = self.versions(name)?;
        if installed.is_empty() {
            bail!("no bundle `{name}` is installed in {}", self.root.display());
        }
        let chosen: Vec<&Installed> = match version {
            Some(v) => {
                let v = semver::Version::parse(v)
                    .with_context(|| format!("`{v}` is not a semver version"))?;
                let found: Vec<_> = installed.iter().filter(|i| i.version == v).collect();
                if found.is_empty() {
                    bail!(
                        "{name}@{v} is not installed (installed: {})",
                        versions_of(&installed)
                    );
                }
                found
            }
            None if installed.len() == 1 || all => installed.iter().collect(),
            None => bail!(
                "several versions of `{name}` are installed ({}): name one \
                 (`maporl bundle remove {name}@VERSION`) or pass --all",
                versions_of(&installed)
            ),
        };
        let mut removed = Vec::new();
        for i in chosen {
            std::fs::remove_dir_all(&i.dir)
                .with_context(|| format!("removing {}", i.dir.display()))?;
            removed.push(i.version.clone());
        }
        // The last version gone, the name is free: its signer binding goes with it.
        if self.versions(name)?.is_empty() {
            let dir = self.root.join(name);
            let _ = std::fs::remove_file(dir.join(SIGNER_FILE));
            if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none()) {
                let _ = std::fs::remove_dir(&dir);
            }
        }
        Ok(removed)
    }
}

fn versions_of(installed: &[Installed]) -> String {
    installed
        .iter()
        .map(|i| i.version.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `NAME` or `NAME@VERSION`, as `remove` takes them.
pub fn split_name_version(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once('@') {
        Some((n, v)) => (n, Some(v)),
        None => (spec, None),
    }
}

/// Whether `path` looks like a bundle directory.
pub fn is_bundle_dir(path: &Path) -> bool {
    path.join(MANIFEST).is_file()
}
