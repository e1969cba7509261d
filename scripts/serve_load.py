#!/usr/bin/env python3
"""Load test of `maporl serve` (issue 22): starts the server on a free loopback port, sends
chat completions (or, with --endpoint debate, whole debates) from C concurrent clients
(Python stdlib only), and reports requests/s, generated tokens/s and p50/p99 latency at each
concurrency, with the ratio of each throughput to the one-client throughput measured in the
same run, and the server's peak resident memory after each level (VmHWM, Linux). For
debates it also reports the most positions (prompt + completion tokens) one debate's
utterances held, summed: what its generation prefix cache could hold at most. JSON on
stdout's last line and in --out.

    python3 scripts/serve_load.py --maporl target/release/maporl --config C \
        [--endpoint chat|debate] [--concurrency 1,8,32] [--requests 64] [--max-tokens 32] \
        [--workers 2] [--set KEY=VALUE]... [--out F]
"""

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            data = json.load(r)
            status = r.status
    except urllib.error.HTTPError as e:
        data, status = json.load(e), e.code
    return status, data, time.perf_counter() - t0


def percentile(xs, q):
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def peak_rss_mib(pid):
    """The process's peak resident memory (VmHWM) in MiB, or None off Linux."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def utterances(data):
    return [u for t in data["turns"] for u in t["utterances"]]


def run_level(base, endpoint, concurrency, requests, max_tokens, agents):
    if endpoint == "debate":
        url = base + "/v1/debate"
        bodies = [{"question": f"What is {i} + {100 - i}?", "reference": "100", "seed": i}
                  for i in range(requests)]
    else:
        url = base + "/v1/chat/completions"
        bodies = [{
            "model": f"agent-{i % agents}",
            "messages": [{"role": "user", "content": f"What is {i} + {100 - i}? Answer in \\boxed{{}}."}],
            "seed": i, "max_tokens": max_tokens, "temperature": 0.7,
        } for i in range(requests)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda b: post(url, b), bodies))
    wall = time.perf_counter() - t0
    bad = [(s, d) for s, d, _ in results if s != 200]
    if bad:
        sys.exit(f"concurrency {concurrency}: {len(bad)} failed requests, e.g. {bad[0]}")
    latencies = [t for _, _, t in results]
    extra = {}
    if endpoint == "debate":
        tokens = sum(u["completion_tokens"] for _, d, _ in results for u in utterances(d))
        positions = [sum(u["prompt_tokens"] + u["completion_tokens"] for u in utterances(d))
                     for _, d, _ in results]
        extra = {"max_debate_positions": max(positions),
                 "mean_debate_positions": round(statistics.mean(positions), 1)}
    else:
        tokens = sum(d["usage"]["completion_tokens"] for _, d, _ in results)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "seconds": round(wall, 3),
        "requests_per_s": round(requests / wall, 3),
        "generated_tokens_per_s": round(tokens / wall, 1),
        "p50_s": round(statistics.median(latencies), 4),
        "p99_s": round(percentile(latencies, 0.99), 4),
        "mean_completion_tokens": round(tokens / requests, 1),
        **extra,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--maporl", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--endpoint", choices=["chat", "debate"], default="chat")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    cmd = [a.maporl, "serve", "--config", a.config, "--addr", "127.0.0.1:0",
           "--workers", str(a.workers), "--queue", "256", "--max-tokens", str(a.max_tokens)]
    for s in a.set:
        cmd += ["--set", s]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline().strip()
        if not line.startswith("listening on "):
            sys.exit(f"the server did not start: {line!r}")
        base = line[len("listening on "):]
        threading.Thread(target=server.stdout.read, daemon=True).start()
        with urllib.request.urlopen(base + "/health") as r:
            agents = json.load(r)["agents"]
        # Warm-up: the first request pays for lazy set-up.
        run_level(base, a.endpoint, 1, 2, a.max_tokens, agents)
        levels = []
        for c in a.concurrency.split(","):
            levels.append(run_level(base, a.endpoint, int(c), a.requests, a.max_tokens, agents))
            levels[-1]["server_peak_rss_mib"] = peak_rss_mib(server.pid)
        one = levels[0]["requests_per_s"]
        for lv in levels:
            lv["throughput_vs_first"] = round(lv["requests_per_s"] / one, 2)
            print(f"concurrency {lv['concurrency']:>3}: {lv['requests_per_s']:.2f} req/s "
                  f"({lv['throughput_vs_first']:.2f}x), {lv['generated_tokens_per_s']:.0f} tok/s, "
                  f"p50 {lv['p50_s'] * 1000:.0f} ms, p99 {lv['p99_s'] * 1000:.0f} ms, "
                  f"server peak RSS {lv['server_peak_rss_mib']} MiB", file=sys.stderr)
        with urllib.request.urlopen(base + "/metrics") as r:
            metrics = r.read().decode()
        rejected = [l for l in metrics.splitlines() if l.startswith("maporl_rejected_busy_total ")]
        result = {"config": a.config, "endpoint": a.endpoint, "sets": a.set,
                  "workers": a.workers, "max_tokens": a.max_tokens,
                  "levels": levels, "rejected_busy": rejected[0].split()[-1] if rejected else None}
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
        print(json.dumps(result))
    finally:
        server.terminate()
        server.wait(timeout=120)


if __name__ == "__main__":
    main()
