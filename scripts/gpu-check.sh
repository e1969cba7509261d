#!/usr/bin/env bash
# The GPU check: run unattended on a fresh machine with one NVIDIA GPU and no network.
#
#   scripts/gpu-check.sh            # writes JSON and logs under $OUT when it is set (else ./gpu-check)
#
# 1. Reports what it finds: nvidia-smi (GPU, driver, compute capability), nvcc, cargo, the
#    CUDA libraries. Without a GPU it stops at once, saying so (exit 2).
# 2. Takes its binaries from the prebuilt bundle .gpu/device.tar.xz when there is one
#    (scripts/gpu-bundle.sh makes it on any x86-64 machine: GPU machines often have no cargo),
#    else builds with `--features cuda`: the device tests and the device benchmark.
# 3. Runs the model tests on CUDA (tests/device.rs): logits, log-probs, values, generation and
#    one PPO micro-batch's loss and LoRA gradients against the CPU, on a random-weights model
#    it makes itself (nothing is downloaded).
# 4. Benchmarks generation (b = 1, 8, 64) and a PPO train step in bf16 on a random-weights
#    ~0.5B llama (host/benches/device.rs), and the same workload in PyTorch when python3 has
#    torch, transformers and peft (scripts/bench_device_torch.py): the ratios of one run.
# 5. With the bundle: `maporl train` end to end on the GPU (the quickstart's config and model,
#    `device = "cuda"`), and the held-out evaluation of the same model on the CPU beside it.
#
# Offline: without the bundle the crates must already be in ~/.cargo/registry, or vendored
# (`cargo vendor vendor` on a machine with network, carried along: this script then builds
# with `--offline` from ./vendor). The reference plugins are taken prebuilt from
# plugins/target/wasm32-wasip2/release when that holds them (no wasm32 target is needed).
# nvcc comes from PATH, /usr/local/cuda, or the PyPI wheels scripts/cuda-env.sh installs.
# Environment: OUT, NVIDIA_SMI (the command to ask, for tests), CUDA_COMPUTE_CAP,
# MAPORL_GPU_BUNDLE (default .gpu/device.tar.xz), MAPORL_GPU_STAGE_TIMEOUT (300 s a stage).
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

stage_timeout=${MAPORL_GPU_STAGE_TIMEOUT:-300}
status=0
stage() { # name, command...: one stage under a time limit, its output also in $out/<name>.log
    local name=$1 rc
    shift
    log "$name: $*"
    timeout --kill-after=10 "$stage_timeout" "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        status=1
        log "$name FAILED (exit $rc$([ "$rc" -eq 124 ] && echo ", over ${stage_timeout} s"))"
    fi
}
torch_reference() { # the same workload in PyTorch, when this machine's python3 has it
    if python3 -c 'import torch, transformers, peft; assert torch.cuda.is_available()' 2>/dev/null; then
        stage torch-bench env PYTHONUNBUFFERED=1 python3 scripts/bench_device_torch.py \
            --device cuda:0 --dtype bf16 --json "$out/torch-bf16-0.5b.json"
    else
        log "no PyTorch with CUDA, transformers and peft here: no reference times"
    fi
}

bundle=${MAPORL_GPU_BUNDLE:-.gpu/device.tar.xz}
if [ -f "$bundle" ]; then
    # 2. The prebuilt binaries, and the CUDA libraries they need from this machine.
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    tar -C "$dir" -xJf "$bundle" || { echo "gpu-check: cannot unpack $bundle" >&2; exit 1; }
    log "bundle: $(tr '\n' ';' < "$dir/BUILD")"
    source scripts/gpu-libs.sh
    # (Not in a pipe: gpu_libs sets LD_LIBRARY_PATH for the stages below.)
    if ! gpu_libs "$dir/lib" "$dir"/bin/* >"$out/libs.log" 2>&1; then
        cat "$out/libs.log" >&2
        exit 1
    fi
    while read -r line; do log "$line"; done <"$out/libs.log"
    echo "{\"gpus\": \"$gpus\", \"bundle\": \"$(tr '\n' ';' < "$dir/BUILD")\", \"compute_cap\": \"$cap\"}" \
        > "$out/machine.json"

    # 3. The device tests.
    stage device-tests env MAPORL_TEST_DEVICE=cuda:0 "$dir/bin/device-tests" \
        --include-ignored --nocapture --test-threads 1
    # 4. The benchmark, in bf16 on a random ~0.5B llama, and PyTorch's times for the same work.
    stage bench env MAPORL_BENCH_DEVICE=cuda:0 MAPORL_BENCH_DTYPE=bf16 MAPORL_BENCH_SIZE=0.5b \
        MAPORL_BENCH_JSON="$out/bench-bf16-0.5b.json" "$dir/bin/device-bench" --bench
    torch_reference
    # 5. MAPoRL end to end on the GPU, and the same model's held-out evaluation on the CPU.
    if [ -d "$dir/quickstart-model" ]; then
        model=(--config configs/quickstart.toml --set "model.path=$dir/quickstart-model")
        stage train-cuda "$dir/bin/maporl" train "${model[@]}" --set device=cuda \
            --set "run_dir=$dir/run-cuda"
        stage eval-cpu "$dir/bin/maporl" eval "${model[@]}" --set device=cpu \
            --set "run_dir=$dir/eval-cpu"
        cp "$dir/run-cuda/metrics.jsonl" "$out/train-cuda-metrics.jsonl" 2>/dev/null
    fi
    log "done (status $status); results in $out/"
    exit $status
fi

for dir in /usr/local/cuda/bin "$HOME/.cache/maporl/cuda-13.0/nvidia/cu13/bin"; do
    command -v nvcc >/dev/null 2>&1 || { [ -x "$dir/nvcc" ] && export PATH="$dir:$PATH"; }
done
command -v nvcc >/dev/null 2>&1 || { echo "gpu-check: no nvcc (PATH, /usr/local/cuda/bin, ~/.cache/maporl/cuda-13.0) and no bundle ($bundle: scripts/gpu-bundle.sh)" >&2; exit 1; }
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
stage device-tests env MAPORL_TEST_DEVICE=cuda:0 cargo test "${offline[@]}" --release -p maporl \
    --features cuda --test device -- --include-ignored --nocapture --test-threads 1

# 4. The benchmark, in bf16 on a random ~0.5B llama, and PyTorch's times for the same work.
stage bench env MAPORL_BENCH_DEVICE=cuda:0 MAPORL_BENCH_DTYPE=bf16 MAPORL_BENCH_SIZE=0.5b \
    MAPORL_BENCH_JSON="$PWD/$out/bench-bf16-0.5b.json" \
    cargo bench "${offline[@]}" -p maporl --features cuda --bench device
torch_reference

log "done (status $status); results in $out/"
exit $status
