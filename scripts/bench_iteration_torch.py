"""The PPO update of one MAPoRL iteration, replayed TRL-style in PyTorch on the same shapes.

scripts/bench-iteration.sh runs `maporl train` for one step with MAPORL_BENCH_PPO_BATCHES set;
every PPO update then appends one JSON line: each sample's prompt and response lengths, and
the micro-batches (sample indices) of each optimizer step. This script does the same work per
line with HF transformers + peft on the same SmolLM2 weights (dequantized from the same GGUF):

- scoring, without gradients, as TRL's batched forward pass does it: the policy (LoRA on) for
  log-probs and values, and the reference as the same model with the adapter disabled
  (`disable_adapter()`, TRL's PEFT reference), each over the whole left-padded batch;
- then each optimizer step: for each micro-batch, a forward with gradients over the left-padded
  micro-batch, log-probs and entropy on the response positions, a value head on the hidden
  states, clipped policy loss + 0.1 x clipped value loss, backward; then gradient clipping
  at norm 1 and AdamW (lr 1e-5).

LoRA r 8, alpha 16 on q, k, v, o, gate, up and down projections (peft), a fresh adapter per
agent, a Linear(hidden, 1) value head; the base is frozen. Token ids are random (throughput
does not depend on them); advantages are random, returns are the old values plus noise.
Log-probs are computed on the response positions only (one lm_head call), as in maporl.
One untimed forward and backward on two samples warms PyTorch up first.

Prints one JSON line: the phase times summed over agents, response tokens and peak RSS.
    python scripts/bench_iteration_torch.py --gguf FILE --batches FILE [--threads N]
"""

import argparse
import json
import os
import resource
import time


def vm_hwm_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def machine_limits(torch):
    """This machine's f32 matrix-product rate (GFLOP/s, 2048^3 products) and memory
    bandwidth (GB/s, bytes read + written by a 256 MiB copy), at the set thread count."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(2):
        a @ b
    n, t = 10, time.perf_counter()
    for _ in range(n):
        a @ b
    gflops = 2 * 2048**3 * n / (time.perf_counter() - t) / 1e9
    x = torch.ones(64 * 1024 * 1024)
    y = torch.empty_like(x)
    y.copy_(x)
    n, t = 5, time.perf_counter()
    for _ in range(n):
        y.copy_(x)
    gbs = 2 * x.numel() * 4 * n / (time.perf_counter() - t) / 1e9
    return round(gflops, 1), round(gbs, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--batches", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--vf-coef", type=float, default=0.1)
    ap.add_argument("--lr", type=float, default=1e-5)
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(0)
    updates = [json.loads(l) for l in open(args.batches) if l.strip()]
    peak_gflops, bandwidth_gbs = machine_limits(torch)

    started = time.perf_counter()
    base = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(args.gguf)),
        gguf_file=os.path.basename(args.gguf),
        dtype=torch.float32,
    )
    base.eval()  # no dropout, as in maporl
    n_params = sum(p.numel() for p in base.parameters())
    load_seconds = time.perf_counter() - started
    rss_after_load = vm_hwm_mib()
    hidden = base.config.hidden_size
    vocab = base.config.vocab_size
    lora = lambda: LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(base, lora(), adapter_name="agent-0")
    decoder = model.base_model.model.model  # the LlamaModel (adapter layers inside)
    lm_head = model.base_model.model.lm_head

    def left_pad(seqs):
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
        return ids, mask

    def score(value_head, seqs, resp_lens):
        """Log-probs and entropy of the last r_max tokens, values at their positions."""
        ids, mask = left_pad(seqs)
        pos = (mask.cumsum(1) - mask).clamp(min=0)
        h = decoder(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        r = max(resp_lens)
        pred = h[:, -r - 1 : -1]
        lsm = F.log_softmax(lm_head(pred), dim=-1)
        lp = lsm.gather(2, ids[:, -r:].unsqueeze(2)).squeeze(2)
        ent = -(lsm.exp() * lsm).sum(-1)
        values = value_head(pred).squeeze(2)
        rmask = torch.zeros(len(seqs), r)
        for i, n in enumerate(resp_lens):
            rmask[i, r - n:] = 1
        return lp, ent, values, rmask

    g = torch.Generator().manual_seed(0)
    totals = dict(score_seconds=0.0, optimize_seconds=0.0, backward_seconds=0.0)
    tokens = steps = 0
    for a, u in enumerate(updates):
        name = f"agent-{a}"
        if a > 0:
            model.add_adapter(name, lora())
            model.set_adapter(name)
        value_head = torch.nn.Linear(hidden, 1)
        params = [p for p in model.parameters() if p.requires_grad] + list(value_head.parameters())
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
        seqs = [
            torch.randint(1, vocab, (p + r,), generator=g).tolist()
            for p, r in zip(u["prompt_lens"], u["response_lens"])
        ]
        resp = u["response_lens"]
        tokens += sum(resp)
        if a == 0:  # untimed warm-up: PyTorch's first calls pay one-off setup
            lp, _, v, _ = score(value_head, seqs[:2], resp[:2])
            (lp.sum() + v.sum()).backward()
            opt.zero_grad(set_to_none=True)

        started = time.perf_counter()
        r_all = max(resp)
        old_lp, old_v, k = torch.zeros(len(seqs), r_all), torch.zeros(len(seqs), r_all), len(seqs)
        with torch.no_grad():
            for i in range(0, len(seqs), k):
                lp, _, v, _ = score(value_head, seqs[i : i + k], resp[i : i + k])
                old_lp[i : i + k, r_all - lp.shape[1] :] = lp
                old_v[i : i + k, r_all - lp.shape[1] :] = v
                with model.disable_adapter():
                    score(value_head, seqs[i : i + k], resp[i : i + k])
        totals["score_seconds"] += time.perf_counter() - started
        adv = torch.randn(old_lp.shape, generator=g)
        returns = old_v + 0.1 * torch.randn(old_v.shape, generator=g)

        started = time.perf_counter()
        backward = 0.0
        for step in u["optimizer_steps"]:
            mb_tokens = sum(resp[i] for part in step for i in part)
            for part in step:
                share = sum(resp[i] for i in part) / mb_tokens
                lp, ent, v, m = score(value_head, [seqs[i] for i in part], [resp[i] for i in part])
                w = lp.shape[1]
                sel = lambda x: x[part][:, r_all - w :]
                ratio = (lp - sel(old_lp)).exp()
                a_ = sel(adv)
                pg = torch.max(-a_ * ratio, -a_ * ratio.clamp(1 - args.clip, 1 + args.clip))
                n = m.sum().clamp(min=1)
                pg = (pg * m).sum() / n
                ov = sel(old_v)
                vc = ov + (v - ov).clamp(-args.clip, args.clip)
                ret = sel(returns)
                vf = 0.5 * (torch.max((v - ret) ** 2, (vc - ret) ** 2) * m).sum() / n
                entropy = (ent * m).sum() / n
                loss = pg + args.vf_coef * vf
                t = time.perf_counter()
                (loss * share).backward()
                backward += time.perf_counter() - t
                _ = (pg.item(), vf.item(), entropy.item())
            t = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            backward += time.perf_counter() - t
            steps += 1
        totals["optimize_seconds"] += time.perf_counter() - started
        totals["backward_seconds"] += backward

    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            dict(
                torch=torch.__version__,
                params=n_params,
                peak_gflops=peak_gflops,
                bandwidth_gbs=bandwidth_gbs,
                threads=args.threads,
                agents=len(updates),
                optimizer_steps=steps,
                response_tokens=tokens,
                load_seconds=round(load_seconds, 2),
                **{k: round(v, 3) for k, v in totals.items()},
                peak_rss_after_load_mib=round(rss_after_load),
                peak_rss_mib=round(max(ru, vm_hwm_mib())),
            )
        )
    )


if __name__ == "__main__":
    main()
