#!/usr/bin/env bash
# The fair test of the paper's claim (RESULTS.md, configs/fair.toml): every row over every
# seed, trained on the 512 training questions and evaluated on the 1,000 held-out ones with
# paired draws, so that rows at one seed differ only by their weights.
#   scripts/fair.sh                       # every row, SEEDS (default 0 1 2 3 4)
#   SEEDS="0" scripts/fair.sh maporl      # one row, one seed
#   python3 scripts/fair_table.py         # the tables, from the kept summaries
# Rows: off-the-shelf (the untrained team), single (agent 0 learns), sft, maporl (rule
# verifier, influence shaper), maporl-current (no influence term: horizon = "current"),
# maporl-alpha (alpha_1 = 2), maporl-beta (beta_0 = 2, the paper's sign), maporl-beta-code
# (beta_0 = 2, the released code's sign), maporl-learned (the learned verifier, trained on
# every turn's answers, scores every answer), heterogeneous-before and heterogeneous (agents
# 0 and 2 on the fair model, agent 1 on a second warm-started architecture), cross-domain-before
# and cross-domain (a model warm-started on addition and subtraction, MAPoRL-trained on
# addition, both evaluated on subtraction: the paper's GSM8K -> ANLI transfer in miniature);
# the other direction, cross-domain-reverse-before and cross-domain-reverse (trained on
# subtraction, evaluated on addition); and each direction's adapters on their own family,
# cross-domain-same and cross-domain-reverse-same (no training of their own: they evaluate
# the cross-domain or cross-domain-reverse run of the same seed, which must exist).
# MODEL_X and X_WARM (the two-family model's directory and its warm-start settings beyond
# the fair model's) choose another two-family model, e.g. a stronger one:
#   MODEL_X=runs/fair-model-x2 X_WARM="warm_start.families=[1,4] warm_start.steps=3000
#   warm_start.tasks=4000 warm_start.drills=12000" OUT=runs/fair-x2 KEPT=results/fair-x2 ...
# `curve` evaluates the maporl row's kept checkpoints (every 8 steps) on the first
# CURVE_QUESTIONS (default 300) held-out questions, to see where training flattens.
# maporl-long is the maporl row at four times the budget (128 steps, the learning rate
# decayed over 128, a checkpoint every 16, all kept); `curve-long` evaluates its checkpoints.
# maporl-current-long is maporl-current at that budget (the ablation where the curve is flat).
# The controls (issue 47), outside the default set: off-the-shelf-hidden (the untrained team
# with peers hidden: `plugins.protocol.settings={peers=0}`); peers-hidden (the same RL with
# peers hidden, each answer rewarded for its own correctness, evaluated with peers hidden)
# and peers-hidden-shown (its adapters evaluated with peers shown); the same three with
# `echo` instead, the debate's format with no peer information (off-the-shelf-echo,
# peers-echo, peers-echo-shown: the tiny model never saw a prompt without peers, and with
# peers hidden its untrained team falls from 0.73 to 0.03 at turn 2); single-all (single's
# adapter, agent 0's, on all three agents: the single row's run is trained first if this
# checkout has none); vote-6 and vote-9 (evaluation only: one turn, 6 or 9 agents, the
# majority of independent turn-1 answers: the compute of a 3-agent debate of 2 or 3 turns);
# sft-matched (SFT at MAPoRL's budget: 512 debates kept, the best 10% of 5,120; 128
# optimizer steps; lr 2e-4); maporl-t1 and maporl-current-t1 (turn 1 trained too:
# adapter_from_turn = 1, with and without the influence term); drift-free-before and
# drift-free (the untrained and the MAPoRL team on a model warm-started longer, MODEL_D with
# D_WARM, so that the untrained model drifts less from its teachers); drift-free-echo-shown
# (peers-echo's RL on that model, evaluated with peers shown: MAPoRL's control there).
# maporl-grpo (issue 51): MAPoRL with GRPO instead of PPO (train.algorithm = "grpo", groups of
# 4 debates of a question, so 4 questions a step of 16 debates; no value head).
# ADD_AGENTS=1 runs again the rows whose kept summary has no per-agent record (`agents`),
# checks that the new evaluation gives the kept credits exactly, and adds the record.
# REEVAL=1 evaluates again the rows whose run is still under $OUT (its final checkpoint), with
# no training, and replaces their kept summaries: for a fix to a row's evaluation settings.
# Each run is `maporl train` (with the held-out questions left out by data.offset, and no
# evaluation of its own) and then `maporl eval` of its final adapters, whose summary is kept
# in results/fair/ROW-seedS.json (committed; the run itself stays under runs/fair), with the
# warm-started models and the learned verifier in results/fair/models. Rows
# with a summary are skipped, so the script can be rerun, in any checkout, to add seeds. Two
# instances may run at once on different rows or seeds once the models are made
# (`scripts/fair.sh setup`).
# Every run uses one build, pinned at FAIR_COMMIT: a later build whose kernels only round
# differently samples different text, and rows at one seed would no longer differ only by
# their weights. The script builds that commit in a worktree under .cache (BIN=... runs
# another binary; the summaries record which, and the tables refuse to mix builds). The
# configs, plugins and scripts it uses are the checkout's; they are unchanged since
# FAIR_COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-"0 1 2 3 4"}
ALL="off-the-shelf maporl maporl-current single sft maporl-alpha maporl-beta maporl-beta-code maporl-learned heterogeneous-before heterogeneous cross-domain-before cross-domain"
ROWS=${*:-$ALL}
OUT=${OUT:-runs/fair}
KEPT=${KEPT:-results/fair}
FAIR_COMMIT=${FAIR_COMMIT:-3bc3ac0}
CONFIG=configs/fair.toml
MODEL=runs/fair-model
MODEL_B=runs/fair-model-b
MODEL_X=${MODEL_X:-runs/fair-model-x}
MODEL_D=${MODEL_D:-runs/fair-model-d}
D_WARM=${D_WARM:-"warm_start.steps=6000"}
X_WARM=${X_WARM:-"warm_start.families=[1,4]"}
VERIFIER="$OUT/verifier/checkpoints/final"
if [ -z "${FAIR_NO_BUILD:-}" ]; then
    cargo xtask plugins
fi
if [ -z "${BIN:-}" ]; then
    src=.cache/fair-$FAIR_COMMIT
    [ -d "$src" ] || git worktree add --detach "$src" "$FAIR_COMMIT"
    (cd "$src" && cargo build --release -p maporl)
    BIN=$src/target/release/maporl
fi
BUILD=${FAIR_BUILD:-$FAIR_COMMIT}
mkdir -p "$OUT"

# The warm-started models are kept too (results/fair/models, committed): on another CPU the
# same warm start rounds differently and makes another model. A kept model is copied in
# first (the warm start then finds it made); a model made here is kept.
warm_start() {
    local model=$1 kept_model="$KEPT/models/${1##*/}"
    shift
    if [ -d "$kept_model" ]; then
        if [ ! -d "$model" ]; then
            mkdir -p "$(dirname "$model")"
            cp -r "$kept_model" "$model"
        elif ! cmp -s "$model/model.safetensors" "$kept_model/model.safetensors"; then
            echo "fair: $model differs from the kept $kept_model (the kept runs used that one): move $model aside" >&2
            exit 1
        fi
    fi
    "$BIN" warm-start --config "$CONFIG" --set "model.path=$model" "$@"
    if [ ! -d "$kept_model" ]; then
        mkdir -p "$KEPT/models"
        cp -r "$model" "$kept_model"
    fi
}
# The models: the fair team's, and a second architecture for the heterogeneous team (4
# layers, 48 wide: the same teachers, tokenizer budget and steps).
for row in $ROWS; do
    # Only the cross-domain rows do without the fair team's model.
    if [[ $row != cross-domain* ]]; then
        warm_start "$MODEL"
        break
    fi
done
if [[ " $ROWS " == *" heterogeneous"* || " $ROWS " == *" setup "* ]]; then
    warm_start "$MODEL_B" --set warm_start.hidden_size=48 --set warm_start.intermediate_size=192 \
        --set warm_start.layers=4
fi
if [[ " $ROWS " == *" cross-domain"* || " $ROWS " == *" setup "* ]]; then
    x_settings=()
    for setting in $X_WARM; do
        x_settings+=(--set "$setting")
    done
    warm_start "$MODEL_X" "${x_settings[@]}"
fi
if [[ " $ROWS " == *" drift-free"* || " $ROWS " == *" setup "* ]]; then
    d_settings=()
    for setting in $D_WARM; do
        d_settings+=(--set "$setting")
    done
    warm_start "$MODEL_D" "${d_settings[@]}"
fi
# The learned verifier: the untrained team's answers at every turn of the training
# questions, labelled by the rule verifier; LoRA + a head (settings as in scripts/results.sh).
# Kept like the models (its final checkpoint).
if [[ " $ROWS " == *" maporl-learned "* || " $ROWS " == *" setup "* ]] && [ ! -d "$VERIFIER" ]; then
    if [ -d "$KEPT/models/verifier" ]; then
        mkdir -p "$(dirname "$VERIFIER")"
        cp -r "$KEPT/models/verifier" "$VERIFIER"
    else
        "$BIN" verifier generate --config "$CONFIG" --out "$OUT/verifier-answers.jsonl"
        rm -rf "$OUT/verifier"
        "$BIN" verifier train --config "$CONFIG" --data "$OUT/verifier-answers.jsonl" \
            --out "$OUT/verifier" --set verifier.train.lr=2e-3 --set verifier.train.epochs=4 \
            --set verifier.train.loss=last-token
        mkdir -p "$KEPT/models"
        cp -r "$VERIFIER" "$KEPT/models/verifier"
    fi
fi

# The models row $1's team is made of.
models_of() {
    case $1 in
    heterogeneous*) echo "$MODEL $MODEL_B" ;;
    cross-domain*) echo "$MODEL_X" ;;
    drift-free*) echo "$MODEL_D" ;;
    *) echo "$MODEL" ;;
    esac
}

HETERO="agents=[{model=\"$MODEL\"},{model=\"$MODEL_B\"},{model=\"$MODEL\"}]"
# The ablation of Definition 1: each answer rewarded for its own correctness only.
CURRENT='plugins.shaper.settings={gamma=0.3,horizon="current"}'
# The debate with no peer shown: each agent sees only its own earlier answers.
HIDDEN='plugins.protocol.settings={peers=0}'
# The debate's own format with no peer information: each answer shown as a peer's is the
# agent's own (the debate protocol's `echo`, in the checkout's build of it: the pinned
# build's built-in protocol predates the setting).
# The component is copied into $OUT once, so that every seed's run uses the same bytes
# whatever is built later (its sha256 is in each run's plugins.lock).
ECHO=(--set "plugins.protocol.path=$PWD/$OUT/debate-echo.wasm"
    --set 'plugins.protocol.settings={echo=true}')
if [[ " $ROWS " == *"-echo"* ]] && [ ! -f "$OUT/debate-echo.wasm" ]; then
    cp plugins/target/wasm32-wasip2/release/debate.wasm "$OUT/debate-echo.wasm"
fi
# The team for `maporl eval` of row $1: each agent's model and, when checkpoint $2 holds
# one for it, its adapter (single-all: agent 0's adapter for every agent; vote-N: N agents).
team() {
    local row=$1 checkpoint=$2 models=("$MODEL" "$MODEL" "$MODEL") list="" a adapter
    [[ $row == heterogeneous* ]] && models=("$MODEL" "$MODEL_B" "$MODEL")
    [[ $row == cross-domain* ]] && models=("$MODEL_X" "$MODEL_X" "$MODEL_X")
    [[ $row == drift-free* ]] && models=("$MODEL_D" "$MODEL_D" "$MODEL_D")
    [[ $row == vote-* ]] && for ((a = 3; a < ${row#vote-}; a++)); do models+=("$MODEL"); done
    for a in "${!models[@]}"; do
        list+="{model=\"${models[$a]}\""
        adapter=$checkpoint/agent-$a
        [ "$row" = single-all ] && adapter=$checkpoint/agent-0
        [ -n "$checkpoint" ] && [ -d "$adapter" ] && list+=",adapter=\"$adapter\""
        list+="},"
    done
    echo "agents=[${list%,}]"
}

for seed in $SEEDS; do
    for row in $ROWS; do
        [ "$row" = setup ] && continue
        if [ "$row" = curve ] || [ "$row" = curve-long ]; then
            n=${CURVE_QUESTIONS:-300}
            trained=maporl curve=curve
            [ "$row" = curve-long ] && trained=maporl-long curve=curve-long
            mkdir -p "$OUT/$curve-seed$seed"
            for step in "" "$OUT/$trained-seed$seed"/train/checkpoints/step-*; do
                name=${step##*/}
                name=${name:-step-000000}
                dir="$OUT/$curve-seed$seed/$name"
                kept="$KEPT/$curve-seed$seed-$name.json"
                [ -f "$kept" ] && continue
                "$BIN" eval --config "$CONFIG" --set "seed=$seed" --set "data.held_out=$n" \
                    --set "$(team maporl "$step")" --set "run_dir=$dir" >"$dir.log" 2>&1 || {
                    tail -20 "$dir.log"
                    exit 1
                }
                python3 scripts/fair_table.py keep-curve "$dir" "$kept" "$BUILD" $(models_of maporl)
                echo "fair: $curve, seed $seed, $name: $(grep 'majority accuracy' "$dir.log")"
            done
            continue
        fi
        dir="$OUT/$row-seed$seed"
        kept="$KEPT/$row-seed$seed.json"
        adding="" reeval=""
        if [ -n "${REEVAL:-}" ] && [ -d "$dir/train/checkpoints/final" ]; then
            reeval=1
        elif [ -f "$kept" ]; then
            if [ -n "${ADD_AGENTS:-}" ] && ! grep -q '"agents"' "$kept"; then
                adding=1
            else
                echo "fair: $kept is done"
                continue
            fi
        fi
        echo "fair: $row, seed $seed ($(date +%T))${reeval:+, evaluated again}"
        if [ -n "$reeval" ]; then
            rm -rf "$dir/eval" "$kept"
        else
            rm -rf "$dir"
            mkdir -p "$dir"
        fi
        settings=() eval_settings=() count=512
        case $row in
        off-the-shelf) ;;
        off-the-shelf-hidden) eval_settings=(--set "$HIDDEN") ;;
        peers-hidden)
            settings=(--set "$HIDDEN" --set "$CURRENT")
            eval_settings=(--set "$HIDDEN")
            ;;
        peers-hidden-shown | single-all) ;;
        vote-6 | vote-9)
            eval_settings=(--set "debate.agents=${row#vote-}" --set debate.turns=1
                --set train.adapter_from_turn=1)
            ;;
        off-the-shelf-echo) eval_settings=("${ECHO[@]}") ;;
        peers-echo)
            settings=("${ECHO[@]}" --set "$CURRENT")
            eval_settings=("${ECHO[@]}")
            ;;
        peers-echo-shown) ;;
        sft-matched)
            settings=(--set train.mode=sft --set train.sft.top_fraction=0.1 --set train.sft.epochs=2
                --set train.sft.batch_size=16 --set train.sft.lr=2e-4)
            count=5120
            ;;
        # Turn 1 trained, and evaluated with its adapter (the evaluation reads the same key).
        maporl-t1)
            settings=(--set train.adapter_from_turn=1)
            eval_settings=(--set train.adapter_from_turn=1)
            ;;
        maporl-current-t1)
            settings=(--set train.adapter_from_turn=1 --set "$CURRENT")
            eval_settings=(--set train.adapter_from_turn=1)
            ;;
        drift-free-before) ;;
        drift-free) settings=(--set "model.path=$MODEL_D") ;;
        drift-free-echo-shown) settings=("${ECHO[@]}" --set "$CURRENT" --set "model.path=$MODEL_D") ;;
        heterogeneous-before) ;;
        maporl) settings=(--set train.mode=maporl) ;;
        maporl-long | maporl-current-long)
            settings=(--set train.mode=maporl --set train.steps=128 --set train.checkpoint_every=16
                --set train.keep_checkpoints=0)
            [ "$row" = maporl-current-long ] &&
                settings+=(--set "$CURRENT")
            ;;
        single | sft) settings=(--set "train.mode=$row") ;;
        maporl-current) settings=(--set "$CURRENT") ;;
        maporl-alpha) settings=(--set 'plugins.shaper.settings={gamma=0.3,alpha_1=2.0}') ;;
        maporl-grpo) settings=(--set train.algorithm=grpo) ;;
        maporl-beta) settings=(--set 'plugins.shaper.settings={gamma=0.3,beta_0=2.0}') ;;
        maporl-beta-code) settings=(--set 'plugins.shaper.settings={gamma=0.3,beta_0=2.0,beta_sign="code"}') ;;
        maporl-learned)
            settings=(--set plugins.verifier.path=learned.wasm --set 'plugins.verifier.settings={}'
                --set "verifier.checkpoint=$VERIFIER")
            ;;
        heterogeneous) settings=(--set "$HETERO") ;;
        cross-domain-before | cross-domain-reverse-before) ;;
        cross-domain) settings=(--set "model.path=$MODEL_X") ;;
        cross-domain-reverse) settings=(--set "model.path=$MODEL_X" --set data.difficulty=4) ;;
        cross-domain-same | cross-domain-reverse-same) ;;
        *)
            echo "fair: unknown row $row (rows: $ALL maporl-long maporl-current-long curve curve-long" \
                "cross-domain-reverse-before cross-domain-reverse cross-domain-same" \
                "cross-domain-reverse-same off-the-shelf-hidden peers-hidden peers-hidden-shown" \
                "off-the-shelf-echo peers-echo peers-echo-shown" \
                "single-all vote-6 vote-9 sft-matched maporl-t1 maporl-current-t1" \
                "drift-free-before drift-free drift-free-echo-shown maporl-grpo)" >&2
            exit 2
            ;;
        esac
        run=""
        if [[ $row == cross-domain*-same || $row == peers-*-shown ]]; then
            trained=${row%-same}
            [[ $row == peers-*-shown ]] && trained=${row%-shown}
            run="$OUT/$trained-seed$seed/train"
            [ -d "$run/checkpoints/final" ] || {
                echo "fair: $row evaluates $run, which has no final checkpoint: run $trained first" >&2
                exit 1
            }
        elif [ "$row" = single-all ]; then
            # The single row's run, trained here when this checkout has none (the same
            # command as the single row's).
            run="$OUT/single-seed$seed/train"
            if [ ! -d "$run/checkpoints/final" ]; then
                rm -rf "$run"
                mkdir -p "$OUT/single-seed$seed"
                "$BIN" train --config "$CONFIG" --set "seed=$seed" --set train.mode=single \
                    --set data.offset=1000 --set data.count=512 --set data.held_out=0 \
                    --set "run_dir=$run" >"$OUT/single-seed$seed/train.log" 2>&1 || {
                    tail -20 "$OUT/single-seed$seed/train.log"
                    exit 1
                }
            fi
        elif [ -n "$reeval" ]; then
            run="$dir/train"
        elif [[ $row != *-before && $row != off-the-shelf* && $row != vote-* ]]; then
            run="$dir/train"
            # The held-out questions are data's first 1,000: training starts after them.
            "$BIN" train --config "$CONFIG" --set "seed=$seed" "${settings[@]}" \
                --set data.offset=1000 --set "data.count=$count" --set data.held_out=0 \
                --set "run_dir=$run" >"$dir/train.log" 2>&1 || {
                tail -20 "$dir/train.log"
                exit 1
            }
        fi
        # The evaluation runs the rule verifier whatever the row trained with: accuracy is
        # the ground truth's. The cross-domain rows are evaluated on the other family than
        # they trained on (subtraction, 4, for cross-domain; addition, 1, for
        # cross-domain-reverse), the -same rows on their own.
        family=1
        case $row in
        cross-domain | cross-domain-before | cross-domain-reverse-same) family=4 ;;
        esac
        "$BIN" eval --config "$CONFIG" --set "seed=$seed" --set "data.difficulty=$family" \
            "${eval_settings[@]}" --set "$(team "$row" "${run:+$run/checkpoints/final}")" \
            --set "run_dir=$dir/eval" >"$dir/eval.log" 2>&1 || {
            tail -20 "$dir/eval.log"
            exit 1
        }
        if [ -n "$adding" ]; then
            python3 scripts/fair_table.py add-agents "$dir/eval" "$kept"
        else
            python3 scripts/fair_table.py keep "$dir/eval" "$kept" "$BUILD" $(models_of "$row")
        fi
        tail -14 "$dir/eval.log" | head -12
    done
done
