#!/usr/bin/env python3
"""The tables of RESULTS.md's fair test, from scripts/fair.sh's runs.

    python3 scripts/fair_table.py [results/fair] [--resamples 2000]
    python3 scripts/fair_table.py keep RUN_DIR/eval results/fair/ROW-seedS.json BUILD MODEL...
    python3 scripts/fair_table.py keep-curve RUN_DIR/eval results/fair/curve-seedS-step-N.json BUILD MODEL...
    python3 scripts/fair_table.py add-agents RUN_DIR/eval results/fair/ROW-seedS.json
    python3 scripts/fair_table.py --self-test

The tables read the kept summaries (results/fair, committed: a run's directory under runs/
is not, and a fresh checkout has none). `keep` writes one evaluation's summary: per question,
the team's credit at each turn, each agent's correctness at each turn ("agents", below), and
the conditional and unaided move counts; `keep-curve` writes a curve point's per-turn
accuracy. BUILD names the commit whose build ran it, MODEL the warm-started model directories
its team used (their weights' sha256 are kept), and the CPU is recorded. Rows are compared
only within one build and one set of models (a faster kernel or another warm start changes
the sampled text, and then rows at one seed no longer differ only by their weights): one
model name must have the same weights in every summary, and two rows are paired only when
they used the same model names (so the drift-free rows, on fair-model-d, pair only with each
other); summaries from different CPUs are flagged, since a CPU that rounds differently
samples other text from the same weights. `--self-test` checks the statistics below on
synthetic summaries in a temporary directory and exits non-zero on a failure.

For every row (a summary ROW-seedS.json, kept from maporl eval's transcripts.jsonl and
eval.json):
- the team's held-out accuracy per turn (the paper's majority with its tie rule, the same
  credit as `maporl eval`), mean and standard deviation over seeds; a row with fewer turns
  than others (the vote rows have turn 1 only) shows "-" for the turns it lacks, and is
  paired only on the turns both rows have;
- the paired difference from the row's untrained team (off-the-shelf; for the
  heterogeneous, cross-domain, peers-hidden and drift-free teams, their own untrained
  versions) per turn, pooled over seeds question by question; MAPoRL's paired difference
  from every other row on the same model; MAPoRL at 128 steps' from each other 128-step
  row; MAPoRL with turn 1 trained minus the same without the influence term; and MAPoRL's
  turns 2 and 3 minus a vote over 6 or 9 independent turn-1 answers (the vote rows'
  compute-matched comparison);
- the row's own gain from turn 1 to each later turn (paired within the row);
- the conditional rates P(wrong->right | wrong, a peer right) and P(right->wrong | right, a
  peer wrong) at each transition, summed over agents and seeds, and the unaided moves;
- the training curves (`scripts/fair.sh curve` and `curve-long`): the maporl and maporl-long
  rows' checkpoints on the first held-out questions, per seed.

Definitions, so that the numbers can be re-derived from the summaries alone. A row's credits
at seed S are `credits` of ROW-seedS.json: {question id: [credit at turn 1, 2, ...]}, each
credit 1, 0 or 1/k (a k-way tie of the team's majority that holds the right answer).
- Paired difference of `first` minus `second` at turn t: the question-seeds are every
  (seed S, question q) with S in both rows' seeds and q in both rows' credits at S; for each,
  x = first[S][q][t] - second[S][q][t]; the cell's number is the mean of x over all
  question-seeds pooled (not a mean of seed means). A row's gain "turn t - turn 1" is the
  same with x = row[S][q][t] - row[S][q][1].
- Intervals, each a percentile 95% interval over R resamples (default 2000) of the pooled
  mean of x: the sorted resampled means' entries int(0.025 R) and int(0.975 R) - 1 (0-based).
  A cell reads `d [lo, hi] {lo, hi}`:
  [] within-seed: each resample draws, for every seed, as many of that seed's x as it has,
     with replacement, and pools them (the training runs held fixed);
  {} hierarchical, seeds then questions: each resample first draws as many seeds as there
     are, with replacement, then for each drawn seed (a seed drawn twice is drawn into
     twice) as many of its x as it has, with replacement, and takes the mean of all the x
     drawn; it covers the variation between training runs as well as between questions.
     With one seed the seed draw is skipped, and it is the within-seed bootstrap.
  Each cell's generator is random.Random(NAME) for the cell's own name, so a cell's intervals
  move only when its own rows' seeds do: "ROW turn T - turn 1" for a row's gain, "FIRST -
  SECOND turn T" for a paired difference (e.g. "maporl - off-the-shelf turn 2"), "maporl turn
  T - VOTE turn 1" for a vote; the hierarchical draws use NAME + " | seeds, then questions"
  (HIER_SUFFIX). The draws, in order, per resample: [] rng.choices(x of seed, k=its count)
  for each seed in ascending order; {} rng.choices(the seeds' lists, k=number of seeds) (not
  drawn with one seed), then rng.choices(x of drawn seed, k=its count) for each drawn seed
  in the drawn order. When every x of a cell is the same number, every resample's mean is
  that number and the draws are skipped.
- Decomposition by turn-1 outcome, of a trained row against its untrained team, on the
  question-seeds of the paired difference (above): each question-seed's stratum is the
  UNTRAINED team's turn-1 credit c = untrained[S][q][1]: "right" if c == 1, "wrong" if
  c == 0 (a tie of wrong answers scores 0 and counts here), "tie" otherwise (a tie that
  holds the right answer, 0 < c < 1). With N question-seeds in all and n in a stratum, for
  each turn t >= 2: share = n / N; untrained = the mean of untrained[S][q][t] over the
  stratum; row = the mean of row[S][q][t] over it; contribution = share x (row - untrained)
  = (sum of row[S][q][t] - sum of untrained[S][q][t] over the stratum) / N. The three
  contributions sum to the paired difference at turn t; they are computed exactly (each
  credit as the exact fraction of its float), and the table prints their sum beside the
  paired difference. Turn 1 is the same text in the two rows when turn 1 is frozen, so the
  strata are those of either; where the rows' turn-1 credits differ (a row that trains turn
  1 too), the table says on how many question-seeds, and the strata stay the untrained
  team's.
- "agents" (optional in a summary): {question id: [one string per turn]}, the string's
  character a being agent a's correctness at that turn: "1" right, "0" wrong, "-" no
  utterance. β₀'s target transition at turn t (2, 3), per row: over every seed with the key,
  question, agent a and peer p != a such that a's and p's characters at turn t-1 are both
  "0" and p's at turn t is "1" or "0", count the pairs (of) and those where p's is "1"
  (moved); the table prints moved/of. It is P(a peer wrong at t-1 is right at t | agent a
  and that peer wrong at t-1), the event the paper's β₀ rewards agent a for ("an incorrect
  answer that still leads others to the right answer"); a peer wrong beside k wrong agents
  counts k times.
Standard library only.
"""

import contextlib
import hashlib
import io
import json
import platform
import random
import re
import statistics
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

ORDER = [
    "off-the-shelf",
    "off-the-shelf-hidden",
    "off-the-shelf-echo",
    "vote-6",
    "vote-9",
    "single",
    "single-all",
    "sft",
    "sft-matched",
    "sft-teachers",
    "maporl",
    "maporl-long",
    "maporl-t1",
    "maporl-current",
    "maporl-current-long",
    "maporl-current-t1",
    "maporl-alpha",
    "maporl-beta",
    "maporl-beta-code",
    "maporl-learned",
    "maporl-grpo",
    "peers-hidden",
    "peers-hidden-shown",
    "peers-echo",
    "peers-echo-shown",
    "heterogeneous-before",
    "heterogeneous",
    "cross-domain-before",
    "cross-domain",
    "cross-domain-reverse-same",
    "cross-domain-reverse-before",
    "cross-domain-reverse",
    "cross-domain-same",
    "drift-free-before",
    "drift-free",
    "drift-free-echo-shown",
]
LABEL = {
    "off-the-shelf": "off-the-shelf (untrained team)",
    "off-the-shelf-hidden": "untrained team, peers hidden",
    "off-the-shelf-echo": "untrained team, peers echoed (own answers shown as peers')",
    "peers-echo": "RL with peers echoed (own correctness reward)",
    "peers-echo-shown": "RL with peers echoed, evaluated with peers shown",
    "vote-6": "vote over 6 independent turn-1 answers",
    "vote-9": "vote over 9 independent turn-1 answers",
    "single": "single-agent RL (agent 0 learns)",
    "single-all": "single-agent RL's adapter on all three agents",
    "sft": "SFT on the best 10% of debates",
    "sft-matched": "SFT, budget matched to MAPoRL",
    "sft-teachers": "SFT on the teachers' turn-2/3 utterances",
    "maporl": "MAPoRL, rule verifier",
    "maporl-long": "MAPoRL, rule verifier, 128 steps",
    "maporl-t1": "MAPoRL, turn 1 trained too",
    "maporl-current": "MAPoRL without influence (horizon = current)",
    "maporl-current-long": "MAPoRL without influence, 128 steps",
    "maporl-current-t1": "MAPoRL without influence, turn 1 trained too",
    "maporl-alpha": "MAPoRL + alpha_1 = 2",
    "maporl-beta": "MAPoRL + beta_0 = 2 (paper's sign)",
    "maporl-beta-code": "MAPoRL + beta_0 = 2 (code's sign)",
    "maporl-learned": "MAPoRL, learned verifier (all turns)",
    "maporl-grpo": "MAPoRL with GRPO (groups of 4, no critic)",
    "peers-hidden": "RL with peers hidden (own correctness reward)",
    "peers-hidden-shown": "RL with peers hidden, evaluated with peers shown",
    "heterogeneous-before": "heterogeneous team, untrained",
    "heterogeneous": "heterogeneous team, MAPoRL",
    "cross-domain-before": "cross-domain: untrained, on subtraction",
    "cross-domain": "cross-domain: MAPoRL on addition, on subtraction",
    "cross-domain-reverse-same": "cross-domain: MAPoRL on subtraction, on subtraction",
    "cross-domain-reverse-before": "cross-domain: untrained, on addition",
    "cross-domain-reverse": "cross-domain: MAPoRL on subtraction, on addition",
    "cross-domain-same": "cross-domain: MAPoRL on addition, on addition",
    "drift-free-before": "untrained team, non-drifting warm start",
    "drift-free": "MAPoRL, non-drifting warm start",
    "drift-free-echo-shown": "RL with peers echoed, evaluated with peers shown, non-drifting warm start",
}
# Each trained row's untrained team: the same models on the same questions. The cross-domain
# rows are evaluated on subtraction (cross-domain, cross-domain-reverse-same) or on addition
# (cross-domain-reverse, cross-domain-same), and only teams on the same family pair up.
# peers-hidden is evaluated with peers hidden, like its untrained team; peers-hidden-shown
# (the same adapters with peers shown) pairs with off-the-shelf.
BASE = {
    "heterogeneous": "heterogeneous-before",
    "cross-domain": "cross-domain-before",
    "cross-domain-reverse-same": "cross-domain-before",
    "cross-domain-reverse": "cross-domain-reverse-before",
    "cross-domain-same": "cross-domain-reverse-before",
    "peers-hidden": "off-the-shelf-hidden",
    "peers-echo": "off-the-shelf-echo",
    "drift-free": "drift-free-before",
    "drift-free-echo-shown": "drift-free-before",
}
# Rows that are an untrained team (besides every *-before row): never a trained row.
UNTRAINED = {"off-the-shelf", "off-the-shelf-hidden", "off-the-shelf-echo"}
# Further pairs for the table of differences from an untrained team: (row, untrained team,
# label). peers-hidden against the untrained team with peers shown, beside its own.
EXTRA_BASE = [
    (
        "peers-hidden",
        "off-the-shelf",
        "RL with peers hidden (own correctness reward), against the untrained team with peers shown",
    ),
    (
        "peers-echo",
        "off-the-shelf",
        "RL with peers echoed (own correctness reward), against the untrained team with peers shown",
    ),
]
# The rows that are not a model on fair-model beside MAPoRL (another model, or a vote).
OTHER_MODEL = ("heterogeneous", "cross-domain", "drift-free")
# Appended to a cell's name to seed its hierarchical draws (another stream than its []).
HIER_SUFFIX = " | seeds, then questions"
# The untrained team's turn-1 outcomes of the decomposition (the module docstring).
OUTCOMES = ("right", "wrong", "tie")


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


def agent_marks(debate):
    """One string per turn, character a agent a's correctness at that turn: "1" right, "0"
    wrong, "-" no utterance (the summaries' "agents")."""
    said = {(u["turn"], u["agent"]): u["correct"] for u in debate["transcript"]["utterances"]}
    agents = debate["transcript"]["agents"]
    return [
        "".join("-" if (t, a) not in said else "1" if said[(t, a)] else "0" for a in range(agents))
        for t in range(1, debate["transcript"]["turns"] + 1)
    ]


def read_eval(path):
    """{task id: [credit at turn 1, 2, ...]}, the turn count, the report and the unaided
    moves of one evaluation; report["agents"] holds each question's agent_marks."""
    out, turns, counts, marks = {}, 0, {}, {}
    with open(path / "transcripts.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if d.get("error"):
                continue
            t = d["transcript"]["turns"]
            turns = max(turns, t)
            out[d["task"]["id"]] = [credit(d, k) for k in range(1, t + 1)]
            marks[d["task"]["id"]] = agent_marks(d)
            unaided(d, counts)
    report = json.loads((path / "eval.json").read_text())
    # maporl eval's conditional rates beside the unaided moves, keyed alike.
    for metrics in report["turns"]:
        for key in ("corrected_by_peers", "misled_by_peers"):
            rate = metrics.get(key) or {}
            counts[(metrics["turn"], key)] = [rate.get("moved", 0), rate.get("of", 0)]
    report["rates"] = counts
    report["agents"] = marks
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
        "agents": report["agents"],
        "rates": [[t, kind, moved, of] for (t, kind), (moved, of) in sorted(report["rates"].items())],
    }
    write_json(Path(out), summary)


def add_agents(eval_dir, kept):
    """Adds the per-agent record ("agents") of a new evaluation to a summary kept without
    one, once the evaluation is shown to be the kept one: every question's credits and the
    rates must be equal, else nothing is written."""
    credits, _, report = read_eval(Path(eval_dir))
    path = Path(kept)
    summary = json.loads(path.read_text())
    rates = [[t, kind, moved, of] for (t, kind), (moved, of) in sorted(report["rates"].items())]
    if credits != summary["credits"] or rates != summary["rates"]:
        differ = sum(1 for q, c in summary["credits"].items() if credits.get(q) != c)
        sys.exit(
            f"fair_table: {eval_dir} is not the evaluation kept in {kept} ({differ} of "
            f"{len(summary['credits'])} questions' credits differ): nothing added"
        )
    summary["agents"] = report["agents"]
    cpu = cpu_name()
    if cpu != summary.get("cpu") and cpu not in summary.get("reproduced_on", []):
        summary["reproduced_on"] = summary.get("reproduced_on", []) + [cpu]
    write_json(path, summary)


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
    """A kept summary as read_eval returns it; report["agents"] is None where the summary
    has no "agents" (the summaries kept before it was)."""
    summary = json.loads(path.read_text())
    rates = {(t, kind): [moved, of] for t, kind, moved, of in summary["rates"]}
    meta = {k: summary.get(k) for k in ("build", "models", "cpu", "agents")}
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


def hierarchical(strata, resamples, rng):
    """Percentile 95% interval of the pooled mean over resamples drawn seeds, then questions:
    each resample draws len(strata) strata (a stratum is one seed's values) with replacement,
    then within each drawn stratum as many values as it has, with replacement, and takes the
    mean of all the values drawn. Empty strata (a seed with no paired question) are left out.
    With a single stratum the seed draw is skipped (it could only draw that seed), so this is
    the questions-only bootstrap, draw for draw the same as bootstrap(strata, mean, ...) from
    a generator in the same state."""
    strata = [s for s in strata if s]
    values = []
    for _ in range(resamples):
        drawn = strata if len(strata) == 1 else rng.choices(strata, k=len(strata))
        pooled = []
        for s in drawn:
            pooled.extend(rng.choices(s, k=len(s)))
        values.append(mean(pooled))
    values.sort()
    return values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]


def constant(values):
    """Whether every value is the same number (then every resample's mean is it)."""
    return bool(values) and all(x == values[0] for x in values)


def interval(strata, resamples, rng):
    """The pooled mean of strata's values and its bootstrap 95% interval, as a table cell.
    rng is a random.Random, or a string naming the cell that seeds one of its own: a cell's
    interval then does not move when another row gains a seed."""
    values = [x for s in strata for x in s]
    d = mean(values)
    if isinstance(rng, str) and constant(values):
        # Every resample pools len(values) copies of one number, summed in the same order as
        # d's: its mean is d to the bit, so the draws would give [d, d]. (Only for a cell's own
        # generator: a shared one's later draws would move.)
        lo = hi = d
    else:
        if isinstance(rng, str):
            rng = random.Random(rng)
        lo, hi = bootstrap(strata, mean, resamples, rng)
    return f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def hierarchical_interval(strata, resamples, name):
    """The hierarchical interval of a cell named `name`, as "{lo, hi}"; its generator is
    seeded from the name and HIER_SUFFIX, a stream of its own."""
    values = [x for s in strata for x in s]
    if constant(values):
        lo = hi = values[0]
    elif not values:
        lo = hi = float("nan")
    else:
        lo, hi = hierarchical(strata, resamples, random.Random(name + HIER_SUFFIX))
    return f"{{{lo:+.3f}, {hi:+.3f}}}"


def cell(strata, resamples, name):
    """A table cell: the pooled mean, its within-seed interval [] and hierarchical {}."""
    return f"{interval(strata, resamples, name)} {hierarchical_interval(strata, resamples, name)}"


INTERVALS_NOTE = (
    "Each interval cell reads `d [lo, hi] {{lo, hi}}`: d is the mean over all question-seeds\n"
    "pooled, [] its bootstrap 95% interval resampling questions within each seed (the training\n"
    "runs held fixed), {{}} the hierarchical one, resampling seeds with replacement and then\n"
    "questions within each drawn seed (it also covers the variation between training runs; with\n"
    "one seed the two are the same bootstrap); {resamples} resamples each, percentile intervals."
)


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def outcome(c):
    """The untrained team's turn-1 outcome from its credit c (the decomposition's stratum)."""
    return "right" if c == 1 else "wrong" if c == 0 else "tie"


def decompose(pairs, turn):
    """The decomposition at `turn` (1-based, >= 2) of pairs, [(untrained credits, row
    credits)] per question-seed, by the untrained team's turn-1 outcome, in exact fractions:
    {outcome: (n, share, untrained mean or None, row mean or None, contribution)} and the
    paired difference, which the contributions sum to exactly (asserted)."""
    total = len(pairs)
    sums = {o: [0, Fraction(0), Fraction(0)] for o in OUTCOMES}
    for base, row in pairs:
        s = sums[outcome(base[0])]
        s[0] += 1
        s[1] += Fraction(base[turn - 1])
        s[2] += Fraction(row[turn - 1])
    out = {}
    for o, (n, base_sum, row_sum) in sums.items():
        out[o] = (
            n,
            Fraction(n, total),
            base_sum / n if n else None,
            row_sum / n if n else None,
            (row_sum - base_sum) / total,
        )
    paired = sum((Fraction(r[turn - 1]) - Fraction(b[turn - 1]) for b, r in pairs), Fraction(0)) / total
    assert sum(v[4] for v in out.values()) == paired, "the contributions sum to the paired difference"
    return out, paired


def decomposition_table(title, pairs, turns, base_head="untrained team"):
    """The decomposition's lines for pairs (decompose's), turns 2..turns."""
    lines = [title, ""]
    differ = sum(1 for b, r in pairs if b[0] != r[0])
    if differ:
        lines[0] += (
            f"\n(turn 1 differs between the two rows on {differ} of {len(pairs)} question-seeds: "
            "the strata are the untrained team's turn-1 outcome)"
        )
    lines += [
        f"| turn | untrained turn-1 outcome | share (question-seeds) | {base_head} at the turn | "
        "row at the turn | contribution |",
        "|---|---|---|---|---|---|",
    ]
    n_all = len(pairs)
    for t in range(2, turns + 1):
        parts, paired = decompose(pairs, t)
        for o in OUTCOMES:
            n, share, base, row, contribution = parts[o]
            means = [f"{float(m):.3f}" if m is not None else "-" for m in (base, row)]
            lines.append(
                f"| {t} | {o} | {float(share):.3f} ({n}) | {means[0]} | {means[1]} | "
                f"{float(contribution):+.4f} |"
            )
        base_all = mean([b[t - 1] for b, _ in pairs])
        row_all = mean([r[t - 1] for _, r in pairs])
        floats = mean([r[t - 1] - b[t - 1] for b, r in pairs])
        lines.append(
            f"| {t} | sum | 1.000 ({n_all}) | {base_all:.3f} | {row_all:.3f} | "
            f"{float(sum(p[4] for p in parts.values())):+.4f} (paired difference {floats:+.4f}) |"
        )
    return lines


DECOMPOSITION_NOTE = (
    "Decomposition of each trained row's paired difference from its untrained team by the\n"
    "untrained team's turn-1 outcome on the question (turn 1 is the same text in both when\n"
    "turn 1 is frozen): right (credit 1), wrong (credit 0, a tie of wrong answers included),\n"
    "tie (a tie holding the right answer, credit 1/2 or 1/3). share = the stratum's fraction of\n"
    "the question-seeds; contribution = share x (row - untrained team) at the turn; the\n"
    "contributions sum to the paired difference (the sum line)."
)


def beta0_transitions(agents, turn):
    """(moved, of) at `turn` (>= 2) over agents, {question: [marks per turn]}: pairs of an
    agent a and a peer p != a both wrong ("0") at turn-1, p speaking at turn ("1" or "0");
    moved counts those with p right ("1") at turn."""
    moved = of = 0
    for marks in agents.values():
        if len(marks) < turn:
            continue
        before, now = marks[turn - 2], marks[turn - 1]
        wrong = [a for a, c in enumerate(before) if c == "0"]
        for a in wrong:
            for p in wrong:
                if p == a or p >= len(now) or now[p] not in "01":
                    continue
                of += 1
                moved += now[p] == "1"
    return moved, of


def load(root):
    """{row: {seed: read_kept}} of the summaries under root, after the build and model checks."""
    runs, builds, models, cpus = {}, set(), {}, set()
    # Pairs of CPUs on which one kept evaluation was run again and gave the same credits on
    # every question (add-agents checks it and records "reproduced_on"): the same text.
    same = set()
    for path in sorted(root.glob("*-seed*.json")):
        m = re.fullmatch(r"(.+)-seed(\d+)", path.stem)
        if not m or m.group(1).startswith("curve"):
            continue
        kept = read_kept(path)
        meta = kept[2]
        builds.add(meta["build"])
        cpus.add(meta["cpu"])
        for cpu in json.loads(path.read_text()).get("reproduced_on", []):
            cpus.add(cpu)
            same.add(frozenset((meta["cpu"], cpu)))
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
    # CPUs tied by a reproduction sample the same text: counted as one.
    groups = [{c} for c in cpus]
    for pair in same:
        linked = [g for g in groups if g & pair]
        merged = set(pair).union(*linked)
        groups = [g for g in groups if not g & pair] + [merged]
    return runs, groups


def tables(root, resamples):
    """Prints every table of the summaries under root."""
    runs, cpu_groups = load(root)
    if len(cpu_groups) > 1:
        names = "; ".join(sorted(map(str, set().union(*cpu_groups))))
        print(
            f"Note: these summaries come from CPUs ({names}) not shown to sample the same "
            "text from the same weights, so pairs across them are looser.\n"
        )
    elif len(cpu_groups[0]) > 1:
        names = "; ".join(sorted(map(str, cpu_groups[0])))
        print(
            f"Note: these summaries come from {len(cpu_groups[0])} CPUs ({names}); a kept "
            "evaluation run again on the other gave the same credits on every question, so "
            "rows pair exactly across them.\n"
        )
    rows = [r for r in ORDER if r in runs] + sorted(set(runs) - set(ORDER))
    turns = max(t for r in runs.values() for (_, t, _) in r.values())

    def nturns(row):
        """The turns every seed of row has."""
        return min(t for (_, t, _) in runs[row].values())

    def model_names(row):
        """The model names row's summaries used (None where none recorded)."""
        names = set()
        for _, _, meta in runs[row].values():
            names |= set(meta["models"] or {})
        return frozenset(names) or None

    def comparable(first, second):
        """Rows are paired only on the same models (the drift-free rows' fair-model-d pairs
        only with itself)."""
        a, b = model_names(first), model_names(second)
        return a is None or b is None or a == b

    def untrained(row):
        return row in UNTRAINED or row.endswith("-before")

    def base_of(row):
        if row in BASE:
            return BASE[row]
        return row if untrained(row) else "off-the-shelf"

    def is_vote(row):
        return row.startswith("vote-")

    def paired_questions(first, second, seeds, t1, t2):
        """Per seed, the question ids both rows have, with turn t1 in first and t2 in second."""
        out = []
        for s in seeds:
            a, b = runs[first][s][0], runs[second][s][0]
            out.append([i for i in a if i in b and len(a[i]) > t1 and len(b[i]) > t2])
        return out

    print(INTERVALS_NOTE.format(resamples=resamples))
    print()
    cols = " | ".join(f"turn {t}" for t in range(1, turns + 1))
    gains = " | ".join(f"turn {t} - turn 1" for t in range(2, turns + 1))
    print(f"| held-out majority accuracy | seeds | {cols} | {gains} |")
    print("|---|---|" + "---|" * (2 * turns - 1))
    for row in rows:
        seeds = sorted(runs[row])
        cells = []
        for t in range(turns):
            if t >= nturns(row):
                cells.append("-")
                continue
            accs = [mean([c[t] for c in runs[row][s][0].values()]) for s in seeds]
            if len(accs) > 1:
                cells.append(f"{mean(accs):.3f} ± {statistics.stdev(accs):.3f}")
            else:
                cells.append(f"{accs[0]:.3f}")
        for t in range(1, turns):
            if t >= nturns(row):
                cells.append("-")
                continue
            strata = [[c[t] - c[0] for c in runs[row][s][0].values()] for s in seeds]
            cells.append(cell(strata, resamples, f"{row} turn {t + 1} - turn 1"))
        seeds_s = ",".join(map(str, seeds))
        print(f"| {LABEL.get(row, row)} | {seeds_s} | {' | '.join(cells)} |")

    def paired_table(title, header, pairs):
        """One line per (label, first, second): first minus second, per turn both have."""
        print()
        print(title)
        print()
        print(f"| {header} | seeds | {cols} |")
        print("|---|---|" + "---|" * turns)
        for label, first, second in pairs:
            seeds = sorted(set(runs[first]) & set(runs[second]))
            if not seeds or not comparable(first, second):
                continue
            cells = []
            for t in range(turns):
                if t >= min(nturns(first), nturns(second)):
                    cells.append("-")
                    continue
                strata = []
                for s, ids in zip(seeds, paired_questions(first, second, seeds, t, t)):
                    a, b = runs[first][s][0], runs[second][s][0]
                    strata.append([a[i][t] - b[i][t] for i in ids])
                cells.append(cell(strata, resamples, f"{first} - {second} turn {t + 1}"))
            print(f"| {label} | {','.join(map(str, seeds))} | {' | '.join(cells)} |")

    trained_pairs = [
        (LABEL.get(r, r), r, base_of(r))
        for r in rows
        if r != base_of(r) and base_of(r) in runs and not is_vote(r)
    ] + [(label, r, b) for r, b, label in EXTRA_BASE if r in runs and b in runs]
    paired_table(
        "Paired differences from the untrained team (same seed, same draws), pooled over seeds,\n"
        "with bootstrap 95% intervals over questions [] and over seeds, then questions {}:",
        "row minus its untrained team",
        trained_pairs,
    )
    if "maporl" in runs:
        paired_table(
            "MAPoRL (rule verifier) minus each other row on the same model, paired the same way:",
            "MAPoRL minus",
            [
                (LABEL.get(r, r), "maporl", r)
                for r in rows
                if r != "maporl" and not r.startswith(OTHER_MODEL) and not is_vote(r)
            ],
        )

    if "maporl-long" in runs:
        paired_table(
            "MAPoRL at 128 steps minus each other row at 128 steps, paired the same way:",
            "MAPoRL, 128 steps, minus",
            [(LABEL.get(r, r), "maporl-long", r) for r in rows if r.endswith("-long") and r != "maporl-long"],
        )

    if "maporl-t1" in runs:
        paired_table(
            "MAPoRL with turn 1 trained too minus each other row with turn 1 trained, paired the\n"
            "same way (turn 1 is no longer the same text in the two rows):",
            "MAPoRL, turn 1 trained, minus",
            [(LABEL.get(r, r), "maporl-t1", r) for r in rows if r.endswith("-t1") and r != "maporl-t1"],
        )

    if "drift-free" in runs and "drift-free-echo-shown" in runs:
        paired_table(
            "MAPoRL on the longer warm start minus its control there (the same RL with peers\n"
            "echoed, evaluated with peers shown), paired the same way:",
            "MAPoRL, non-drifting warm start, minus",
            [(LABEL.get(r, r), "drift-free", r) for r in rows if r.startswith("drift-free-echo")],
        )

    votes = [r for r in rows if is_vote(r) and "maporl" in runs and comparable("maporl", r)]
    votes = [r for r in votes if set(runs[r]) & set(runs["maporl"])]
    if votes:
        # The compute-matched comparison: a vote over 6 (9) independent turn-1 answers
        # against the 3-agent debate's later turns, question by question at one seed.
        later = range(1, nturns("maporl"))
        print()
        print(
            "MAPoRL's debate at its later turns minus a vote over independent turn-1 answers (6 or 9\n"
            "answers against 3 agents' 2 or 3 turns), paired per question at one seed:"
        )
        print()
        print("| MAPoRL at turn t minus | seeds | " + " | ".join(f"t = {t + 1}" for t in later) + " |")
        print("|---|---|" + "---|" * len(later))
        for v in votes:
            seeds = sorted(set(runs[v]) & set(runs["maporl"]))
            cells = []
            for t in later:
                strata = []
                for s, ids in zip(seeds, paired_questions("maporl", v, seeds, t, 0)):
                    a, b = runs["maporl"][s][0], runs[v][s][0]
                    strata.append([a[i][t] - b[i][0] for i in ids])
                cells.append(cell(strata, resamples, f"maporl turn {t + 1} - {v} turn 1"))
            print(f"| {LABEL.get(v, v)} | {','.join(map(str, seeds))} | {' | '.join(cells)} |")

    first = True
    for _, row, base in trained_pairs:
        seeds = sorted(set(runs[row]) & set(runs[base]))
        last = min(nturns(row), nturns(base))
        if not seeds or not comparable(row, base) or last < 2:
            continue
        pairs = []
        for s, ids in zip(seeds, paired_questions(base, row, seeds, last - 1, last - 1)):
            b, a = runs[base][s][0], runs[row][s][0]
            pairs.extend((b[i], a[i]) for i in ids)
        if not pairs:
            continue
        print()
        if first:
            print(DECOMPOSITION_NOTE)
            print()
            first = False
        title = (
            f"{LABEL.get(row, row)} minus {LABEL.get(base, base)}, by the untrained team's turn-1 outcome "
            f"(seeds {','.join(map(str, seeds))}; {len(pairs)} question-seeds):"
        )
        print("\n".join(decomposition_table(title, pairs, last)))

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

    def with_agents(row):
        return sorted(s for s, (_, _, meta) in runs.get(row, {}).items() if meta.get("agents"))

    if with_agents("maporl") and with_agents("maporl-beta"):
        print()
        print(
            "β₀'s target transition: among pairs of an agent and a peer both wrong at turn t-1, how\n"
            "often the peer is right at t (moved/of), summed over agents, peers, questions and the\n"
            "seeds whose summary has each agent's correctness:"
        )
        print()
        heads = [f"P(peer W→R \\| agent and peer wrong) {t - 1}→{t}" for t in range(2, turns + 1)]
        print(f"| row | seeds | {' | '.join(heads)} |")
        print("|---|---|" + "---|" * len(heads))
        for row in ("off-the-shelf", "maporl", "maporl-beta", "maporl-beta-code"):
            seeds = with_agents(row)
            if not seeds:
                continue
            cells = []
            for t in range(2, turns + 1):
                moved = of = 0
                for s in seeds:
                    m, o = beta0_transitions(runs[row][s][2]["agents"], t)
                    moved, of = moved + m, of + o
                cells.append(f"{moved / of:.3f} ({moved}/{of})" if of else "-")
            print(f"| {LABEL.get(row, row)} | {','.join(map(str, seeds))} | {' | '.join(cells)} |")

    points = []
    for path in sorted(root.glob("curve*-seed*-step-*.json")):
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


def synthetic(root, rows, seeds=(0, 1), questions=60, agents_rows=()):
    """Writes synthetic summaries ROW-seedS.json under root: rows is {row: (model name, turns,
    function (seed, question, turn) -> credit)}; rows in agents_rows get an "agents" key."""
    for row, (model, turns, f) in rows.items():
        for s in seeds:
            credits = {f"arith-0-{q}": [f(s, q, t) for t in range(1, turns + 1)] for q in range(questions)}
            summary = {
                "build": "test",
                "cpu": "test CPU",
                "models": {model: model * 2},
                "turns": turns,
                "credits": credits,
                "rates": [[2, "corrected_by_peers", 1, 2]],
            }
            if row in agents_rows:
                summary["agents"] = {
                    q: ["".join("1" if c >= 1 else "0" for c in (v[t],) * 3) for t in range(turns)]
                    for q, v in credits.items()
                }
            write_json(root / f"{row}-seed{s}.json", summary)


def self_test():
    """Checks the statistics on constructed cases; raises AssertionError on a failure."""
    # The hierarchical interval with one seed is the questions-only bootstrap, draw for draw.
    gen = random.Random("self-test data")
    xs = [gen.choice([-1.0, 0.0, 0.0, 1.0, 0.5]) for _ in range(200)]
    assert hierarchical([xs], 500, random.Random(7)) == bootstrap([xs], mean, 500, random.Random(7))
    # It holds the point estimate on a symmetric case, and stays within the values' range.
    strata = [[-1.0, 0.0, 1.0] * 40, [-1.0, 1.0] * 50, [0.0, 1.0, -1.0] * 30]
    lo, hi = hierarchical(strata, 2000, random.Random("symmetric"))
    d = mean([x for s in strata for x in s])
    assert -1.0 <= lo <= d <= hi <= 1.0, (lo, d, hi)
    # Seeds constant within, different between: the within-seed interval is a point, while
    # the hierarchical one reaches both seeds' values (with two seeds a resample draws seed 0
    # twice a quarter of the time: far more than the 2.5% the percentile needs).
    split = [[0.0] * 50, [1.0] * 50]
    assert interval(split, 2000, "split") == "+0.500 [+0.500, +0.500]", interval(split, 2000, "split")
    assert hierarchical(split, 2000, random.Random("split")) == (0.0, 1.0)
    # A constant cell skips the draws and gives the constant.
    assert cell([[0.0] * 5, [0.0] * 7], 2000, "zero") == "+0.000 [+0.000, +0.000] {+0.000, +0.000}"

    # The decomposition's contributions sum to the paired difference exactly, ties included.
    gen = random.Random("self-test decomposition")
    values = [0.0, 1.0, 1 / 2, 1 / 3]
    pairs = []
    for _ in range(500):
        first = gen.choice(values)
        pairs.append(([first, gen.choice(values), gen.choice(values)], [first, gen.choice(values), gen.choice(values)]))
    for t in (2, 3):
        parts, paired = decompose(pairs, t)
        assert sum(p[4] for p in parts.values()) == paired
        assert abs(float(paired) - mean([r[t - 1] - b[t - 1] for b, r in pairs])) < 1e-12
        assert sum(p[0] for p in parts.values()) == len(pairs)
        assert all(parts[o][0] for o in OUTCOMES)
    # A hand-made case: 4 question-seeds, untrained turn 1 right, wrong, wrong, tie.
    hand = [([1.0, 1.0], [1.0, 0.0]), ([0.0, 0.0], [0.0, 1.0]), ([0.0, 0.0], [0.0, 1.0]), ([0.5, 0.5], [0.5, 1.0])]
    parts, paired = decompose(hand, 2)
    assert paired == Fraction(3, 2) / 4
    assert parts["right"] == (1, Fraction(1, 4), 1, 0, Fraction(-1, 4))
    assert parts["wrong"] == (2, Fraction(1, 2), 0, 1, Fraction(1, 2))
    assert parts["tie"] == (1, Fraction(1, 4), Fraction(1, 2), 1, Fraction(1, 8))

    # β₀'s target transition on hand-made marks.
    marks = {
        # turn 1 all wrong; turn 2 agents 0 and 1 right: 6 pairs, 4 with the peer right.
        "a": ["000", "110"],
        # turn 1 agents 0 and 2 wrong, both right at 2: 2 of 2; turn 3: no one wrong at 2.
        "b": ["010", "111", "111"],
        # turn 1 all wrong, agent 1 silent at 2: its 2 pairs left out; agent 0 right: 2 of 4.
        "c": ["000", "1-0"],
        # one agent wrong alone: no pair.
        "d": ["011", "111"],
    }
    assert beta0_transitions(marks, 2) == (8, 12), beta0_transitions(marks, 2)
    assert beta0_transitions(marks, 3) == (0, 0)
    assert beta0_transitions({"e": ["111", "001", "100"]}, 3) == (1, 2)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # keep writes each agent's correctness; read_kept reads it, and does without it.
        eval_dir = tmp / "eval"
        eval_dir.mkdir()
        utterance = lambda t, a, ans, ok: {"turn": t, "agent": a, "answer": ans, "correct": ok}
        debate = {
            "task": {"id": "arith-0-0"},
            "transcript": {
                "turns": 2,
                "agents": 3,
                "utterances": [
                    utterance(1, 0, "5", True), utterance(1, 1, "4", False), utterance(1, 2, "4", False),
                    utterance(2, 0, "5", True), utterance(2, 2, "5", True),
                ],
            },
            "decisions": [["4"], ["5"]],
        }
        (eval_dir / "transcripts.jsonl").write_text(json.dumps(debate) + "\n")
        (eval_dir / "eval.json").write_text(json.dumps({"turns": [{"turn": 1}, {"turn": 2}]}))
        model = tmp / "fair-model"
        model.mkdir()
        (model / "model.safetensors").write_bytes(b"weights")
        keep(eval_dir, tmp / "kept" / "maporl-seed0.json", "test", str(model))
        credits, turns, meta = read_kept(tmp / "kept" / "maporl-seed0.json")
        assert credits == {"arith-0-0": [0.0, 1.0]} and turns == 2, (credits, turns)
        assert meta["agents"] == {"arith-0-0": ["100", "1-1"]}, meta["agents"]
        summary = json.loads((tmp / "kept" / "maporl-seed0.json").read_text())
        del summary["agents"]
        write_json(tmp / "kept" / "maporl-seed1.json", summary)
        assert read_kept(tmp / "kept" / "maporl-seed1.json")[2]["agents"] is None

        # The tables over synthetic rows: a vote row with turn 1 only, the drift-free rows on
        # another model, the agents key on some rows; twice, the same.
        def h(*key):
            x = random.Random(repr(key)).random()
            return 0.5 if x > 0.95 else float(x < 0.7)

        def trained(row, gain):
            def f(s, q, t):
                return h("base", s, q, 1) if t == 1 else float(random.Random(repr((row, s, q, t))).random() < gain)
            return f

        rows = {
            "off-the-shelf": ("fair-model", 3, lambda s, q, t: h("base", s, q, t) if t > 1 else h("base", s, q, 1)),
            "maporl": ("fair-model", 3, trained("maporl", 0.8)),
            "maporl-beta": ("fair-model", 3, trained("maporl-beta", 0.75)),
            "vote-6": ("fair-model", 1, lambda s, q, t: 0.5 if q % 7 == 0 else h("vote", s, q)),
            "peers-hidden": ("fair-model", 3, trained("peers-hidden", 0.72)),
            "off-the-shelf-hidden": ("fair-model", 3, trained("off-the-shelf-hidden", 0.7)),
            "maporl-t1": ("fair-model", 3, lambda s, q, t: h("t1", s, q, t)),
            "maporl-current-t1": ("fair-model", 3, lambda s, q, t: h("ct1", s, q, t)),
            "drift-free-before": ("fair-model-d", 3, trained("dfb", 0.7)),
            "drift-free": ("fair-model-d", 3, trained("df", 0.8)),
        }
        synthetic(tmp / "fair", rows, agents_rows=("off-the-shelf", "maporl", "maporl-beta"))
        outputs = []
        for _ in range(2):
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                tables(tmp / "fair", 200)
            outputs.append(buf.getvalue())
        assert outputs[0] == outputs[1], "the tables are deterministic"
        out = outputs[0]
        sections = out.split("\n\n")

        def section(head):
            found = [s for s in sections if f"| {head} |" in s]
            assert len(found) == 1, (head, len(found))
            return found[0]

        first = section("held-out majority accuracy")
        vote = [l for l in first.splitlines() if l.startswith("| vote over 6")]
        assert vote and vote[0].count("| - |") == 2 and vote[0].endswith("| - |"), vote
        untrained = section("row minus its untrained team")
        assert "| MAPoRL, non-drifting warm start |" in untrained, untrained
        assert "| RL with peers hidden (own correctness reward) |" in untrained
        assert "against the untrained team with peers shown" in untrained
        assert "vote" not in untrained
        minus = section("MAPoRL minus")
        assert "non-drifting" not in minus and "vote" not in minus, minus
        for label in ("RL with peers hidden (own correctness reward)", "untrained team, peers hidden",
                      "MAPoRL, turn 1 trained too"):
            assert f"| {label} |" in minus, (label, minus)
        assert "| MAPoRL without influence, turn 1 trained too |" in section("MAPoRL, turn 1 trained, minus")
        assert "| vote over 6 independent turn-1 answers | 0,1 |" in section("MAPoRL at turn t minus")
        assert "β₀'s target transition" in out and "| MAPoRL, rule verifier | 0,1 |" in out
        # Each decomposition's sum line carries the paired table's point estimate.
        sums = re.findall(r"\| (\d) \| sum \| [^|]+\| [^|]+\| [^|]+\| ([+-][\d.]+) \(paired difference ([+-][\d.]+)\) \|", out)
        assert sums and all(a == b for _, a, b in sums), sums
        ties = re.findall(r"\| [23] \| tie \| [\d.]+ \((\d+)\) \|", out)
        assert ties and all(int(n) > 0 for n in ties), ties
        assert "non-drifting warm start minus untrained team, non-drifting warm start" in out
        # A model name with two sets of weights is refused.
        synthetic(tmp / "clash", {"maporl": ("fair-model", 3, trained("maporl", 0.8))})
        (tmp / "clash" / "off-the-shelf-seed0.json").write_text(
            (tmp / "fair" / "off-the-shelf-seed0.json").read_text().replace('"fair-modelfair-model"', '"other"')
        )
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                tables(tmp / "clash", 50)
        except SystemExit as e:
            assert "paired only on the same models" in str(e), e
        else:
            raise AssertionError("a model with two sets of weights was not refused")


def main():
    args = sys.argv[1:]
    if args and args[0] in ("keep", "keep-curve"):
        if len(args) < 5:
            sys.exit(f"fair_table: usage: {args[0]} EVAL_DIR OUT.json BUILD MODEL...")
        (keep if args[0] == "keep" else keep_curve)(*args[1:])
        return
    if args and args[0] == "add-agents":
        if len(args) != 3:
            sys.exit("fair_table: usage: add-agents EVAL_DIR KEPT.json")
        add_agents(*args[1:])
        return
    if args and args[0] == "--self-test":
        try:
            self_test()
        except AssertionError as e:
            import traceback

            traceback.print_exc()
            sys.exit(f"fair_table: self-test failed: {e}")
        print("fair_table: self-test passed")
        return
    resamples = 2000
    if "--resamples" in args:
        i = args.index("--resamples")
        resamples = int(args[i + 1])
        del args[i : i + 2]
    tables(Path(args[0] if args else "results/fair"), resamples)


if __name__ == "__main__":
    main()
