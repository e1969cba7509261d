#!/usr/bin/env bash
# Rollout throughput of the debate engine on SmolLM2-135M (issue 4's benchmark): two agents,
# three turns, the reference debate protocol, gsm8k verifier and influence shaper, 8 seeded
# arithmetic questions, up to 96 new tokens. Prints eval's table and its timing line:
# utterances/s, generated tokens/s, and the share of wall time spent inside plugin calls
# (measured in the same run, around every plugin call).
#   scripts/bench-rollout.sh            # THREADS=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
bash scripts/fetch-smollm2.sh >/dev/null
cargo build --release -q -p maporl
cargo build --release -q --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir plugins/target
echo "machine: $(nproc --all) cores, $(lscpu | sed -n 's/^Model name: *//p'), threads $THREADS, $(date -u +%F)"
RAYON_NUM_THREADS="$THREADS" ./target/release/maporl eval --config configs/smollm2-arith.toml \
  --set run_dir="${RUN_DIR:-/tmp/maporl-bench-rollout}" --set data.count=8 \
  --set debate.agents=2 --set debate.turns=3 --set generation.max_new_tokens=96
