"""Reading answers out of responses, as the Rust SDK's `answers` module does."""

from typing import Optional

from .text import trim

ASCII_WS = " \t\n\x0c\r"


def box_at(text: str, pos: int) -> Optional[str]:
    """The content of the box whose `\\boxed` starts at `pos`, if it is complete."""
    n = len(text)
    i = pos + 6
    while i < n and text[i] in ASCII_WS:
        i += 1
    if i >= n or text[i] != "{":
        return None
    start = i + 1
    depth = 1
    j = start
    while j < n:
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:j]
        j += 1
    return None


def last_boxed(text: str) -> Optional[str]:
    """The content of the last complete `\\boxed{...}` (nested braces kept)."""
    end = len(text)
    while True:
        pos = text.rfind("\\boxed", 0, end)
        if pos < 0:
            return None
        content = box_at(text, pos)
        if content is not None:
            return content
        end = pos


_NUMERIC = set("0123456789+-.")
_DIGITS = set("0123456789")
I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def numeric_chars(s: str) -> str:
    """The characters of `s` that can be part of a number (U+2212 read as '-')."""
    return "".join("-" if c == "\u2212" else c for c in s if c in _NUMERIC or c == "\u2212")


def parse_integer(s: str) -> Optional[int]:
    """Rust's `str::parse::<i64>` on the numeric characters of `s`."""
    t = numeric_chars(s)
    body = t[1:] if t[:1] in ("+", "-") else t
    if not body or not set(body) <= _DIGITS:
        return None
    n = int(t)
    return n if I64_MIN <= n <= I64_MAX else None


def strip_latex_commands(s: str) -> str:
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        i += 1
        if c == "\\" and i < n and s[i].isascii() and s[i].isalpha():
            while i < n and s[i].isascii() and s[i].isalpha():
                i += 1
        else:
            out.append(c)
    return "".join(out)


NLI_LABELS = ("entailment", "neutral", "contradiction")


def nli_label(text: str) -> Optional[str]:
    """entailment / neutral / contradiction from the last box (or the whole text)."""
    answer = last_boxed(text)
    if answer is None:
        answer = text
    letters = "".join(c for c in strip_latex_commands(answer) if c.isalpha()).lower()
    return letters if letters in NLI_LABELS else None


def nli_reference(reference: str) -> Optional[str]:
    r = trim(reference).lower()
    for label in NLI_LABELS:
        if label == r or (len(r) == 1 and label.startswith(r)):
            return label
    return None
