#!/usr/bin/env bash
# candle (host/benches/model.rs) against HF transformers on PyTorch CPU, same run, same weights:
#   - SmolLM2-135M-Instruct from its Q4_1 GGUF (both dequantize the same file to f32; the logits of
#     one prompt are compared and the max difference printed);
#   - a ~31M llama with random weights, written once as an HF folder by transformers.
# For each: greedy generation tok/s at batch 1 and 8, a PPO-shaped LoRA train step at 8 x 128,
# peak RSS, and batch-1 decoding against weight bytes / measured copy bandwidth.
# The runs are repeated REPS times, alternating which implementation goes first; the table takes
# the best of them (the machine may be shared).
#
#   scripts/bench-vs-torch.sh                  # THREADS=1 REPS=3
#   THREADS=2 REPS=1 scripts/bench-vs-torch.sh
#   PLAIN=0 ...                                # skip the extra candle run without the frozen matmul
#   BENCH_VENV=/path/to/venv MAPORL_MODEL_CACHE=/data scripts/bench-vs-torch.sh
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
THREADS="${THREADS:-1}"
REPS="${REPS:-3}"
VENV="${BENCH_VENV:-$HOME/.cache/maporl/bench-venv}"
CACHE="${MAPORL_MODEL_CACHE:-$HOME/.cache/maporl/models}"
PY="$ROOT/scripts/bench_vs_torch.py"
OUT="${BENCH_OUT:-$(mktemp -d /tmp/maporl-bench.XXXXXX)}"
mkdir -p "$OUT"

# 1. PyTorch + transformers (+ gguf and accelerate, which transformers needs to read a GGUF)
#    in a venv, reused if present.
if ! "$VENV/bin/python" -c 'import torch, transformers, gguf, numpy, accelerate' 2>/dev/null; then
    echo "installing torch, transformers, gguf, accelerate into $VENV (several minutes, a few GB)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet torch transformers gguf numpy accelerate
fi

# 2. Models.
GGUF="$("$ROOT/scripts/fetch-smollm2.sh")"
TINY="$CACHE/tiny-llama-31m"
if [ ! -f "$TINY/model.safetensors" ]; then
    "$VENV/bin/python" "$PY" make-tiny "$TINY" >&2
fi

# 3. The candle bench binary (release).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
BIN="$(cd "$ROOT" && cargo bench -p maporl --bench model --no-run --message-format=json 2>/dev/null \
    | python3 "$ROOT/scripts/cargo_executable.py" model bench)"
[ -x "$BIN" ] || { echo "could not build the candle bench binary" >&2; exit 1; }
cp "$BIN" "$OUT/candle-bench" && BIN="$OUT/candle-bench"  # immune to rebuilds during the run

RESULTS="$OUT/results.jsonl"
: > "$RESULTS"
export RAYON_NUM_THREADS="$THREADS" OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS"

run_candle() { # name path logits-file-or-empty [plain]
    local env=(MAPORL_BENCH_JSON=1 MAPORL_BENCH_MODEL="$2")
    [ -n "$3" ] && env+=(MAPORL_BENCH_LOGITS="$3")
    [ -n "${4:-}" ] && env+=(MAPORL_BENCH_PLAIN_MATMUL=1)
    env "${env[@]}" "$BIN" > "$OUT/candle-$1.log" 2>&1 || { cat "$OUT/candle-$1.log" >&2; exit 1; }
    grep '^JSON ' "$OUT/candle-$1.log" | sed "s/^JSON {/{\"model\":\"$1\",/" >> "$RESULTS"
    grep -E '^(generation|train step|peak)' "$OUT/candle-$1.log" | sed 's/^/  candle: /' >&2
}
run_torch() { # name args...
    local name="$1"; shift
    "$VENV/bin/python" "$PY" torch "$@" --threads "$THREADS" > "$OUT/torch-$name.log" 2>&1 \
        || { cat "$OUT/torch-$name.log" >&2; exit 1; }
    grep '^JSON ' "$OUT/torch-$name.log" | sed "s/^JSON {/{\"model\":\"$name\",/" >> "$RESULTS"
    grep -E '^(generation|train step)' "$OUT/torch-$name.log" | sed 's/^/  torch:  /' >&2
}

for rep in $(seq 1 "$REPS"); do
    for m in smollm2-135m tiny-31m; do
        case $m in
            smollm2-135m) cpath="$GGUF"; targs=("$(dirname "$GGUF")" --gguf "$(basename "$GGUF")");;
            tiny-31m) cpath="$TINY"; targs=("$TINY");;
        esac
        echo "== rep $rep/$REPS, $m, $THREADS thread(s)" >&2
        logits=""
        [ "$rep" = 1 ] && logits="$OUT/logits-$m.f32"
        cmp=()
        [ -n "$logits" ] && cmp=(--compare-logits "$logits")
        if [ $((rep % 2)) = 1 ]; then
            run_candle "$m" "$cpath" "$logits"
            run_torch "$m" "${targs[@]}" "${cmp[@]}"
        else
            run_torch "$m" "${targs[@]}"
            run_candle "$m" "$cpath" ""
        fi
        # once: candle with its plain matmul backward (no frozen-weight matmul), for comparison
        [ "$rep" = 1 ] && [ "${PLAIN:-1}" = 1 ] && run_candle "$m" "$cpath" "" plain
    done
done

echo
echo "$(date -u +%F), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores, threads $THREADS, results in $RESULTS"
"$VENV/bin/python" "$PY" report "$RESULTS"
