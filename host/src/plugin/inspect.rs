//! What a component file is: its world, WIT version, imports and exports; and the checks
//! that refuse a component built for another world or an incompatible WIT version.

use std::path::Path;

use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::component::types::{ComponentFunc, ComponentItem};
use wasmtime::component::Component;
use wasmtime::Engine;

use super::{wit_version, World, WIT_PACKAGE, WIT_VERSION};

/// A description of one component file, as `maporl plugin inspect` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct Inspection {
    pub file: String,
    pub size: u64,
    pub sha256: String,
    /// The sha256 of the source it was built from, as its build declares it (see
    /// [`super::source`]); none for a component that declares none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_sha256: Option<String>,
    /// The maporl world the component implements, if any.
    pub world: Option<String>,
    /// The WIT version it was built against, e.g. "0.1.0".
    pub wit_version: Option<String>,
    /// Imported interfaces (e.g. `maporl:plugin/host@0.1.0`, `wasi:cli/environment@0.2.6`).
    pub imports: Vec<String>,
    /// Exported interfaces with their functions' signatures.
    pub exports: Vec<ExportedInterface>,
    /// Bytes of linear memory and tables a fresh instance holds before its first call
    /// (`plugin check` instantiates it to see; `inspect` does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initial_memory: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ExportedInterface {
    pub name: String,
    pub functions: Vec<String>,
}

/// Compiles and describes a component without instantiating it.
pub fn inspect(runtime: &super::Runtime, path: &Path) -> Result<Inspection, String> {
    let bytes = super::builtin::read_component(path, crate::files::COMPONENT_CAP_MAX)?;
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let source_sha256 = super::source::declared(&bytes)?;
    let component = runtime.compile(&bytes, &sha256)?;
    Ok(describe(
        &runtime.engine,
        path,
        bytes.len() as u64,
        sha256,
        source_sha256,
        &component,
    ))
}

/// Describes a compiled component; `size`, `sha256` and `source_sha256` are those of its
/// file.
pub(crate) fn describe(
    engine: &Engine,
    path: &Path,
    size: u64,
    sha256: String,
    source_sha256: Option<String>,
    component: &Component,
) -> Inspection {
    let ty = component.component_type();
    let imports = ty.imports(engine).map(|(n, _)| n.to_string()).collect();
    let mut exports = Vec::new();
    let mut ours = Vec::new();
    for (name, item) in ty.exports(engine) {
        let functions = match &item.ty {
            ComponentItem::ComponentInstance(inst) => inst
                .exports(engine)
                .filter_map(|(f, item)| match &item.ty {
                    ComponentItem::ComponentFunc(func) => Some(signature(f, func)),
                    _ => None,
                })
                .collect(),
            ComponentItem::ComponentFunc(func) => vec![signature(name, func)],
            _ => Vec::new(),
        };
        if let Some((iface, version)) = parse_name(name) {
            ours.push((iface.to_string(), version));
        }
        exports.push(ExportedInterface {
            name: name.to_string(),
            functions,
        });
    }
    let world = ours.iter().find_map(|(iface, _)| {
        World::ALL
            .into_iter()
            .find(|w| w.export_interface() == iface)
    });
    let version = ours.iter().find_map(|(_, v)| *v);
    Inspection {
        file: path.display().to_string(),
        size,
        sha256,
        source_sha256,
        world: world.map(|w| w.name().to_string()),
        wit_version: version.map(|(a, b, c)| format!("{a}.{b}.{c}")),
        imports,
        exports,
        initial_memory: None,
    }
}

fn signature(name: &str, func: &ComponentFunc) -> String {
    let params: Vec<String> = func
        .params()
        .map(|(p, ty)| format!("{p}: {}", type_name(&ty)))
        .collect();
    let results: Vec<String> = func.results().map(|ty| type_name(&ty)).collect();
    if results.is_empty() {
        format!("{name}({})", params.join(", "))
    } else {
        format!("{name}({}) -> {}", params.join(", "), results.join(", "))
    }
}

fn type_name(ty: &wasmtime::component::types::Type) -> String {
    use wasmtime::component::types::Type;
    match ty {
        Type::Bool => "bool".into(),
        Type::U32 => "u32".into(),
        Type::S32 => "s32".into(),
        Type::U64 => "u64".into(),
        Type::S64 => "s64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::String => "string".into(),
        Type::List(l) => format!("list<{}>", type_name(&l.ty())),
        Type::Option(o) => format!("option<{}>", type_name(&o.ty())),
        Type::Result(r) => format!(
            "result<{}, {}>",
            r.ok().map(|t| type_name(&t)).unwrap_or_else(|| "_".into()),
            r.err().map(|t| type_name(&t)).unwrap_or_else(|| "_".into())
        ),
        Type::Tuple(t) => format!(
            "tuple<{}>",
            t.types()
                .map(|t| type_name(&t))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Type::Record(r) => format!(
            "record {{ {} }}",
            r.fields()
                .map(|f| f.name.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        other => format!("{other:?}"),
    }
}

/// A WIT package version: (major, minor, patch).
type Version = (u64, u64, u64);

/// Splits `maporl:plugin/collaboration@0.1.0` into ("collaboration", Some((0, 1, 0))).
pub(crate) fn parse_name(name: &str) -> Option<(&str, Option<Version>)> {
    let rest = name.strip_prefix(WIT_PACKAGE)?.strip_prefix('/')?;
    match rest.split_once('@') {
        None => Some((rest, None)),
        Some((iface, version)) => Some((iface, parse_version(version))),
    }
}

pub(crate) fn parse_version(v: &str) -> Option<Version> {
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// A plugin built against `version` runs on this host when the host links that version's
/// track (see [`super::wit::same_track`]): one of [`super::WIT_VERSIONS`], or a later patch.
pub(crate) fn check_version(what: &str, version: Version) -> Result<(), String> {
    if super::wit::linked_for(version).is_some() {
        return Ok(());
    }
    let newer = version > WIT_VERSION;
    Err(format!(
        "{what} is built against {WIT_PACKAGE}@{}.{}.{}, which this host does not link: it \
         runs plugins built against {WIT_PACKAGE} {} (each, or a later patch of it){}",
        version.0,
        version.1,
        version.2,
        super::wit_versions(),
        if newer {
            "; the plugin is newer than this host: upgrade maporl, or rebuild the plugin \
             against this host's wit/maporl.wit (`maporl plugin new` copies it)"
        } else {
            "; rebuild it against this host's wit/maporl.wit (`maporl plugin new` copies it)"
        }
    ))
}

/// Refuses a component that does not export `world`'s interface at a compatible version,
/// or imports the host interface at an incompatible one, or imports `wasi:http` (what a
/// default componentize-js build does), saying how to build it without.
pub(crate) fn check_world(
    engine: &Engine,
    component: &Component,
    world: World,
) -> Result<(), String> {
    let ty = component.component_type();
    if let Some((http, _)) = ty
        .imports(engine)
        .find(|(n, _)| n.starts_with("wasi:http/"))
    {
        return Err(format!(
            "imports `{http}`, but a plugin has no network, so maporl provides no wasi:http; \
             a JavaScript plugin built with componentize-js imports it unless built without \
             HTTP: `componentize-js ... --disable http fetch-event` (jco: `jco componentize \
             ... --disable http fetch-event`)"
        ));
    }
    let exports: Vec<String> = ty.exports(engine).map(|(n, _)| n.to_string()).collect();
    let want = world.export_interface();
    let found = exports
        .iter()
        .find_map(|e| parse_name(e).filter(|(iface, _)| *iface == want));
    let Some((_, version)) = found else {
        let other = exports.iter().find_map(|e| {
            let (iface, _) = parse_name(e)?;
            World::ALL
                .into_iter()
                .find(|w| w.export_interface() == iface)
                .map(|w| (w, e))
        });
        return Err(match other {
            Some((w, e)) => format!(
                "targets world `{w}` (it exports `{e}`), not world `{world}`, which exports \
                 `{WIT_PACKAGE}/{want}`"
            ),
            None => format!(
                "does not implement world `{world}`: it exports no `{WIT_PACKAGE}/{want}` \
                 interface (its exports: {}); build it with wit-bindgen against wit/maporl.wit",
                if exports.is_empty() {
                    "none".to_string()
                } else {
                    exports.join(", ")
                }
            ),
        });
    };
    let Some(version) = version else {
        return Err(format!(
            "exports `{WIT_PACKAGE}/{want}` without a version; build it against wit/maporl.wit \
             ({WIT_PACKAGE}@{})",
            wit_version()
        ));
    };
    check_version(&format!("its export `{WIT_PACKAGE}/{want}`"), version)?;
    for (import, _) in ty.imports(engine) {
        if let Some((iface, Some(v))) = parse_name(import) {
            check_version(&format!("its import `{WIT_PACKAGE}/{iface}`"), v)?;
        }
    }
    Ok(())
}

/// Refuses files that are not WebAssembly components, with a hint for core modules.
pub(crate) fn check_header(bytes: &[u8]) -> Result<(), String> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Err("not a WebAssembly file (no `\\0asm` header)".to_string());
    }
    match &bytes[4..8] {
        [0x0d, 0x00, 0x01, 0x00] => Ok(()),
        [0x01, 0x00, 0x00, 0x00] => Err(
            "is a core WebAssembly module, not a component: build it for the `wasm32-wasip2` \
             target (cargo build --release --target wasm32-wasip2)"
                .to_string(),
        ),
        other => Err(format!(
            "unknown WebAssembly version/layer bytes {other:02x?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_interface_names_and_versions() {
        assert_eq!(
            parse_name("maporl:plugin/collaboration@0.1.0"),
            Some(("collaboration", Some((0, 1, 0))))
        );
        assert_eq!(parse_name("maporl:plugin/host"), Some(("host", None)));
        assert_eq!(
            parse_name("maporl:plugin/host@1.2.3-rc.1"),
            Some(("host", Some((1, 2, 3))))
        );
        assert_eq!(parse_name("wasi:cli/environment@0.2.6"), None);
        assert_eq!(parse_name("maporl:pluginx/host@0.1.0"), None);
    }

    #[test]
    fn versions_the_host_links_are_accepted_and_others_refused() {
        assert!(check_version("x", (0, 1, 0)).is_ok());
        assert!(check_version("x", (0, 1, 7)).is_ok());
        assert!(check_version("x", (0, 2, 0)).is_ok());
        let err = check_version("x", (0, 3, 0)).unwrap_err();
        assert!(
            err.contains("maporl:plugin@0.3.0")
                && err.contains("0.1.0, 0.2.0")
                && err.contains("newer than this host"),
            "{err}"
        );
        let err = check_version("x", (0, 0, 3)).unwrap_err();
        assert!(err.contains("rebuild it against"), "{err}");
        assert!(check_version("x", (1, 0, 0)).is_err());
    }

    #[test]
    fn header_check_tells_modules_from_components() {
        assert!(check_header(b"\0asm\x0d\x00\x01\x00rest").is_ok());
        let err = check_header(b"\0asm\x01\x00\x00\x00").unwrap_err();
        assert!(err.contains("wasm32-wasip2"), "{err}");
        assert!(check_header(b"hello world")
            .unwrap_err()
            .contains("not a WebAssembly"));
    }
}
