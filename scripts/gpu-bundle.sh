#!/usr/bin/env bash
# Builds, here (no GPU, no CUDA driver, no CUDA libraries), everything the GPU check runs, so
# that a GPU machine with no cargo and no network can run it:
#
#   scripts/gpu-bundle.sh            # -> .gpu/device.tar.xz (ignored by git), about 30 MB
#   scripts/gpu-check.sh             # on the GPU machine: uses .gpu/device.tar.xz when present
#
# The bundle holds the CUDA builds of `maporl`, the device tests (tests/device.rs) and the
# device benchmark (host/benches/device.rs), stripped, and the quickstart's model when
# runs/quickstart-model exists (for `maporl train` end to end on the GPU). The toolkit (CUDA
# 13.0 from PyPI) and the stub libraries the binaries link against: scripts/cuda-env.sh.
# The binaries need glibc 2.34 or newer and the GPU machine's CUDA 13 libraries.
#
# Environment: MAPORL_GPU_CUDA (13.0.88), CUDA_COMPUTE_CAP (90), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
target=${CARGO_TARGET_DIR:-target}
nvcc --version | tail -1

# The library (candle's kernels and cudarc for this CUDA version), then the stubs, then the
# binaries linked against them.
cargo build --release -p maporl --lib --features cuda
cuda_stubs "$target"
cargo build --release -p maporl --features cuda --bin maporl --test device --bench device \
    --message-format=json-render-diagnostics > "$target/gpu-bundle-build.json"
executable() { # the executable of the target named $1 of kind $2
    python3 scripts/cargo_executable.py "$1" "$2" < "$target/gpu-bundle-build.json"
}

stage=$target/gpu-bundle
rm -rf "$stage" && mkdir -p "$stage/bin"
cp "$(executable maporl bin)" "$stage/bin/maporl"
cp "$(executable device test)" "$stage/bin/device-tests"
cp "$(executable device bench)" "$stage/bin/device-bench"
strip --strip-debug "$stage"/bin/*
if [ -d runs/quickstart-model ]; then
    cp -r runs/quickstart-model "$stage/quickstart-model"
else
    echo "gpu-bundle: no runs/quickstart-model (maporl warm-start --config configs/quickstart.toml): the end-to-end run is left out" >&2
fi
{
    echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes')"
    echo "cuda $cuda_version, compute capability $CUDA_COMPUTE_CAP, cudarc bindings $CUDARC_CUDA_VERSION"
} > "$stage/BUILD"
mkdir -p .gpu
tar -C "$stage" -cJf .gpu/device.tar.xz .
echo "gpu-bundle: .gpu/device.tar.xz ($(du -h .gpu/device.tar.xz | cut -f1)): $(tr '\n' ';' < "$stage/BUILD")"
