"""Text operations with Rust's meaning, so that a Python plugin gives the bytes the Rust SDK
gives: Rust trims and splits on Unicode `White_Space`, which is narrower than Python's
`str.isspace` (that also takes U+001C..U+001F)."""

WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_WS = frozenset(WHITE_SPACE)


def trim(s: str) -> str:
    """Rust's `str::trim`."""
    return s.strip(WHITE_SPACE)


def is_whitespace(c: str) -> bool:
    """Rust's `char::is_whitespace`."""
    return c in _WS


def split_whitespace(s: str) -> list:
    """Rust's `str::split_whitespace`."""
    words, start = [], None
    for i, c in enumerate(s):
        if c in _WS:
            if start is not None:
                words.append(s[start:i])
                start = None
        elif start is None:
            start = i
    if start is not None:
        words.append(s[start:])
    return words
