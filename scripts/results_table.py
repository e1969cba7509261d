"""The RESULTS.md tables from the runs scripts/results.sh wrote: held-out majority accuracy
per turn, mean and standard deviation over seeds, and the transitions summed over seeds."""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROWS = [
    ("off-the-shelf debate", None, "before"),
    ("single-agent RL (agent 0 learns)", "single", "after"),
    ("SFT on the best 10% of debates", "sft", "after"),
    ("MAPoRL, rule verifier (no learned verifier)", "maporl", "after"),
    ("MAPoRL with the learned verifier", "maporl-learned", "after"),
]


def main(out: Path) -> None:
    runs = defaultdict(dict)  # mode -> seed -> dir
    for d in sorted(out.iterdir()):
        if d.is_dir() and "-seed" in d.name and (d / "eval-after.json").is_file():
            mode, seed = d.name.rsplit("-seed", 1)
            runs[mode][int(seed)] = d
    if not runs:
        sys.exit(f"no finished runs under {out}")
    print("| held-out majority accuracy | seeds | turn 1 | turn 2 | turn 3 | RW/WR turn 1->2 | RW/WR turn 2->3 |")
    print("|---|---|---|---|---|---|---|")
    for name, mode, when in ROWS:
        # Off the shelf: every run's "before" evaluation (the same untrained team and seed).
        sources = runs["maporl"] if mode is None else runs.get(mode, {})
        reports = [
            json.loads((d / f"eval-{when}.json").read_text()) for d in sources.values()
        ]
        if not reports:
            continue
        turns = len(reports[0]["turns"])
        cells = []
        for t in range(turns):
            accs = [r["turns"][t]["majority_accuracy"] for r in reports]
            sd = statistics.stdev(accs) if len(accs) > 1 else 0.0
            cells.append(f"{statistics.mean(accs):.3f} ± {sd:.3f}")
        moves = []
        for t in range(1, turns):
            rw = sum(r["turns"][t]["transitions"]["rw"] for r in reports)
            wr = sum(r["turns"][t]["transitions"]["wr"] for r in reports)
            moves.append(f"{rw}/{wr}")
        seeds = ",".join(str(s) for s in sorted(sources))
        print(f"| {name} | {seeds} | " + " | ".join(cells + moves) + " |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/results"))
