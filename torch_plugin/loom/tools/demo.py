"""`loom demo`: the comparison on the embedded workloads.

Runs `loom compare --plot` on a real PyTorch training step (shipped as a loom
trace in bench/data/traces/) and on a generated MoE training run whose
expert sizes change every iteration, prints each table and a summary, and
writes one picture per workload.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from loom import _paths

WORKLOADS = (
    ("gpt2small_train_step",
     "a real PyTorch training step (GPT-2 small, from a memory snapshot)",
     str(_paths.data_file("bench/data/traces/gpt2small_train_step.ltt"))),
    ("moe", "a generated MoE training run (top-2 of 8 experts, token counts "
     "per expert change every iteration)", "builtin:moe"),
)


def _run_compare(spec, extra):
    cmd = [sys.executable, "-m", "loom", "compare", spec, *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_paths.PACKAGE_DIR.parent) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env=env)


def main(argv):
    parser = argparse.ArgumentParser(
        prog="loom demo",
        description="Compares PyTorch's caching allocator, expandable "
        "segments, a GMLake-style stitcher and loom on the embedded "
        "workloads: a table per workload and a picture of memory over time "
        "and of loom's plan.")
    parser.add_argument("--out", default="loom-demo",
                        help="folder for the pictures (default: loom-demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON instead of tables")
    parser.add_argument("--time-limit", type=float, default=5,
                        help="seconds loom's planner may search (default 5)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary, all_rows = [], {}
    for name, description, spec in WORKLOADS:
        picture = out / f"{name}.png"
        common = ["--loom-time-limit", str(args.time_limit)]
        table = _run_compare(spec, [*common, "--plot", str(picture)])
        if table.returncode != 0:
            sys.stderr.write(table.stderr)
            return 1
        rows = _run_compare(spec, [*common, "--json"])
        if rows.returncode != 0:
            sys.stderr.write(rows.stderr)
            return 1
        parsed = json.loads(rows.stdout)
        all_rows[name] = parsed
        if not args.json:
            print(f"=== {name}: {description}")
            print(table.stdout)
            print(f"picture: {picture}\n")
        for row in parsed:
            summary.append((name, row["allocator"], row["peak_reserved_bytes"],
                            row["efficiency"]))
    if args.json:
        print(json.dumps(all_rows, indent=2))
        return 0
    print("=== summary: peak reserved memory and efficiency "
          "(peak allocated / peak reserved)")
    print(f"{'workload':<22} {'allocator':<20} {'peak reserved':>14} "
          f"{'efficiency':>11}")
    for name, allocator, reserved, efficiency in summary:
        print(f"{name:<22} {allocator:<20} {reserved / 2**30:>10.2f} GiB "
              f"{100 * efficiency:>10.2f}%")
    return 0
