"""Prints the executable cargo built for one target, read from cargo's JSON messages.

    cargo bench -p maporl --bench plugins --no-run --message-format=json \
        | python3 scripts/cargo_executable.py plugins [KIND]

NAME is the target's name; KIND (e.g. "bench", "bin", "test"), when given, must be one of
its kinds. The last matching artifact is printed; nothing when none matches.
"""

import json
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    name, kind = sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None
    found = None
    for line in sys.stdin:
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue  # cargo's own text, when it prints any
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if m["target"]["name"] == name and (kind is None or kind in m["target"]["kind"]):
            found = m["executable"]
    if found:
        print(found)


if __name__ == "__main__":
    main()
