#!/usr/bin/env bash
# SmolLM2-135M-Instruct in the fair design (issue 21, RESULTS.md "SmolLM2-135M-Instruct, turn 1
# frozen"): three agents on the seeded arithmetic task, turn 1 frozen (adapter_from_turn = 2),
# MAPoRL (rule verifier, influence shaper) for a wall-clock budget, then the untrained team and
# the trained one evaluated on the same held-out questions with paired draws, in chunks, the
# two alternately, until the evaluation's budget is spent: both always cover the same
# questions, as many as fit.
#
#   DEVICE=cuda TRAIN_SECONDS=240 EVAL_SECONDS=270 scripts/smollm2-fair.sh OUTDIR
#   maporl compare OUTDIR/before.jsonl OUTDIR/after.jsonl    # the paired table (also in OUTDIR)
#
# The training questions come after the held-out ones (data.offset = HELD_OUT); a checkpoint
# is written after every step and the last one is evaluated, so TRAIN_SECONDS decides how many
# steps fit (`train.steps = N` with the same seed repeats a run of N steps). The training is
# stopped with SIGINT (a clean stop, after the step in progress; killed if that step takes
# over STOP_GRACE seconds more, its checkpoint the one before). Run again on the same OUTDIR,
# the script resumes: the training goes on from its last checkpoint (`maporl train --resume`,
# exact), the untrained team's chunks already evaluated are kept, and the trained team is
# evaluated again if its adapters changed (its chunks are named after the adapters' hash).
# Resume on the same kind of device: before and after are paired only on the same numerics.
# ROW chooses what is trained: maporl (default: the paper's debate, the influence reward), or
# peers-hidden (the same RL with no peer shown, `plugins.protocol.settings={peers=0}`, each
# answer rewarded for its own correctness, horizon = "current"; its untrained and trained
# teams are evaluated with peers hidden too). Each row's OUTDIR holds its own untrained team.
# An arithmetic family small enough to enumerate (DIFFICULTY 5-7) trains on the questions
# after the held-out ones, cycling through them when the steps ask for more.
# Environment: BIN (maporl), MODEL (the GGUF; scripts/fetch-smollm2.sh), DEVICE (cpu, cuda),
# SEED (0), TRAIN_SECONDS (240; 0 evaluates the last checkpoint without training more),
# STOP_GRACE (600), EVAL_SECONDS (270), STEPS (at most, 64), BATCH (questions a step, 16),
# CHUNK (held-out questions an evaluation call, 100), HELD_OUT (at most, 1000),
# MAX_NEW_TOKENS (96), DIFFICULTY (1: a + b).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/smollm2-fair.sh OUTDIR}
BIN=${BIN:-target/release/maporl}
MODEL=${MODEL:-~/.cache/maporl/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DEVICE=${DEVICE:-cpu}
SEED=${SEED:-0}
TRAIN_SECONDS=${TRAIN_SECONDS:-240}
STOP_GRACE=${STOP_GRACE:-600}
EVAL_SECONDS=${EVAL_SECONDS:-270}
STEPS=${STEPS:-64}
BATCH=${BATCH:-16}
CHUNK=${CHUNK:-100}
HELD_OUT=${HELD_OUT:-1000}
MAX_NEW_TOKENS=${MAX_NEW_TOKENS:-96}
DIFFICULTY=${DIFFICULTY:-1}
ROW=${ROW:-maporl}
start=$(date +%s)
log() { echo "smollm2-fair [$(($(date +%s) - start))s]: $*"; }
mkdir -p "$out"

# The design, shared by the training and both evaluations (configs/smollm2-arith.toml's model,
# verifier, shaper, temperature and PPO settings otherwise).
common=(--config configs/smollm2-arith.toml --set "device=$DEVICE" --set "model.path=$MODEL"
    --set "seed=$SEED" --set data.seed=0 --set "data.difficulty=$DIFFICULTY"
    --set debate.agents=3 --set debate.turns=3 --set train.adapter_from_turn=2
    --set "generation.max_new_tokens=$MAX_NEW_TOKENS")

train_row=()
case $ROW in
maporl) ;;
peers-hidden)
    common+=(--set 'plugins.protocol.settings={peers=0}')
    train_row=(--set 'plugins.shaper.settings={gamma=0.3,horizon="current"}')
    ;;
*)
    echo "smollm2-fair: unknown ROW=$ROW (maporl, peers-hidden)" >&2
    exit 2
    ;;
esac
# The training questions: after the held-out ones; an enumerated family holds only so many.
train_count=$((STEPS * BATCH))
case $DIFFICULTY in
5) family_size=810 ;;
6) family_size=361 ;;
7) family_size=729 ;;
*) family_size=0 ;;
esac
if [ "$family_size" -gt 0 ] && [ $((HELD_OUT + train_count)) -gt "$family_size" ]; then
    train_count=$((family_size - HELD_OUT))
fi

resume=()
[ -d "$out/train/checkpoints" ] && resume=(--resume)
log "train: up to $STEPS steps of $BATCH questions, at most ${TRAIN_SECONDS}s, on $DEVICE ${resume[*]}"
[ -d "$out/train/checkpoints/final" ] || [ "$TRAIN_SECONDS" -eq 0 ] ||
    timeout -s INT -k "$STOP_GRACE" "$TRAIN_SECONDS" "$BIN" train "${resume[@]}" "${common[@]}" \
    "${train_row[@]}" --set "data.offset=$HELD_OUT" --set "data.count=$train_count" --set data.held_out=0 \
    --set "debate.batch_size=$BATCH" --set "train.steps=$STEPS" --set train.checkpoint_every=1 \
    --set train.keep_checkpoints=2 --set train.kl_coef=0.02 \
    --set train.ppo.minibatches=2 --set train.ppo.grad_accum=4 \
    --set "run_dir=$out/train" >>"$out/train.log" 2>&1
log "train stopped (exit $?): $(grep -c '"step"' "$out/train/metrics.jsonl" 2>/dev/null || echo 0) steps in metrics"
last=$(ls -d "$out"/train/checkpoints/step-* 2>/dev/null | sort | tail -1)
[ -d "$out/train/checkpoints/final" ] && last=$out/train/checkpoints/final
if [ -z "$last" ]; then
    tail -30 "$out/train.log"
    log "no checkpoint: nothing to evaluate"
    exit 1
fi
tag=$(cat "$last"/agent-*/adapter_model.safetensors | sha256sum | cut -c1-12)
log "evaluating $last (adapters $tag) against the untrained team"
echo "$last $tag" >"$out/evaluated.txt"
team=""
for a in 0 1 2; do team+="{model=\"$MODEL\",adapter=\"$last/agent-$a\"},"; done

# Before and after, chunk by chunk, on the same questions; the budget is checked before each
# chunk, so the last pair may overrun it by one chunk's time.
eval_deadline=$(($(date +%s) + EVAL_SECONDS))
: >"$out/before.jsonl"
: >"$out/after.jsonl"
for ((offset = 0; offset < HELD_OUT; offset += CHUNK)); do
    [ "$(date +%s)" -lt "$eval_deadline" ] || break
    ok=1
    for side in before after; do
        dir=$out/eval-$side-$offset
        [ $side = after ] && dir=$out/eval-after-$tag-$offset
        [ -f "$dir/eval.json" ] && continue
        rm -rf "$dir"
        agents=()
        [ $side = after ] && agents=(--set "agents=[${team%,}]")
        "$BIN" eval "${common[@]}" --set "data.offset=$offset" --set "data.count=$CHUNK" \
            --set data.held_out=0 --set "debate.batch_size=$CHUNK" "${agents[@]}" \
            --set "run_dir=$dir" >"$dir.log" 2>&1 || {
            tail -20 "$dir.log"
            ok=0
            break
        }
    done
    [ $ok = 1 ] || break
    cat "$out/eval-before-$offset/transcripts.jsonl" >>"$out/before.jsonl"
    cat "$out/eval-after-$tag-$offset/transcripts.jsonl" >>"$out/after.jsonl"
    log "held-out questions $offset..$((offset + CHUNK)) done"
done
"$BIN" compare "$out/before.jsonl" "$out/after.jsonl" | tee "$out/compare.txt"
"$BIN" compare --json "$out/before.jsonl" "$out/after.jsonl" >"$out/compare.json"
log "done"
