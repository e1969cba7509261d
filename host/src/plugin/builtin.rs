//! The reference plugins, built into the binary (host/build.rs embeds them): a run config
//! that names `debate`, `gsm8k.wasm` or `final-only` gets the same component, with the same
//! sha256, wherever `maporl` runs, from a checkout, a copied binary or `cargo install`.
//!
//! A built-in is addressed as `builtin:NAME` (what [`crate::config::Config::plugin_path`]
//! makes of a bare reference name); NAME may be the README's name (`final-only`) or the
//! component file's (`final_only.wasm`).

use std::borrow::Cow;
use std::path::Path;

use super::World;

/// One built-in reference plugin.
#[derive(Debug)]
pub struct Builtin {
    /// The name the README gives it (`final-only`).
    pub name: &'static str,
    /// Its component file as the plugin workspace builds it (`final_only.wasm`).
    pub file: &'static str,
    pub world: World,
    /// sha256 of `bytes`, computed when the binary was built.
    pub sha256: &'static str,
    /// Its source's module documentation: what it does and its settings (empty when the
    /// binary was built from prebuilt components).
    pub docs: &'static str,
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/builtin/table.rs"));

/// The prefix of a built-in plugin's path.
pub const PREFIX: &str = "builtin:";

/// The version the built-ins are listed under: the host's own.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Every built-in reference plugin.
pub fn all() -> &'static [Builtin] {
    BUILTINS
}

/// The built-in called `name`: its README name or its file name, with or without `.wasm`,
/// `-` and `_` alike (`final-only`, `final_only.wasm`, `final-only.wasm`).
pub fn find(name: &str) -> Option<&'static Builtin> {
    let key = |s: &str| s.trim_end_matches(".wasm").replace('_', "-");
    let wanted = key(name);
    BUILTINS.iter().find(|b| key(b.file) == wanted)
}

/// The path that addresses the built-in `b`.
pub fn path_of(b: &Builtin) -> std::path::PathBuf {
    format!("{PREFIX}{}", b.file).into()
}

/// The bytes of the component at `path`: a built-in's from the binary, else the file's.
/// A file larger than `cap` bytes is refused before it is read.
pub(crate) fn read_component(path: &Path, cap: u64) -> Result<Cow<'static, [u8]>, String> {
    let text = path.to_string_lossy();
    if let Some(name) = text.strip_prefix(PREFIX) {
        return match find(name) {
            Some(b) => Ok(Cow::Borrowed(b.bytes)),
            None => {
                let stem = |s: &'static str| s.trim_end_matches(".wasm");
                let near = crate::suggest::nearest(
                    name.trim_end_matches(".wasm"),
                    BUILTINS.iter().flat_map(|b| [b.name, stem(b.file)]),
                )
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
                Err(format!(
                    "no built-in reference plugin is called `{name}`{near}; the built-ins \
                     are {} (a component file in the working directory is named `./{name}`; \
                     set plugins.dir for a directory of them)",
                    names()
                ))
            }
        };
    }
    crate::files::read_regular(path, cap, "plugin component")
        .map(Cow::Owned)
        .map_err(|e| {
            let raise = if cap < crate::files::COMPONENT_CAP_MAX {
                " (a larger plugin needs its limits.max_component_mib raised, at most 1024)"
            } else {
                ""
            };
            format!("{e:#}{raise}")
        })
}

/// The built-ins' names, for messages: `debate (protocol), ...`.
pub fn names() -> String {
    BUILTINS
        .iter()
        .map(|b| format!("{} ({})", b.name, b.world))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn every_reference_plugin_is_built_in_under_both_of_its_names_and_pinned() {
        assert_eq!(all().len(), 9);
        for b in all() {
            assert_eq!(hex::encode(Sha256::digest(b.bytes)), b.sha256, "{}", b.name);
            for alias in [
                b.name.to_string(),
                b.file.to_string(),
                format!("{}.wasm", b.name),
                b.file.trim_end_matches(".wasm").to_string(),
            ] {
                assert_eq!(find(&alias).map(|x| x.file), Some(b.file), "{alias}");
                let bytes = read_component(Path::new(&format!("{PREFIX}{alias}")), 0).unwrap();
                assert_eq!(bytes.as_ref(), b.bytes);
            }
        }
        let f = find("final-only").unwrap();
        assert_eq!((f.file, f.world), ("final_only.wasm", World::RewardShaper));
        let err = read_component(Path::new("builtin:nope"), 0).unwrap_err();
        assert!(
            err.contains("`nope`") && err.contains("final-only (reward-shaper)"),
            "{err}"
        );
        assert!(find("debatee").is_none() && find("").is_none());
    }

    #[test]
    fn the_built_ins_are_the_components_the_plugin_workspace_builds() {
        // In a checkout the same files are in plugins/target: byte for byte the same.
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/target/wasm32-wasip2/release");
        for b in all() {
            let on_disk = std::fs::read(dir.join(b.file)).unwrap();
            assert!(on_disk == b.bytes, "{} differs from {}", b.name, b.file);
        }
    }
}
