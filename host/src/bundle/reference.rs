//! Plugin references in run configs: a component file path, or `bundle/component@req`
//! resolved against the bundle store to the highest installed version that matches.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::manifest::check_name;
use super::store::Store;
use super::verify::{check_hash, check_signature, check_wit, Trust, TrustPolicy};
use crate::config::{Config, PluginConfig};
use crate::files::expand_home;
use crate::plugin::World;

/// `bundle/component@version-req` (the requirement defaults to any version).
#[derive(Clone, Debug, PartialEq)]
pub struct Reference {
    pub bundle: String,
    pub component: String,
    pub req: semver::VersionReq,
}

impl Reference {
    /// `None` when `text` is a file path: it ends in `.wasm`, starts with `.`, `/` or `~`, or
    /// is not `NAME/NAME[@REQ]`. A reference with a bad name or requirement is an error.
    pub fn parse(text: &str) -> Option<anyhow::Result<Reference>> {
        let (head, req) = match text.split_once('@') {
            Some((h, r)) => (h, Some(r)),
            None => (text, None),
        };
        if text.ends_with(".wasm")
            || text.starts_with(['.', '/', '~'])
            || head.matches('/').count() != 1
            || (req.is_none() && head.contains(['.', '\\']))
        {
            return None;
        }
        let (bundle, component) = head.split_once('/').expect("one slash");
        Some(Reference::build(text, bundle, component, req))
    }

    fn build(
        text: &str,
        bundle: &str,
        component: &str,
        req: Option<&str>,
    ) -> anyhow::Result<Reference> {
        let at = || format!("plugin reference `{text}` (bundle/component@version-req)");
        check_name("bundle", bundle).with_context(at)?;
        check_name("component", component).with_context(at)?;
        let req = match req {
            None => semver::VersionReq::STAR,
            Some(r) => semver::VersionReq::parse(r)
                .with_context(|| format!("`{r}` is not a semver version requirement"))
                .with_context(at)?,
        };
        Ok(Reference {
            bundle: bundle.to_string(),
            component: component.to_string(),
            req,
        })
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.bundle, self.component, self.req)
    }
}

/// What a run's plugin reference resolved to.
#[derive(Clone, Debug)]
pub struct ResolvedPlugin {
    /// The reference as the config wrote it.
    pub reference: String,
    pub world: World,
    /// The component file to load.
    pub path: PathBuf,
    /// The settings `configure` receives: the bundle's defaults, overridden key by key by
    /// the run config's.
    pub settings: serde_json::Value,
    pub bundle: Option<ResolvedBundle>,
}

/// The installed bundle a reference picked.
#[derive(Clone, Debug)]
pub struct ResolvedBundle {
    pub name: String,
    pub version: semver::Version,
    pub component: String,
    pub file: String,
    /// The sha256 the (verified) manifest pins.
    pub sha256: String,
    pub trust: Trust,
    /// The key id that signed it, or `unsigned`.
    pub signer: String,
}

/// The bundle store a config uses: `plugins.store`, else the default store.
pub fn config_store(config: &Config) -> Store {
    if config.plugins.store.is_empty() {
        Store::default_store()
    } else {
        Store::new(expand_home(&config.plugins.store))
    }
}

/// The trust policy a config sets: `plugins.trusted_keys` (else the default file) and
/// `plugins.allow_unsigned`.
pub fn config_policy(config: &Config) -> TrustPolicy {
    TrustPolicy {
        trusted_keys: if config.plugins.trusted_keys.is_empty() {
            super::default_trusted_keys()
        } else {
            expand_home(&config.plugins.trusted_keys)
        },
        allow_unsigned: config.plugins.allow_unsigned,
    }
}

/// Resolves the plugin in `world`'s slot of `config`: a path as [`Config::plugin_path`]
/// makes it, or a bundle reference to the highest installed version that matches, after
/// checking that bundle's signature against the config's trust policy, its WIT version,
/// the component's world and its sha256.
pub fn resolve_plugin(
    config: &Config,
    plugin: &PluginConfig,
    world: World,
) -> anyhow::Result<ResolvedPlugin> {
    let Some(reference) = Reference::parse(&plugin.path) else {
        return Ok(ResolvedPlugin {
            reference: plugin.path.clone(),
            world,
            path: config.plugin_path(plugin),
            settings: plugin.settings_json(),
            bundle: None,
        });
    };
    let reference = reference?;
    let store = config_store(config);
    let what = || format!("plugin `{}` for world {world}", plugin.path);
    // The signer the config names for this bundle, else the one the store bound it to.
    let installed = store
        .find_signed(
            &reference.bundle,
            &reference.req,
            config
                .plugins
                .signers
                .get(&reference.bundle)
                .map(String::as_str),
        )
        .with_context(what)?;
    let m = &installed.manifest;
    let bytes = std::fs::read(installed.dir.join(super::MANIFEST))
        .with_context(|| format!("reading {}", installed.dir.display()))?;
    let trust =
        check_signature(&installed.dir, &bytes, &config_policy(config)).with_context(what)?;
    check_wit(m).with_context(what)?;
    let Some(component) = m.component(&reference.component) else {
        bail!(
            "{}: bundle {} has no component `{}` (its components: {})",
            what(),
            m.id(),
            reference.component,
            m.components
                .iter()
                .map(|c| format!("{} ({})", c.name, c.world))
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if component.world != world.name() {
        bail!(
            "{}: component `{}` of bundle {} targets world `{}`, not world `{world}`",
            what(),
            component.name,
            m.id(),
            component.world
        );
    }
    check_hash(&installed.dir, &component.file, &component.sha256)
        .with_context(|| format!("installed bundle {} is damaged or tampered with", m.id()))
        .with_context(what)?;
    let mut settings = component.settings.clone();
    for (k, v) in &plugin.settings {
        settings.insert(k.clone(), v.clone());
    }
    Ok(ResolvedPlugin {
        reference: plugin.path.clone(),
        world,
        path: installed.dir.join(&component.file),
        settings: serde_json::to_value(&settings).expect("TOML tables are valid JSON"),
        bundle: Some(ResolvedBundle {
            name: m.bundle.name.clone(),
            version: installed.version.clone(),
            component: component.name.clone(),
            file: component.file.clone(),
            sha256: component.sha256.clone(),
            trust,
            signer: installed.signer.clone(),
        }),
    })
}

/// Resolves the three plugins of a config: protocol, verifier, shaper. A malformed
/// `bundle/component@req` reference is an error naming its key, before any is resolved.
pub fn resolve_plugins(config: &Config) -> anyhow::Result<[ResolvedPlugin; 3]> {
    let p = &config.plugins;
    for (role, plugin) in [
        ("protocol", &p.protocol),
        ("verifier", &p.verifier),
        ("shaper", &p.shaper),
    ] {
        if let Some(Err(e)) = Reference::parse(&plugin.path) {
            return Err(e.context(format!("plugins.{role}.path")));
        }
    }
    Ok([
        resolve_plugin(config, &p.protocol, World::Protocol)?,
        resolve_plugin(config, &p.verifier, World::Verifier)?,
        resolve_plugin(config, &p.shaper, World::RewardShaper)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_references_are_told_apart() {
        for path in [
            "debate.wasm",
            "./mine/v.wasm",
            "/opt/x",
            "~/p/x",
            "mine/v.wasm",
            "a/b/c",
            "plain",
            "dir/file.bin",
        ] {
            assert!(Reference::parse(path).is_none(), "{path}");
        }
        let r = Reference::parse("arith/debate@^0.1").unwrap().unwrap();
        assert_eq!(
            (r.bundle.as_str(), r.component.as_str()),
            ("arith", "debate")
        );
        assert!(r.req.matches(&semver::Version::new(0, 1, 9)));
        assert!(!r.req.matches(&semver::Version::new(0, 2, 0)));
        let any = Reference::parse("arith/gsm8k").unwrap().unwrap();
        assert_eq!(any.req, semver::VersionReq::STAR);
        let err = format!(
            "{:#}",
            Reference::parse("arith/debate@banana")
                .unwrap()
                .unwrap_err()
        );
        assert!(
            err.contains("arith/debate@banana") && err.contains("banana"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            Reference::parse("Arith/debate@1").unwrap().unwrap_err()
        );
        assert!(err.contains("bundle"), "{err}");
    }
}
