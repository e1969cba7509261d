"""TEST FIXTURE, not a plugin to use: a Python verifier that misbehaves on request, read from
the task's question (tests/python_plugins.rs):

- `print`: prints two lines (they must reach the plugin log), then behaves;
- `divide`: divides by zero (the error must name the exception and the line);
- `late-import`: imports a module app.py did not import at the top (a component has no
  files to import it from: the error must say so);
- `random`: the answer is 8 bytes of `os.urandom` in hex (WASI randomness: the host seeds it
  from the run seed and the plugin's source);
- anything else: the answer is the trimmed response, right when it equals the reference.
"""

import os

from maporl_plugin import Verdict, Verifier, export

NAME = "hostile-py"


class Hostile(Verifier):
    NAME = NAME
    SETTINGS = {}

    def extract(self, task, text):
        return text.strip() or None

    def score(self, task, responses):
        q = task.question.strip()
        if q == "print":
            print("hello from Python")
            print("a second line", len(responses))
        elif q == "divide":
            return [Verdict(None, 1 / len([]), False)]
        elif q == "random":
            return [Verdict(os.urandom(8).hex(), 0.0, False) for _ in responses]
        elif q == "late-import":
            import csv  # noqa: F401: not imported at build time

        return [Verdict(self.extract(task, r), float(r.strip() == task.reference), r.strip() == task.reference) for r in responses]


Verification = export(Hostile)
