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
MODES=${MODES:-"maporl single sft"}
OUT=${OUT:-runs/results}
cargo xtask plugins
cargo build --release -p maporl
BIN=target/release/maporl
CONFIG=configs/quickstart.toml
mkdir -p "$OUT"
"$BIN" warm-start --config "$CONFIG"
for seed in $SEEDS; do
    for mode in $MODES; do
        dir="$OUT/$mode-seed$seed"
        if [ -f "$dir/eval-after.json" ]; then
            echo "results: $dir is done"
            continue
        fi
        rm -rf "$dir" # an unfinished run
        echo "results: $mode, seed $seed"
        "$BIN" train --config "$CONFIG" --set "seed=$seed" --set "train.mode=$mode" \
            --set "run_dir=$dir" > "$dir.log" 2>&1 || { tail -20 "$dir.log"; exit 1; }
    done
done
python3 scripts/results_table.py "$OUT"
