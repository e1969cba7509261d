//! HTTP to servers maporl does not control (OCI registries and their token servers, the
//! Hugging Face hub and its CDN, dataset hosts and mirrors), treated as hostile:
//!
//! - **Text from a server** (an error body, a header value, a manifest field) reaches a
//!   terminal or a log only through [`server_text`]: escaped as plugin text is
//!   ([`crate::plugin::printable`]: no escape sequence, control character, bidirectional
//!   override or line break gets through) and cut to [`SERVER_TEXT_MAX`] characters. Of an
//!   error body, at most [`ERROR_BODY_MAX`] bytes are read at all ([`error_body`]).
//! - **Every request has a deadline for the whole of it** ([`Deadline`]): connecting, the
//!   answer's headers and its whole body, redirects included. A server that trickles a byte
//!   now and then (which a per-read timeout never catches) is cut off at the deadline:
//!   [`TIMEOUT_ENV`] seconds ([`DEFAULT_TIMEOUT_SECS`] by default), plus, for a download of a
//!   known or capped size, the time that size takes at [`MIN_RATE_ENV`] bytes a second
//!   ([`DEFAULT_MIN_RATE`] by default).
//! - **Sizes** are checked before a byte is written, and a body is never read past the
//!   size it was declared at (or the cap): [`copy_capped`] streams it to a file, hashing on
//!   the way, and stops one byte past the limit, so memory stays bounded whatever the size.

use std::io::{self, Read, Write};
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use sha2::{Digest, Sha256};

use crate::plugin::printable;

/// Seconds every request may take, as a whole (connect, headers, body, redirects).
pub const TIMEOUT_ENV: &str = "MAPORL_HTTP_TIMEOUT";
/// Bytes a second a download must average: a download of N bytes gets N / this many more
/// seconds than [`TIMEOUT_ENV`].
pub const MIN_RATE_ENV: &str = "MAPORL_HTTP_MIN_RATE";
/// The default of [`TIMEOUT_ENV`]: 120 s.
pub const DEFAULT_TIMEOUT_SECS: u64 = 120;
/// The default of [`MIN_RATE_ENV`]: 256 KiB/s (a 64 MiB plugin layer may take 120 + 256 s,
/// a 1 GiB model file 120 + 4096 s).
pub const DEFAULT_MIN_RATE: u64 = 256 << 10;
/// The most characters of a server's text shown in a message (after escaping).
pub const SERVER_TEXT_MAX: usize = 300;
/// The most bytes of an error response's body read.
pub const ERROR_BODY_MAX: u64 = 16 << 10;

/// How long one request may take as a whole: `base`, plus `bytes / min_rate` seconds for a
/// download of `bytes`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deadline {
    pub base: Duration,
    /// Bytes a second (at least 1).
    pub min_rate: u64,
}

impl Default for Deadline {
    fn default() -> Deadline {
        Deadline {
            base: Duration::from_secs(DEFAULT_TIMEOUT_SECS),
            min_rate: DEFAULT_MIN_RATE,
        }
    }
}

impl Deadline {
    /// From [`TIMEOUT_ENV`] and [`MIN_RATE_ENV`] (unset or empty: the defaults).
    pub fn from_env() -> Result<Deadline> {
        Deadline::from_vars(|k| std::env::var(k).ok())
    }

    /// From `var` as [`Deadline::from_env`] reads the environment; a value that is not a
    /// positive number is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Deadline> {
        let mut d = Deadline::default();
        if let Some(v) = var(TIMEOUT_ENV).filter(|v| !v.trim().is_empty()) {
            let secs: f64 = v.trim().parse().unwrap_or(f64::NAN);
            if !(secs.is_finite() && secs > 0.0 && secs <= 1e7) {
                bail!(
                    "{TIMEOUT_ENV}={}: expected the seconds a request may take, a positive \
                     number (default {DEFAULT_TIMEOUT_SECS})",
                    server_text(&v)
                );
            }
            d.base = Duration::from_secs_f64(secs);
        }
        if let Some(v) = var(MIN_RATE_ENV).filter(|v| !v.trim().is_empty()) {
            match v.trim().parse::<u64>() {
                Ok(rate) if rate > 0 => d.min_rate = rate,
                _ => bail!(
                    "{MIN_RATE_ENV}={}: expected the bytes a second a download must average, \
                     a positive whole number (default {DEFAULT_MIN_RATE})",
                    server_text(&v)
                ),
            }
        }
        Ok(d)
    }

    /// The deadline of a request whose body is `bytes` long (at most).
    pub fn for_bytes(&self, bytes: u64) -> Duration {
        let extra = bytes as f64 / self.min_rate as f64;
        self.base
            .saturating_add(Duration::try_from_secs_f64(extra).unwrap_or(Duration::MAX))
    }

    /// What a request that ran out of time is told: the deadline and how to change it.
    pub fn exceeded(&self, bytes: u64) -> anyhow::Error {
        let total = self.for_bytes(bytes).as_secs_f64();
        let how = if bytes == 0 {
            format!("{TIMEOUT_ENV}={}", self.base.as_secs_f64())
        } else {
            format!(
                "{TIMEOUT_ENV}={} s, plus {bytes} bytes at {MIN_RATE_ENV}={} bytes/s",
                self.base.as_secs_f64(),
                self.min_rate
            )
        };
        anyhow!(
            "no complete answer within the deadline of {total:.1} s ({how}); the server is \
             too slow, or trickling its answer"
        )
    }

    /// `err` from ureq, with a whole-request timeout explained ([`Deadline::exceeded`]).
    pub fn ureq_error(&self, err: ureq::Error, bytes: u64) -> anyhow::Error {
        if matches!(err, ureq::Error::Timeout(ureq::Timeout::Global)) {
            return self.exceeded(bytes);
        }
        match err {
            ureq::Error::Io(e) => self.io_error(e, bytes),
            e => anyhow::Error::new(e),
        }
    }

    /// `err` from reading a ureq body, with a whole-request timeout explained.
    pub fn io_error(&self, err: io::Error, bytes: u64) -> anyhow::Error {
        let global = err
            .get_ref()
            .and_then(|e| e.downcast_ref::<ureq::Error>())
            .is_some_and(|e| matches!(e, ureq::Error::Timeout(ureq::Timeout::Global)));
        if global {
            self.exceeded(bytes)
        } else {
            anyhow::Error::new(err)
        }
    }
}

/// Text a server sent, fit for a terminal or a log: surrounding white space trimmed, every
/// character a terminal acts on escaped ([`printable`]), at most [`SERVER_TEXT_MAX`]
/// characters kept, and a cut text marked as cut with its full length.
pub fn server_text(text: &str) -> String {
    let text = text.trim();
    bounded(text, || format!("{} bytes", text.len()))
}

/// `text` escaped and cut to [`SERVER_TEXT_MAX`] characters, a cut one marked with how
/// long it was (`length`).
fn bounded(text: &str, length: impl FnOnce() -> String) -> String {
    let shown = printable(text);
    if shown.chars().count() <= SERVER_TEXT_MAX {
        return shown.into_owned();
    }
    let cut: String = shown.chars().take(SERVER_TEXT_MAX).collect();
    format!("{cut}[... cut, {} in all]", length())
}

/// [`server_text`] of bytes that may not be UTF-8.
pub fn server_bytes(bytes: &[u8]) -> String {
    server_text(&String::from_utf8_lossy(bytes))
}

/// The start of an error response's body as [`server_text`] (empty when there is none or
/// it cannot be read): at most [`ERROR_BODY_MAX`] bytes are read, the rest never.
pub fn error_body(response: &mut ureq::http::Response<ureq::Body>) -> String {
    let mut bytes = Vec::new();
    let _ = response
        .body_mut()
        .as_reader()
        .take(ERROR_BODY_MAX + 1)
        .read_to_end(&mut bytes);
    let more = bytes.len() as u64 > ERROR_BODY_MAX;
    bytes.truncate(ERROR_BODY_MAX as usize);
    let text = String::from_utf8_lossy(&bytes);
    let text = text.trim();
    bounded(text, || match more {
        true => format!("more than {ERROR_BODY_MAX} bytes"),
        false => format!("{} bytes", text.len()),
    })
}

/// How a capped copy went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    /// Bytes written (at most the limit).
    pub bytes: u64,
    /// The source had more than the limit: the copy stopped there.
    pub over: bool,
}

/// Copies `from` into `to`, never more than `limit` bytes (it reads one byte past the limit
/// to tell whether there is more, and writes none of it), feeding `hasher` what it writes.
/// Memory stays at one 64 KiB buffer whatever the size.
pub fn copy_capped(
    from: &mut impl Read,
    to: &mut impl Write,
    limit: u64,
    mut hasher: Option<&mut Sha256>,
) -> io::Result<Copied> {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let room = (limit - total).saturating_add(1).min(buf.len() as u64) as usize;
        let n = match from.read(&mut buf[..room]) {
            Ok(0) => {
                return Ok(Copied {
                    bytes: total,
                    over: false,
                })
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let keep = (n as u64).min(limit - total) as usize;
        if keep > 0 {
            to.write_all(&buf[..keep])?;
            if let Some(h) = hasher.as_deref_mut() {
                h.update(&buf[..keep]);
            }
            total += keep as u64;
        }
        if keep < n {
            return Ok(Copied {
                bytes: total,
                over: true,
            });
        }
    }
}

/// `n` bytes in words: `512 bytes`, `64 MiB`, `1.5 GiB`.
pub fn size_words(n: u64) -> String {
    const KIB: u64 = 1 << 10;
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{} GiB", n >> 30),
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= KIB && n % KIB == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_text_is_escaped_and_bounded() {
        let hostile = "\x1b]0;pwned\x07\x1b[2J\r\nerror: forged line\u{202e}\u{9b}31m";
        let shown = server_text(hostile);
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        assert!(!shown.contains('\u{202e}'), "{shown:?}");
        assert!(shown.contains("\\nerror: forged line"), "{shown:?}");
        let long = format!("{}{}", "\x1b[31m".repeat(10_000), "x".repeat(100_000));
        let shown = server_text(&long);
        assert!(
            shown.chars().count() < SERVER_TEXT_MAX + 60,
            "{}",
            shown.len()
        );
        assert!(shown.ends_with("[... cut, 150000 bytes in all]"), "{shown}");
        assert!(!shown.chars().any(|c| c.is_control()));
        assert_eq!(server_text("  plain  "), "plain");
        assert_eq!(server_bytes(b"a\xffb"), "a\u{fffd}b");
    }

    #[test]
    fn error_bodies_are_read_to_a_bound_and_say_when_there_was_more() {
        let body = |bytes: Vec<u8>| {
            let mut r = ureq::http::Response::new(ureq::Body::builder().data(bytes));
            error_body(&mut r)
        };
        assert_eq!(
            body(b"  {\"error\": \"no\"}\n".to_vec()),
            "{\"error\": \"no\"}"
        );
        assert_eq!(body(Vec::new()), "");
        let shown = body(hostile_megabyte());
        assert!(
            shown.ends_with("[... cut, more than 16384 bytes in all]"),
            "{shown}"
        );
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
        let shown = body(vec![b'x'; 1000]);
        assert!(shown.ends_with("[... cut, 1000 bytes in all]"), "{shown}");
    }

    fn hostile_megabyte() -> Vec<u8> {
        b"\x1b]0;t\x07\r\nerror: forged\n"
            .iter()
            .copied()
            .cycle()
            .take(1 << 20)
            .collect()
    }

    #[test]
    fn copies_stop_one_byte_past_the_limit_and_write_none_of_it() {
        for (len, limit, over) in [
            (0usize, 0u64, false),
            (10, 10, false),
            (11, 10, true),
            (1 << 20, 100, true),
            (200_000, 1 << 20, false),
            (1, 0, true),
        ] {
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut out = Vec::new();
            let mut h = Sha256::new();
            let got = copy_capped(&mut &data[..], &mut out, limit, Some(&mut h)).unwrap();
            let kept = len.min(limit as usize);
            assert_eq!(
                got,
                Copied {
                    bytes: kept as u64,
                    over
                },
                "{len} {limit}"
            );
            assert_eq!(out, data[..kept], "{len} {limit}");
            assert_eq!(
                h.finalize().to_vec(),
                Sha256::digest(&data[..kept]).to_vec()
            );
        }
        // An endless source: the copy reads limit + 1 bytes and stops.
        let mut endless = io::repeat(7);
        let mut out = Vec::new();
        let got = copy_capped(&mut endless, &mut out, 300_000, None).unwrap();
        assert_eq!((got.bytes, got.over, out.len()), (300_000, true, 300_000));
    }

    #[test]
    fn deadlines_come_from_the_environment_or_the_defaults() {
        let d = Deadline::from_vars(|_| None).unwrap();
        assert_eq!(d, Deadline::default());
        assert_eq!(d.for_bytes(0), Duration::from_secs(120));
        assert_eq!(d.for_bytes(64 << 20), Duration::from_secs(120 + 256));
        let d = Deadline::from_vars(|k| match k {
            TIMEOUT_ENV => Some("2.5".into()),
            MIN_RATE_ENV => Some("1000".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(d.for_bytes(500), Duration::from_secs(3));
        assert_eq!(
            Deadline::default().for_bytes(u64::MAX),
            Duration::from_secs(120) + Duration::from_secs_f64(u64::MAX as f64 / 262144.0)
        );
        for (k, v) in [
            (TIMEOUT_ENV, "0"),
            (TIMEOUT_ENV, "-1"),
            (TIMEOUT_ENV, "soon"),
            (TIMEOUT_ENV, "inf"),
            (MIN_RATE_ENV, "0"),
            (MIN_RATE_ENV, "1.5"),
            (MIN_RATE_ENV, "\x1b[2J"),
        ] {
            let e = Deadline::from_vars(|key| (key == k).then(|| v.to_string()))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(k) && !e.contains('\x1b'), "{e}");
        }
        let e = Deadline::default().exceeded(1000).to_string();
        assert!(e.contains(TIMEOUT_ENV) && e.contains(MIN_RATE_ENV), "{e}");
    }

    #[test]
    fn sizes_in_words() {
        assert_eq!(size_words(64 << 20), "64 MiB");
        assert_eq!(size_words(4 << 20), "4 MiB");
        assert_eq!(size_words(1 << 30), "1 GiB");
        assert_eq!(size_words(1000), "1000 bytes");
        assert_eq!(size_words(3 << 29), "1.5 GiB");
    }
}
