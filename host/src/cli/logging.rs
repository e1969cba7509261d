//! The binary's diagnostics: `tracing` events on stderr.
//!
//! - `RUST_LOG` filters them (`tracing_subscriber::EnvFilter` syntax, e.g.
//!   `RUST_LOG=debug`, `RUST_LOG=maporl::plugin=debug`). Unset or empty: [`DEFAULT_FILTER`],
//!   which shows what the host always printed (warnings, the `devices:` line, data-fetch
//!   progress) and plugins' warnings and errors. A `RUST_LOG` that does not parse is told
//!   as a warning and the default is used instead.
//! - `MAPORL_PLUGIN_LOG=debug|info|warn|error|off` sets the level of plugins' log lines
//!   (target `maporl::plugin`), over whatever `RUST_LOG` says about them.
//! - `MAPORL_LOG_FORMAT=json`: one JSON object per line (`timestamp`, `level`, `target`,
//!   `message` and the event's fields, e.g. `plugin`, `world`, `task`). Otherwise text, one
//!   line per event without a timestamp, close to what the host printed before: host lines
//!   as they were (`warning: ` before a warning, `debug: ` before a debug line), plugin
//!   lines as `[plugin NAME world=W task=T] Level: text`; colour only on a terminal (and
//!   not with `NO_COLOR`).
//!
//! Neither format lets event text act on a terminal: the text formatter escapes the message
//! and every field value ([`maporl::plugin::printable`]); in JSON, serde escapes the C0
//! controls and the writer here escapes the rest of what a terminal acts on (DEL, C1,
//! bidirectional controls, line separators) as `\uXXXX`, which decodes to the same text.
//!
//! Tables, progress bars and results of commands stay `println!`/`eprintln!`: they are the
//! output, not diagnostics.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, IsTerminal, Write};

use maporl::plugin::{printable, PLUGIN_LOG_TARGET};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset: warnings from everything, the host's information
/// lines, plugins' warnings and errors.
pub const DEFAULT_FILTER: &str = "warn,maporl=info,maporl::plugin=warn";

/// Installs the stderr subscriber, as the environment asks (see the module's doc).
pub fn init() {
    let mut problems = Vec::new();
    let filter = filter(
        std::env::var("RUST_LOG").ok(),
        std::env::var("MAPORL_PLUGIN_LOG").ok(),
        &mut problems,
    );
    let json = match std::env::var("MAPORL_LOG_FORMAT") {
        Ok(v) if v.eq_ignore_ascii_case("json") => true,
        Ok(v) if v.is_empty() || v.eq_ignore_ascii_case("text") => false,
        Err(std::env::VarError::NotPresent) => false,
        Ok(v) => {
            problems.push(format!(
                "MAPORL_LOG_FORMAT={v}: expected `json` or `text`; writing text"
            ));
            false
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            problems.push("MAPORL_LOG_FORMAT is not UTF-8; writing text".to_string());
            false
        }
    };
    // A second subscriber cannot be installed; the first one stays (nothing to report).
    let _ = if json {
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_ansi(false)
            .with_env_filter(filter)
            .with_writer(JsonStderr)
            .try_init()
    } else {
        let colour =
            io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        tracing_subscriber::fmt()
            .with_ansi(colour)
            .event_format(Text)
            .with_env_filter(filter)
            .with_writer(io::stderr)
            .try_init()
    };
    for problem in problems {
        tracing::warn!("{problem}");
    }
}

/// The filter from `RUST_LOG` (or the default, when it is unset, empty or does not parse:
/// then a line in `problems` says why) with `MAPORL_PLUGIN_LOG`'s level for plugins on top.
fn filter(
    rust_log: Option<String>,
    plugin_log: Option<String>,
    problems: &mut Vec<String>,
) -> EnvFilter {
    let default = || EnvFilter::new(DEFAULT_FILTER);
    let mut filter = match rust_log.filter(|s| !s.trim().is_empty()) {
        None => default(),
        Some(spec) => match EnvFilter::builder().parse(&spec) {
            Ok(filter) => filter,
            Err(e) => {
                problems.push(format!(
                    "RUST_LOG={spec}: {e}; using the default filter `{DEFAULT_FILTER}`"
                ));
                default()
            }
        },
    };
    if let Some(level) = plugin_log.filter(|s| !s.trim().is_empty()) {
        let level = level.trim().to_ascii_lowercase();
        match level.as_str() {
            "trace" | "debug" | "info" | "warn" | "error" | "off" => {
                let directive = format!("{PLUGIN_LOG_TARGET}={level}")
                    .parse()
                    .expect("a target and a level make a directive");
                filter = filter.add_directive(directive);
            }
            _ => problems.push(format!(
                "MAPORL_PLUGIN_LOG={level}: expected debug, info, warn, error or off; ignored"
            )),
        }
    }
    filter
}

/// An event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }
}

/// The text format (see the module's doc).
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let level = *meta.level();
        let colour = if writer.has_ansi_escapes() {
            match level {
                Level::ERROR => Some("\x1b[1;31m"),
                Level::WARN => Some("\x1b[1;33m"),
                Level::INFO => None,
                _ => Some("\x1b[2m"),
            }
        } else {
            None
        };
        let (on, off) = colour.map_or(("", ""), |c| (c, "\x1b[0m"));
        let plugin = fields.rest.iter().position(|(k, _)| *k == "plugin");
        match plugin {
            Some(i) if meta.target() == PLUGIN_LOG_TARGET => {
                // `[plugin NAME world=W task=T] Level: text`: what the host knows first,
                // the plugin's text last.
                let (_, name) = fields.rest.remove(i);
                write!(writer, "[plugin {}", printable(&name))?;
                for (key, value) in &fields.rest {
                    write!(writer, " {key}={}", printable(value))?;
                }
                let word = match level {
                    Level::ERROR => "Error",
                    Level::WARN => "Warn",
                    Level::INFO => "Info",
                    Level::DEBUG => "Debug",
                    Level::TRACE => "Trace",
                };
                write!(writer, "] {on}{word}{off}: {}", printable(&fields.message))?;
            }
            _ => {
                let prefix = match level {
                    Level::ERROR => "error: ",
                    Level::WARN => "warning: ",
                    Level::INFO => "",
                    Level::DEBUG => "debug: ",
                    Level::TRACE => "trace: ",
                };
                write!(writer, "{on}{prefix}{off}")?;
                // Another crate's event says whose it is.
                if !(meta.target() == "maporl" || meta.target().starts_with("maporl::")) {
                    write!(writer, "{}: ", printable(meta.target()))?;
                }
                write!(writer, "{}", printable(&fields.message))?;
                for (key, value) in &fields.rest {
                    write!(writer, " {key}={}", printable(value))?;
                }
            }
        }
        writeln!(writer)
    }
}

/// Stderr for JSON lines, with what a terminal would act on and serde leaves as it is
/// escaped (see [`json_terminal_safe`]).
struct JsonStderr;

impl<'a> MakeWriter<'a> for JsonStderr {
    type Writer = JsonStderrWriter;

    fn make_writer(&'a self) -> Self::Writer {
        JsonStderrWriter
    }
}

struct JsonStderrWriter;

impl Write for JsonStderrWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        // The fmt layer writes each event whole.
        match std::str::from_utf8(buf) {
            Ok(text) => io::stderr()
                .lock()
                .write_all(json_terminal_safe(text).as_bytes()),
            Err(_) => io::stderr().lock().write_all(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// JSON text with every character [`printable`] would escape written as a JSON `\uXXXX`
/// escape: the same JSON value, nothing for a terminal to act on. (Such characters are only
/// ever inside strings: JSON's own syntax is ASCII and printable.)
fn json_terminal_safe(json: &str) -> Cow<'_, str> {
    let acted_on = |c: char| {
        !(' '..='~').contains(&c) && c != '\n' && {
            let mut b = [0; 4];
            matches!(printable(c.encode_utf8(&mut b)), Cow::Owned(_))
        }
    };
    if !json.chars().any(acted_on) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if acted_on(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directives(filter: &EnvFilter) -> String {
        filter.to_string()
    }

    #[test]
    fn the_filter_is_rust_log_else_the_default_and_a_bad_one_is_told() {
        let mut problems = Vec::new();
        let f = filter(None, None, &mut problems);
        assert_eq!(directives(&f), directives(&EnvFilter::new(DEFAULT_FILTER)));
        let f = filter(Some("  ".into()), None, &mut problems);
        assert_eq!(directives(&f), directives(&EnvFilter::new(DEFAULT_FILTER)));
        assert!(problems.is_empty(), "{problems:?}");

        let f = filter(Some("maporl=debug".into()), None, &mut problems);
        assert!(directives(&f).contains("maporl=debug"), "{f}");
        assert!(problems.is_empty(), "{problems:?}");

        let f = filter(Some("maporl=loud".into()), None, &mut problems);
        assert_eq!(directives(&f), directives(&EnvFilter::new(DEFAULT_FILTER)));
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("RUST_LOG=maporl=loud: "),
            "{problems:?}"
        );
    }

    #[test]
    fn maporl_plugin_log_sets_the_plugins_level_over_rust_log() {
        let mut problems = Vec::new();
        let f = filter(None, Some("debug".into()), &mut problems);
        assert!(directives(&f).contains("maporl::plugin=debug"), "{f}");
        assert!(!directives(&f).contains("maporl::plugin=warn"), "{f}");
        let f = filter(
            Some("maporl::plugin=error".into()),
            Some("INFO".into()),
            &mut problems,
        );
        assert!(directives(&f).contains("maporl::plugin=info"), "{f}");
        assert!(problems.is_empty(), "{problems:?}");
        let f = filter(None, Some("chatty".into()), &mut problems);
        assert!(directives(&f).contains("maporl::plugin=warn"), "{f}");
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn json_keeps_its_value_and_loses_what_a_terminal_acts_on() {
        let plain = r#"{"message":"ünïcode ✓ \u001b[2J"}"#;
        assert!(matches!(json_terminal_safe(plain), Cow::Borrowed(_)));
        let raw = "{\"message\":\"a\u{7f}b\u{9b}31m\u{202e}c\u{2028}d\"}";
        let safe = json_terminal_safe(raw);
        assert!(safe.is_ascii(), "{safe}");
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        let orig: serde_json::Value = serde_json::from_str(raw).unwrap();
        assert_eq!(back, orig);
    }
}
