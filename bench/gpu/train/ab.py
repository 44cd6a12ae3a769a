"""Step-time ratios with confidence intervals, from runs that alternate
allocators across processes (`compare.py run --rounds N`).

One process per (round, allocator), allocators in a rotated order each
round, so that slow drift of the machine (clocks, other tenants, the
allocator's own warm-up) falls on every allocator alike. A host-bound
model's steps vary by 10-20% step to step and process to process; a ratio
from one process per allocator cannot resolve 1%. Here:

  - the ratio of an allocator's median step to PyTorch's (or expandable
    segments') over all its timed steps of all rounds;
  - its 95% confidence interval by a paired two-level bootstrap: rounds
    are resampled with replacement (both allocators' processes of a round
    together: they ran back to back), then the steps within each chosen
    process; 2,000 resamples from a fixed seed, so a table is reproducible;
  - the per-round ratios, to show the spread between processes;
  - a verdict against a bound (1.01 for "within 1% of PyTorch's", 1.00
    for "at or below expandable segments'"): met when the interval's upper
    end is at or under the bound, missed when its lower end is over it,
    undecided otherwise (more rounds or steps would tell).

    make_ab(lines) -> markdown   (lines: compare.py's results, any kinds)
"""

import random
import statistics

RESAMPLES = 2000
SEED = 20261126
# (model or None for every model, allocator, baseline, bound): the issue 21
# targets the table checks.
TARGETS = (
    (None, "loom", "torch", 1.01),
    ("gpt2_interleaved", "loom", "expandable", 1.00),
)


def rounds_of(lines):
    """{model: {round: {allocator: [step seconds]}}} from the measure lines
    that carry a round number and step times (finished runs only)."""
    out = {}
    for line in lines:
        if line.get("kind") != "measure" or "round" not in line:
            continue
        steps = line.get("step_seconds")
        if not steps or line.get("returncode") != 0 or line.get("oom"):
            continue
        out.setdefault(line["model"], {}).setdefault(
            line["round"], {})[line["allocator"]] = list(steps)
    return out


def paired_rounds(by_round, allocator, baseline):
    """The rounds in which both ran: [(allocator's steps, baseline's)]."""
    return [(runs[allocator], runs[baseline])
            for _, runs in sorted(by_round.items())
            if allocator in runs and baseline in runs]


def ratio_of_medians(pairs):
    mine = [s for a, _ in pairs for s in a]
    base = [s for _, b in pairs for s in b]
    return statistics.median(mine) / statistics.median(base)


def bootstrap_interval(pairs, resamples=RESAMPLES, seed=SEED, level=0.95):
    """(low, high) of the ratio of medians: rounds resampled with
    replacement, then the steps of each chosen process. Precondition:
    pairs is not empty and no process has zero steps."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        sample = [([a[rng.randrange(len(a))] for _ in a],
                   [b[rng.randrange(len(b))] for _ in b])
                  for a, b in chosen]
        ratios.append(ratio_of_medians(sample))
    ratios.sort()
    tail = (1.0 - level) / 2
    low = ratios[int(tail * (resamples - 1))]
    high = ratios[int((1.0 - tail) * (resamples - 1))]
    return low, high


def verdict(low, high, bound):
    if high <= bound:
        return "met"
    if low > bound:
        return "missed"
    return "undecided"


def comparison(by_round, allocator, baseline, bound=None):
    """One row's numbers, or None when no round has both allocators."""
    pairs = paired_rounds(by_round, allocator, baseline)
    if not pairs:
        return None
    low, high = bootstrap_interval(pairs)
    row = {
        "allocator": allocator, "baseline": baseline,
        "rounds": len(pairs),
        "steps": sum(len(a) for a, _ in pairs),
        "median_s": statistics.median([s for a, _ in pairs for s in a]),
        "baseline_median_s": statistics.median(
            [s for _, b in pairs for s in b]),
        "ratio": ratio_of_medians(pairs), "low": low, "high": high,
        "per_round": [statistics.median(a) / statistics.median(b)
                      for a, b in pairs],
    }
    if bound is not None:
        row["bound"] = bound
        row["verdict"] = verdict(low, high, bound)
    return row


def comparisons(lines):
    """{model: [row]}: every allocator against torch (and against
    expandable segments where both ran), with the targets' bounds."""
    out = {}
    for model, by_round in sorted(rounds_of(lines).items()):
        allocators = sorted({a for runs in by_round.values() for a in runs})
        rows = []
        for baseline in ("torch", "expandable"):
            if baseline not in allocators:
                continue
            for allocator in allocators:
                if allocator in ("torch", baseline):
                    continue
                bound = next((b for m, a, base, b in TARGETS
                              if m in (None, model) and a == allocator
                              and base == baseline), None)
                row = comparison(by_round, allocator, baseline, bound)
                if row:
                    rows.append(row)
        out[model] = rows
    return out


def make_ab(lines):
    """Markdown: per model, each allocator's step time against the
    baselines, with intervals, per-round ratios and verdicts."""
    table = comparisons(lines)
    out = ["# Step time, allocators alternated across processes", "",
           "Ratio of median steps (allocator / baseline) over every timed "
           "step of every round; 95% interval by a paired bootstrap over "
           "rounds, then steps (bench/gpu/train/ab.py). Verdict against "
           "the bound: met (interval's top at or under it), missed (its "
           "bottom over it), undecided.", ""]
    if not table:
        return "\n".join(out + ["No measure runs with rounds.", ""])
    out += ["| model | allocator | baseline | rounds | steps | median ms "
            "| ratio | 95% interval | per round | bound | verdict |",
            "|---|---|---|---:|---:|---:|---:|---|---|---:|---|"]
    for model, rows in table.items():
        for r in rows:
            per = " ".join(f"{x:.3f}" for x in r["per_round"])
            out.append(
                f"| {model} | {r['allocator']} | {r['baseline']} "
                f"| {r['rounds']} | {r['steps']} | {1000 * r['median_s']:.1f}"
                f" | {r['ratio']:.3f} | {r['low']:.3f}-{r['high']:.3f} "
                f"| {per} | {r.get('bound', '-')} | {r.get('verdict', '-')} |")
    return "\n".join(out) + "\n"
