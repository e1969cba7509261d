"""The reference for host/benches/device.rs: the same workload in PyTorch + transformers + PEFT
on the same device, so the GPU check reports maporl's times as ratios measured in one run.

    python3 scripts/bench_device_torch.py --json OUT.json [--device cuda:0] [--dtype bf16]

Workload (as host/benches/device.rs, MAPORL_BENCH_SIZE=0.5b): a random-weights llama (hidden
1024, 24 layers, MLP 4096, 16 heads, 4 KV heads, vocab 32000, untied); greedy generation of
64 new tokens after a 32-token prompt at batch 1, 8 and 64 (KV cache, no early stop); a train
step on 8 x (256 + 256) tokens with LoRA r 16 on all seven projections and an f32 value head:
the response's log-probs (f32 log-softmax), loss 0.5 v^2 - exp(lp - lp.detach()) averaged
over the response, backward, AdamW; best of two steps after a warm-up.
"""

import argparse
import json
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--size", default="0.5b", choices=["0.5b", "tiny"])
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--train", default="8x256x256")
    ap.add_argument("--json")
    args = ap.parse_args()

    import transformers
    from peft import LoraConfig, get_peft_model

    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    h, i, layers, heads, kv, vocab = {
        "0.5b": (1024, 4096, 24, 16, 4, 32000), "tiny": (128, 256, 2, 4, 2, 512)}[args.size]
    cfg = transformers.LlamaConfig(
        hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
        rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(cfg).to(device=dev, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {dev}, "
          f"{args.dtype}, random llama: {params / 1e6:.1f}M params")

    prompt = torch.arange(100, 132, device=dev)
    generation = {}
    with torch.no_grad():
        for b in (1, 8, 64):
            ids = prompt.repeat(b, 1)
            kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, use_cache=True)
            model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
            sync()
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, **kw)
            sync()
            s = time.perf_counter() - t
            n = (out.shape[1] - ids.shape[1]) * b
            print(f"generation b={b}: {n / s:.1f} tok/s ({n} tokens in {s:.2f} s)")
            generation[f"b{b}_tokens_per_s"] = n / s

    batch, plen, rlen = (int(x) for x in args.train.split("x"))
    learner = get_peft_model(model, LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"]))
    learner.train()
    value_head = torch.nn.Linear(cfg.hidden_size, 1, device=dev, dtype=torch.float32)
    trainable = [p for p in learner.parameters() if p.requires_grad] + list(value_head.parameters())
    opt = torch.optim.AdamW(trainable, lr=1e-5, weight_decay=0.0)
    k = torch.arange(batch, device=dev)[:, None]
    prompts = (200 + torch.arange(plen, device=dev)[None] * 7 + k) % cfg.vocab_size
    responses = (900 + torch.arange(rlen, device=dev)[None] * 3 + k) % cfg.vocab_size
    ids = torch.cat([prompts, responses], 1)
    best, parts = float("inf"), None
    for step in range(3):
        sync()
        t = time.perf_counter()
        out = learner(input_ids=ids, output_hidden_states=True)
        logits = out.logits[:, plen - 1:-1].float()
        lp = logits.log_softmax(-1).gather(-1, responses[..., None]).squeeze(-1)
        values = value_head(out.hidden_states[-1][:, plen - 1:-1].float()).squeeze(-1)
        loss = (0.5 * values.square() - (lp - lp.detach()).exp()).mean()
        sync()
        forward = time.perf_counter() - t
        loss.backward()
        sync()
        backward = time.perf_counter() - t - forward
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        s = time.perf_counter() - t
        print(f"train step {step} ({batch} x ({plen} + {rlen}) tokens): {s:.3f} s "
              f"(forward {forward:.3f}, backward {backward:.3f}, "
              f"optimizer {s - forward - backward:.3f})")
        if step > 0 and s < best:
            best, parts = s, (forward, backward, s - forward - backward)
    tokens = batch * (plen + rlen)
    print(f"train: {tokens / best:.0f} tokens/s (best of 2 after a warm-up)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "torch": torch.__version__, "transformers": transformers.__version__,
                "device": str(dev), "dtype": args.dtype, "size": args.size, "params": params,
                "new_tokens": args.new_tokens, "generation": generation,
                "train": {"batch": batch, "prompt": plen, "response": rlen, "step_s": best,
                          "tokens_per_s": tokens / best, "forward_s": parts[0],
                          "backward_s": parts[1], "optimizer_s": parts[2]},
            }, f, indent=2)


if __name__ == "__main__":
    main()
