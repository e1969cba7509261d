//! The local store of installed bundles: `<root>/<name>/<version>/` holding `bundle.toml`,
//! its signature when signed, and the component files. Installs are atomic (a temp
//! directory in the store, then a rename).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::manifest::{check_name, Manifest, MANIFEST};
use super::sign::SIGNATURE;
use super::verify::Verified;

/// An installed bundle.
#[derive(Clone, Debug)]
pub struct Installed {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub version: semver::Version,
    pub signed: bool,
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
    /// version is replaced only with `force` (or when it is byte-identical).
    pub fn install(&self, bundle: &Verified, force: bool) -> anyhow::Result<PathBuf> {
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
                dir: path,
                manifest,
                version,
            });
        }
        out.sort_by(|a, b| a.version.cmp(&b.version));
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
        let all = self.versions(name)?;
        if all.is_empty() {
            bail!(
                "no bundle `{name}` is installed in {} (install it with `maporl bundle install \
                 DIR` or `maporl bundle pull REF --install`)",
                self.root.display()
            );
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
        let dir = self.root.join(name);
        if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_none()) {
            let _ = std::fs::remove_dir(&dir);
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
