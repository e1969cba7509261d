#!/usr/bin/env bash
# Compiles and links maporl with the `cuda` feature on a machine without a GPU (and without a
# CUDA install): nvcc and the CUDA headers come from NVIDIA's PyPI wheels, installed once into
# a cache, and the binary links against stub libraries (scripts/cuda-env.sh says how). This is
# what CI runs to keep the CUDA build compiling.
#
#   scripts/cuda-build.sh            # the library and the binary, built; every target, type-checked
#
# What it checks and what it cannot:
# - `cargo build --release --features cuda` compiles candle's CUDA kernels with nvcc (to PTX,
#   for CUDA_COMPUTE_CAP, default 90 = H100/H200), the whole maporl library and the `maporl`
#   binary, linked (against the stubs: the real libcuda comes with the NVIDIA driver).
# - The test executables are type-checked (`cargo check --all-targets`); scripts/gpu-bundle.sh
#   links the device tests and benchmark for scripts/gpu-check.sh to run on a GPU machine.
#
# Environment: MAPORL_GPU_CUDA (13.0.88), CUDA_COMPUTE_CAP (90), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
nvcc --version | tail -2

cargo build --release -p maporl --lib --features cuda
cuda_stubs "${CARGO_TARGET_DIR:-target}"
cargo build --release -p maporl --features cuda
cargo check --release -p maporl --all-targets --features cuda,test-hooks
echo "cuda-build: ok (library and binary built for compute capability $CUDA_COMPUTE_CAP, CUDA $cuda_version; tests type-checked)"
