#!/usr/bin/env python3
"""The table of RESULTS.md's SmolLM2 run, from scripts/smollm2-fair.sh's run directory.

    python3 scripts/smollm2_table.py RUN_DIR [--keep results/smollm2/NAME.json]
    python3 scripts/smollm2_table.py results/smollm2/NAME.json

Reads the held-out chunks that both the untrained team (RUN_DIR/eval-before-OFFSET) and the
trained one (eval-after-TAG-OFFSET, TAG the adapters named in evaluated.txt) finished, and
prints per turn: each team's majority accuracy, the paired difference trained - untrained
with a bootstrap 95% interval (questions resampled), each team's own gain from turn 1, and
the conditional rates P(wrong->right | wrong, a peer right) and P(right->wrong | right, a peer
wrong). --keep writes what the table needs (per question, each team's credit at each turn;
the move counts; the training's step count and times), which the second form reads: the run
directory is not committed, the summary is. Standard library only; the credit and the rates
are scripts/fair_table.py's.
"""

import json
import random
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fair_table  # noqa: E402


def read_run(run):
    tag = (run / "evaluated.txt").read_text().split()[1]
    teams = {"untrained": [{}, {}], "trained": [{}, {}]}
    chunks = 0
    dirs = [p for p in run.glob("eval-before-*") if p.is_dir()]
    for before in sorted(dirs, key=lambda p: int(p.name.rsplit("-", 1)[1])):
        offset = before.name.rsplit("-", 1)[1]
        after = run / f"eval-after-{tag}-{offset}"
        if not (before / "eval.json").is_file() or not (after / "eval.json").is_file():
            continue
        chunks += 1
        for team, path in (("untrained", before), ("trained", after)):
            credits, _, report = fair_table.read_eval(path)
            teams[team][0].update(credits)
            for key, (moved, of) in report["rates"].items():
                c = teams[team][1].setdefault(key, [0, 0])
                c[0] += moved
                c[1] += of
    if not chunks:
        raise SystemExit(f"smollm2_table: no chunk of {run} was evaluated for both teams")
    steps = [json.loads(line) for line in open(run / "train" / "metrics.jsonl")]
    config = tomllib.loads((run / "train" / "config.toml").read_text())
    return {
        "adapters": tag,
        "steps": len(steps),
        "train_seconds": round(
            sum(s.get("rollout_seconds", 0) + s.get("update_seconds", 0) for s in steps), 1
        ),
        "device": config.get("device", "?"),
        "cpu": fair_table.cpu_name(),
        "teams": {
            team: {
                "credits": credits,
                "rates": [[t, kind, m, o] for (t, kind), (m, o) in sorted(rates.items())],
            }
            for team, (credits, rates) in teams.items()
        },
    }


def table(summary, resamples=10000):
    rng = random.Random(0)
    before = summary["teams"]["untrained"]["credits"]
    after = summary["teams"]["trained"]["credits"]
    ids = sorted(set(before) & set(after))
    turns = len(before[ids[0]])
    rates = {
        team: {(t, k): (m, o) for t, k, m, o in summary["teams"][team]["rates"]}
        for team in ("untrained", "trained")
    }
    head = f"| {len(ids)} held-out questions, {summary['steps']} PPO steps |"
    rows = [head + "".join(f" turn {t} |" for t in range(1, turns + 1)),
            "|---|" + "---|" * turns]

    def row(label, cells):
        rows.append(f"| {label} |" + "".join(f" {c} |" for c in cells))

    for team, credits in (("untrained", before), ("trained", after)):
        row(f"majority accuracy, {team}",
            [f"{fair_table.mean([credits[i][t] for i in ids]):.3f}" for t in range(turns)])
    row("trained - untrained [95%]", [
        fair_table.interval([[after[i][t] - before[i][t] for i in ids]], resamples, rng)
        for t in range(turns)])
    for team, credits in (("untrained", before), ("trained", after)):
        row(f"gain from turn 1, {team}", ["-"] + [
            fair_table.interval([[credits[i][t] - credits[i][0] for i in ids]], resamples, rng)
            for t in range(1, turns)])
    for key, label in (("corrected_by_peers", "P(W->R \\| wrong, a peer right)"),
                       ("misled_by_peers", "P(R->W \\| right, a peer wrong)")):
        for team in ("untrained", "trained"):
            cells = ["-"]
            for t in range(2, turns + 1):
                m, o = rates[team].get((t, key), (0, 0))
                cells.append(f"{m / o:.3f} ({m}/{o})" if o else "-")
            row(f"{label}, {team}", cells)
    return "\n".join(rows)


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    path = Path(args[0])
    summary = json.loads(path.read_text()) if path.is_file() else read_run(path)
    if "--keep" in args:
        fair_table.write_json(Path(args[args.index("--keep") + 1]), summary)
    print(table(summary))
    print(f"\n{summary['steps']} steps ({summary['train_seconds']} s of rollout and update) "
          f"on {summary['device']} ({summary['cpu']}); adapters {summary['adapters']}")


if __name__ == "__main__":
    main()
