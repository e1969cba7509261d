"""The Python SDK as an oracle for the JavaScript SDK's differential test.

Reads a JSON list of calls `{"fn": "module.name", "args": [...], "kwargs": {...}}` on stdin
and writes a JSON list of results on stdout, one per call, in order.

Arguments: JSON values as they are, except `{"$float": "nan" | "inf" | "-inf" | "-0.0"}` (a
float JSON cannot carry), objects read as the SDK's records by their keys (`utterances`:
a Transcript, `question`: a Task, `text`: an Utterance), and scores, reward parts and the
numbers of `score_note` / `f32` read as floats even when JSON wrote them as whole numbers.

Results: `null`, booleans, strings and lists as they are (tuples as lists), records as
objects of their fields, numbers as `{"$n": key}` with key the 16 hex digits of the IEEE
double (`nan` for any NaN) for floats and for ints of at most 2**53 - 1 in magnitude, and
`big:<digits>` for larger ints; a call that raises gives `{"$error": [type name, message]}`.

A constant (`answers.ASCII_WS`) gives its value. `builtin.repr_float(x)` and
`builtin.format_fixed(x, digits)` give Python's `repr(float(x))` and
`format(float(x), f".{digits}f")`; `builtin.python_version()` gives "3.11" and the like.
"""

import dataclasses
import importlib
import json
import math
import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk-python"))

from maporl_plugin import types  # noqa: E402

MODULES = ("answers", "text", "transcript", "prompts", "reward", "types")
SAFE = 2**53 - 1


def decode(v):
    if isinstance(v, list):
        return [decode(x) for x in v]
    if isinstance(v, dict):
        if "$float" in v:
            return float(v["$float"])
        d = {k: decode(x) for k, x in v.items()}
        if "utterances" in d:
            return types.Transcript(**d)
        if "question" in d:
            return types.Task(**d)
        if "text" in d:
            d["score"] = float(d["score"])
            return types.Utterance(**d)
        return d
    return v


def float_key(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return struct.pack(">d", x).hex()


def encode(v):
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return {"$n": float_key(float(v)) if abs(v) <= SAFE else f"big:{v}"}
    if isinstance(v, float):
        return {"$n": float_key(v)}
    if isinstance(v, (list, tuple)):
        return [encode(x) for x in v]
    if dataclasses.is_dataclass(v):
        return {f.name: encode(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {k: encode(x) for k, x in v.items()}
    if isinstance(v, BaseException):
        return {"$error": [type(v).__name__, str(v)]}
    raise TypeError(f"cannot encode {type(v).__name__}")


BUILTINS = {
    "repr_float": lambda x: repr(float(x)),
    "format_fixed": lambda x, digits: format(float(x), f".{digits}f"),
    "python_version": lambda: "%d.%d" % sys.version_info[:2],
}


def function(name: str):
    module, _, attr = name.partition(".")
    if module == "builtin":
        return BUILTINS[attr]
    if module not in MODULES:
        raise KeyError(name)
    return getattr(importlib.import_module(f"maporl_plugin.{module}"), attr)


def floats(shown):
    return [(label, text, None if score is None else float(score)) for label, text, score in shown]


# Where the contract carries a float, an argument that JSON wrote as a whole number is read
# as a float, as the bindings give it.
FLOAT_ARGS = {
    "prompts.score_note": lambda a: [float(a[0])],
    "prompts.render_shown": lambda a: [floats(a[0])],
    "prompts.followup_message": lambda a: [a[0], floats(a[1])],
    "reward.f32": lambda a: [float(a[0])],
    "reward.reward": lambda a: [a[0], a[1], [(name, float(value)) for name, value in a[2]]],
}


def call(c):
    fn = function(c["fn"])
    if not callable(fn):  # a constant
        return encode(fn)
    args = decode(c.get("args", []))
    kwargs = decode(c.get("kwargs", {}))
    if c["fn"] in FLOAT_ARGS:
        args = FLOAT_ARGS[c["fn"]](args)
    try:
        return encode(fn(*args, **kwargs))
    except Exception as e:  # the error is the result
        return {"$error": [type(e).__name__, str(e)]}


def main():
    calls = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    out = [call(c) for c in calls]
    sys.stdout.write(json.dumps(out, ensure_ascii=True))


if __name__ == "__main__":
    main()
