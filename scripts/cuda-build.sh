#!/usr/bin/env bash
# Compiles maporl with the `cuda` feature on a machine without a GPU (and without a CUDA
# install): nvcc and the CUDA headers come from NVIDIA's PyPI wheels, installed once into a
# cache (nvcc, its crt headers and NVVM back end, the runtime headers, CCCL). This is what
# CI runs to keep the CUDA build compiling.
#
#   scripts/cuda-build.sh            # the library, built; every target, type-checked
#
# What it checks and what it cannot:
# - `cargo build --release --lib --features cuda` compiles candle's CUDA kernels with nvcc
#   (to PTX, for CUDA_COMPUTE_CAP, default 90 = H100/H200) and the whole maporl library.
# - The binary and the test executables are type-checked (`cargo check --all-targets`), not
#   linked: linking needs libcuda, libcublas, libcurand and libnvrtc, which come with the
#   NVIDIA driver and a full CUDA toolkit, not with these wheels. `scripts/gpu-check.sh`
#   builds and runs them on a GPU machine.
#
# Environment: MAPORL_CUDA_CACHE (default ~/.cache/maporl/cuda-13), CUDA_COMPUTE_CAP.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${MAPORL_CUDA_CACHE:-$HOME/.cache/maporl/cuda-13}
cu=$cache/nvidia/cu13
if [ ! -x "$cu/bin/nvcc" ] || [ ! -x "$cu/nvvm/bin/cicc" ] || [ ! -f "$cu/include/crt/host_config.h" ]; then
    echo "cuda-build: installing nvcc and the CUDA 13 headers from PyPI into $cache"
    # pip --target skips a top-level directory that exists: start from an empty cache.
    rm -rf "$cache"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$cache" \
        nvidia-cuda-nvcc==13.5.37 nvidia-cuda-crt==13.5.37 nvidia-nvvm==13.5.37 \
        nvidia-cuda-runtime==13.5.37 nvidia-cuda-cccl==13.3.5.0.6 \
        || { echo "cuda-build: FAILED to install the CUDA wheels (needs PyPI)" >&2; exit 1; }
fi
[ -x "$cu/bin/nvcc" ] || { echo "cuda-build: no nvcc at $cu/bin/nvcc" >&2; exit 1; }

export PATH="$cu/bin:$PATH"
export CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu"
export NVCC_PREPEND_FLAGS="-I$cu/include -I$cu/include/cccl"
# No nvidia-smi here: candle-kernels' build would ask it for the compute capability.
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
# The wheels are CUDA 13.5; cudarc 0.19 knows versions up to 13.4, whose API we use.
export CUDARC_CUDA_VERSION=13040

nvcc --version | tail -2
cargo build --release -p maporl --lib --features cuda
cargo check --release -p maporl --all-targets --features cuda,test-hooks
echo "cuda-build: ok (library built for compute capability $CUDA_COMPUTE_CAP; binary and tests type-checked)"
