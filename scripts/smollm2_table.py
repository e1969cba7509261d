#!/usr/bin/env python3
"""The table of RESULTS.md's SmolLM2 run, from scripts/smollm2-fair.sh's run directory.

    python3 scripts/smollm2_table.py RUN_DIR [--keep results/smollm2/NAME.json]
    python3 scripts/smollm2_table.py results/smollm2/NAME.json

Reads the held-out chunks that both the untrained team (RUN_DIR/eval-before-OFFSET) and the
trained one (eval-after-TAG-OFFSET, TAG the adapters named in evaluated.txt) finished, and
prints per turn: each team's majority accuracy, the paired difference trained - untrained
with a bootstrap 95% interval (questions resampled), each team's own gain from turn 1, and
the conditional rates P(wrong->right | wrong, a peer right) and P(right->wrong | right, a peer
wrong). --keep writes what the table needs (per question, each team's credit at each turn
and each agent's correctness, fair_table.py's "agents"; the move counts; the training's step
count and times), which the second form reads: the run directory is not committed, the
summary is. Standard library only; the credit and the rates
are scripts/fair_table.py's. Both forms also print the decomposition of the paired difference
by the untrained team's turn-1 outcome (scripts/fair_table.py's docstring defines it).

    python3 scripts/smollm2_table.py results/smollm2/FAMILY [--resamples 10000]
    python3 scripts/smollm2_table.py results/smollm2/FAMILY/ROW-seedS.json ... [--resamples 10000]

The third form reads several kept summaries (every ROW-seedS.json directly under a directory
that is not a run directory, or the files named, more than one): ROW names the run's row
(maporl, peers-hidden, ...; a file named cpu-seed0.json is row "cpu" at seed 0), each file
holding that run's untrained and trained teams. Per row, pooled over its seeds: each team's
majority accuracy; trained - untrained (each run against its own untrained team) per turn;
MAPoRL's trained team (row "maporl") minus every other row's trained team at the same seed,
on the questions both evaluated (peers-hidden among them); each interval both within seeds
[] and hierarchical, seeds then questions {} (scripts/fair_table.py's, each cell's generator
seeded from its name); the decomposition by turn-1 outcome of each row's trained - untrained;
and the conditional rates, summed over seeds.
"""

import json
import random
import re
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fair_table  # noqa: E402


def read_run(run):
    tag = (run / "evaluated.txt").read_text().split()[1]
    teams = {"untrained": [{}, {}, {}], "trained": [{}, {}, {}]}
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
            teams[team][2].update(report["agents"])
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
                "agents": agents,
                "rates": [[t, kind, m, o] for (t, kind), (m, o) in sorted(rates.items())],
            }
            for team, (credits, rates, agents) in teams.items()
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


def decomposition(summary):
    """The decomposition of one summary's trained - untrained by turn-1 outcome."""
    before = summary["teams"]["untrained"]["credits"]
    after = summary["teams"]["trained"]["credits"]
    ids = sorted(set(before) & set(after))
    turns = min(len(before[i]) for i in ids)
    title = (
        f"trained minus untrained, by the untrained team's turn-1 outcome ({len(ids)} questions):"
    )
    return "\n".join(
        [fair_table.DECOMPOSITION_NOTE, ""]
        + fair_table.decomposition_table(title, [(before[i], after[i]) for i in ids], turns)
    )


def load_many(paths):
    """{row: {seed: summary}} of the kept summaries ROW-seedS.json in paths (files, or
    directories whose ROW-seedS.json files are read)."""
    files = []
    for path in paths:
        files.extend(sorted(path.glob("*-seed*.json")) if path.is_dir() else [path])
    runs = {}
    for path in files:
        m = re.fullmatch(r"(.+)-seed(\d+)", path.stem)
        if not m:
            raise SystemExit(f"smollm2_table: {path} is not named ROW-seedS.json")
        summary = json.loads(path.read_text())
        if "teams" not in summary:
            raise SystemExit(f"smollm2_table: {path} is not a kept SmolLM2 summary (no teams)")
        seeds = runs.setdefault(m.group(1), {})
        if int(m.group(2)) in seeds:
            raise SystemExit(f"smollm2_table: two summaries of {m.group(1)} at seed {m.group(2)}")
        seeds[int(m.group(2))] = summary
    if not runs:
        raise SystemExit(f"smollm2_table: no kept summary ROW-seedS.json in {', '.join(map(str, paths))}")
    return runs


def many_tables(runs, resamples=10000):
    """The tables of several kept summaries (the third form), as text."""
    rows = sorted(runs, key=lambda r: (r != "maporl", r))
    out = [fair_table.INTERVALS_NOTE.format(resamples=resamples), ""]

    def credits(row, seed, team):
        return runs[row][seed]["teams"][team]["credits"]

    def common(a, b):
        return sorted(set(a) & set(b))

    def nturns(row):
        return min(
            len(c)
            for s in runs[row]
            for team in ("untrained", "trained")
            for c in credits(row, s, team).values()
        )

    turns = max(nturns(r) for r in rows)
    cols = " | ".join(f"turn {t}" for t in range(1, turns + 1))
    out += [f"| majority accuracy | team | seeds | questions | {cols} |", "|---|---|---|---|" + "---|" * turns]
    for row in rows:
        seeds = sorted(runs[row])
        ids = {s: common(credits(row, s, "untrained"), credits(row, s, "trained")) for s in seeds}
        for team in ("untrained", "trained"):
            cells = []
            for t in range(turns):
                values = [credits(row, s, team)[i][t] for s in seeds for i in ids[s]] if t < nturns(row) else []
                cells.append(f"{fair_table.mean(values):.3f}" if values else "-")
            n = sum(len(v) for v in ids.values())
            out.append(f"| {row} | {team} | {','.join(map(str, seeds))} | {n} | {' | '.join(cells)} |")

    def paired(title, header, pairs):
        """pairs: (label, seeds, per seed (first credits, second credits, ids), name, turns)."""
        out.extend(["", title, "", f"| {header} | seeds | {cols} |", "|---|---|" + "---|" * turns])
        for label, seeds, per_seed, name, last in pairs:
            cells = []
            for t in range(turns):
                if t >= last:
                    cells.append("-")
                    continue
                strata = [[a[i][t] - b[i][t] for i in ids] for a, b, ids in per_seed]
                cells.append(fair_table.cell(strata, resamples, f"{name} turn {t + 1}"))
            out.append(f"| {label} | {','.join(map(str, seeds))} | {' | '.join(cells)} |")

    own = []
    for row in rows:
        seeds = sorted(runs[row])
        per_seed = []
        for s in seeds:
            a, b = credits(row, s, "trained"), credits(row, s, "untrained")
            per_seed.append((a, b, common(a, b)))
        own.append((row, seeds, per_seed, f"smollm2 {row} trained - untrained", nturns(row)))
    paired(
        "Trained minus untrained (each run against its own untrained team, same draws), pooled over seeds:",
        "trained minus untrained",
        own,
    )
    if "maporl" in runs:
        others = []
        for row in rows:
            seeds = sorted(set(runs["maporl"]) & set(runs[row]))
            if row == "maporl" or not seeds:
                continue
            per_seed = []
            for s in seeds:
                a, b = credits("maporl", s, "trained"), credits(row, s, "trained")
                per_seed.append((a, b, common(a, b)))
            others.append(
                (row, seeds, per_seed, f"smollm2 maporl - {row} trained", min(nturns("maporl"), nturns(row)))
            )
        if others:
            paired(
                "MAPoRL's trained team minus each other row's trained team (same seed, the questions\n"
                "both evaluated), pooled over seeds:",
                "MAPoRL minus",
                others,
            )

    out.extend(["", fair_table.DECOMPOSITION_NOTE])
    for row, seeds, per_seed, _, last in own:
        pairs = [(b[i], a[i]) for a, b, ids in per_seed for i in ids]
        if last < 2 or not pairs:
            continue
        title = (
            f"{row}: trained minus untrained, by the untrained team's turn-1 outcome "
            f"(seeds {','.join(map(str, seeds))}; {len(pairs)} question-seeds):"
        )
        out.extend([""] + fair_table.decomposition_table(title, pairs, last))

    kinds = (("corrected_by_peers", "P(W->R \\| wrong, a peer right)"),
             ("misled_by_peers", "P(R->W \\| right, a peer wrong)"))
    heads = [f"{head} {t - 1}->{t}" for t in range(2, turns + 1) for _, head in kinds]
    out.extend(["", "Conditional rates, summed over agents and seeds (moved/of):", "",
                f"| row | team | {' | '.join(heads)} |", "|---|---|" + "---|" * len(heads)])
    for row in rows:
        for team in ("untrained", "trained"):
            cells = []
            for t in range(2, turns + 1):
                for kind, _ in kinds:
                    moved = of = 0
                    for summary in runs[row].values():
                        for tt, k, m, o in summary["teams"][team]["rates"]:
                            if (tt, k) == (t, kind):
                                moved, of = moved + m, of + o
                    cells.append(f"{moved / of:.3f} ({moved}/{of})" if of else "-")
            out.append(f"| {row} | {team} | {' | '.join(cells)} |")

    out.append("")
    for row in rows:
        for seed, summary in sorted(runs[row].items()):
            out.append(
                f"{row}, seed {seed}: {summary['steps']} steps ({summary['train_seconds']} s of rollout "
                f"and update) on {summary['device']} ({summary['cpu']}); adapters {summary['adapters']}"
            )
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    if not args:
        raise SystemExit(__doc__)
    keep_to, resamples, paths = None, 10000, []
    i = 0
    while i < len(args):
        if args[i] == "--keep":
            keep_to = Path(args[i + 1])
            i += 2
        elif args[i] == "--resamples":
            resamples = int(args[i + 1])
            i += 2
        else:
            paths.append(Path(args[i]))
            i += 1
    single = len(paths) == 1 and (paths[0].is_file() or (paths[0] / "evaluated.txt").is_file())
    if not single:
        if keep_to:
            raise SystemExit("smollm2_table: --keep takes one run directory")
        print(many_tables(load_many(paths), resamples))
        return
    path = paths[0]
    summary = json.loads(path.read_text()) if path.is_file() else read_run(path)
    if keep_to:
        fair_table.write_json(keep_to, summary)
    print(table(summary, resamples))
    print(f"\n{summary['steps']} steps ({summary['train_seconds']} s of rollout and update) "
          f"on {summary['device']} ({summary['cpu']}); adapters {summary['adapters']}")
    print()
    print(decomposition(summary))


if __name__ == "__main__":
    main()
