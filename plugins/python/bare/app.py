"""TEST FIXTURE, not a plugin to use: a verifier written against componentize-py's bindings
directly, without the SDK, so that nothing catches its exceptions (tests/python_plugins.rs).
An exception that reaches componentize-py's runtime is printed as a traceback, then the
runtime panics with a generic message; the host must read the traceback's reason.

- `raise`: looks the task's kind up in an empty table (a `KeyError`, uncaught);
- anything else: the answer is the trimmed response, right when it equals the reference.
"""

from wit_world.imports import types

TABLE = {}


def lookup(kind):
    return TABLE[kind]


class Verification:
    def configure(self, settings):
        return None

    def extract(self, task, text):
        return text.strip() or None

    def score(self, task, responses):
        if task.question.strip() == "raise":
            lookup(task.kind)
        return [
            types.Verdict(r.strip() or None, float(r.strip() == task.reference), r.strip() == task.reference)
            for r in responses
        ]
