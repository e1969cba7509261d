//! Reading answers out of responses.

/// The contents of every complete `\boxed{...}` in `text`, in the order the boxes open.
/// Nested braces are balanced (`\boxed{\frac{1}{2}}` gives `\frac{1}{2}`); whitespace between
/// `\boxed` and `{` is allowed; a box that is never closed (a truncated response) is skipped.
pub fn boxed_contents(text: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find(BOXED) {
        let at = from + pos;
        found.extend(box_at(text, at));
        from = at + BOXED.len();
    }
    found
}

/// The content of the last complete `\boxed{...}` (see [`boxed_contents`]): the complete
/// box that opens last. Found from the end of the text, where answers are, so a response's
/// reasoning before its box is not read.
pub fn last_boxed(text: &str) -> Option<&str> {
    let mut end = text.len();
    while let Some(at) = text[..end].rfind(BOXED) {
        if let Some(content) = box_at(text, at) {
            return Some(content);
        }
        // `at` is where an ASCII `\` starts: a char boundary.
        end = at;
    }
    None
}

const BOXED: &str = "\\boxed";

/// The content of the box whose `\boxed` starts at byte `at`, if it is complete.
fn box_at(text: &str, at: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut i = at + BOXED.len();
    while i < bytes.len() && bytes[i].is_ascii_whitespace() {
        i += 1;
    }
    if i >= bytes.len() || bytes[i] != b'{' {
        return None;
    }
    let start = i + 1;
    let mut depth = 1usize;
    for (j, &b) in bytes.iter().enumerate().skip(start) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    // Braces are ASCII, so `start..j` lies on char boundaries.
                    return Some(&text[start..j]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Keeps the characters an integer answer may use: ASCII digits, `+`, `-` (also the
/// Unicode minus sign, read as `-`) and `.`; everything else (`$`, `,`, spaces, units,
/// LaTeX) is dropped.
pub fn numeric_chars(s: &str) -> String {
    s.chars()
        .filter_map(|c| match c {
            '0'..='9' | '+' | '-' | '.' => Some(c),
            '\u{2212}' => Some('-'),
            _ => None,
        })
        .collect()
}

/// [`numeric_chars`], then the result must parse as an `i64` ("18.5", "1-2" and "" do not).
pub fn parse_integer(s: &str) -> Option<i64> {
    numeric_chars(s).parse::<i64>().ok()
}

/// The text after the last `####` up to the end of that line (GSM8K's own answer format).
pub fn after_last_hashes(text: &str) -> Option<&str> {
    let pos = text.rfind("####")?;
    let rest = &text[pos + 4..];
    Some(rest.split('\n').next().unwrap_or(rest))
}

/// The last number in `text` (an optional `-`, digits with optional thousands commas, an
/// optional decimal part), with the commas removed: "costs $1,234.50." gives "1234.50".
pub fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut last = None;
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let negative = i > 0 && (chars[i - 1] == '-' || chars[i - 1] == '\u{2212}');
        let mut number = String::new();
        if negative {
            number.push('-');
        }
        while i < chars.len() {
            let c = chars[i];
            let next_is_digit = chars.get(i + 1).is_some_and(|n| n.is_ascii_digit());
            if c.is_ascii_digit() {
                number.push(c);
            } else if c == ',' && next_is_digit {
                // thousands separator: dropped
            } else if c == '.' && next_is_digit && !number.contains('.') {
                number.push('.');
            } else {
                break;
            }
            i += 1;
        }
        last = Some(number);
    }
    last
}

/// Removes LaTeX command names (`\text`, `\mathrm`, ...) so that `\text{Neutral}` reads as
/// `{Neutral}`.
pub fn strip_latex_commands(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) {
            while chars.peek().is_some_and(|n| n.is_ascii_alphabetic()) {
                chars.next();
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The three ANLI labels.
pub const NLI_LABELS: [&str; 3] = ["entailment", "neutral", "contradiction"];

/// Reads an NLI label out of a response (arXiv 2502.18439): the last `\boxed{}`, or the whole text
/// when there is none, with LaTeX command names removed, letters only, lower-cased, must be
/// exactly one of the labels. A response that discusses the labels ("not entailment, so
/// neutral") is invalid without a box: the answer must be a label, not contain one.
pub fn nli_label(text: &str) -> Option<&'static str> {
    let answer = last_boxed(text).unwrap_or(text);
    let letters: String = strip_latex_commands(answer)
        .chars()
        .filter(|c| c.is_alphabetic())
        .flat_map(char::to_lowercase)
        .collect();
    NLI_LABELS.iter().copied().find(|l| *l == letters)
}

/// Reads an NLI reference: the label itself or its initial (`e`, `n`, `c`), any case.
pub fn nli_reference(reference: &str) -> Option<&'static str> {
    let r = reference.trim().to_lowercase();
    NLI_LABELS
        .iter()
        .copied()
        .find(|l| *l == r || (r.len() == 1 && l.starts_with(r.as_str())))
}

/// The text after the last `Answer:` (any case) up to the end of that line, trimmed; a
/// `\boxed{}` inside that line is unwrapped. `None` when there is no such line or it is empty.
pub fn answer_line(text: &str) -> Option<&str> {
    // Compared ASCII-case-insensitively in place, from the end: no lower-cased copy.
    const ANSWER: &[u8] = b"answer:";
    let pos = text
        .as_bytes()
        .windows(ANSWER.len())
        .rposition(|w| w.eq_ignore_ascii_case(ANSWER))?;
    let rest = &text[pos + "answer:".len()..];
    let line = rest.split('\n').next().unwrap_or(rest);
    let line = last_boxed(line).unwrap_or(line).trim();
    (!line.is_empty()).then_some(line)
}

/// Punctuation stripped from both ends of an answer by [`normalize`]. Signs, `$`, `%` and
/// `#` are kept: they can be part of an answer.
pub const EDGE_PUNCTUATION: &[char] = &[
    '.', ',', ';', ':', '!', '?', '\'', '"', '`', '(', ')', '[', ']', '{', '}', '*', '_',
    '\u{201c}', '\u{201d}', '\u{2018}', '\u{2019}', '\u{ab}', '\u{bb}', '\u{3002}',
];

/// Normalises an answer for exact comparison: lower-cased, surrounding punctuation
/// ([`EDGE_PUNCTUATION`]) stripped, runs of whitespace collapsed to one space, trimmed;
/// with `strip_articles` the words "a", "an" and "the" are removed too.
pub fn normalize(s: &str, strip_articles: bool) -> String {
    let lower = s.to_lowercase();
    let collapse = |t: &str| {
        t.split_whitespace()
            .filter(|w| !(strip_articles && matches!(*w, "a" | "an" | "the")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let once =
        collapse(lower.trim_matches(|c: char| EDGE_PUNCTUATION.contains(&c) || c.is_whitespace()));
    collapse(once.trim_matches(|c: char| EDGE_PUNCTUATION.contains(&c) || c.is_whitespace()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_handles_nesting_truncation_and_spaces() {
        assert_eq!(last_boxed("so \\boxed{42}."), Some("42"));
        assert_eq!(
            last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}"),
            Some("\\frac{1}{2}")
        );
        assert_eq!(last_boxed("\\boxed {7}"), Some("7"));
        // A truncated last box: the last complete one counts.
        assert_eq!(last_boxed("\\boxed{12} and finally \\boxed{1"), Some("12"));
        assert_eq!(last_boxed("no box here"), None);
        assert_eq!(last_boxed("\\boxed"), None);
        assert_eq!(last_boxed("\\boxed{}"), Some(""));
        assert_eq!(boxed_contents("\\boxed{a}\\boxed{b}"), vec!["a", "b"]);
        // Non-ASCII around and inside the box.
        assert_eq!(last_boxed("é \\boxed{ü{ß}} ø"), Some("ü{ß}"));
    }

    /// The search from the end finds what the forward scan's last box is, on texts built
    /// from the pieces that matter: boxes (nested, spaced, unclosed, empty), stray braces
    /// and backslashes, `\\boxe` prefixes, and non-ASCII text.
    #[test]
    fn the_last_box_from_the_end_is_the_forward_scans_last() {
        const PIECES: [&str; 14] = [
            "\\boxed{",
            "\\boxed {",
            "\\boxed",
            "\\boxe",
            "{",
            "}",
            "}}",
            "42",
            " ",
            "\\",
            "é ü",
            "\\frac{1}{2}",
            "Answer: ",
            "\\boxed{7}",
        ];
        let mut rng = crate::testing::Xorshift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next_u64();
        let mut with_box = 0;
        for _ in 0..20_000 {
            let len = next() % 12;
            let text: String = (0..len)
                .map(|_| PIECES[(next() % PIECES.len() as u64) as usize])
                .collect();
            let forward = boxed_contents(&text).pop();
            with_box += usize::from(forward.is_some());
            assert_eq!(last_boxed(&text), forward, "text {text:?}");
        }
        assert!(
            with_box > 5_000,
            "the texts must exercise boxes: {with_box}"
        );
    }

    #[test]
    fn integers_keep_digits_sign_and_point_only() {
        assert_eq!(parse_integer("1,234"), Some(1234));
        assert_eq!(parse_integer("\\$18"), Some(18));
        assert_eq!(parse_integer("-5"), Some(-5));
        assert_eq!(parse_integer("\u{2212}5"), Some(-5));
        assert_eq!(parse_integer("+5"), Some(5));
        assert_eq!(parse_integer("x = 7 apples"), Some(7));
        assert_eq!(parse_integer("18.5"), None);
        assert_eq!(parse_integer("18.00"), None);
        assert_eq!(parse_integer("5-3"), None);
        assert_eq!(parse_integer("none"), None);
        assert_eq!(parse_integer("99999999999999999999"), None);
    }

    #[test]
    fn hashes_take_the_rest_of_the_line() {
        assert_eq!(
            after_last_hashes("a #### 1\nb #### 72\nmore 5"),
            Some(" 72")
        );
        assert_eq!(after_last_hashes("nothing"), None);
    }

    #[test]
    fn last_number_reads_commas_signs_and_decimals() {
        assert_eq!(
            last_number("paid $1,234.50 in 3 parts").as_deref(),
            Some("3")
        );
        assert_eq!(last_number("total: 1,234.").as_deref(), Some("1234"));
        assert_eq!(last_number("it is -12 degrees").as_deref(), Some("-12"));
        assert_eq!(last_number("2.5 cups").as_deref(), Some("2.5"));
        assert_eq!(last_number("1, 2, 3").as_deref(), Some("3"));
        assert_eq!(last_number("no digits"), None);
    }

    #[test]
    fn nli_labels_from_boxes_and_text() {
        assert_eq!(nli_label("Answer: \\boxed{Entailment}"), Some("entailment"));
        assert_eq!(nli_label("\\boxed{\\text{Neutral}}"), Some("neutral"));
        assert_eq!(
            nli_label("\\boxed{ contradiction. }"),
            Some("contradiction")
        );
        // A box with something else is invalid, even if the text names a label.
        assert_eq!(nli_label("neutral \\boxed{maybe}"), None);
        assert_eq!(nli_label("\\boxed{e}"), None);
        // No box: the whole text must be a label.
        assert_eq!(nli_label("Contradiction."), Some("contradiction"));
        assert_eq!(nli_label("  Neutral\n"), Some("neutral"));
        assert_eq!(
            nli_label("Not entailment; I think it is a contradiction, not neutral."),
            None
        );
        assert_eq!(nli_label("neutral, then entailment"), None);
        assert_eq!(nli_label("contradictions"), None);
        assert_eq!(nli_label("nothing"), None);
    }

    #[test]
    fn nli_references() {
        assert_eq!(nli_reference("e"), Some("entailment"));
        assert_eq!(nli_reference(" N "), Some("neutral"));
        assert_eq!(nli_reference("Contradiction"), Some("contradiction"));
        assert_eq!(nli_reference("x"), None);
        assert_eq!(nli_reference(""), None);
        assert_eq!(nli_reference("2"), None);
    }

    #[test]
    fn answer_lines() {
        assert_eq!(answer_line("Reasoning.\nAnswer: Paris\n"), Some("Paris"));
        assert_eq!(answer_line("answer: a\nFinal ANSWER: b"), Some("b"));
        assert_eq!(answer_line("Answer: \\boxed{x} done"), Some("x"));
        assert_eq!(answer_line("Answer:   \n"), None);
        assert_eq!(answer_line("none"), None);
        // Any ASCII case; non-ASCII text before it keeps the offsets right.
        assert_eq!(answer_line("ÄÖ answer: x\nANSWER:  ünï "), Some("ünï"));
        assert_eq!(answer_line("AnSwEr:7"), Some("7"));
        assert_eq!(answer_line("answer"), None);
    }

    #[test]
    fn normalisation() {
        assert_eq!(
            normalize("  The  Eiffel\tTower. ", false),
            "the eiffel tower"
        );
        assert_eq!(normalize("  The  Eiffel\tTower. ", true), "eiffel tower");
        assert_eq!(normalize("\"(Paris)\"", false), "paris");
        assert_eq!(normalize("-5", false), "-5");
        assert_eq!(normalize("$5.", false), "$5");
        assert_eq!(normalize("A cat", true), "cat");
        assert_eq!(normalize("...", false), "");
    }

    #[test]
    fn latex_commands_are_removed() {
        assert_eq!(strip_latex_commands("\\text{a}\\,b"), "{a}\\,b");
        assert_eq!(strip_latex_commands("\\mathrm{Neutral}"), "{Neutral}");
    }
}
