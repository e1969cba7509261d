"""HF transformers (PyTorch, CPU) side of scripts/bench-vs-torch.sh.

Subcommands:
  make-tiny DIR            write a ~31M-parameter llama (random weights, f32) as an HF folder
  torch MODEL [--gguf F]   the same measurements as host/benches/model.rs, one `JSON {...}` line
  report RESULTS           the table (best of the repeated runs) from the collected JSON lines

The workload mirrors host/benches/model.rs exactly: a 32-token prompt (ids 100..131), greedy
generation of 64 new tokens at batch 1 and 8 (no stop token), and a PPO-shaped step at
8 x (64 prompt + 64 response) with LoRA r 8 (alpha 16) on q,k,v,o,gate,up,down plus a value
head, AdamW (lr 1e-4, no weight decay).
"""

import argparse
import json
import math
import os
import sys
import time


def vmhwm_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return 0


def bandwidth_gbs():
    """Copy bandwidth of a 256 MiB buffer (read + write bytes), best of 5; as the Rust bench."""
    import numpy as np

    n = 256 << 20
    src = np.ones(n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2.0 * n / best / 1e9


def make_tiny(out):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=5,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {out} ({n / 1e6:.1f}M params)")


def add_lora(model, r=8, alpha=16.0, seed=0):
    import torch
    from torch import nn

    class Lora(nn.Module):
        # y = W x + s * B (A x); A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0 (as host/src/model/lora.rs)
        def __init__(self, base):
            super().__init__()
            self.base = base
            out_dim, in_dim = base.weight.shape
            bound = 1.0 / math.sqrt(in_dim)
            self.lora_A = nn.Parameter(torch.empty(r, in_dim).uniform_(-bound, bound))
            self.lora_B = nn.Parameter(torch.zeros(out_dim, r))
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + (x @ self.lora_A.t() @ self.lora_B.t()) * self.scale

    torch.manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in model.model.layers:
        for parent, names in (
            (layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")),
            (layer.mlp, ("gate_proj", "up_proj", "down_proj")),
        ):
            for n in names:
                setattr(parent, n, Lora(getattr(parent, n)))
    return [p for p in model.parameters() if p.requires_grad]


def run_torch(args):
    import torch

    threads = args.threads
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import transformers
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    if args.gguf:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, gguf_file=args.gguf, dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    load_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{params / 1e6:.1f}M params, threads {torch.get_num_threads()}, loaded in {load_s:.2f} s",
        file=sys.stderr,
    )
    prompt = torch.arange(100, 132, dtype=torch.long).unsqueeze(0)

    result = {"impl": "torch", "threads": torch.get_num_threads(), "params": params}
    result["torch"] = torch.__version__
    result["transformers"] = transformers.__version__
    result["load_s"] = load_s
    if args.compare_logits:
        import numpy as np

        with torch.no_grad():
            logits = model(prompt).logits[0].float().numpy()
        theirs = np.fromfile(args.compare_logits, dtype="<f4").reshape(logits.shape)
        result["logits_max_abs_diff"] = float(np.abs(logits - theirs).max())
        result["logits_max_abs"] = float(np.abs(logits).max())

    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    for b in (1, 8):
        ids = prompt.repeat(b, 1)
        mask = torch.ones_like(ids)
        kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=mask)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.new_tokens, **kw)
            s = time.perf_counter() - t
        new = out[:, ids.shape[1]:]
        n = new.numel()
        result[f"gen_b{b}_tps"] = n / s
        result[f"gen_b{b}_tokens"] = new[0].tolist()
        print(f"generation b={b} (greedy): {n / s:.1f} tok/s ({n} tokens, {s:.2f} s)", file=sys.stderr)
    result["rss_gen_mb"] = vmhwm_mb()
    result["bandwidth_gbs"] = bandwidth_gbs()
    result["weight_bytes"] = params * 4

    # PPO-shaped step, as host/benches/model.rs.
    trainable = add_lora(model)
    hidden = model.config.hidden_size
    torch.manual_seed(0)
    vhead = torch.nn.Linear(hidden, 1)
    trainable += list(vhead.parameters())
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    rows = []
    for k in range(8):
        rows.append([200 + i + k for i in range(64)] + [900 + i * 3 + k for i in range(64)])
    ids = torch.tensor(rows, dtype=torch.long)
    tgt = ids[:, 64:]
    maskr = torch.ones(8, 64)
    best = [float("inf")] * 4
    model.train()
    for step in range(args.steps):
        t = time.perf_counter()
        h = model.model(input_ids=ids).last_hidden_state
        pred = h[:, 63:127]
        logits = model.lm_head(pred).float()
        lp = torch.log_softmax(logits, -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        old = lp.detach()
        adv = torch.ones_like(old)
        ratio = (lp - old).exp()
        pg = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        v = vhead(pred).squeeze(-1)
        vloss = (v - adv) ** 2
        loss = ((vloss * 0.5 - pg) * maskr).sum()
        t_fwd = time.perf_counter() - t
        loss.backward()
        t_bwd = time.perf_counter() - t
        opt.step()
        opt.zero_grad(set_to_none=True)
        total = time.perf_counter() - t
        print(
            f"train step {step}: {total:.2f} s (forward {t_fwd:.2f}, backward {t_bwd - t_fwd:.2f}, "
            f"AdamW {total - t_bwd:.3f})",
            file=sys.stderr,
        )
        if step > 0 or args.steps == 1:
            best = [min(a, b) for a, b in zip(best, [total, t_fwd, t_bwd - t_fwd, total - t_bwd])]
    result.update(
        train_s=best[0], train_fwd_s=best[1], train_bwd_s=best[2], train_opt_s=best[3],
        rss_peak_mb=vmhwm_mb(),
    )
    print("JSON " + json.dumps(result))


def report(path):
    runs = {}
    meta = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            runs.setdefault(r["model"], {}).setdefault(r["impl"], []).append(r)
            if r["impl"] == "torch":
                meta = r
    print(f"torch {meta.get('torch')}, transformers {meta.get('transformers')}, candle 0.11.1, "
          f"threads {meta.get('threads')} (both)\n")
    for model, by in runs.items():
        c, t = by.get("candle", []), by.get("torch", [])
        if not c or not t:
            print(f"{model}: missing runs")
            continue
        params = c[0]["params"]
        bw = max(r["bandwidth_gbs"] for r in c + t)
        limit = bw * 1e9 / (params * 4)
        diff = [r["logits_max_abs_diff"] for r in t if "logits_max_abs_diff" in r]
        same = [r["gen_b1_tokens"] == c[0]["gen_b1_tokens"] for r in t]
        print(f"### {model} ({params / 1e6:.1f}M params, f32; runs: candle {len(c)}, torch {len(t)})")
        if diff:
            print(f"logits max |candle - torch| over a 32-token prompt: {max(diff):.2e} "
                  f"(max |logit| {t[0]['logits_max_abs']:.1f}); greedy b=1 tokens identical: "
                  f"{all(same)}")
        print()
        print("| metric | candle | PyTorch | candle/PyTorch |")
        print("|---|---|---|---|")

        def row(name, key, unit, higher_better, fmt="{:.1f}"):
            f = max if higher_better else min
            cv, tv = f(r[key] for r in c), f(r[key] for r in t)
            ratio = cv / tv
            print(f"| {name} | {fmt.format(cv)} {unit} | {fmt.format(tv)} {unit} | {ratio:.2f}x |")
            return cv, tv

        g1 = row("generation b=1 (best)", "gen_b1_tps", "tok/s", True)
        row("generation b=8 (best)", "gen_b8_tps", "tok/s", True)
        row("train step 8x128 (best)", "train_s", "s", False, "{:.2f}")
        row("  forward", "train_fwd_s", "s", False, "{:.2f}")
        row("  backward", "train_bwd_s", "s", False, "{:.2f}")
        row("  AdamW", "train_opt_s", "s", False, "{:.3f}")
        row("peak RSS after generation", "rss_gen_mb", "MB", False, "{:.0f}")
        row("peak RSS (whole run)", "rss_peak_mb", "MB", False, "{:.0f}")
        p = by.get("candle-plain", [])
        if p:
            pv = min(r["train_s"] for r in p)
            pb = min(r["train_bwd_s"] for r in p)
            print(f"| train step, candle's plain matmul backward ({len(p)} run) | {pv:.2f} s "
                  f"(backward {pb:.2f}) | | |")
        print(f"| b=1 decode vs limit ({bw:.1f} GB/s copy, {params * 4 / 1e6:.0f} MB weights "
              f"-> {limit:.0f} tok/s) | {100 * g1[0] / limit:.0f}% | {100 * g1[1] / limit:.0f}% | |")
        print()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("make-tiny")
    a.add_argument("out")
    a = sub.add_parser("torch")
    a.add_argument("model")
    a.add_argument("--gguf")
    a.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    a.add_argument("--new-tokens", type=int, default=64)
    a.add_argument("--steps", type=int, default=3)
    a.add_argument("--compare-logits")
    a = sub.add_parser("report")
    a.add_argument("results")
    args = ap.parse_args()
    if args.cmd == "make-tiny":
        make_tiny(args.out)
    elif args.cmd == "torch":
        run_torch(args)
    else:
        report(args.results)


if __name__ == "__main__":
    main()
