//! `bundle.toml`: what a bundle is (name, version, description, licence, authors, the WIT
//! version it targets) and, per component, its file, world, sha256 and default settings.
//! `pack` fills in what can be read from the components themselves.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::plugin::{self, Runtime, World, WIT_PACKAGE};

/// The manifest's file name inside a bundle directory.
pub const MANIFEST: &str = "bundle.toml";
/// The signature's file name inside a bundle directory.
pub const SIGNATURE: &str = "bundle.toml.sig";

/// A bundle manifest, as `bundle.toml` holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub bundle: BundleInfo,
    #[serde(rename = "component", default)]
    pub components: Vec<ComponentEntry>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleInfo {
    /// Lower-case letters, digits, `-` and `_` (see [`check_name`]); what run configs name (`NAME/component@req`).
    pub name: String,
    /// A semver version, e.g. "0.1.0".
    pub version: String,
    #[serde(default)]
    pub description: String,
    /// An SPDX licence expression, e.g. "Apache-2.0".
    #[serde(default, alias = "license")]
    pub licence: String,
    #[serde(default)]
    pub authors: Vec<String>,
    /// The WIT package the components are built against, e.g. "maporl:plugin@0.1.0"
    /// (filled by `pack`: the highest version among the components).
    #[serde(default)]
    pub wit: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentEntry {
    /// The component's name in references (`bundle/NAME@req`); default: the file's stem.
    #[serde(default)]
    pub name: String,
    /// The component file, a plain name inside the bundle directory.
    pub file: String,
    /// protocol, verifier or reward-shaper (filled by `pack`).
    #[serde(default)]
    pub world: String,
    /// sha256 of the file, hex (filled by `pack`).
    #[serde(default)]
    pub sha256: String,
    /// sha256 of the source the component was built from, as its build declares it in the
    /// component (filled by `pack`; absent when it declares none). See `plugin::source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_sha256: Option<String>,
    /// Settings passed to `configure` unless the run config overrides them (key by key).
    #[serde(default)]
    pub settings: toml::Table,
}

impl Manifest {
    /// Reads and checks `DIR/bundle.toml`.
    pub fn read(dir: &Path) -> anyhow::Result<(Manifest, Vec<u8>)> {
        let path = dir.join(MANIFEST);
        let bytes = crate::files::read_regular(&path, crate::files::TEXT_MAX, "bundle manifest")?;
        let manifest = Manifest::parse(&bytes).with_context(|| format!("in {}", path.display()))?;
        Ok((manifest, bytes))
    }

    /// Parses manifest text and checks every field a packed manifest must have.
    pub fn parse(bytes: &[u8]) -> anyhow::Result<Manifest> {
        let text = std::str::from_utf8(bytes).context("bundle.toml is not UTF-8")?;
        let manifest: Manifest = toml::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))?;
        manifest.check(true)?;
        Ok(manifest)
    }

    /// The bundle's version, parsed.
    pub fn version(&self) -> semver::Version {
        semver::Version::parse(&self.bundle.version).expect("checked when parsed")
    }

    /// `name@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.bundle.name, self.bundle.version)
    }

    pub fn component(&self, name: &str) -> Option<&ComponentEntry> {
        self.components.iter().find(|c| c.name == name)
    }

    /// The WIT version the manifest declares, as (major, minor, patch).
    pub fn wit_version(&self) -> anyhow::Result<(u64, u64, u64)> {
        parse_wit(&self.bundle.wit)
    }

    /// `packed`: the fields `pack` fills in must be there too.
    fn check(&self, packed: bool) -> anyhow::Result<()> {
        let b = &self.bundle;
        check_name("bundle.name", &b.name)?;
        semver::Version::parse(&b.version).with_context(|| {
            format!(
                "bundle.version = {:?} is not a semver version (e.g. \"0.1.0\")",
                b.version
            )
        })?;
        if packed {
            parse_wit(&b.wit).context("bundle.wit")?;
        }
        if self.components.is_empty() {
            bail!("the bundle lists no components ([[component]] with file = \"x.wasm\")");
        }
        let mut names = std::collections::BTreeSet::new();
        let mut files = std::collections::BTreeSet::new();
        for (i, c) in self.components.iter().enumerate() {
            let at = format!("component {} ({:?})", i + 1, c.file);
            check_file_name(&c.file).with_context(|| at.clone())?;
            if !c.name.is_empty() || packed {
                check_name(&format!("{at}: name"), &c.name)?;
            }
            if !c.world.is_empty() || packed {
                World::parse(&c.world).map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
            }
            if packed && (c.sha256.len() != 64 || hex::decode(&c.sha256).is_err()) {
                bail!(
                    "{at}: sha256 = {:?} is not 64 hex digits; run `maporl bundle pack`",
                    c.sha256
                );
            }
            if let Some(source) = &c.source_sha256 {
                let hex = source.len() == 64
                    && source
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
                if !hex {
                    bail!("{at}: source_sha256 = {source:?} is not 64 lower-case hex digits");
                }
            }
            if !files.insert(c.file.clone()) {
                bail!("{at}: the file is listed twice");
            }
            if !c.name.is_empty() && !names.insert(c.name.clone()) {
                bail!("{at}: the name `{}` is used twice", c.name);
            }
        }
        Ok(())
    }

    pub fn to_toml(&self) -> String {
        let mut text = String::from(
            "# A maporl plugin bundle (`maporl bundle pack` fills world, sha256 and wit;\n\
             # `maporl bundle sign` signs this file's exact bytes).\n",
        );
        text.push_str(&toml::to_string_pretty(self).expect("a manifest serializes"));
        text
    }
}

/// "maporl:plugin@0.1.0" -> (0, 1, 0).
pub fn parse_wit(wit: &str) -> anyhow::Result<(u64, u64, u64)> {
    let version = wit
        .strip_prefix(WIT_PACKAGE)
        .and_then(|r| r.strip_prefix('@'))
        .with_context(|| format!("{wit:?} is not `{WIT_PACKAGE}@X.Y.Z`"))?;
    let v = semver::Version::parse(version)
        .with_context(|| format!("{wit:?}: `{version}` is not a semver version"))?;
    Ok((v.major, v.minor, v.patch))
}

/// Names in references: lower-case ASCII letters, digits, `-` and `_`, starting with a
/// letter or digit.
pub fn check_name(what: &str, name: &str) -> anyhow::Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !ok {
        bail!(
            "{what} = {name:?}: expected 1-64 lower-case letters, digits, `-` or `_`, \
             starting with a letter or digit"
        );
    }
    Ok(())
}

/// Component (and other bundle) files are plain names: no directories, nothing hidden.
pub fn check_file_name(file: &str) -> anyhow::Result<()> {
    let ok = !file.is_empty()
        && !file.starts_with('.')
        && file.len() <= 128
        && file
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        bail!(
            "file name {file:?}: expected a plain file name inside the bundle \
             (letters, digits, `-`, `_`, `.`; no directories, not starting with `.`)"
        );
    }
    Ok(())
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Metadata for a new manifest when the directory has no `bundle.toml` yet.
#[derive(Clone, Debug, Default)]
pub struct NewBundle {
    pub name: Option<String>,
    pub version: Option<String>,
    pub description: Option<String>,
    pub licence: Option<String>,
    pub authors: Vec<String>,
}

/// Packs `dir` into a bundle: reads its `bundle.toml` (or starts one from `new` listing every
/// `*.wasm` in `dir`), inspects every component (world, WIT version, that it links against
/// this host), fills in world, sha256 and the bundle's WIT version, and writes `bundle.toml`
/// back. A signature left from before is removed: it no longer matches.
pub fn pack(runtime: &Runtime, dir: &Path, new: &NewBundle) -> anyhow::Result<Manifest> {
    let path = dir.join(MANIFEST);
    let mut manifest = if path.is_file() {
        let text =
            crate::files::read_regular_text(&path, crate::files::TEXT_MAX, "bundle manifest")?;
        let mut m: Manifest = toml::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("in {}", path.display()))?;
        // Flags given on the command line update the manifest.
        let b = &mut m.bundle;
        if let Some(v) = &new.name {
            b.name.clone_from(v);
        }
        if let Some(v) = &new.version {
            b.version.clone_from(v);
        }
        if let Some(v) = &new.description {
            b.description.clone_from(v);
        }
        if let Some(v) = &new.licence {
            b.licence.clone_from(v);
        }
        if !new.authors.is_empty() {
            b.authors.clone_from(&new.authors);
        }
        m
    } else {
        let (Some(name), Some(version)) = (&new.name, &new.version) else {
            bail!(
                "{} does not exist: write one, or give --name and --version to start one \
                 listing every *.wasm in {}",
                path.display(),
                dir.display()
            );
        };
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot list {}", dir.display()))?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|f| f.ends_with(".wasm"))
            .collect();
        files.sort();
        Manifest {
            bundle: BundleInfo {
                name: name.clone(),
                version: version.clone(),
                description: new.description.clone().unwrap_or_default(),
                licence: new.licence.clone().unwrap_or_default(),
                authors: new.authors.clone(),
                wit: String::new(),
            },
            components: files
                .into_iter()
                .map(|file| ComponentEntry {
                    name: String::new(),
                    file,
                    world: String::new(),
                    sha256: String::new(),
                    source_sha256: None,
                    settings: toml::Table::new(),
                })
                .collect(),
        }
    };
    manifest
        .check(false)
        .with_context(|| format!("in {}", path.display()))?;
    let mut wit = (0, 0, 0);
    for c in &mut manifest.components {
        let file = dir.join(&c.file);
        let what = format!("component {:?} ({})", c.file, file.display());
        let ins = plugin::inspect(runtime, &file).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let Some(world) = ins.world.as_deref() else {
            bail!(
                "{what} is not a maporl plugin: it exports none of the worlds' interfaces \
                 (protocol, verifier, reward-shaper)"
            );
        };
        if !c.world.is_empty() && c.world != world {
            bail!(
                "{what}: bundle.toml says world `{}`, but the component targets world `{world}`",
                c.world
            );
        }
        let world = World::parse(world).expect("inspect names known worlds");
        runtime
            .check(&file, world)
            .map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        let version = ins.wit_version.as_deref().unwrap_or("0.0.0");
        let v = parse_wit(&format!("{WIT_PACKAGE}@{version}"))?;
        wit = wit.max(v);
        if c.name.is_empty() {
            c.name = stem_name(&c.file);
        }
        c.world = world.name().to_string();
        c.sha256 = ins.sha256;
        c.source_sha256 = ins.source_sha256;
    }
    manifest.bundle.wit = format!("{WIT_PACKAGE}@{}.{}.{}", wit.0, wit.1, wit.2);
    manifest
        .check(true)
        .with_context(|| format!("in {}", path.display()))?;
    crate::files::write_atomic(&path, manifest.to_toml().as_bytes())?;
    let sig = dir.join(SIGNATURE);
    if sig.exists() {
        std::fs::remove_file(&sig).with_context(|| format!("removing {}", sig.display()))?;
    }
    Ok(manifest)
}

/// `my_verifier.wasm` -> `my-verifier`.
fn stem_name(file: &str) -> String {
    let stem = file.strip_suffix(".wasm").unwrap_or(file);
    stem.to_ascii_lowercase().replace('_', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[bundle]
name = "arith"
version = "0.1.0"
licence = "Apache-2.0"
wit = "maporl:plugin@0.1.0"

[[component]]
name = "debate"
file = "debate.wasm"
world = "protocol"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
[component.settings]
turns = 3
"#;

    #[test]
    fn a_packed_manifest_parses_and_round_trips() {
        let m = Manifest::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(m.id(), "arith@0.1.0");
        assert_eq!(m.wit_version().unwrap(), (0, 1, 0));
        assert_eq!(m.components[0].settings["turns"].as_integer(), Some(3));
        assert_eq!(Manifest::parse(m.to_toml().as_bytes()).unwrap(), m);
    }

    #[test]
    fn bad_fields_are_named() {
        let cases = [
            ("name = \"arith\"", "name = \"Arith!\"", "bundle.name"),
            ("version = \"0.1.0\"", "version = \"one\"", "bundle.version"),
            (
                "file = \"debate.wasm\"",
                "file = \"../x.wasm\"",
                "../x.wasm",
            ),
            ("world = \"protocol\"", "world = \"judge\"", "unknown world"),
            ("sha256 = \"0000", "sha256 = \"zz00", "sha256"),
            ("licence = \"Apache-2.0\"", "licence = 1", "licence"),
            (
                "wit = \"maporl:plugin@0.1.0\"",
                "wit = \"0.1.0\"",
                "bundle.wit",
            ),
        ];
        for (from, to, want) in cases {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "{from}");
            let err = format!("{:#}", Manifest::parse(text.as_bytes()).unwrap_err());
            assert!(err.contains(want), "{to}: {err}");
        }
        let err = format!(
            "{:#}",
            Manifest::parse(GOOD.replacen("licence", "extra = 1\nlicence", 1).as_bytes())
                .unwrap_err()
        );
        assert!(err.contains("extra"), "{err}");
    }

    #[test]
    fn wit_and_names() {
        assert_eq!(parse_wit("maporl:plugin@1.2.3").unwrap(), (1, 2, 3));
        assert!(parse_wit("wasi:cli@0.2.0").is_err());
        assert_eq!(stem_name("my_verifier.wasm"), "my-verifier");
        assert!(check_file_name("a/b.wasm").is_err());
        assert!(check_file_name(".hidden").is_err());
        assert!(check_file_name("gsm8k.wasm").is_ok());
    }
}
