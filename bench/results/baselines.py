#!/usr/bin/python3
"""Regenerates the tables of bench/results/baselines.md.

Runs `loom_tool compare --json` on every planning-instance CSV under
bench/data and on the built-in workloads, and prints one Markdown table per
group. Usage (from the repository root, after `bazel build //cli:loom_tool`):

    /usr/bin/python3 bench/results/baselines.py > /tmp/tables.md

Arguments after the script's name are passed to every `compare` call, e.g.
`--plan-from self` (loom planned from the measured trace itself, the
oracle rows of earlier versions of this file) or `--driver-costs FILE`
(another GPU's per-call costs). The driver-time column is what each row's
driver calls take at those costs (the H200's by default), before the last
complete iteration (warm-up) and during it (steady state; "-" for inputs
without iterations).
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "bazel-bin/cli/loom_tool"

GROUPS = [
    ("MiniMalloc", sorted((REPO / "bench/data/minimalloc").rglob("*.csv"))),
    ("idealloc", sorted((REPO / "bench/data/idealloc").rglob("*.csv"))),
    ("PyTorch snapshot instances",
     sorted((REPO / "bench/data/pytorch_snapshots/instances").glob("*.csv"))),
    ("Recorded on the CPU (bench/data/recorded: HF transformers models, "
     "6 iterations; loom planned from the first 3)",
     sorted((REPO / "bench/data/recorded").glob("*.ltb"))),
    ("Built-in workloads", [
        ("builtin:moe", []), ("builtin:dense", []), ("builtin:moe_comm", []),
        ("builtin:moe:routing_skew=2", []),
        ("builtin:moe", ["--capacity", "13GiB"]),
        ("builtin:dense", ["--alloc-conf", "expandable_segments:False,"
                                           "max_split_size_mb:128"]),
    ]),
]


def mib(n):
    return f"{n / (1 << 20):,.1f}"


def driver_time(row):
    """Warm-up / steady-state driver time of a compare row, at the per-call
    costs loom_tool priced it with (the H200's by default), as loom_tool
    formats it: ">=" when some calls have no measured cost (cudaMalloc),
    "n/a" when none has."""
    t = row["driver_time"]
    if t["warmup_text"] == "n/a":
        return "n/a (cudaMalloc)"
    return f"{t['warmup_text']} / {t['steady_text'] or '-'}"


EXTRA = sys.argv[1:]


def run(spec, extra):
    out = subprocess.run([str(TOOL), "compare", str(spec), "--json", *extra,
                          *EXTRA],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main():
    if not TOOL.exists():
        sys.exit(f"{TOOL} is not built: bazel build //cli:loom_tool")
    for title, inputs in GROUPS:
        print(f"### {title}\n")
        print("| input | peak alloc (MiB) | allocator | peak reserved (MiB) "
              "| efficiency | own alloc peak (MiB) | driver calls "
              "| driver time (warm-up / steady) | notes |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---|")
        for item in inputs:
            spec, extra = (item if isinstance(item, tuple) else (item, []))
            rows = run(spec, extra)
            name = spec if isinstance(spec, str) else spec.relative_to(REPO)
            label = f"`{name}`" + (f" `{' '.join(extra)}`" if extra else "")
            for i, r in enumerate(rows):
                notes = []
                if r["oom"]:
                    notes.append(f"OOM at event {r['oom_event']}")
                if r["num_alloc_retries"]:
                    notes.append(f"{r['num_alloc_retries']} retries")
                for key in ("stitches", "stitch_reuses"):
                    if r["counters"].get(key):
                        notes.append(f"{key} {r['counters'][key]}")
                plan_from = r.get("plan_from")
                if plan_from:
                    notes.append("planned from itself (oracle)"
                                 if plan_from == "self"
                                 else f"planned from {plan_from}")
                print(f"| {label if i == 0 else ''} "
                      f"| {mib(r['peak_allocated_bytes']) if i == 0 else ''} "
                      f"| {r['allocator']} | {mib(r['peak_reserved_bytes'])} "
                      f"| {100 * r['efficiency']:.2f}% "
                      f"| {mib(r['allocator_peak_allocated_bytes'])} "
                      f"| {r['driver_calls']['total']} | {driver_time(r)} "
                      f"| {'; '.join(notes)} |")
        print()


if __name__ == "__main__":
    main()
