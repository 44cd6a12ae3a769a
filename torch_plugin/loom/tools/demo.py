"""`loom demo`: the comparison on the embedded workloads.

Leads with real training traced on a GPU: the 1.1B-parameter Llama run on an
NVIDIA H200 (bench/data/traces/gpu/h200_2026-11-26/llama1b.ltb), loom
planned from its first two iterations and measured on all three, every
simulated allocator's peak beside the peak the H200 measured for that
allocator (measured.json); loom's arena there runs as it ran on the H200,
without stitching idle chunks (`--no-stitch`). Then `loom compare --plot` on a real PyTorch
training step (a memory snapshot shipped as a loom trace in
bench/data/traces/) and on a generated MoE training run whose expert sizes
change every iteration. Prints each table and a summary (a loom row planned
from the very trace it is measured on says "oracle"; where loom unplanned
holds less than planned loom, or loom's plan was declined because it lost
on the trace it was made from (whatif/loom/plan_check.h), as on the MoE run,
a note under the table says why), and writes one picture per workload
(captioned: what each allocator
row is). Without matplotlib (the `plots` extra) the tables are printed
all the same and one line at the end says the pictures were skipped and
how to get them.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from loom import _extras
from loom import _paths
from loom.tools import compare_plot

H200_RUN = "bench/data/traces/gpu/h200_2026-11-26"


class Workload:
    """One demo workload: `spec` for loom compare, the options it needs,
    and, for a trace recorded on a GPU, what that GPU measured."""

    def __init__(self, name, description, spec, options=(), measured=None):
        self.name = name
        self.description = description
        self.spec = spec
        self.options = list(options)
        self.measured = measured  # {compare row: {"reserved_bytes.all.peak"..}}


def _h200_workload():
    """The lead: llama1b as traced on the H200, with the H200's peaks."""
    measured = json.loads(_paths.data_file(
        f"{H200_RUN}/measured.json").read_text())
    model = measured["models"]["llama1b"]
    return Workload(
        "llama1b_h200",
        f"a 1.1B-parameter Llama trained on an {measured['gpu']} "
        f"(PyTorch {measured['torch']}, micro-batch "
        f"{model['micro_batch']} x 2048 tokens, {measured['date'][:10]}): "
        f"the requests traced on the GPU; loom's arena as it ran there, "
        f"without stitching idle chunks (--no-stitch)",
        str(_paths.data_file(f"{H200_RUN}/{model['trace']}")),
        # The H200 ran loom before the arena stitched idle chunks: the
        # simulated rows are that allocator, so their peaks compare with
        # the ones it measured.
        ["--plan-from", model["plan_from"], "--no-stitch"],
        model["measured"])


def workloads():
    return (
        _h200_workload(),
        Workload("gpt2small_train_step",
                 "a real PyTorch training step (GPT-2 small, from a memory "
                 "snapshot)",
                 str(_paths.data_file(
                     "bench/data/traces/gpt2small_train_step.ltt"))),
        Workload("moe", "a generated MoE training run (top-2 of 8 experts, "
                 "token counts per expert change every iteration)",
                 "builtin:moe"),
    )


def _run_compare(spec, extra):
    cmd = [sys.executable, "-m", "loom", "compare", spec, *extra]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(_paths.PACKAGE_DIR.parent) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env=env)


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def plan_note(row):
    """How a loom row got its plan, with "oracle" when it is the measured
    trace's own (compare's plan_from: "own trace (oracle)")."""
    plan_from = row.get("plan_from")
    if not plan_from:
        return ""
    if (row.get("counters") or {}).get("plan_not_served"):
        return (f"plan from {plan_from} declined (it lost on that trace): "
                f"no plan")
    if "oracle" in plan_from:
        return "oracle: planned from this very trace"
    return f"planned from {plan_from}"


def measured_lines(workload, rows):
    """Each simulated allocator beside what the GPU measured for it."""
    out = ["simulated vs measured on the GPU the trace was recorded on "
           "(peak reserved; bench/results/whatif.md):",
           f"  {'allocator':<20} {'simulated':>12} {'measured':>12} "
           f"{'difference':>11}"]
    for row in rows:
        real = workload.measured.get(row["allocator"])
        simulated = row["peak_reserved_bytes"]
        if real is None:
            why = ("not measured: the plan did not install on CUDA"
                   if row["allocator"] == "loom"
                   else "not run on the GPU")
            out.append(f"  {row['allocator']:<20} {gib(simulated):>12} "
                       f"{'-':>12} {'':>11}  {why}")
            continue
        reserved = real["reserved_bytes.all.peak"]
        out.append(f"  {row['allocator']:<20} {gib(simulated):>12} "
                   f"{gib(reserved):>12} "
                   f"{100 * (simulated - reserved) / reserved:>+10.2f}%")
    return out


def main(argv):
    parser = argparse.ArgumentParser(
        prog="loom demo",
        description="Compares PyTorch's caching allocator, expandable "
        "segments, a GMLake-style stitcher and loom on the embedded "
        "workloads, led by a training run traced on an NVIDIA H200 with the "
        "peaks the H200 measured: a table per workload and a picture of "
        "memory over time and of loom's plan.")
    parser.add_argument("--out", default="loom-demo",
                        help="folder for the pictures (default: loom-demo)")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON instead of tables")
    parser.add_argument("--time-limit", type=float, default=5,
                        help="seconds loom's planner may search (default 5)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    pictures = _extras.importable("matplotlib")
    if pictures:
        out.mkdir(parents=True, exist_ok=True)
    summary, all_rows = [], {}
    for workload in workloads():
        picture = out / f"{workload.name}.png"
        common = ["--loom-time-limit", str(args.time_limit),
                  *workload.options]
        table = _run_compare(workload.spec, [*common, "--plot", str(picture)]
                             if pictures else common)
        if table.returncode != 0:
            sys.stderr.write(table.stderr)
            return 1
        rows = _run_compare(workload.spec, [*common, "--json"])
        if rows.returncode != 0:
            sys.stderr.write(rows.stderr)
            return 1
        parsed = json.loads(rows.stdout)
        all_rows[workload.name] = parsed
        if workload.measured is not None:
            all_rows[f"{workload.name}_measured"] = workload.measured
        if not args.json:
            print(f"=== {workload.name}: {workload.description}")
            print(table.stdout)
            if workload.measured is not None:
                print("\n".join(measured_lines(workload, parsed)) + "\n")
            note = compare_plot.unplanned_note(parsed)
            if note:
                print(textwrap.fill(note, 100) + "\n")
            if pictures:
                print(f"picture: {picture}\n")
        for row in parsed:
            real = (workload.measured or {}).get(row["allocator"])
            summary.append((workload.name, row, real,
                            workload.measured is not None))
    if args.json:
        print(json.dumps(all_rows, indent=2))
        _pictures_skipped(pictures)
        return 0
    print("=== summary: peak reserved memory and efficiency "
          "(peak allocated / peak reserved); measured = on the GPU")
    print(f"{'workload':<22} {'allocator':<20} {'peak reserved':>14} "
          f"{'efficiency':>11} {'measured':>12}  note")
    for name, row, real, on_gpu in summary:
        measured = (gib(real["reserved_bytes.all.peak"]) if real
                    else "-" if on_gpu else "")
        print(f"{name:<22} {row['allocator']:<20} "
              f"{row['peak_reserved_bytes'] / 2**30:>10.2f} GiB "
              f"{100 * row['efficiency']:>10.2f}% {measured:>12}  "
              f"{plan_note(row)}".rstrip())
    _pictures_skipped(pictures)
    return 0


def _pictures_skipped(pictures):
    """Without matplotlib: one line on stderr, the fix included."""
    if not pictures:
        print(_extras.message("loom demo", "drawing them", ["matplotlib"],
                              outcome="pictures skipped"), file=sys.stderr)
