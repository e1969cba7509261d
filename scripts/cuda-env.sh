# Sourced by scripts/cuda-build.sh and scripts/gpu-bundle.sh: a CUDA toolkit for building
# maporl with `--features cuda` on a machine with no GPU, no driver and no CUDA install.
#
# - nvcc, its headers and the runtime come from NVIDIA's PyPI wheels for CUDA
#   $MAPORL_GPU_CUDA (default 13.0.88), cached in ~/.cache/maporl/cuda-<major.minor>. The
#   oldest CUDA 13 toolkit is the default on purpose: candle's kernels ship as PTX that the
#   driver compiles at start-up, and a driver refuses PTX from a toolkit newer than itself
#   (driver 580 is CUDA 13.0: the H200 that ran scripts/gpu-check.sh had 580.159). cudarc's
#   bindings are pinned to the same version.
# - `cuda_stubs TARGET_DIR`, once the library is built, makes stub libraries to link the
#   binaries against: libcuda.so.1, libcublas.so.13, libcublasLt.so.13, libcurand.so.10 and
#   libnvrtc.so.13 with every CUDA symbol the build's objects refer to (found with `nm`), and
#   the runtime wheel's real libcudart.so.13 (candle's kernels library needs it). At run time
#   the dynamic loader takes the real libraries: the driver's libcuda and the CUDA 13
#   libraries of the GPU machine (scripts/gpu-check.sh finds them).
# Environment: MAPORL_GPU_CUDA, CUDA_COMPUTE_CAP (default 90: H100/H200; nvidia-smi would be
# asked otherwise).

cuda_version=${MAPORL_GPU_CUDA:-13.0.88}
cuda_minor=$(echo "$cuda_version" | cut -d. -f1-2)
cuda_cache=$HOME/.cache/maporl/cuda-$cuda_minor
cu=$cuda_cache/nvidia/cu13
case "$cuda_minor" in
    13.0) cccl=13.0.85 ;;
    *) cccl=$cuda_version ;;
esac
if [ ! -x "$cu/bin/nvcc" ] || [ ! -x "$cu/nvvm/bin/cicc" ] || [ ! -f "$cu/include/crt/host_config.h" ]; then
    echo "cuda-env: installing nvcc and the CUDA $cuda_version headers from PyPI into $cuda_cache"
    # pip --target skips a top-level directory that exists: start from an empty cache.
    rm -rf "$cuda_cache"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$cuda_cache" \
        "nvidia-cuda-nvcc==$cuda_version" "nvidia-cuda-crt==$cuda_version" \
        "nvidia-nvvm==$cuda_version" "nvidia-cuda-runtime==$cuda_version" \
        "nvidia-cuda-cccl==$cccl" \
        || { echo "cuda-env: FAILED to install the CUDA $cuda_version wheels (needs PyPI)" >&2; exit 1; }
fi
[ -x "$cu/bin/nvcc" ] || { echo "cuda-env: no nvcc at $cu/bin/nvcc" >&2; exit 1; }

export PATH="$cu/bin:$PATH"
export CUDA_ROOT="$cu" CUDA_PATH="$cu" CUDA_HOME="$cu"
export NVCC_PREPEND_FLAGS="-I$cu/include -I$cu/include/cccl"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
CUDARC_CUDA_VERSION=$(echo "$cuda_minor" | awk -F. '{printf "%d%02d0", $1, $2}')
export CUDARC_CUDA_VERSION

cuda_stubs() { # TARGET_DIR: after the library's build; exports LIBRARY_PATH
    local target=$1 stubs=$cuda_cache/stubs rlibs=() crate newest
    rm -rf "$stubs" && mkdir -p "$stubs"
    for crate in cudarc candle_core candle_nn candle_transformers maporl; do
        newest=$(ls -t "$target"/release/deps/lib"$crate"-*.rlib 2>/dev/null | head -1)
        [ -n "$newest" ] && rlibs+=("$newest")
    done
    nm -u "${rlibs[@]}" 2>/dev/null | awk '{print $NF}' | grep -E '^(cu|nvrtc)[A-Za-z0-9_]+$' \
        | sort -u > "$stubs/symbols"
    [ -s "$stubs/symbols" ] || { echo "cuda-env: found no CUDA symbols in ${rlibs[*]}" >&2; return 1; }
    _cuda_stub "$stubs" libcuda.so.1 '^cu[A-Z]'
    _cuda_stub "$stubs" libcublasLt.so.13 '^cublasLt'
    _cuda_stub "$stubs" libcublas.so.13 '^cublas([^L]|L[^t]|$)'
    _cuda_stub "$stubs" libcurand.so.10 '^curand'
    _cuda_stub "$stubs" libnvrtc.so.13 '^nvrtc'
    ln -sf "$cu/lib/libcudart.so.13" "$stubs/libcudart.so"
    export LIBRARY_PATH="$stubs:${LIBRARY_PATH:-}"
    echo "cuda-env: $(wc -l < "$stubs/symbols") CUDA symbols stubbed in $stubs"
}
_cuda_stub() { # dir, soname, the symbols' pattern
    local dir=$1 soname=$2 pattern=$3 name=${2%%.so*}
    grep -E "$pattern" "$dir/symbols" | sed 's/.*/void &(void) {}/' > "$dir/$name.c"
    cc -shared -fPIC -Wl,-soname,"$soname" -o "$dir/$soname" "$dir/$name.c"
    ln -sf "$soname" "$dir/$name.so"
}
