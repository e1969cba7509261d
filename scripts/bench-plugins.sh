#!/usr/bin/env bash
# Per-call latency of every reference plugin (issue 19's plugin-call benchmark): each call
# through the host on the wasm component, the same plugin source called natively, and a
# Python port (scripts/bench_plugins.py), on the same 3-agent x 3-turn payloads with
# ~1,200-character answers, in one run. Prints one table (median and p99 per call, the
# wasm/native and python/wasm ratios, the fuel of the call) and writes the JSON. The Python
# port asserts that it computes the native outputs on every row before it is timed.
#
#   scripts/bench-plugins.sh                       # CALLS=5000 WARMUP=200 REPS=3
#   REPS=1 CALLS=1000 BENCH_OUT=/tmp/pb scripts/bench-plugins.sh
#
# The learned verifier runs on a stub judge (0.75 for every response): no model.
#
#   BASELINE=REV scripts/bench-plugins.sh          # also REV's host and plugins, same run
#
# With BASELINE, every repetition first runs the bench and the components of git revision
# REV (checked out in .cache/bench-plugins-REV with its own target dir, built once: 10-15
# minutes the first time), then this checkout's; the table adds REV's wasm medians, the
# ratio and REV's fuel.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${BENCH_OUT:-$(mktemp -d /tmp/maporl-bench-plugins.XXXXXX)}"
mkdir -p "$OUT"
export MAPORL_BENCH_CALLS="${CALLS:-5000}" MAPORL_BENCH_WARMUP="${WARMUP:-200}"
REPS="${REPS:-3}"

cargo build --release -q --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir plugins/target
# Build first, so that the timed run is not sharing the machine with the compiler.
cargo bench -q -p maporl --bench plugins --features test-hooks --no-run
BASE_BENCH=""
if [ -n "${BASELINE:-}" ]; then
    REV="$(git rev-parse --short "$BASELINE^{commit}")"
    BASE_DIR="$ROOT/.cache/bench-plugins-$REV"
    if [ ! -x "$BASE_DIR/bench" ]; then
        echo "building the baseline $REV in $BASE_DIR (once)"
        git worktree remove --force "$BASE_DIR/src" 2>/dev/null || rm -rf "$BASE_DIR/src"
        git worktree prune
        mkdir -p "$BASE_DIR"
        git worktree add -q --detach "$BASE_DIR/src" "$REV"
        # Its build script builds its plugins (into its plugins/target) before the bench.
        exe="$(cd "$BASE_DIR/src" && CARGO_TARGET_DIR="$BASE_DIR/target" cargo bench -q -p maporl \
            --bench plugins --features test-hooks --no-run --message-format=json \
            | python3 "$ROOT/scripts/cargo_executable.py" plugins bench)"
        [ -x "$exe" ] || { echo "no bench executable built for $REV" >&2; exit 1; }
        cp "$exe" "$BASE_DIR/bench.tmp" && mv "$BASE_DIR/bench.tmp" "$BASE_DIR/bench"
    fi
    BASE_BENCH="$BASE_DIR/bench"
    echo "baseline: $REV ($BASE_BENCH, components $BASE_DIR/src/plugins/target/wasm32-wasip2/release)"
fi
echo "machine: $(nproc --all) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(python3 --version), $(date -u +%F)," \
    "load $(cut -d' ' -f1-3 /proc/loadavg)"
# REPS repetitions, each the Rust bench (wasm, native) then the Python port; the table takes
# each cell from the repetition with the lowest median (the machine may be shared).
for r in $(seq 1 "$REPS"); do
    if [ -n "$BASE_BENCH" ]; then
        (cd "$BASE_DIR/src" && MAPORL_BENCH_PLUGINS="$BASE_DIR/src/plugins/target/wasm32-wasip2/release" \
            MAPORL_BENCH_JSON="$OUT/base-$r.json" "$BASE_BENCH" --bench > "$OUT/base-$r.txt" 2> "$OUT/base-$r.err") \
            || { cat "$OUT/base-$r.err" "$OUT/base-$r.txt" >&2; exit 1; }
    fi
    MAPORL_BENCH_JSON="$OUT/rust-$r.json" cargo bench -q -p maporl --bench plugins --features test-hooks \
        > "$OUT/rust-$r.txt" 2> "$OUT/rust-$r.err" || { cat "$OUT/rust-$r.err" "$OUT/rust-$r.txt" >&2; exit 1; }
    python3 scripts/bench_plugins.py time "$OUT/rust-$r.json" "$OUT/python-$r.json"
done
grep '^payload' "$OUT/rust-1.err" || true
python3 scripts/bench_plugins.py table "$OUT"
echo "load after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "JSON: $OUT/plugins.json (each repetition: $OUT/rust-N.json, $OUT/python-N.json)"
