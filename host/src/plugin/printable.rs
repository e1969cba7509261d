//! Plugin text made safe for a terminal: log lines, panic messages, errors a plugin returns
//! and the names of files someone sent. Such text is printed as one line, with every
//! character that could move the cursor, rewrite the screen, set the window title, start a
//! new line that passes for the host's own, or reorder what is shown (C0 and C1 controls,
//! DEL, the escape character, Unicode bidirectional overrides and isolates, line and
//! paragraph separators) written as a visible escape (`\n`, `\u{1b}`). Machine-readable
//! records (transcripts, JSON) keep the text as it was. Text from servers (registries, the
//! hub, dataset hosts) goes through the same escaping, cut to a bounded length
//! ([`crate::net::server_text`]).

use std::borrow::Cow;

/// `text` with every character a terminal would act on written as a visible escape.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Like [`printable`], but a multi-line text (a panic message, a trap's backtrace) keeps its
/// lines: each is escaped, and every line after the first starts with `  | `, so no line
/// of it can pass for one of the host's.
pub fn printable_lines(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let lines: Vec<Cow<'_, str>> = text
        .trim_end_matches('\n')
        .split('\n')
        .map(printable)
        .collect();
    Cow::Owned(lines.join("\n  | "))
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Bidirectional embeddings, overrides and isolates (the "Trojan Source" set),
            // the implicit marks, and the line and paragraph separators.
            '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
                | '\u{2028}' | '\u{2029}' | '\u{061c}'
        )
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn everything_a_terminal_acts_on_is_escaped_and_the_rest_kept() {
        for (raw, shown) in [
            ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),
            // A forged host line.
            ("ok\nerror: the host failed", "ok\\nerror: the host failed"),
            // Carriage return overwriting the line.
            (
                "fine\r[plugin other.wasm] Error: x",
                "fine\\r[plugin other.wasm] Error: x",
            ),
            // Clear screen, colours, cursor moves (CSI).
            (
                "\x1b[2J\x1b[31mred\x1b[0m",
                "\\u{1b}[2J\\u{1b}[31mred\\u{1b}[0m",
            ),
            // Window title (OSC ... BEL) and an 8-bit CSI (C1).
            ("\x1b]0;pwned\x07", "\\u{1b}]0;pwned\\u{7}"),
            ("\u{9b}31m", "\\u{9b}31m"),
            // Backspace, DEL, NUL, tab.
            ("a\x08b\x7fc\0d\te", "a\\u{8}b\\u{7f}c\\u{0}d\\te"),
            // Bidi override reordering what is shown; line separator.
            ("x\u{202e}txt.exe", "x\\u{202e}txt.exe"),
            ("a\u{2028}b\u{2066}c", "a\\u{2028}b\\u{2066}c"),
        ] {
            assert_eq!(printable(raw), shown, "{raw:?}");
            assert!(!printable(raw).chars().any(|c| c.is_control()));
        }
        assert!(matches!(printable("clean"), std::borrow::Cow::Borrowed(_)));
    }

    #[test]
    fn multi_line_messages_keep_their_lines_marked_as_the_plugins() {
        use super::printable_lines;
        assert_eq!(printable_lines("one line"), "one line");
        assert_eq!(
            printable_lines("panicked at x\nerror: forged\x1b[2K\n"),
            "panicked at x\n  | error: forged\\u{1b}[2K"
        );
        for line in printable_lines("a\r\nb\n\x1b]0;t\x07").lines().skip(1) {
            assert!(line.starts_with("  | "), "{line:?}");
            assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
        }
    }
}
