#!/usr/bin/env bash
# Reproduces RESULTS.md: the paper's comparison at micro scale, on the quickstart setup
# (configs/quickstart.toml: the warm-started tiny model, 2 agents x 3 turns, 64 held-out
# arithmetic questions, 16 training steps of 16 debates). Every row is trained and evaluated
# with the same seeds and the same budget; "off-the-shelf" is each run's evaluation before
# training. Finished runs are kept and skipped, so the script can be rerun to add seeds.
#   SEEDS="0 1 2" bash scripts/results.sh        # then: python3 scripts/results_table.py runs/results
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2"}
MODES=${MODES:-"maporl single sft maporl-learned"}
OUT=${OUT:-runs/results}
cargo xtask plugins
cargo build --release -p maporl
BIN=target/release/maporl
CONFIG=configs/quickstart.toml
mkdir -p "$OUT"
"$BIN" warm-start --config "$CONFIG"
# The learned verifier (for the maporl-learned row): the tiny model's own answers to the
# training questions, labelled by the rule verifier, then LoRA + a head trained on them. The
# [verifier.train] defaults (lr 1e-4, 2 epochs, all-token loss) are for real models and stay
# at chance here (validation AUC 0.48); these reach about 0.85.
VERIFIER="$OUT/verifier/checkpoints/final"
if [[ " $MODES " == *" maporl-learned "* && ! -d "$VERIFIER" ]]; then
    "$BIN" verifier generate --config "$CONFIG" --out "$OUT/verifier-answers.jsonl"
    rm -rf "$OUT/verifier"
    "$BIN" verifier train --config "$CONFIG" --data "$OUT/verifier-answers.jsonl" \
        --out "$OUT/verifier" --set verifier.train.lr=2e-3 --set verifier.train.epochs=4 \
        --set verifier.train.loss=last-token
fi
for seed in $SEEDS; do
    for mode in $MODES; do
        dir="$OUT/$mode-seed$seed"
        if [ -f "$dir/eval-after.json" ]; then
            echo "results: $dir is done"
            continue
        fi
        rm -rf "$dir" # an unfinished run
        echo "results: $mode, seed $seed"
        if [ "$mode" = maporl-learned ]; then
            # MAPoRL with the learned verifier scoring every answer through `judge`.
            set -- --set train.mode=maporl --set plugins.verifier.path=learned.wasm \
                --set 'plugins.verifier.settings={}' --set "verifier.checkpoint=$VERIFIER"
        else
            set -- --set "train.mode=$mode"
        fi
        "$BIN" train --config "$CONFIG" --set "seed=$seed" "$@" \
            --set "run_dir=$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
    done
done
python3 scripts/results_table.py "$OUT"
