#!/usr/bin/env bash
# Resident memory of a team on one base (issue 19): `maporl train` for one step on
# SmolLM2-135M with 1, 2 and 3 agents, each a learner with its own LoRA adapter (r 8 on every
# projection), value head and AdamW state over the one shared frozen base, on a batch so small
# (one question, one turn, 8 new tokens) that activations do not hide the team's own memory.
# Prints each run's peak RSS (GNU time) and its ratio to one agent's.
#
#   scripts/bench-team-memory.sh            # AGENTS="1 2 3"
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
command -v /usr/bin/time >/dev/null || { echo "needs GNU time: apt-get install -y time" >&2; exit 1; }
bash scripts/fetch-smollm2.sh >/dev/null
cargo build --release -q -p maporl
cargo build --release -q --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir plugins/target
OUT="$(mktemp -d /tmp/maporl-team-memory.XXXXXX)"
echo "machine: $(nproc --all) cores, $(free -g | awk '/^Mem:/{print $2}') GiB, $(date -u +%F)"
echo "| agents | peak RSS (MiB) | vs one agent |"
echo "|---|---|---|"
one=""
for n in ${AGENTS:-1 2 3}; do
    MAPORL_PLUGINS="$ROOT/plugins/target/wasm32-wasip2/release" \
        /usr/bin/time -v -o "$OUT/time-$n.txt" target/release/maporl train \
        --config configs/smollm2-arith.toml --set run_dir="$OUT/run-$n" --set train.steps=1 \
        --set data.count=1 --set debate.batch_size=1 --set debate.agents="$n" \
        --set debate.turns=1 --set generation.max_new_tokens=8 >"$OUT/log-$n.txt" 2>&1
    kb="$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$OUT/time-$n.txt")"
    mib=$((kb / 1024))
    one="${one:-$mib}"
    echo "| $n | $mib | $(python3 -c "print(f'{$mib / $one:.3f}x')") |"
done
echo "raw: $OUT"
