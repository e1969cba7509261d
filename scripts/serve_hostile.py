#!/usr/bin/env python3
"""Hostile clients against `maporl serve` (issue 49): what a server's memory, its `/health`
and its shutdown do under them. Starts a server on a free loopback port for each scenario
and reports, as JSON on stdout's last line (and in --out):

  slowloris  when a connection that sends nothing, a half-sent head, a body that stalls and
             a body that trickles in (a byte every 0.5 s) are closed, and with what status
             (up to --patience seconds: null means still open then);
  bodies     resident memory (VmRSS) before and after 400 unfinished 1 MiB bodies (each
             sent but for its last byte), and how many were refused;
  flood      /health latency with the worker busy and the queue full, then with 1,100
             half-sent heads on top under `ulimit -n 1024` (the server's own limit), and how
             many of the heads are still open 15 s later;
  shutdown   SIGTERM with one generation in flight and 8 requests queued, with
             --shutdown-timeout 1: time to exit, and what the queued requests got.

With --baseline BIN the same scenarios run against a second binary (e.g. main's) in the
same run; only flags both know are passed (--workers, --queue, --max-tokens,
--shutdown-timeout), so each server runs with its defaults otherwise.

    python3 scripts/serve_hostile.py --maporl target/release/maporl \
        [--baseline OLD_BIN] --config configs/smollm2-arith.toml \
        [--scenarios slowloris,bodies,flood,shutdown] [--patience 40] [--out F]
"""

import argparse
import json
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

MIB = 1 << 20


def start(binary, config, args, nofile=None):
    cmd = [binary, "serve", "--config", config, "--addr", "127.0.0.1:0", *args]

    def limit():
        if nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         preexec_fn=limit)
    line = p.stdout.readline().strip()
    if not line.startswith("listening on http://"):
        p.kill()
        sys.exit(f"{binary}: the server did not start: {line!r}")
    threading.Thread(target=p.stdout.read, daemon=True).start()
    base = line[len("listening on "):]
    host, port = base[len("http://"):].rsplit(":", 1)
    return p, base, (host, int(port))


def stop(p):
    p.kill()
    p.wait()


def proc_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def raw(addr, data=b"", timeout=5):
    s = socket.create_connection(addr, timeout=timeout)
    if data:
        s.sendall(data)
    return s


def is_closed(s):
    """Whether the server closed `s` (without waiting), and what it sent."""
    s.setblocking(False)
    got = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True, got
            got += chunk
    except BlockingIOError:
        return False, got
    except OSError:
        return True, got
    finally:
        s.setblocking(True)


def status_of(got):
    try:
        return int(got.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def get_json(base, path, timeout=10):
    t0 = time.perf_counter()
    with urllib.request.urlopen(base + path, timeout=timeout) as r:
        return json.load(r), time.perf_counter() - t0


def health(base, timeout=5):
    """(latency in s, JSON) or (None, why)."""
    try:
        h, took = get_json(base, "/health", timeout)
        return took, h
    except Exception as e:  # noqa: BLE001 - a timeout, a reset, a refusal: all count
        return None, f"{type(e).__name__}: {e}"


def wait_health(base, field, value, within=120):
    t0 = time.time()
    while time.time() - t0 < within:
        took, h = health(base, 10)
        if took is not None and h.get(field) == value:
            return
        time.sleep(0.05)
    sys.exit(f"/health never showed {field} = {value}")


def post(base, path, body, timeout=600):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}"


def chat(i, max_tokens, stream=False):
    return {"model": f"agent-{i % 2}", "seed": i, "max_tokens": max_tokens, "stream": stream,
            "temperature": 1.0,
            "messages": [{"role": "user", "content": "Write a very long story about a city."}]}


def head(length_header):
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: application/json\r\n{length_header}\r\n\r\n").encode()


def latency_summary(results):
    ok = [t for t, _ in results if t is not None]
    return {
        "probes": len(results),
        "answered": len(ok),
        "p50_ms": round(statistics.median(ok) * 1000, 1) if ok else None,
        "max_ms": round(max(ok) * 1000, 1) if ok else None,
        "failures": sorted({h for t, h in results if t is None})[:3],
    }


def slowloris(binary, config, patience):
    p, base, addr = start(binary, config, [])
    t0 = time.perf_counter()
    conns = {
        "nothing sent": raw(addr),
        "half-sent head": raw(addr, b"GET /health HTTP/1.1\r\nHost: x\r\n"),
        "stalled body": raw(addr, head("Content-Length: 1000") + b'{"model":'),
    }
    trickle = raw(addr, head("Content-Length: 100000"))
    conns["trickling body"] = trickle

    def dribble():
        try:
            while True:
                trickle.sendall(b" ")
                time.sleep(0.5)
        except OSError:
            pass

    threading.Thread(target=dribble, daemon=True).start()
    closed = {}
    while time.perf_counter() - t0 < patience and len(closed) < len(conns):
        for name, s in conns.items():
            if name not in closed:
                done, got = is_closed(s)
                if done:
                    closed[name] = {"closed_after_s": round(time.perf_counter() - t0, 2),
                                    "status": status_of(got)}
        time.sleep(0.05)
    for s in conns.values():
        s.close()
    stop(p)
    return {name: closed.get(name, {"closed_after_s": None, "status": None}) for name in conns}


def bodies(binary, config):
    p, base, addr = start(binary, config, ["--workers", "2"])
    post(base, "/v1/chat/completions", chat(0, 8))
    before = proc_kib(p.pid, "VmRSS")
    socks = []
    payload = b" " * (MIB - 1)
    t0 = time.perf_counter()
    for _ in range(400):
        s = raw(addr)
        s.settimeout(2)
        try:
            s.sendall(head(f"Content-Length: {MIB}"))
            s.sendall(payload)
        except OSError:
            pass
        socks.append(s)
    sent_s = time.perf_counter() - t0
    time.sleep(2)
    after = proc_kib(p.pid, "VmRSS")
    peak = proc_kib(p.pid, "VmHWM")
    refused = closed = 0
    for s in socks:
        done, got = is_closed(s)
        refused += status_of(got) == 503
        closed += done
        s.close()
    took, _ = health(base)
    stop(p)
    return {"rss_before_mib": round(before / 1024, 1), "rss_after_mib": round(after / 1024, 1),
            "peak_mib": round(peak / 1024, 1), "sent_in_s": round(sent_s, 1),
            "answered_503": refused, "closed": closed, "held": 400 - closed,
            "health_after_ms": round(took * 1000, 1) if took is not None else None}


def saturate(base, addr, workers, queue, max_tokens):
    """Holds every worker busy with a long stream and fills the queue: raw sockets, kept."""
    held = []
    for i in range(workers):
        body = json.dumps(chat(100 + i, max_tokens, stream=True))
        held.append(raw(addr, head(f"Content-Length: {len(body)}") + body.encode()))
        wait_health(base, "busy_workers", i + 1)
    for i in range(queue):
        body = json.dumps(chat(200 + i, max_tokens))
        held.append(raw(addr, head(f"Content-Length: {len(body)}") + body.encode()))
    wait_health(base, "queue_depth", queue)
    return held


def flood(binary, config, max_tokens):
    p, base, addr = start(binary, config, ["--workers", "1", "--queue", "8",
                                           "--max-tokens", str(max_tokens)], nofile=1024)
    held = saturate(base, addr, 1, 8, max_tokens)
    saturated = [health(base) for _ in range(10)]
    _, h = health(base)
    t0 = time.perf_counter()
    heads, refused = [], 0
    for _ in range(1100):
        try:
            heads.append(raw(addr, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n", timeout=2))
        except OSError:
            refused += 1
    flood_s = time.perf_counter() - t0
    during = [health(base) for _ in range(20)]
    time.sleep(max(0.0, 15 - (time.perf_counter() - t0)))
    still_open = sum(not is_closed(s)[0] for s in heads)
    after = [health(base) for _ in range(5)]
    for s in heads + held:
        s.close()
    stop(p)
    return {"saturated_state": h if isinstance(h, dict) else None,
            "health_saturated": latency_summary(saturated),
            "flood_connect_s": round(flood_s, 2), "flood_connect_failed": refused,
            "health_during_flood": latency_summary(during),
            "heads_open_after_15s": still_open,
            "health_after_15s": latency_summary(after)}


def shutdown(binary, config, max_tokens):
    p, base, addr = start(binary, config, ["--workers", "1", "--queue", "8",
                                           "--shutdown-timeout", "1",
                                           "--max-tokens", str(max_tokens)])
    answers = {}

    def ask(i, body):
        status = post(base, "/v1/chat/completions", body)
        answers[i] = (status, time.perf_counter())

    threads = [threading.Thread(target=ask, args=(0, chat(0, max_tokens)), daemon=True)]
    threads[0].start()
    wait_health(base, "busy_workers", 1)
    for i in range(1, 9):
        threads.append(threading.Thread(target=ask, args=(i, chat(i, 64)), daemon=True))
        threads[-1].start()
    wait_health(base, "queue_depth", 8)
    t0 = time.perf_counter()
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill()
    exit_s = time.perf_counter() - t0
    for t in threads:
        t.join(timeout=10)
    queued = [answers.get(i, ("no answer", None)) for i in range(1, 9)]
    by_status = {}
    for status, _ in queued:
        by_status[str(status)] = by_status.get(str(status), 0) + 1
    answered_at = [at - t0 for _, at in queued if at is not None]
    return {"exit_after_s": round(exit_s, 2), "exit_code": p.returncode,
            "in_flight": str(answers.get(0, ("no answer",))[0]),
            "queued_by_status": by_status,
            "queued_last_answer_s": round(max(answered_at), 2) if answered_at else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--maporl", required=True)
    ap.add_argument("--baseline")
    ap.add_argument("--config", required=True)
    ap.add_argument("--scenarios", default="slowloris,bodies,flood,shutdown")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--patience", type=float, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    binaries = {"new": a.maporl}
    if a.baseline:
        binaries["baseline"] = a.baseline
    result = {"config": a.config, "max_tokens": a.max_tokens, "binaries": binaries}
    for label, binary in binaries.items():
        out = {}
        for sc in a.scenarios.split(","):
            t0 = time.perf_counter()
            if sc == "slowloris":
                out[sc] = slowloris(binary, a.config, a.patience)
            elif sc == "bodies":
                out[sc] = bodies(binary, a.config)
            elif sc == "flood":
                out[sc] = flood(binary, a.config, a.max_tokens)
            elif sc == "shutdown":
                out[sc] = shutdown(binary, a.config, a.max_tokens)
            else:
                sys.exit(f"unknown scenario {sc}")
            print(f"{label} {sc} ({time.perf_counter() - t0:.0f} s): {json.dumps(out[sc])}",
                  file=sys.stderr, flush=True)
        result[label] = out
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
