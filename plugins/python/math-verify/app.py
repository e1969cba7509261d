"""A verifier on Hugging Face's math-verify (sympy underneath): an answer is right when it is
mathematically equal to the reference (`0.5`, `\\frac{1}{2}` and `1/2` agree; so do `x+1`
and `1+x`). An example of a plugin that bundles large pure-Python packages: the component is
about 80 MB and starts with about 75 MiB of memory, over the default caps, so a run raises
them:

    [plugins.verifier]
    path = "math-verify.wasm"
    [plugins.verifier.limits]
    max_component_mib = 128
    memory_mib = 256

Built with the packages installed beside it:

    python3 -m pip install --target site math-verify==0.9.0
    python3 -m maporl_plugin build app.py --world verifier --path site -o math-verify.wasm

math-verify's own timeouts use signals, which a component does not have: they are off here,
and the call's fuel and deadline bound the work instead. sympy imports `ctypes`, which a
component lacks: the module stands in for the one thing sympy reads from it.
"""

import sys
import types

try:
    import ctypes  # noqa: F401
except ImportError:
    # A component has no `_ctypes`. sympy imports `c_long` and `sizeof` only to learn the
    # width of a C long (32 bits on wasm32): a stand-in with just that, before it is imported.
    class _CLong:
        pass

    def _sizeof(kind):
        if kind is _CLong:
            return 4
        raise NotImplementedError("ctypes is not available in a component")

    _stub = types.ModuleType("ctypes")
    _stub.c_long, _stub.sizeof = _CLong, _sizeof
    sys.modules["ctypes"] = _stub

from math_verify import parse, verify  # noqa: E402

from maporl_plugin import Task, Verdict, Verifier, export, parse_settings  # noqa: E402


def _parse(text):
    return parse(text, parsing_timeout=None)


class MathVerify(Verifier):
    NAME = "math-verify-py"
    SETTINGS = {}

    def extract(self, task, text):
        parsed = _parse(text)
        # math-verify gives the parsed expression, then the text it was read from.
        return parsed[-1] if parsed else None

    def score(self, task, responses):
        gold = _parse("$" + task.reference + "$")
        verdicts = []
        for r in responses:
            answer = _parse(r)
            right = bool(answer) and verify(gold, answer, timeout_seconds=None)
            verdicts.append(Verdict(answer[-1] if answer else None, 1.0 if right else 0.0, right))
        return verdicts


# A component cannot import a module later (it has no files), and the parser and sympy
# import some of theirs inside functions: grade a few answers now, while the build snapshots
# the module, so that the modules those paths need are imported.
_warm = MathVerify(parse_settings(MathVerify, "{}"))
for _reference, _response in [
    ("\\frac{1}{2}", "The answer is \\boxed{0.5}"),
    ("x + 1", "$1 + x$"),
    ("\\sqrt{2}", "so 1/2"),
    ("(1, 2)", "\\boxed{[1, 2]}"),
    ("\\{1, 2\\}", "the set \\boxed{\\{2, 1\\}}"),
    ("10\\%", "0.1"),
    ("3", "no idea"),
]:
    _warm.score(Task("warm-up", "math", "", _reference, []), [_response])
del _warm

Verification = export(MathVerify)
