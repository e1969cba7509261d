//! The versions of the contract this host links, one bindings module each (as Zed's
//! extension host does): `since_v0_1_0` for plugins built against 0.1.x and `since_v0_2_0`,
//! the latest, for 0.2.x. wasmtime matches an import of `maporl:plugin/host@0.1.x` only with
//! a definition at `@0.1.*` (`@1.x` with `@1.*`), so each version's `host` interface is
//! linked under its own name, and the older ones answer through the latest.
//!
//! Exports need no module per version: the host finds the interface a component exports at
//! whichever supported version it has, and checks each function's type structurally (record
//! fields, enum cases), which is what keeps a version's records unchanged within a major.
//!
//! Releasing a version: freeze `wit/maporl.wit` as `wit/since_vX.Y.Z/`, add a module here
//! that generates from the frozen copy and implements its `host` through the latest one,
//! and add the version to [`VERSIONS`].

use wasmtime::component::{HasSelf, Linker};

use super::sandbox::Sandbox;

pub(crate) mod since_v0_1_0;
pub(crate) mod since_v0_2_0;

/// The latest version: the one `wit/maporl.wit` holds, whose records the host converts to.
pub(crate) use since_v0_2_0 as latest;

/// A contract version: (major, minor, patch).
pub type Version = (u64, u64, u64);

/// Every version of the contract this host links, oldest first; the last is
/// `wit/maporl.wit`'s.
pub const VERSIONS: [Version; 2] = [(0, 1, 0), (0, 2, 0)];

/// Whether a plugin built against `version` links with the host's `linked` version:
/// wasmtime's semver tracks (`0.0.z` alone, `0.y.*` within one minor, `x.*` within one
/// major) and, within a track, a minor not above the linked one (a newer minor may import
/// what the host lacks).
pub(crate) fn same_track(version: Version, linked: Version) -> bool {
    match version {
        (0, 0, patch) => linked == (0, 0, patch),
        (0, minor, _) => linked.0 == 0 && linked.1 == minor,
        (major, minor, _) => linked.0 == major && minor <= linked.1,
    }
}

/// The linked version a plugin built against `version` runs under, if any.
pub(crate) fn linked_for(version: Version) -> Option<Version> {
    VERSIONS.into_iter().find(|&v| same_track(version, v))
}

/// Links every version's `host` interface.
pub(crate) fn add_to_linker(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    since_v0_1_0::host::add_to_linker::<Sandbox, HasSelf<Sandbox>>(linker, |s| s)?;
    since_v0_2_0::host::add_to_linker::<Sandbox, HasSelf<Sandbox>>(linker, |s| s)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_are_wasmtimes() {
        assert_eq!(linked_for((0, 1, 0)), Some((0, 1, 0)));
        // A patch release (comments only) runs on its minor's host interface.
        assert_eq!(linked_for((0, 1, 7)), Some((0, 1, 0)));
        assert_eq!(linked_for((0, 2, 0)), Some((0, 2, 0)));
        assert_eq!(linked_for((0, 3, 0)), None);
        assert_eq!(linked_for((0, 0, 3)), None);
        assert_eq!(linked_for((1, 0, 0)), None);
        assert!(same_track((1, 2, 0), (1, 3, 0)));
        assert!(!same_track((1, 4, 0), (1, 3, 0)));
        assert!(!same_track((0, 1, 0), (0, 2, 0)));
        assert!(same_track((0, 0, 3), (0, 0, 3)) && !same_track((0, 0, 3), (0, 0, 4)));
    }
}
