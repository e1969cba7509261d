#!/usr/bin/env bash
# Generation against llama.cpp (issue 19), in one run: the same GGUF file, a 32-token prompt,
# 64 greedy new tokens with no stop, batch 1 and 8, the same number of threads.
#
#   scripts/bench-llamacpp.sh
#
# llama.cpp is built from its source as llama-cpp-python ships it (the PyPI sdist, vendored
# llama.cpp; LLAMA_CPP_PYTHON, default 0.3.36), with cmake, into ~/.cache/maporl/, once:
# `llama-batched-bench` measures, `llama-quantize` writes an F32 copy of the GGUF so that the
# dtype can be matched (maporl dequantizes GGUF weights to f32 at load).
#
# Both sides count the same thing: generated tokens (B x 64) over the whole time, prompt
# processing included (llama-batched-bench: B x 64 / T, T its total time; maporl's model
# benchmark: tokens / generate's time).
# Environment: MAPORL_BENCH_MODEL (the GGUF; default SmolLM2-135M-Instruct Q4_1, fetched by
# scripts/fetch-smollm2.sh), THREADS (2), LLAMA_CPP_PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${LLAMA_CPP_PYTHON:-0.3.36}
threads=${THREADS:-2}
gguf=${MAPORL_BENCH_MODEL:-$HOME/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$gguf" ] || scripts/fetch-smollm2.sh
[ -f "$gguf" ] || { echo "bench-llamacpp: no GGUF at $gguf" >&2; exit 1; }
command -v cmake >/dev/null || { echo "bench-llamacpp: needs cmake (apt-get install cmake)" >&2; exit 1; }

cache=$HOME/.cache/maporl/llama.cpp-$ver
src=$cache/llama_cpp_python-$ver/vendor/llama.cpp
bin=$src/build/bin
if [ ! -x "$bin/llama-batched-bench" ] || [ ! -x "$bin/llama-quantize" ]; then
    mkdir -p "$cache"
    if [ ! -d "$src" ]; then
        url=$(python3 - "$ver" <<'EOF'
import json, sys, urllib.parse, urllib.request
api = f"https://pypi.org/pypi/llama-cpp-python/{sys.argv[1]}/json"
d = json.load(urllib.request.urlopen(api))
sdist = [u for u in d["urls"] if u["packagetype"] == "sdist"][0]
print(urllib.parse.urljoin(api, sdist["url"]))
EOF
)
        echo "bench-llamacpp: fetching $url"
        curl -sSfL -o "$cache/src.tar.gz" "$url"
        tar -C "$cache" -xzf "$cache/src.tar.gz"
    fi
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF > "$cache/cmake.log"
    cmake --build "$src/build" --target llama-batched-bench llama-quantize -j"$(nproc)" > "$cache/build.log"
fi
f32=$cache/$(basename "${gguf%.gguf}").F32.gguf
if [ ! -f "$f32" ]; then
    "$bin/llama-quantize" --allow-requantize "$gguf" "$f32" F32 > "$cache/quantize.log" 2>&1 \
        || { tail -5 "$cache/quantize.log" >&2; echo "bench-llamacpp: no F32 copy" >&2; exit 1; }
fi

llama() { # gguf -> "b1 b8" tokens/s
    "$bin/llama-batched-bench" -m "$1" -c 2048 -b 512 -ub 512 -npp 32 -ntg 64 -npl 1,8 \
        -t "$threads" -tb "$threads" 2>/dev/null \
        | awk -F'|' 'NF > 10 && $4+0 > 0 { gsub(/ /, ""); print $4 * 64 / $10 }' | tr '\n' ' '
}
echo "bench-llamacpp: $(date -u +%FT%TZ), $(nproc) cores, $threads threads, llama.cpp from llama-cpp-python $ver ($(cd "$src" && git describe --tags 2>/dev/null || echo "vendored"))"
read -r lq1 lq8 <<< "$(llama "$gguf")"
read -r lf1 lf8 <<< "$(llama "$f32")"
out=$(RAYON_NUM_THREADS=$threads MAPORL_BENCH_MODEL=$gguf MAPORL_BENCH_STEPS=0 \
    MAPORL_BENCH_BATCHES=1,8 cargo bench -q -p maporl --bench model 2>/dev/null)
m1=$(echo "$out" | awk '/generation b=1 /{print $4}')
m8=$(echo "$out" | awk '/generation b=8 /{print $4}')
echo "maporl: $m1 $m8; llama.cpp Q4_1: $lq1 $lq8; F32: $lf1 $lf8"
python3 - "$m1" "$m8" "$lq1" "$lq8" "$lf1" "$lf8" <<'EOF'
import sys
m1, m8, q1, q8, f1, f8 = map(float, sys.argv[1:])
print("| batch | maporl (f32 from Q4_1) | llama.cpp Q4_1 | llama.cpp F32 | maporl / Q4_1 | maporl / F32 |")
print("|---|---|---|---|---|---|")
for b, m, q, f in ((1, m1, q1, f1), (8, m8, q8, f8)):
    print(f"| {b} | {m:.1f} tok/s | {q:.1f} | {f:.1f} | {m / q:.2f}x | {m / f:.2f}x |")
EOF
