//! A plugin's source identity: the sha256 of the source it was built from, which its build
//! records in the component as a custom section, `maporl:source`.
//!
//! Some toolchains do not build the same bytes twice from the same source (componentize-py
//! snapshots a CPython heap laid out anew on every build), so a component's own sha256
//! changes with every rebuild. Where a component declares its source, the host derives the
//! plugin's random seed from it and a resume accepts a component rebuilt from the same
//! source (`plugins.lock`, the checkpoint's plugin hashes). The section is a claim the build
//! makes, as the rest of the component is: a signed bundle signs it with the component's
//! bytes; a component with none is known by its own sha256 alone.

/// The custom section's name; its contents are the source's sha256 as 64 lower-case hex
/// digits.
pub const SECTION: &str = "maporl:source";

/// The source sha256 a component declares in a top-level `maporl:source` section, if it
/// has one. Nested modules' sections are not read. A malformed file is left to the
/// compiler to refuse; a `maporl:source` section that is not a sha256, or two of them,
/// are refused here.
pub fn declared(bytes: &[u8]) -> Result<Option<String>, String> {
    let mut found = None;
    for (name, contents) in custom_sections(bytes) {
        if name != SECTION {
            continue;
        }
        let ok = contents.len() == 64
            && contents
                .iter()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
        if !ok {
            return Err(format!(
                "its `{SECTION}` section is not a sha256 (64 lower-case hex digits): {}",
                super::printable(&String::from_utf8_lossy(
                    &contents[..contents.len().min(80)]
                ))
            ));
        }
        if found.is_some() {
            return Err(format!("it has two `{SECTION}` sections"));
        }
        found = Some(String::from_utf8(contents.to_vec()).expect("checked ASCII"));
    }
    Ok(found)
}

/// The top-level custom sections (name, contents) of a module or component, in order;
/// stops at the first byte that does not parse.
fn custom_sections(bytes: &[u8]) -> Vec<(&str, &[u8])> {
    let mut out = Vec::new();
    // Magic and a 4-byte version (a module's 1, or a component's layer and version).
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return out;
    }
    let mut at = 8;
    while at < bytes.len() {
        let id = bytes[at];
        let Some((size, after)) = leb_u32(bytes, at + 1) else {
            break;
        };
        let Some(end) = after
            .checked_add(size as usize)
            .filter(|&e| e <= bytes.len())
        else {
            break;
        };
        if id == 0 {
            if let Some((len, name_at)) = leb_u32(bytes, after) {
                let name_end = name_at.saturating_add(len as usize);
                if name_end <= end {
                    if let Ok(name) = std::str::from_utf8(&bytes[name_at..name_end]) {
                        out.push((name, &bytes[name_end..end]));
                    }
                }
            }
        }
        at = end;
    }
    out
}

/// An unsigned LEB128 u32 at `at`: its value and the offset after it.
fn leb_u32(bytes: &[u8], at: usize) -> Option<(u32, usize)> {
    let mut value: u32 = 0;
    for i in 0..5 {
        let b = *bytes.get(at + i)?;
        value |= u32::from(b & 0x7f).checked_shl(7 * i as u32)?;
        if b & 0x80 == 0 {
            return Some((value, at + i + 1));
        }
    }
    None
}

/// `bytes` (a module or component) with a custom section appended at its top level: what
/// the Python SDK's build does to record `maporl:source`, for a build written in Rust.
pub fn with_section(bytes: &[u8], name: &str, contents: &[u8]) -> Vec<u8> {
    fn leb(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            out.push(if v == 0 { b } else { b | 0x80 });
            if v == 0 {
                break;
            }
        }
    }
    let mut payload = Vec::new();
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(contents);
    let mut out = bytes.to_vec();
    out.push(0);
    leb(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    /// An empty component (layer 1) with one custom section of its own before the source's.
    fn component() -> Vec<u8> {
        let empty = b"\0asm\x0d\0\x01\0".to_vec();
        with_section(&empty, "producers", b"whatever")
    }

    #[test]
    fn a_declared_source_is_read_and_checked() {
        assert_eq!(declared(&component()), Ok(None));
        let with = with_section(&component(), SECTION, SHA.as_bytes());
        assert_eq!(declared(&with), Ok(Some(SHA.to_string())));
        // Sizes that take several LEB bytes.
        let padded = with_section(&component(), "pad", &[7u8; 300]);
        let with = with_section(&padded, SECTION, SHA.as_bytes());
        assert_eq!(declared(&with), Ok(Some(SHA.to_string())));

        for bad in [&SHA[..63], &SHA.to_uppercase(), "sha256:abc", ""] {
            let err = declared(&with_section(&component(), SECTION, bad.as_bytes()));
            assert!(
                err.as_ref().is_err_and(|e| e.contains("is not a sha256")),
                "{bad:?}: {err:?}"
            );
        }
        let twice = with_section(&with, SECTION, SHA.as_bytes());
        assert_eq!(
            declared(&twice),
            Err(format!("it has two `{SECTION}` sections"))
        );
        // Terminal escapes in a bad section are shown escaped.
        let err = declared(&with_section(&component(), SECTION, b"\x1b[2Jx")).unwrap_err();
        assert!(!err.contains('\x1b'), "{err:?}");
    }

    #[test]
    fn truncated_or_absurd_sizes_read_nothing() {
        let with = with_section(&component(), SECTION, SHA.as_bytes());
        for cut in 0..with.len() {
            // Never a panic, never a source read from a section cut short.
            let found = declared(&with[..cut]);
            assert!(matches!(found, Ok(None)), "{cut}: {found:?}");
        }
        let mut huge = component();
        huge.extend_from_slice(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(declared(&huge), Ok(None));
        let mut long_leb = component();
        long_leb.extend_from_slice(&[0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
        assert_eq!(declared(&long_leb), Ok(None));
        assert_eq!(declared(b"not wasm at all"), Ok(None));
    }
}
