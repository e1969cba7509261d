#!/usr/bin/env bash
# The GPU check: run unattended on a fresh machine with one NVIDIA GPU and no network.
#
#   scripts/gpu-check.sh            # writes JSON under $OUT when it is set (else ./gpu-check)
#
# 1. Reports what it finds: nvidia-smi (GPU, driver, compute capability), nvcc, cargo.
#    Without a GPU it stops at once, saying so (exit 2).
# 2. Builds with `--features cuda`: the device tests and the device benchmark.
# 3. Runs the model tests on CUDA (tests/device.rs): logits, log-probs, values, generation and
#    one PPO micro-batch's loss and LoRA gradients against the CPU, on a random-weights model
#    it makes itself (nothing is downloaded).
# 4. Benchmarks generation (b = 1, 8, 64) and a PPO train step in bf16 on a random-weights
#    ~0.5B llama (host/benches/device.rs).
#
# Offline: the crates must already be in ~/.cargo/registry, or vendored (`cargo vendor
# vendor` on a machine with network, carried along: this script then builds with
# `--offline` from ./vendor). The reference plugins are taken prebuilt from
# plugins/target/wasm32-wasip2/release when that holds them (no wasm32 target is needed).
# nvcc comes from PATH, /usr/local/cuda, or the PyPI wheels scripts/cuda-build.sh installs.
# Environment: OUT, NVIDIA_SMI (the command to ask, for tests), CUDA_COMPUTE_CAP.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
out=${OUT:-gpu-check}
mkdir -p "$out"
log() { echo "gpu-check [$(( $(date +%s) - start ))s]: $*"; }

# 1. What is here.
smi=${NVIDIA_SMI:-nvidia-smi}
if ! command -v "$smi" >/dev/null 2>&1 || ! gpus=$("$smi" --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null) || [ -z "$gpus" ]; then
    echo "gpu-check: no NVIDIA GPU here ($smi is missing or lists no GPU); nothing to check" >&2
    exit 2
fi
log "GPU: $gpus"
cap=${CUDA_COMPUTE_CAP:-$(echo "$gpus" | head -1 | awk -F', ' '{print $4}' | tr -d '.')}
export CUDA_COMPUTE_CAP=$cap

for dir in /usr/local/cuda/bin "$HOME/.cache/maporl/cuda-13/nvidia/cu13/bin"; do
    command -v nvcc >/dev/null 2>&1 || { [ -x "$dir/nvcc" ] && export PATH="$dir:$PATH"; }
done
command -v nvcc >/dev/null 2>&1 || { echo "gpu-check: no nvcc (PATH, /usr/local/cuda/bin, ~/.cache/maporl/cuda-13)" >&2; exit 1; }
cuda_root=$(dirname "$(dirname "$(command -v nvcc)")")
export CUDA_ROOT="$cuda_root" CUDA_PATH="$cuda_root"
[ -d "$cuda_root/include/cccl" ] && export NVCC_PREPEND_FLAGS="-I$cuda_root/include -I$cuda_root/include/cccl"
for lib in "$cuda_root/lib64" "$cuda_root/lib"; do
    [ -d "$lib" ] && export LIBRARY_PATH="$lib:${LIBRARY_PATH:-}" LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
done
case "$(nvcc --version | grep -o 'release [0-9.]*')" in
    "release 13."[5-9]*) export CUDARC_CUDA_VERSION=13040 ;;  # cudarc 0.19 knows up to 13.4
esac
command -v cargo >/dev/null 2>&1 || { echo "gpu-check: no cargo" >&2; exit 1; }
log "nvcc: $(nvcc --version | tail -1); $(cargo --version); compute capability $cap"
{
    echo "{\"gpus\": \"$gpus\", \"nvcc\": \"$(nvcc --version | tail -1)\","
    echo " \"cargo\": \"$(cargo --version)\", \"compute_cap\": \"$cap\"}"
} > "$out/machine.json"

# 2. Build.
offline=()
if [ -d vendor ]; then
    offline=(--offline --config 'source.crates-io.replace-with="vendored"' --config 'source.vendored.directory="vendor"')
fi
if ls plugins/target/wasm32-wasip2/release/*.wasm >/dev/null 2>&1; then
    export MAPORL_PREBUILT_PLUGINS=$PWD/plugins/target/wasm32-wasip2/release
fi
log "building (release, --features cuda)"
if ! cargo build "${offline[@]}" --release -p maporl --features cuda --tests --benches > "$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo "gpu-check: the CUDA build failed; see $out/build.log" >&2
    exit 1
fi
log "built"

# 3. The device tests.
status=0
MAPORL_TEST_DEVICE=cuda:0 cargo test "${offline[@]}" --release -p maporl --features cuda \
    --test device -- --include-ignored --nocapture 2>&1 | tee "$out/device-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; log "device tests FAILED"; }

# 4. The benchmark, in bf16 on a random ~0.5B llama.
MAPORL_BENCH_DEVICE=cuda:0 MAPORL_BENCH_DTYPE=bf16 MAPORL_BENCH_SIZE=0.5b \
MAPORL_BENCH_JSON="$PWD/$out/bench-bf16-0.5b.json" \
    cargo bench "${offline[@]}" -p maporl --features cuda --bench device 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || { status=1; log "benchmark FAILED"; }

log "done (status $status); results in $out/"
exit $status
