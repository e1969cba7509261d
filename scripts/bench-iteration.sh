#!/usr/bin/env bash
# One MAPoRL iteration (issue 5): `maporl train` for one step on SmolLM2-135M with the CPU
# quickstart (two agents, three turns, 8 arithmetic questions, up to 96 new tokens, LoRA r 8,
# PPO 4 epochs x 8 minibatches). Prints where the time went, from metrics.jsonl:
# generation, plugins, scoring (policy log-probs and values, reference log-probs), optimization
# (forward with gradients, backward, AdamW), with generated and update tokens/s, and the peak
# RSS of the process (GNU time). Then, unless TORCH=0, it replays the same PPO update shapes
# TRL-style in PyTorch (scripts/bench_iteration_torch.py, same weights, same threads) and
# prints the ratio. The PyTorch venv is the one scripts/bench-vs-torch.sh makes, plus peft.
#
#   scripts/bench-iteration.sh              # THREADS=2 TORCH=1
#   TORCH=0 scripts/bench-iteration.sh      # candle only
#   BENCH_SET="--set train.ppo.epochs=1" scripts/bench-iteration.sh   # more --set overrides
#   BASELINE=/path/to/old/maporl scripts/bench-iteration.sh  # the same step with an older
#                                    # build first, then a phase-by-phase ratio (one run)
#   BASELINE_SET="--set generation.prefix_cache_mib=0" scripts/bench-iteration.sh
#                                    # the baseline is today's build (or BASELINE) with these
#                                    # overrides: one feature off against on, in one run
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
THREADS="${THREADS:-2}"
TORCH="${TORCH:-1}"
VENV="${BENCH_VENV:-$HOME/.cache/maporl/bench-venv}"
OUT="${BENCH_OUT:-$(mktemp -d /tmp/maporl-bench-iteration.XXXXXX)}"
mkdir -p "$OUT"
command -v /usr/bin/time >/dev/null || { echo "needs GNU time: apt-get install -y time" >&2; exit 1; }

GGUF="$(bash scripts/fetch-smollm2.sh)"
cargo build --release -q -p maporl --features test-hooks
cargo build --release -q --target wasm32-wasip2 --manifest-path plugins/Cargo.toml --target-dir plugins/target
cp target/release/maporl "$OUT/maporl"  # immune to rebuilds during the run
if [ "$TORCH" = 1 ] && ! "$VENV/bin/python" -c 'import torch, transformers, gguf, peft' 2>/dev/null; then
    echo "installing torch, transformers, gguf, peft into $VENV (several minutes, a few GB)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet torch transformers gguf numpy peft
fi

echo "machine: $(nproc --all) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/^Mem:/{print $2}') GiB, threads $THREADS, $(date -u +%F)"
# One training step with binary $1 into folder $2 (run/, batches.jsonl, time.txt).
one_step() {
    rm -rf "$2/run" "$2/batches.jsonl"
    mkdir -p "$2"
    RAYON_NUM_THREADS="$THREADS" MAPORL_PLUGINS="$ROOT/plugins/target/wasm32-wasip2/release" \
        MAPORL_BENCH_PPO_BATCHES="$2/batches.jsonl" \
        /usr/bin/time -v -o "$2/time.txt" "$1" train --config configs/smollm2-arith.toml \
        --set run_dir="$2/run" --set train.steps=1 --set data.count=8 --set debate.agents=2 \
        --set debate.turns=3 --set generation.max_new_tokens=96 ${BENCH_SET:-}
}
if [ -n "${BASELINE:-}" ] || [ -n "${BASELINE_SET:-}" ]; then
    COMPARE=1
fi
if [ -n "${BASELINE:-}" ]; then
    # A baseline built in this target directory can leave artefacts cargo takes for fresh,
    # so that "now" is the baseline again: build it in a target directory of its own.
    if cmp -s "$BASELINE" "$OUT/maporl"; then
        echo "BASELINE ($BASELINE) is the binary just built; build the baseline with its own CARGO_TARGET_DIR" >&2
        exit 1
    fi
fi
if [ -n "${COMPARE:-}" ]; then
    echo "baseline: ${BASELINE:-this build} ${BASELINE_SET:-}"
    BENCH_SET="${BENCH_SET:-} ${BASELINE_SET:-}" one_step "${BASELINE:-$OUT/maporl}" "$OUT/baseline"
fi
one_step "$OUT/maporl" "$OUT"
RSS_KB="$(sed -n 's/.*Maximum resident set size (kbytes): *//p' "$OUT/time.txt")"

TORCH_JSON=""
if [ "$TORCH" = 1 ]; then
    OMP_NUM_THREADS="$THREADS" MKL_NUM_THREADS="$THREADS" "$VENV/bin/python" \
        scripts/bench_iteration_torch.py --gguf "$GGUF" --batches "$OUT/batches.jsonl" \
        --threads "$THREADS" > "$OUT/torch.json"
    TORCH_JSON="$OUT/torch.json"
fi

python3 - "$OUT/run/metrics.jsonl" "$OUT/batches.jsonl" "$RSS_KB" "$TORCH_JSON" <<'PY'
import json, sys
m = json.loads(open(sys.argv[1]).readline())
batches = [json.loads(l) for l in open(sys.argv[2])]
rss = int(sys.argv[3]) / 1024
total = m["rollout_seconds"] + m["update_seconds"]
gen_tokens = m["generated_tokens_per_second"] * m["generation_seconds"]
upd_tokens = sum(s["tokens"] for s in m["agents"].values())
rows = [
    ("generation", m["generation_seconds"]),
    ("plugins", m["plugin_seconds"]),
    ("rest of the rollout", m["rollout_seconds"] - m["generation_seconds"] - m["plugin_seconds"]),
    ("scoring (policy log-probs + values, reference)", m["score_seconds"]),
    ("optimization: forward with gradients", m["optimize_seconds"] - m["backward_seconds"]),
    ("optimization: backward + AdamW", m["backward_seconds"]),
    ("rest of the update", m["update_seconds"] - m["score_seconds"] - m["optimize_seconds"]),
]
print(f"\none iteration: {total:.1f} s (rollout {m['rollout_seconds']:.1f} s, update {m['update_seconds']:.1f} s)")
# With train.ppo.agents_in_parallel the agents update at the same time: the update's phases
# are summed over agents and overlap, so the shares are of the rollout plus that sum.
phase_sum = m["score_seconds"] + m["optimize_seconds"]
shown = total
if phase_sum > m["update_seconds"]:
    shown = m["rollout_seconds"] + phase_sum
    rows = rows[:6]
    print(f"(the agents updated side by side: scoring and optimization are summed over agents, "
          f"{phase_sum:.1f} s in {m['update_seconds']:.1f} s of update; shares are of "
          f"rollout + that sum, {shown:.1f} s)")
print("| phase | seconds | share |\n|---|---|---|")
for name, s in rows:
    print(f"| {name} | {s:.3f} | {100 * s / shown:.2f}% |")
samples = sum(len(b["response_lens"]) for b in batches)
steps = sum(len(b["optimizer_steps"]) for b in batches)
print(f"\ngenerated tokens: {gen_tokens:.0f}, {m['generated_tokens_per_second']:.1f} tokens/s of generation")
print(f"update: {len(batches)} agents, {samples} samples, {upd_tokens} response tokens, {steps} optimizer steps; "
      f"{m['update_tokens_per_second']:.1f} response tokens/s of update, "
      f"{upd_tokens / m['optimize_seconds']:.1f} of optimization")
print(f"peak RSS (GNU time, whole process): {rss:.0f} MiB")
if sys.argv[4]:
    t = json.loads(open(sys.argv[4]).read())
    # Agents updated side by side: the update's wall time against PyTorch's one by one.
    c_upd = min(m["score_seconds"] + m["optimize_seconds"], m["update_seconds"])
    t_upd = t["score_seconds"] + t["optimize_seconds"]
    print(f"\nsame PPO update shapes, PyTorch {t['torch']} (TRL-style, peft LoRA), {t['threads']} threads:")
    print("| | candle | PyTorch | candle/PyTorch time |\n|---|---|---|---|")
    for name, c, p in [
        ("scoring", m["score_seconds"], t["score_seconds"]),
        ("optimization", m["optimize_seconds"], t["optimize_seconds"]),
        ("  forward with gradients", m["optimize_seconds"] - m["backward_seconds"], t["optimize_seconds"] - t["backward_seconds"]),
        ("  backward + optimizer", m["backward_seconds"], t["backward_seconds"]),
        ("update (scoring + optimization)", c_upd, t_upd),
    ]:
        print(f"| {name} | {c:.1f} s | {p:.1f} s | {c / p:.2f}x |")
    print(f"| update tokens/s | {upd_tokens / c_upd:.1f} | {t['response_tokens'] / t_upd:.1f} | |")
    print(f"| peak RSS | {rss:.0f} MiB (whole iteration) | {t['peak_rss_mib']} MiB (after load: {t['peak_rss_after_load_mib']}) | |")
    # Distance from the machine's limits, measured in the same run (f32 2048^3 products and
    # a 256 MiB copy in PyTorch, same threads). FLOPs are estimated from the parameter count
    # N (attention's own products not counted): 2N a token for a forward pass, 4N for a
    # forward and backward through a frozen base (input gradients; LoRA's are negligible).
    # Decoding a few rows is bound by bandwidth rather than FLOPs (each step reads every
    # weight once), so generation's share of the FLOP peak understates how close it is.
    n = t["params"]
    seqs = [p + r for b in batches for p, r in zip(b["prompt_lens"], b["response_lens"])]
    # Prompt positions the generation prefix cache served are not computed.
    prompts = sum(p for b in batches for p in b["prompt_lens"])
    gen_hit = m.get("generation_prefix_hit_rate") or 0.0
    gen_flops = 2 * n * (sum(seqs) - prompts * gen_hit)
    hits = [s.get("reference_prefix_hit_rate") or 0.0 for s in m["agents"].values()]
    hit = sum(hits) / max(len(hits), 1)
    score_flops = 2 * n * sum(seqs) * (1 - hit)
    opt_tokens = sum(
        b["prompt_lens"][i] + b["response_lens"][i]
        for b in batches for step in b["optimizer_steps"] for part in step for i in part
    )
    opt_flops = 4 * n * opt_tokens
    print(f"\nmachine limits ({t['threads']} threads): {t['peak_gflops']} GFLOP/s f32 matrix products, "
          f"{t['bandwidth_gbs']} GB/s memory copy; N = {n / 1e6:.1f}M parameters")
    print("| phase | estimated GFLOP | GFLOP/s | of the peak |\n|---|---|---|---|")
    for name, f, s in [
        ("generation (prefill + decode)", gen_flops, m["generation_seconds"]),
        ("reference scoring (prefixes computed once)", score_flops, m["score_seconds"]),
        ("optimization (forward + backward)", opt_flops, m["optimize_seconds"]),
    ]:
        rate = f / max(s, 1e-9) / 1e9
        print(f"| {name} | {f / 1e9:.0f} | {rate:.1f} | {rate / t['peak_gflops']:.1%} |")
PY
if [ -n "${COMPARE:-}" ]; then
    python3 - "$OUT/baseline/run/metrics.jsonl" "$OUT/run/metrics.jsonl" <<'PY'
import json, sys
old, new = (json.loads(open(p).readline()) for p in sys.argv[1:3])
def phases(m):
    return [
        ("generation", m["generation_seconds"]),
        ("scoring", m["score_seconds"]),
        ("optimization", m["optimize_seconds"]),
        ("update (wall)", m["update_seconds"]),
        ("one iteration", m["rollout_seconds"] + m["update_seconds"]),
    ]
print("\nagainst the baseline build, same command, one after the other:")
print("(scoring and optimization are summed over agents: with the agents updating side by "
      "side they overlap, and the update's wall time is what to compare)")
print("| phase | baseline s | now s | speed-up |\n|---|---|---|---|")
for (name, a), (_, b) in zip(phases(old), phases(new)):
    print(f"| {name} | {a:.1f} | {b:.1f} | {a / max(b, 1e-9):.2f}x |")
hits = [s.get("reference_prefix_hit_rate") for s in new["agents"].values()]
print(f"reference scoring: prefix hit rate {', '.join(f'{h:.1%}' for h in hits if h is not None)} (per agent)")
for name, m in [("baseline", old), ("now", new)]:
    if "generation_prefix_hit_rate" in m:
        print(f"generation: prefix hit rate {m['generation_prefix_hit_rate']:.1%} ({name})")
PY
fi
echo "raw: $OUT"
