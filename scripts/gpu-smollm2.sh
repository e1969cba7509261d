#!/usr/bin/env bash
# The SmolLM2 fair run (scripts/smollm2-fair.sh) on a GPU machine that has no cargo, no network
# and a limit on what one transfer may carry (the model alone is 98 MB): the CUDA build and the
# model go over in parts, kept on that machine between calls.
#
#   here:   scripts/gpu-smollm2.sh pack [PART_MB]   # .gpu/smollm2/part-0, part-1, ... (default 51 MiB each)
#   there:  scripts/gpu-smollm2.sh stash            # with each part but the last: keeps it in $STASH
#           scripts/gpu-smollm2.sh run              # with the last: assembles, runs on cuda, results in $OUT
#
# Each call carries one part and the SHA256SUMS beside it (the paths .gpu/smollm2/part-N and
# .gpu/smollm2/SHA256SUMS), on one machine kept between the calls. A call carries 64 MiB in
# all, the checkout (about 8 MB) included: hence parts of 51 MiB (the build and the model
# come to about 101 MiB xz'd, two parts).
#
# pack builds maporl with `--features cuda` (scripts/cuda-env.sh: CUDA 13.0 from PyPI, stub
# libraries; MAPORL_GPU_BIN=PATH takes a CUDA build made before instead), strips it, adds the
# GGUF (MODEL, default scripts/fetch-smollm2.sh's), and splits the xz'd tar into parts with a
# SHA256SUMS file that travels with each. The CUDA build replaces target/release/maporl, so pack
# builds the CPU binary again at its end.
# run checks every part against SHA256SUMS (naming a missing or damaged one), unpacks, finds the
# CUDA libraries (scripts/gpu-libs.sh), and runs scripts/smollm2-fair.sh with DEVICE=cuda (its
# TRAIN_SECONDS, EVAL_SECONDS, ... pass through; STOP_GRACE 60 s) under TOTAL_SECONDS (default
# 540). Into $OUT (or ./gpu-smollm2): run.tar.gz (logs, metrics, transcripts, the paired
# table; no checkpoints) and agent-N.tar.gz (the evaluated checkpoint's adapters, without
# optimizer state). Environment: STASH (default /tmp/maporl-gpu-stash), RUN_DIR (where the run is kept
# there, default /tmp/maporl-smollm2), DEVICE (cuda; cpu to try the whole path here), PARTS
# (the parts' folder in the checkout, default .gpu/smollm2).
set -uo pipefail
cd "$(dirname "$0")/.."
parts=${PARTS:-.gpu/smollm2}
STASH=${STASH:-/tmp/maporl-gpu-stash}
die() {
    echo "gpu-smollm2: $*" >&2
    exit 1
}

case ${1:-} in
pack)
    set -e
    part_mb=${2:-51}
    model=${MODEL:-$HOME/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf}
    [ -f "$model" ] || die "no model at $model (scripts/fetch-smollm2.sh fetches it)"
    target=${CARGO_TARGET_DIR:-target}
    stage=$target/gpu-smollm2
    rm -rf "$stage" && mkdir -p "$stage"
    if [ -n "${MAPORL_GPU_BIN:-}" ]; then
        cp "$MAPORL_GPU_BIN" "$stage/maporl"
        built="$MAPORL_GPU_BIN"
    else
        source scripts/cuda-env.sh
        cargo build --release -p maporl --lib --features cuda
        cuda_stubs "$target"
        cargo build --release -p maporl --features cuda --bin maporl
        cp "$target/release/maporl" "$stage/maporl"
        built="$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo '+changes'), cuda $cuda_version, compute capability $CUDA_COMPUTE_CAP"
        # Back to the CPU build for this machine.
        (unset CUDA_ROOT CUDA_PATH CUDA_HOME NVCC_PREPEND_FLAGS CUDARC_CUDA_VERSION LIBRARY_PATH
            cargo build --release -p maporl)
    fi
    strip --strip-all "$stage/maporl"
    cp "$model" "$stage/model.gguf"
    echo "built $(date -u +%FT%TZ): $built; model $(basename "$model")" >"$stage/BUILD"
    rm -rf "$parts" && mkdir -p "$parts"
    tar -C "$stage" -cf - . | xz -T0 -6 | split -b "${part_mb}M" -d -a 1 - "$parts/part-"
    (cd "$parts" && sha256sum part-* >SHA256SUMS)
    ls -l "$parts"
    echo "gpu-smollm2: $(ls "$parts"/part-* | wc -l) parts; carry each in its own call (stash), the last with run"
    ;;
stash)
    [ -f "$parts/SHA256SUMS" ] || die "no $parts/SHA256SUMS here: carry $parts"
    mkdir -p "$STASH"
    cp "$parts"/part-* "$parts/SHA256SUMS" "$STASH"/
    ls -l "$STASH"
    ;;
run)
    [ -f "$parts/SHA256SUMS" ] || die "no $parts/SHA256SUMS here: carry $parts"
    mkdir -p "$STASH"
    cp "$parts"/part-* "$parts/SHA256SUMS" "$STASH"/ 2>/dev/null
    missing=$(cd "$STASH" && for p in $(awk '{print $2}' SHA256SUMS); do [ -f "$p" ] || echo -n " $p"; done)
    [ -z "$missing" ] || die "missing in $STASH:$missing (run 'stash' in a call that carries each of them first)"
    (cd "$STASH" && sha256sum --quiet -c SHA256SUMS >&2) || die "a part in $STASH is damaged (see above): carry it again"
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    cat "$STASH"/part-* | xz -dc | tar -C "$dir" -x || die "cannot unpack the parts in $STASH"
    echo "gpu-smollm2: $(cat "$dir/BUILD")"
    source scripts/gpu-libs.sh
    gpu_libs "$dir/lib" "$dir/maporl" || exit 1
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    out=${OUT:-gpu-smollm2}
    run=${RUN_DIR:-/tmp/maporl-smollm2}
    mkdir -p "$out"
    BIN=$dir/maporl MODEL=$dir/model.gguf DEVICE=${DEVICE:-cuda} STOP_GRACE=${STOP_GRACE:-60} \
        timeout -k 10 "${TOTAL_SECONDS:-540}" scripts/smollm2-fair.sh "$run"
    echo "gpu-smollm2: smollm2-fair exit $?"
    tar -czf "$out/run.tar.gz" --exclude=checkpoints -C "$run" .
    last=$(cut -d' ' -f1 "$run/evaluated.txt" 2>/dev/null)
    if [ -n "$last" ]; then
        for a in "$last"/agent-*; do
            tar -czf "$out/${a##*/}.tar.gz" --exclude=optimizer.safetensors -C "$last" "${a##*/}"
        done
    fi
    ls -l "$out"
    ;;
*)
    echo "usage: scripts/gpu-smollm2.sh pack [PART_MB] | stash | run" >&2
    exit 2
    ;;
esac
