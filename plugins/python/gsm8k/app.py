"""A GSM8K verifier in Python: the answer is the integer in the last `\\boxed{}`; it is right
when it equals the task's integer reference. The same verdicts as the Rust reference `gsm8k`
with its default settings (tests/python_plugins.rs diffs them).

    python3 -m maporl_plugin build app.py --world verifier -o gsm8k.wasm
"""

from maporl_plugin import PluginError, Verdict, Verifier, export
from maporl_plugin.answers import last_boxed, parse_integer

NAME = "gsm8k-py"


def extract(text):
    boxed = last_boxed(text)
    return None if boxed is None else parse_integer(boxed)


class Gsm8k(Verifier):
    NAME = NAME
    SETTINGS = {}

    def extract(self, task, text):
        n = extract(text)
        return None if n is None else str(n)

    def score(self, task, responses):
        gold = parse_integer(task.reference)
        if gold is None:
            raise PluginError(
                f"{NAME}: task `{task.id}`: the reference `{task.reference}` is not an integer; "
                "this verifier needs integer answers (use the exact-match verifier for other tasks)"
            )
        verdicts = []
        for text in responses:
            n = extract(text)
            right = n == gold
            verdicts.append(Verdict(None if n is None else str(n), 1.0 if right else 0.0, right))
        return verdicts


Verification = export(Gsm8k)
