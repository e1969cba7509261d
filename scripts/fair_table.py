#!/usr/bin/env python3
"""The tables of RESULTS.md's fair test, from scripts/fair.sh's runs.

    python3 scripts/fair_table.py [results/fair] [--resamples 2000]
    python3 scripts/fair_table.py keep RUN_DIR/eval results/fair/ROW-seedS.json BUILD MODEL...
    python3 scripts/fair_table.py keep-curve RUN_DIR/eval results/fair/curve-seedS-step-N.json BUILD MODEL...

The tables read the kept summaries (results/fair, committed: a run's directory under runs/
is not, and a fresh checkout has none). `keep` writes one evaluation's summary: per question,
the team's credit at each turn, and the conditional and unaided move counts; `keep-curve`
writes a curve point's per-turn accuracy. BUILD names the commit whose build ran it, MODEL
the warm-started model directories its team used (their weights' sha256 are kept), and the
CPU is recorded. Rows are compared only within one build and one set of models (a faster
kernel or another warm start changes the sampled text, and then rows at one seed no longer
differ only by their weights); summaries from different CPUs are flagged, since a CPU that
rounds differently samples other text from the same weights.

For every row (a summary ROW-seedS.json, kept from maporl eval's transcripts.jsonl and
eval.json):
- the team's held-out accuracy per turn (the paper's majority with its tie rule, the same
  credit as `maporl eval`), mean and standard deviation over seeds;
- the paired difference from the row's untrained team (off-the-shelf; for the heterogeneous
  and cross-domain teams, their own untrained versions) per turn, pooled over seeds question
  by question, with a bootstrap 95% interval that resamples questions within each seed; and
  MAPoRL's paired difference from every other row on the same model, and MAPoRL at 128
  steps' from each other 128-step row;
- the row's own gain from turn 1 to each later turn (paired within the row) with its
  interval;
- the conditional rates P(wrong->right | wrong, a peer right) and P(right->wrong | right, a
  peer wrong) at each transition, summed over agents and seeds;
- the training curves (`scripts/fair.sh curve` and `curve-long`): the maporl and maporl-long
  rows' checkpoints on the first held-out questions, per seed.
Standard library only.
"""

import hashlib
import json
import platform
import random
import re
import statistics
import sys
from pathlib import Path

ORDER = [
    "off-the-shelf",
    "single",
    "sft",
    "maporl",
    "maporl-long",
    "maporl-current",
    "maporl-current-long",
    "maporl-alpha",
    "maporl-beta",
    "maporl-beta-code",
    "maporl-learned",
    "heterogeneous-before",
    "heterogeneous",
    "cross-domain-before",
    "cross-domain",
    "cross-domain-reverse-same",
    "cross-domain-reverse-before",
    "cross-domain-reverse",
    "cross-domain-same",
]
LABEL = {
    "off-the-shelf": "off-the-shelf (untrained team)",
    "single": "single-agent RL (agent 0 learns)",
    "sft": "SFT on the best 10% of debates",
    "maporl": "MAPoRL, rule verifier",
    "maporl-long": "MAPoRL, rule verifier, 128 steps",
    "maporl-current": "MAPoRL without influence (horizon = current)",
    "maporl-current-long": "MAPoRL without influence, 128 steps",
    "maporl-alpha": "MAPoRL + alpha_1 = 2",
    "maporl-beta": "MAPoRL + beta_0 = 2 (paper's sign)",
    "maporl-beta-code": "MAPoRL + beta_0 = 2 (code's sign)",
    "maporl-learned": "MAPoRL, learned verifier (all turns)",
    "heterogeneous-before": "heterogeneous team, untrained",
    "heterogeneous": "heterogeneous team, MAPoRL",
    "cross-domain-before": "cross-domain: untrained, on subtraction",
    "cross-domain": "cross-domain: MAPoRL on addition, on subtraction",
    "cross-domain-reverse-same": "cross-domain: MAPoRL on subtraction, on subtraction",
    "cross-domain-reverse-before": "cross-domain: untrained, on addition",
    "cross-domain-reverse": "cross-domain: MAPoRL on subtraction, on addition",
    "cross-domain-same": "cross-domain: MAPoRL on addition, on addition",
}
# Each trained row's untrained team: the same models on the same questions. The cross-domain
# rows are evaluated on subtraction (cross-domain, cross-domain-reverse-same) or on addition
# (cross-domain-reverse, cross-domain-same), and only teams on the same family pair up.
BASE = {
    "heterogeneous": "heterogeneous-before",
    "cross-domain": "cross-domain-before",
    "cross-domain-reverse-same": "cross-domain-before",
    "cross-domain-reverse": "cross-domain-reverse-before",
    "cross-domain-same": "cross-domain-reverse-before",
}


def credit(debate, turn):
    """The team answer's credit after `turn` (host/src/eval/mod.rs `credit`)."""
    decisions = debate.get("decisions") or []
    if not decisions:
        return 0.0
    decision = decisions[turn - 1] if turn - 1 < len(decisions) else decisions[-1]
    utterances = debate["transcript"]["utterances"]

    def right(answer):
        giving = [u for u in utterances if u["turn"] <= turn and u.get("answer") == answer]
        if not giving:
            return False
        last = max(u["turn"] for u in giving)
        return any(u["turn"] == last and u["correct"] for u in giving)

    if decision and any(right(a) for a in decision):
        return 1.0 / len(decision)
    return 0.0


def unaided(debate, counts):
    """Adds to counts[(turn, kind)] = [moved, of] the moves no peer could have shown: an
    agent wrong at turn-1 while every peer was wrong too, right now ("self"); an agent right
    while every peer was right too, wrong now ("drift")."""
    said = {(u["turn"], u["agent"]): u["correct"] for u in debate["transcript"]["utterances"]}
    agents = debate["transcript"]["agents"]
    for t in range(2, debate["transcript"]["turns"] + 1):
        for a in range(agents):
            if (t, a) not in said or (t - 1, a) not in said:
                continue
            peers = [said.get((t - 1, p)) for p in range(agents) if p != a]
            if None in peers:
                continue
            before, now = said[(t - 1, a)], said[(t, a)]
            if not before and not any(peers):
                c = counts.setdefault((t, "self"), [0, 0])
                c[0] += now
                c[1] += 1
            if before and all(peers):
                c = counts.setdefault((t, "drift"), [0, 0])
                c[0] += not now
                c[1] += 1


def read_eval(path):
    """{task id: [credit at turn 1, 2, ...]}, the turn count, the report and the unaided
    moves of one evaluation."""
    out, turns, counts = {}, 0, {}
    with open(path / "transcripts.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if d.get("error"):
                continue
            t = d["transcript"]["turns"]
            turns = max(turns, t)
            out[d["task"]["id"]] = [credit(d, k) for k in range(1, t + 1)]
            unaided(d, counts)
    report = json.loads((path / "eval.json").read_text())
    # maporl eval's conditional rates beside the unaided moves, keyed alike.
    for metrics in report["turns"]:
        for key in ("corrected_by_peers", "misled_by_peers"):
            rate = metrics.get(key) or {}
            counts[(metrics["turn"], key)] = [rate.get("moved", 0), rate.get("of", 0)]
    report["rates"] = counts
    return out, turns, report


def provenance(build, models):
    """What a kept result was made with: the build, each model's weights, the CPU."""
    hashes = {}
    for m in models:
        digest = hashlib.sha256((Path(m) / "model.safetensors").read_bytes()).hexdigest()
        hashes[Path(m).name] = digest
    return {"build": build, "models": hashes, "cpu": cpu_name()}


def cpu_name():
    """This machine's CPU model (a CPU that rounds differently samples other text)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def keep(eval_dir, out, build, *models):
    """Writes the summary of one evaluation that the tables need, atomically."""
    credits, turns, report = read_eval(Path(eval_dir))
    summary = {
        **provenance(build, models),
        "turns": turns,
        "credits": credits,
        "rates": [[t, kind, moved, of] for (t, kind), (moved, of) in sorted(report["rates"].items())],
    }
    write_json(Path(out), summary)


def keep_curve(eval_dir, out, build, *models):
    """Writes a curve point: the evaluation's question count and per-turn accuracy."""
    report = json.loads((Path(eval_dir) / "eval.json").read_text())
    point = {
        **provenance(build, models),
        "tasks": report["tasks"],
        "majority_accuracy": [t["majority_accuracy"] for t in report["turns"]],
    }
    write_json(Path(out), point)


def write_json(path, value):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n")
    tmp.replace(path)


def read_kept(path):
    """A kept summary as read_eval returns it."""
    summary = json.loads(path.read_text())
    rates = {(t, kind): [moved, of] for t, kind, moved, of in summary["rates"]}
    meta = {k: summary.get(k) for k in ("build", "models", "cpu")}
    return summary["credits"], summary["turns"], {"rates": rates, **meta}


def bootstrap(strata, stat, resamples, rng):
    """Percentile 95% interval of stat over resamples drawn within each stratum."""
    values = []
    for _ in range(resamples):
        pooled = []
        for s in strata:
            pooled.extend(rng.choices(s, k=len(s)))
        values.append(stat(pooled))
    values.sort()
    return values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]


def interval(strata, resamples, rng):
    """The pooled mean of strata's values and its bootstrap 95% interval, as a table cell.
    rng is a random.Random, or a string naming the cell that seeds one of its own: a cell's
    interval then does not move when another row gains a seed."""
    if isinstance(rng, str):
        rng = random.Random(rng)
    d = mean([x for s in strata for x in s])
    lo, hi = bootstrap(strata, mean, resamples, rng)
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    args = sys.argv[1:]
    if args and args[0] in ("keep", "keep-curve"):
        if len(args) < 5:
            sys.exit(f"fair_table: usage: {args[0]} EVAL_DIR OUT.json BUILD MODEL...")
        (keep if args[0] == "keep" else keep_curve)(*args[1:])
        return
    resamples = 2000
    if "--resamples" in args:
        i = args.index("--resamples")
        resamples = int(args[i + 1])
        del args[i : i + 2]
    root = Path(args[0] if args else "results/fair")
    runs, builds, models, cpus = {}, set(), {}, set()
    for path in sorted(root.glob("*-seed*.json")):
        m = re.fullmatch(r"(.+)-seed(\d+)", path.stem)
        if not m or m.group(1).startswith("curve"):
            continue
        kept = read_kept(path)
        meta = kept[2]
        builds.add(meta["build"])
        cpus.add(meta["cpu"])
        for name, digest in (meta["models"] or {}).items():
            if models.setdefault(name, (digest, path.name))[0] != digest:
                sys.exit(
                    f"fair_table: {path.name} used another {name} than {models[name][1]} "
                    f"(weights {digest[:12]} against {models[name][0][:12]}): rows are "
                    "paired only on the same models"
                )
        runs.setdefault(m.group(1), {})[int(m.group(2))] = kept
    if not runs:
        sys.exit(f"fair_table: no kept evaluation under {root}")
    if len(builds) > 1:
        sys.exit(f"fair_table: the summaries under {root} come from several builds ({sorted(builds)}): rows are paired only within one")
    if len(cpus) > 1:
        print(
            f"Note: these summaries come from {len(cpus)} CPUs ({'; '.join(sorted(map(str, cpus)))}): "
            "across them the same weights sample other text, so pairs are looser.\n"
        )
    rows = [r for r in ORDER if r in runs] + sorted(set(runs) - set(ORDER))
    turns = max(t for r in runs.values() for (_, t, _) in r.values())
    cols = " | ".join(f"turn {t}" for t in range(1, turns + 1))
    gains = " | ".join(f"turn {t} - turn 1" for t in range(2, turns + 1))
    print(f"| held-out majority accuracy | seeds | {cols} | {gains} |")
    print("|---|---|" + "---|" * (2 * turns - 1))
    for row in rows:
        seeds = sorted(runs[row])
        cells = []
        for t in range(turns):
            accs = [mean([c[t] for c in runs[row][s][0].values()]) for s in seeds]
            if len(accs) > 1:
                cells.append(f"{mean(accs):.3f} ± {statistics.stdev(accs):.3f}")
            else:
                cells.append(f"{accs[0]:.3f}")
        for t in range(1, turns):
            strata = [[c[t] - c[0] for c in runs[row][s][0].values()] for s in seeds]
            cells.append(interval(strata, resamples, f"{row} turn {t + 1} - turn 1"))
        seeds_s = ",".join(map(str, seeds))
        print(f"| {LABEL.get(row, row)} | {seeds_s} | {' | '.join(cells)} |")

    def paired_table(title, header, pairs):
        """One line per (row, first, second): first minus second, per turn."""
        print()
        print(title)
        print()
        print(f"| {header} | seeds | {cols} |")
        print("|---|---|" + "---|" * turns)
        for row, first, second in pairs:
            seeds = sorted(set(runs[first]) & set(runs[second]))
            if not seeds:
                continue
            cells = []
            for t in range(turns):
                strata = []
                for s in seeds:
                    a, b = runs[first][s][0], runs[second][s][0]
                    strata.append([a[i][t] - b[i][t] for i in a if i in b])
                cells.append(interval(strata, resamples, f"{first} - {second} turn {t + 1}"))
            print(f"| {LABEL.get(row, row)} | {','.join(map(str, seeds))} | {' | '.join(cells)} |")

    def base_of(row):
        if row in BASE:
            return BASE[row]
        return row if row.endswith("-before") else "off-the-shelf"

    paired_table(
        "Paired differences from the untrained team (same seed, same draws), pooled over seeds,\n"
        "with bootstrap 95% intervals over questions:",
        "row minus its untrained team",
        [(r, r, base_of(r)) for r in rows if r != base_of(r) and base_of(r) in runs],
    )
    if "maporl" in runs:
        paired_table(
            "MAPoRL (rule verifier) minus each other row on the same model, paired the same way:",
            "MAPoRL minus",
            [
                (r, "maporl", r)
                for r in rows
                if r != "maporl" and not r.startswith(("heterogeneous", "cross-domain"))
            ],
        )

    if "maporl-long" in runs:
        paired_table(
            "MAPoRL at 128 steps minus each other row at 128 steps, paired the same way:",
            "MAPoRL, 128 steps, minus",
            [(r, "maporl-long", r) for r in rows if r.endswith("-long") and r != "maporl-long"],
        )

    def rate_table(title, kinds):
        """Per row, each transition's rates of `kinds` ((key, heading) pairs), summed."""
        print()
        print(title)
        print()
        heads = [f"{head} {t-1}→{t}" for t in range(2, turns + 1) for _, head in kinds]
        print(f"| row | {' | '.join(heads)} |")
        print("|---|" + "---|" * len(heads))
        for row in rows:
            cells = []
            for t in range(2, turns + 1):
                for kind, _ in kinds:
                    moved = of = 0
                    for _, _, report in runs[row].values():
                        m, o = report["rates"].get((t, kind), (0, 0))
                        moved, of = moved + m, of + o
                    cells.append(f"{moved / of:.3f} ({moved}/{of})" if of else "-")
            print(f"| {LABEL.get(row, row)} | {' | '.join(cells)} |")

    rate_table(
        "Conditional rates, summed over agents and seeds (moved/of):",
        [
            ("corrected_by_peers", "P(W→R \\| wrong, a peer right)"),
            ("misled_by_peers", "P(R→W \\| right, a peer wrong)"),
        ],
    )
    rate_table(
        "Moves no peer could have shown, summed over agents and seeds: a wrong agent whose\n"
        "peers were all wrong too, right at the next turn (self-correction); a right agent\n"
        "whose peers were all right too, wrong at the next turn (drift):",
        [("self", "P(W→R \\| all wrong)"), ("drift", "P(R→W \\| all right)")],
    )

    points = []
    for path in root.glob("curve*-seed*-step-*.json"):
        m = re.fullmatch(r"curve(-long)?-seed(\d+)-step-(\d+)", path.stem)
        if m:
            steps = 128 if m.group(1) else 32
            point = json.loads(path.read_text())
            points.append((steps, int(m.group(2)), int(m.group(3)), point))
    if points:
        print()
        print(
            "Training curves: the maporl rows' checkpoints (32 steps, and 128 steps with the\n"
            "learning rate decayed over 128) on the first held-out questions:"
        )
        print()
        print(f"| row | seed | step | questions | {cols} |")
        print("|---|---|---|---|" + "---|" * turns)
        for steps, seed, step, point in sorted(points, key=lambda p: p[:3]):
            accs = " | ".join(f"{a:.3f}" for a in point["majority_accuracy"])
            print(f"| {steps} steps | {seed} | {step} | {point['tasks']} | {accs} |")


if __name__ == "__main__":
    main()
