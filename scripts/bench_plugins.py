#!/usr/bin/env python3
"""The Python side of the plugin-call benchmark (scripts/bench-plugins.sh).

A port of the reference plugins' logic (plugins/: the sdk's answers, prompts, vote and
transcript helpers; the debate, round-robin and judge protocols; the gsm8k, anli,
exact-match and learned verifiers; the influence and final-only shapers), each with its
default settings. It reads the JSON that host/benches/plugins.rs writes (every row's inputs
and the native Rust output), checks that the port computes the same output on every row
(exactly; rewards within 1e-6, since Rust rounds them to f32), then times each call with
time.perf_counter_ns, one call at a time.

    python3 scripts/bench_plugins.py time DIR/rust-N.json DIR/python-N.json   # one repetition
    python3 scripts/bench_plugins.py table DIR      # the table over every rust-N / python-N

`table` prints, per row and implementation, the repetition with the lowest median (its
median and p99), the ratios of those, and whether the goal (every call under 5 us through
wasm and faster than Python) is met; it writes DIR/plugins.json.
Environment: MAPORL_BENCH_CALLS / MAPORL_BENCH_WARMUP override the counts the Rust run used.
Standard library only, with the repository's Python SDK (plugins/sdk-python, standard library
only too) for the helpers the reference plugins share.
"""

import json
import os
import platform
import sys
import time

# The Python SDK's helpers, which give the Rust SDK's results (plugins/sdk-python).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "sdk-python"))
from maporl_plugin.answers import (  # noqa: E402
    last_boxed,
    nli_label,
    nli_reference,
    parse_integer,
)
from maporl_plugin.prompts import INSTRUCTION as _INSTRUCTION  # noqa: E402
from maporl_plugin.prompts import REVISE_ALONE, REVISE_WITH_PEERS, score_note  # noqa: E402
from maporl_plugin.transcript import majority  # noqa: E402

INSTRUCTION = {"numeric": _INSTRUCTION["numeric"], "nli": _INSTRUCTION["nli"], "generic": _INSTRUCTION["generic"]}

# --- maporl_plugin::answers ------------------------------------------------------------

ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def answer_line(text):
    pos = text.translate(ASCII_LOWER).rfind("answer:")
    if pos < 0:
        return None
    line = text[pos + 7 :].split("\n", 1)[0]
    boxed = last_boxed(line)
    line = (boxed if boxed is not None else line).strip()
    return line or None


EDGE = set(".,;:!?'\"`()[]{}*_\u201c\u201d\u2018\u2019\u00ab\u00bb\u3002")


def _trim_edges(s):
    i, j = 0, len(s)
    while i < j and (s[i] in EDGE or s[i].isspace()):
        i += 1
    while j > i and (s[j - 1] in EDGE or s[j - 1].isspace()):
        j -= 1
    return s[i:j]


def normalize(s, strip_articles=False):
    def collapse(t):
        words = t.split()
        if strip_articles:
            words = [w for w in words if w not in ("a", "an", "the")]
        return " ".join(words)

    once = collapse(_trim_edges(s.lower()))
    return collapse(_trim_edges(once))


# --- maporl_plugin::transcript, vote, prompts -------------------------------------------


def check(plugin, transcript):
    agents = transcript["agents"]
    if agents == 0:
        raise ValueError(f"{plugin}: the transcript has no agents (agents = 0)")
    seen = set()
    for u in transcript["utterances"]:
        if u["turn"] == 0:
            raise ValueError(f"{plugin}: utterance at turn 0")
        if u["agent"] >= agents:
            raise ValueError(f"{plugin}: agent {u['agent']} out of range")
        key = (u["turn"], u["agent"])
        if key in seen:
            raise ValueError(f"{plugin}: two utterances of agent {u['agent']} at turn {u['turn']}")
        seen.add(key)


def check_turn(plugin, turn):
    if turn == 0:
        raise ValueError(f"{plugin}: turns are 1-based, got turn 0")


def find(transcript, turn, agent):
    for u in transcript["utterances"]:
        if u["turn"] == turn and u["agent"] == agent:
            return u
    return None


def at_turn(transcript, turn):
    return [u for u in transcript["utterances"] if u["turn"] == turn]


def last_turn(transcript):
    return max((u["turn"] for u in transcript["utterances"]), default=None)


def latest(transcript, agent, turn):
    best = None
    for u in transcript["utterances"]:
        if u["agent"] == agent and u["turn"] <= turn and (best is None or u["turn"] >= best["turn"]):
            best = u
    return best


def mean_score(transcript, turn):
    scores = [u["score"] for u in transcript["utterances"] if u["turn"] == turn]
    return sum(scores) / len(scores) if scores else None


def task_kind(task):
    kind = task["kind"].strip().lower()
    if kind in ("gsm8k", "arith"):
        return "numeric"
    if kind == "anli":
        return "nli"
    return "generic"


def field(task, name):
    for k, v in task["fields"]:
        if k == name:
            v = v.strip()
            return v or None
    return None


def question_block(task, kind=None):
    if (kind or task_kind(task)) == "nli":
        p, h = field(task, "premise"), field(task, "hypothesis")
        if p is not None and h is not None:
            return f"Premise: {p}\nHypothesis: {h}"
        return task["question"].strip()
    return f"Question: {task['question'].strip()}"


FORMAT = {
    "numeric": "At the end, write the answer as `Answer: \\boxed{N}` where N is an integer.",
    "nli": "Conclude with `Answer: \\boxed{label}` where label is entailment, neutral or "
    "contradiction.",
    "generic": "End with `Answer: \\boxed{...}`.",
}


def first_turn_prompt(task, kind=None):
    # The kind is found once per prompt by the builders that make several (as in the SDK).
    kind = kind or task_kind(task)
    return f"{question_block(task, kind)}\n{INSTRUCTION[kind]}"


def render_shown(shown):
    return "\n\n".join(
        f"{label}: {text.strip()}" if score is None else f"{label}: {text.strip()}\n{score_note(score)}"
        for label, text, score in shown
    )


def followup_message(task, peers, kind=None):
    question = first_turn_prompt(task, kind)
    if not peers:
        return f"{REVISE_ALONE}\n\n{question}"
    return (
        "These are the other agents' answers from the previous turn:\n\n"
        f"{render_shown(peers)}\n\n{REVISE_WITH_PEERS}\n\n{question}"
    )


def system_message(system):
    if system is None or not system.strip():
        return []
    return [{"role": "system", "content": system}]


def peers_of(participants, agent, limit):
    n = len(participants)
    if agent not in participants:
        return []
    pos = participants.index(agent)
    count = n - 1 if limit is None else min(limit, n - 1)
    return [participants[(pos + 1 + i) % n] for i in range(count)]


def debate_messages(plugin, task, transcript, agent, turn, participants, peers=None, show_scores=False, system=None):
    kind = task_kind(task)
    shown_peers = peers_of(participants, agent, peers)
    messages = system_message(system)
    messages.append({"role": "user", "content": first_turn_prompt(task, kind)})
    for k in range(1, turn):
        own = find(transcript, k, agent)
        if own is None:
            raise ValueError(f"{plugin}: task `{task['id']}`: agent {agent} has no utterance at turn {k}")
        messages.append({"role": "assistant", "content": own["text"]})
        shown = []
        for p in shown_peers:
            u = find(transcript, k, p)
            if u is not None:
                shown.append((f"Agent {u['agent'] + 1}", u["text"], u["score"] if show_scores else None))
        messages.append({"role": "user", "content": followup_message(task, shown, kind)})
    return messages


# --- protocols (default settings) --------------------------------------------------------


def debate_plan(task, turn, transcript):
    check_turn("debate", turn)
    check("debate", transcript)
    participants = list(range(transcript["agents"]))
    return [
        {"agent": a, "messages": debate_messages("debate", task, transcript, a, turn, participants)}
        for a in participants
    ]


def debate_decide(task, turn, transcript):
    check_turn("debate", turn)
    check("debate", transcript)
    return majority(u["answer"] for u in at_turn(transcript, turn))


RR_REVISE = (
    "Consider the solutions above, your own earlier ones included. If you believe the latest "
    "answer is wrong, give a corrected solution; otherwise confirm it. Avoid merely repeating "
    "earlier reasoning, and keep the reasoning short."
)


def round_robin_plan(task, turn, transcript):
    check_turn("round-robin", turn)
    check("round-robin", transcript)
    agent = (turn - 1) % transcript["agents"]
    earlier = sorted(
        (u for u in transcript["utterances"] if u["turn"] < turn), key=lambda u: (u["turn"], u["agent"])
    )
    question = first_turn_prompt(task)
    if not earlier:
        content = question
    else:
        shown = [
            (
                f"Agent {u['agent'] + 1} (you, turn {u['turn']})"
                if u["agent"] == agent
                else f"Agent {u['agent'] + 1} (turn {u['turn']})",
                u["text"],
                None,
            )
            for u in earlier
        ]
        content = (
            f"{question}\n\nThe discussion so far:\n\n{render_shown(shown)}\n\n{RR_REVISE}\n"
            f"{FORMAT[task_kind(task)]}"
        )
    messages = system_message(None)
    messages.append({"role": "user", "content": content})
    return [{"agent": agent, "messages": messages}]


def round_robin_decide(task, turn, transcript):
    check_turn("round-robin", turn)
    check("round-robin", transcript)
    votes = []
    for a in range(transcript["agents"]):
        u = latest(transcript, a, turn)
        if u is not None:
            votes.append(u["answer"])
    return majority(votes)


JUDGE_INSTRUCTION = (
    "You are the judge. Weigh the agents' reasoning, decide which answer is right (or work out "
    "the right one if none is), and give the final answer. Keep the reasoning short."
)


def judge_roles(transcript):
    check("judge", transcript)
    agents = transcript["agents"]
    if agents < 2:
        raise ValueError("judge: needs at least 2 agents")
    if transcript["turns"] < 2:
        raise ValueError("judge: needs at least 2 turns")
    judge = agents - 1
    return judge, [a for a in range(agents) if a != judge], transcript["turns"]


def judge_plan(task, turn, transcript):
    check_turn("judge", turn)
    judge, debaters, last = judge_roles(transcript)
    if turn > last:
        return []
    if turn < last:
        return [
            {"agent": a, "messages": debate_messages("judge", task, transcript, a, turn, debaters)}
            for a in debaters
        ]
    shown = []
    for a in debaters:
        u = latest(transcript, a, turn - 1)
        if u is not None:
            shown.append((f"Agent {u['agent'] + 1}", u["text"], None))
    if not shown:
        raise ValueError(f"judge: task `{task['id']}`: no debater has spoken before the judge's turn {turn}")
    content = (
        f"{question_block(task)}\n\nThe other agents debated this question. Their latest answers:\n\n"
        f"{render_shown(shown)}\n\n{JUDGE_INSTRUCTION}\n{FORMAT[task_kind(task)]}"
    )
    messages = system_message(None)
    messages.append({"role": "user", "content": content})
    return [{"agent": judge, "messages": messages}]


def judge_decide(task, turn, transcript):
    check_turn("judge", turn)
    judge, debaters, last = judge_roles(transcript)
    if turn < last:
        return majority(u["answer"] for u in at_turn(transcript, turn) if u["agent"] != judge)
    verdict = find(transcript, last, judge)
    if verdict is None:
        raise ValueError(f"judge: the judge (agent {judge}) has no utterance at its turn {last}")
    return [] if verdict["answer"] is None else [verdict["answer"]]


# --- verifiers (default settings) --------------------------------------------------------


def gsm8k_extract(text, hash_fallback=False, last_number_fallback=False):
    boxed = last_boxed(text)
    if boxed is not None:
        return parse_integer(boxed)
    # The fall-backs are off by default (and not ported).
    return None


def gsm8k_score(task, responses):
    gold = parse_integer(task["reference"])
    if gold is None:
        raise ValueError(f"gsm8k: task `{task['id']}`: the reference is not an integer")
    out = []
    for text in responses:
        answer = gsm8k_extract(text)
        correct = answer == gold
        out.append(
            {"answer": None if answer is None else str(answer), "score": 1.0 if correct else 0.0, "correct": correct}
        )
    return out


def gsm8k_extract_call(task, text):
    n = gsm8k_extract(text)
    return None if n is None else str(n)


def anli_score(task, responses):
    gold = nli_reference(task["reference"])
    if gold is None:
        raise ValueError(f"anli: task `{task['id']}`: the reference is not an NLI label")
    out = []
    for text in responses:
        answer = nli_label(text)
        correct = answer == gold
        out.append({"answer": answer, "score": 1.0 if correct else 0.0, "correct": correct})
    return out


def anli_extract_call(task, text):
    return nli_label(text)


def exact_match_extract(text, strip_articles=False):
    raw = last_boxed(text)
    if raw is None:
        raw = answer_line(text)
    if raw is None:
        raw = text
    answer = normalize(raw, strip_articles)
    return answer or None


def exact_match_score(task, responses):
    gold = normalize(task["reference"])
    if not gold:
        raise ValueError(f"exact-match: task `{task['id']}`: the reference is empty after normalisation")
    out = []
    for text in responses:
        answer = exact_match_extract(text)
        correct = answer == gold
        out.append({"answer": answer, "score": 1.0 if correct else 0.0, "correct": correct})
    return out


def exact_match_extract_call(task, text):
    return exact_match_extract(text)


STUB_PROBABILITY = 0.75


def stub_judge(question, responses):
    return [STUB_PROBABILITY] * len(responses)


def learned_extract(task, text, answers="auto", max_chars=0):
    if max_chars > 0 and len(text) > max_chars:
        return None
    labels = answers == "label" or (answers == "auto" and task["kind"] == "anli")
    if labels:
        return nli_label(text)
    boxed = last_boxed(text)
    n = None if boxed is None else parse_integer(boxed)
    return None if n is None else str(n)


def learned_score(task, responses, judge=stub_judge, invalid_score=0.0):
    if task["kind"] == "anli":
        gold = nli_reference(task["reference"])
    else:
        n = parse_integer(task["reference"])
        gold = None if n is None else str(n)
    if gold is None:
        raise ValueError(f"learned: task `{task['id']}`: the reference cannot be read")
    answers = [learned_extract(task, t) for t in responses]
    valid = [t for t, a in zip(responses, answers) if a is not None]
    probs = judge(task["question"], valid) if valid else []
    if len(probs) != len(valid):
        raise ValueError("learned: judge gave the wrong number of scores")
    probs = iter(probs)
    return [
        {"correct": a == gold, "answer": a, "score": next(probs) if a is not None else invalid_score}
        for a in answers
    ]


# --- shapers (default settings) ----------------------------------------------------------


def reward(turn, agent, parts):
    return {"turn": turn, "agent": agent, "total": sum(v for _, v in parts), "parts": [[n, v] for n, v in parts]}


def influence_value(transcript, u, last, gamma):
    num, den = u["score"], 1.0
    for t in range(u["turn"] + 1, last + 1):
        m = mean_score(transcript, t)
        if m is not None:
            d = gamma ** (t - u["turn"])
            num += d * m
            den += d
    return num / den


def influence_incentives(transcript, u, last, alpha_0, alpha_1, beta_0, beta_1):
    """The paper's incentives (beta_sign "paper"); not computed when every coefficient is 0,
    as in the plugin."""
    a0 = a1 = b0 = b1 = 0.0
    if u["turn"] >= 2:
        prev = find(transcript, u["turn"] - 1, u["agent"])
        others = [o["correct"] for o in at_turn(transcript, u["turn"] - 1) if o["agent"] != u["agent"]]
        if prev is not None and others:
            others_right = sum(others) / len(others) >= 0.5
            if not prev["correct"] and u["correct"]:
                if others_right:
                    a1 = alpha_1
                else:
                    a0 = alpha_0
            elif prev["correct"] and not u["correct"]:
                if others_right:
                    a0 = -alpha_0
                else:
                    a1 = -alpha_1
    if u["turn"] < last:
        moves = []
        for o in at_turn(transcript, u["turn"]):
            if o["agent"] != u["agent"]:
                nxt = find(transcript, u["turn"] + 1, o["agent"])
                if nxt is not None:
                    moves.append(not o["correct"] and nxt["correct"])
        if moves:
            f = sum(moves) / len(moves)
            if u["correct"]:
                b1 = beta_1 * f
            else:
                b0 = beta_0 * f
    return [a0, a1, b0, b1]


def influence_shape(task, transcript, gamma=0.3, alpha_0=0.0, alpha_1=0.0, beta_0=0.0, beta_1=0.0):
    check("influence", transcript)
    last = last_turn(transcript)
    if last is None:
        return []
    coefficients = (("alpha-0", alpha_0), ("alpha-1", alpha_1), ("beta-0", beta_0), ("beta-1", beta_1))
    incentives_on = any(c != 0.0 for _, c in coefficients)
    out = []
    for u in transcript["utterances"]:
        parts = [("influence", influence_value(transcript, u, last, gamma))]
        terms = (
            influence_incentives(transcript, u, last, alpha_0, alpha_1, beta_0, beta_1)
            if incentives_on
            else [0.0] * 4
        )
        for (name, c), value in zip(coefficients, terms):
            if c != 0.0:
                parts.append((name, value))
        out.append(reward(u["turn"], u["agent"], parts))
    return out


def final_only_shape(task, transcript):
    check("final-only", transcript)
    last = last_turn(transcript)
    if last is None:
        return []
    team = mean_score(transcript, last)  # noqa: F841 (computed as the plugin does; unused with share "individual")
    out = []
    for u in transcript["utterances"]:
        lt = latest(transcript, u["agent"], last)
        value = u["score"] if lt is None else lt["score"]
        out.append(reward(u["turn"], u["agent"], [("final", value)]))
    return out


PLAN = {"debate": debate_plan, "round_robin": round_robin_plan, "judge": judge_plan}
DECIDE = {"debate": debate_decide, "round_robin": round_robin_decide, "judge": judge_decide}
SCORE = {"gsm8k": gsm8k_score, "anli": anli_score, "exact_match": exact_match_score, "learned": learned_score}
EXTRACT = {
    "gsm8k": gsm8k_extract_call,
    "anli": anli_extract_call,
    "exact_match": exact_match_extract_call,
    "learned": learned_extract,
}
SHAPE = {"influence": influence_shape, "final_only": final_only_shape}


def call_of(case):
    """The port's function for a row, bound to the row's inputs (built once, outside timing)."""
    kind = case["kind"]
    task = case["task"]
    if kind == "plan":
        f, tr, turn = PLAN[case["protocol"]], case["transcript"], case["turn"]
        return lambda: f(task, turn, tr)
    if kind == "decide":
        f, tr, turn = DECIDE[case["protocol"]], case["transcript"], case["turn"]
        return lambda: f(task, turn, tr)
    if kind == "score":
        f, responses = SCORE[case["verifier"]], case["responses"]
        return lambda: f(task, responses)
    if kind == "extract":
        f, text = EXTRACT[case["verifier"]], case["text"]
        return lambda: f(task, text)
    if kind == "shape":
        f, tr = SHAPE[case["shaper"]], case["transcript"]
        return lambda: f(task, tr)
    raise ValueError(kind)


def same(a, b, path="output"):
    """Exact equality, floats within 1e-6 (Rust rounds rewards to f32)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), f"{path}: {a!r} vs {b!r}"
        assert abs(a - b) <= 1e-6 * max(1.0, abs(b)), f"{path}: {a!r} vs {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def stats(ns):
    ns = sorted(ns)
    n = len(ns)
    median = ns[n // 2] if n % 2 else (ns[n // 2 - 1] + ns[n // 2]) / 2
    p99 = ns[max(1, -(-n * 99 // 100)) - 1]
    return {"median_ns": float(median), "p99_ns": float(p99), "mean_ns": sum(ns) / n}


def time_calls(f, warmup, calls):
    for _ in range(warmup):
        f()
    clock = time.perf_counter_ns
    ns = []
    for _ in range(calls):
        t = clock()
        f()
        ns.append(clock() - t)
    return stats(ns)


def fmt_us(ns):
    if ns is None:
        return "-"
    us = ns / 1000
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 100 else f"{us:.0f}"


def time_port(rust_json, out_json):
    """Checks the port against the native outputs of a Rust run, times it, writes the times."""
    with open(rust_json) as f:
        rust = json.load(f)
    calls = int(os.environ.get("MAPORL_BENCH_CALLS", rust["calls"]))
    warmup = int(os.environ.get("MAPORL_BENCH_WARMUP", rust["warmup"]))
    clock = time_calls(lambda: None, warmup, calls)
    rows = []
    for row in rust["rows"]:
        case = row["case"]
        if case is None:
            continue
        f = call_of(case)
        try:
            same(f(), case["output"])
        except AssertionError as e:
            sys.exit(f"{row['plugin']} {row['call']}: the Python port differs from native Rust: {e}")
        rows.append({"plugin": row["plugin"], "call": row["call"], "python": time_calls(f, warmup, calls)})
    with open(out_json, "w") as f:
        json.dump({"python": platform.python_version(), "calls": calls, "warmup": warmup, "clock_ns": clock["median_ns"], "rows": rows}, f)


def best(runs):
    """The repetition with the lowest median, and the spread of the medians."""
    runs = [r for r in runs if r is not None]
    if not runs:
        return None
    b = dict(min(runs, key=lambda s: s["median_ns"]))
    b["medians_ns"] = [r["median_ns"] for r in runs]
    return b


def table(out_dir):
    reps = sorted(
        int(name[5:-5]) for name in os.listdir(out_dir) if name.startswith("rust-") and name.endswith(".json")
    )
    if not reps:
        sys.exit(f"no rust-N.json in {out_dir}")
    rust = [json.load(open(os.path.join(out_dir, f"rust-{r}.json"))) for r in reps]
    py = [json.load(open(os.path.join(out_dir, f"python-{r}.json"))) for r in reps]
    # BASELINE=REV runs: the same bench of another revision, run just before each repetition.
    base = [
        json.load(open(os.path.join(out_dir, f"base-{r}.json")))
        for r in reps
        if os.path.exists(os.path.join(out_dir, f"base-{r}.json"))
    ]
    rows = []
    for i, row in enumerate(rust[0]["rows"]):
        key = (row["plugin"], row["call"])
        python, base_wasm, base_fuel = [], [], None
        for p in py:
            python += [r["python"] for r in p["rows"] if (r["plugin"], r["call"]) == key]
        for b in base:
            for r in b["rows"]:
                if (r["plugin"], r["call"]) == key:
                    base_wasm.append(r["wasm"])
                    base_fuel = r.get("fuel")
        rows.append(
            {
                "plugin": row["plugin"],
                "call": row["call"],
                "wasm": best([r["rows"][i]["wasm"] for r in rust]),
                "native": best([r["rows"][i]["native"] for r in rust]),
                "python": best(python),
                "fuel": row["fuel"],
                "baseline_wasm": best(base_wasm),
                "baseline_fuel": base_fuel,
            }
        )

    def pair(s):
        return "-" if s is None else f"{fmt_us(s['median_ns'])} / {fmt_us(s['p99_ns'])}"

    def ratio(a, b):
        return "-" if a is None or b is None else f"{a['median_ns'] / b['median_ns']:.1f}x"

    head = (
        f"{'plugin':<12} {'call':<14} {'wasm med/p99 us':>16} {'native med/p99':>15} "
        f"{'python med/p99':>15} {'wasm/nat':>8} {'py/wasm':>7} {'fuel':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        w, n, p = r["wasm"], r["native"], r["python"]
        print(
            f"{r['plugin']:<12} {r['call']:<14} {pair(w):>16} {pair(n):>15} {pair(p):>15} "
            f"{ratio(w, n):>8} {ratio(p, w):>7} {'-' if r['fuel'] is None else r['fuel']:>7}"
        )
    if base:
        print(f"\nagainst the baseline ({len(base)} repetitions, each run just before this checkout's):")
        head = f"{'plugin':<12} {'call':<14} {'baseline us':>12} {'this us':>8} {'faster':>7} {'fuel baseline -> this':>24}"
        print(head)
        print("-" * len(head))
        for r in rows:
            b, w = r["baseline_wasm"], r["wasm"]
            if b is None:
                continue
            fuel = "-" if r["fuel"] is None else f"{r['baseline_fuel']} -> {r['fuel']}"
            print(
                f"{r['plugin']:<12} {r['call']:<14} {fmt_us(b['median_ns']):>12} {fmt_us(w['median_ns']):>8} "
                f"{ratio(b, w):>7} {fuel:>24}"
            )
    calls_rows = [r for r in rows if r["python"] is not None]
    under5_median = [r for r in calls_rows if r["wasm"]["median_ns"] < 5000]
    under5_p99 = [r for r in calls_rows if r["wasm"]["p99_ns"] < 5000]
    faster = [r for r in calls_rows if r["wasm"]["median_ns"] < r["python"]["median_ns"]]
    spread = max(
        max(s["medians_ns"]) / min(s["medians_ns"])
        for r in rows
        for s in (r["wasm"], r["native"], r["python"])
        if s is not None
    )
    print(
        f"\neach cell: the repetition (of {len(reps)}) with the lowest median, its median and p99; "
        f"{rust[0]['calls']} timed calls per row after {rust[0]['warmup']} warm-up calls, "
        f"restarts {rust[0]['restart_calls']} each"
    )
    print(f"largest spread of a row's medians across repetitions: {spread:.2f}x")
    print(
        f"clock: Rust {rust[0]['clock_ns']:.0f} ns, Python {py[0]['clock_ns']:.0f} ns per timed span "
        f"(median of an empty span; included in every number above)"
    )
    print(
        f"goal (every call under 5 us and faster than Python): wasm median under 5 us in "
        f"{len(under5_median)}/{len(calls_rows)} calls, p99 under 5 us in {len(under5_p99)}/{len(calls_rows)}, "
        f"faster than Python (median) in {len(faster)}/{len(calls_rows)} -> "
        f"{'MET' if len(under5_median) == len(faster) == len(calls_rows) else 'NOT MET'}"
    )
    doc = {
        "python": py[0]["python"],
        "repetitions": len(reps),
        "calls": rust[0]["calls"],
        "warmup": rust[0]["warmup"],
        "clock_ns": {"rust": rust[0]["clock_ns"], "python": py[0]["clock_ns"]},
        "stub_probability": rust[0]["stub_probability"],
        "seed": rust[0]["seed"],
        "rows": rows,
    }
    with open(os.path.join(out_dir, "plugins.json"), "w") as f:
        json.dump(doc, f, indent=1)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "time":
        time_port(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
