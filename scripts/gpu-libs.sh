# Sourced by scripts/gpu-check.sh and scripts/gpu-smollm2.sh on a GPU machine: the CUDA
# libraries a prebuilt CUDA maporl (scripts/gpu-bundle.sh, scripts/gpu-smollm2.sh pack) needs.
#
# `gpu_libs DIR BINARY...` links into DIR the driver's libcuda and the machine's CUDA 13
# libraries (ldconfig, /usr/local/nvidia, /usr/local/cuda, python's nvidia-* wheels), puts DIR
# first on LD_LIBRARY_PATH, prints where each came from, and fails, naming what is missing,
# when a binary still lacks a library.

gpu_libs() {
    local libs=$1 want found sp
    shift
    mkdir -p "$libs"
    local search=(/usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu)
    if command -v python3 >/dev/null 2>&1; then
        while read -r sp; do
            [ -d "$sp/nvidia" ] && search+=("$sp/nvidia")
        done < <(python3 -c 'import site; print("\n".join(site.getsitepackages()))' 2>/dev/null)
    fi
    for want in libcuda.so.1 libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13; do
        found=$(ldconfig -p 2>/dev/null | awk -v w="$want" '$1 == w {print $NF; exit}')
        [ -n "$found" ] || found=$(find "${search[@]}" -name "$want" 2>/dev/null | head -1)
        if [ -n "$found" ]; then
            ln -sf "$found" "$libs/$want"
            echo "$want: $found"
        fi
    done
    export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
    if ldd "$@" | grep 'not found' >&2; then
        echo "gpu-libs: libraries the CUDA build needs are missing here (the driver's libcuda: ldconfig, /usr/local/nvidia; CUDA 13's: /usr/local/cuda, python's nvidia-* wheels)" >&2
        return 1
    fi
}
