#!/usr/bin/env python3
"""The plan-miss suite: loom planned from one run, measured on another.

Every row replays one workload through PyTorch's caching allocator, its
expandable segments, a GMLake-style stitcher (simulated) and loom's real
run-time allocator (fake driver), with loom's plan made from a *different*
trace than the one measured: a perturbed copy of a snapshot or of a trace
recorded on the H200 (the plan comes from the unperturbed one), another
seed of a built-in workload, the first iterations of a recorded
multi-iteration trace, or a CPU-recorded model at another micro-batch or
sequence length (planned from the default one's trace). The same row is replayed
once more on the host backend with `--check-data` (real memory, every
allocation stamped and verified at its free, or at the replay's end if it
is still live then), serving and re-planning as loom's row does.

Usage (repository root, after `bazel build //cli:loom_tool
//torch_plugin:libloom.so`):

    .venv/bin/python bench/misses/misses.py [--quick] [--out FILE] [--json FILE]

`--loom-only REF.json` measures loom and unplanned loom only, against the
baselines of an earlier run's JSON (bench/results/misses.json): a rule
tried in the allocator is judged on the 84 rows in about 10 minutes on two
cores (`--jobs 2`), with `--tool` naming the loom_tool built with it; it
prints each row that moved and the targets against the reference (no
host replay, no settling copies: those targets are the full run's).

`--quick` runs the short suite that `./loom test` runs
(tests/python/test_misses_suite.py). Driver time: what loom's and expandable
segments' driver calls take at the H200's per-call costs (loom_tool's
embedded table; loom's calls priced at the granule, vmm not recording their
sizes), before the last complete iteration and during it. Writes the Markdown table and its
summary to stdout, or into FILE between the lines `<!-- misses:begin -->`
and `<!-- misses:end -->` (the rest of FILE, the text around the table, is
kept); --json writes the raw rows.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "bazel-bin/cli/loom_tool"
SNAPSHOTS = REPO / "bench/data/pytorch_snapshots/raw"
RECORDED = REPO / "bench/data/recorded"
# Traces loom recorded on an H200 (bench/data/traces/gpu/README.md): several
# training steps of four models at full size.
GPU_TRACES = REPO / "bench/data/traces/gpu/h200_2026-11-26"
GPU_MODELS = ("llama1b", "llama1b_recompute", "gpt2_interleaved", "moe")
BASELINES = ("pytorch", "pytorch_expandable", "gmlake")
MOE = ("moe", "moe_comm", "moe_dropless", "moe_capacity")


def full_suite(snapshot_traces):
    rows = []
    # A foreign plan: the GPT-2 step served with the plan of another model's
    # step (another snapshot).
    by_name = dict(snapshot_traces)
    gpt2 = by_name.get("bcrafton_gpt2small_ctx64_b1_train_step")
    other = by_name.get("magma27_small_ctx256_b32_fwd_bwd")
    if gpt2 and other:
        rows.append(("bcrafton_gpt2small_ctx64_b1_train_step planned from "
                     "magma27 (a foreign plan)", gpt2, ["--plan-from", other]))
    for name, trace in snapshot_traces:
        for level in (1, 3, 10):
            for seed in (1, 2):
                p = f"drop={level}%,add={level}%,resize={level}%,seed={seed}"
                rows.append((f"{name} perturbed {level}% (seed {seed})", trace,
                             ["--perturb", p]))
    for w in MOE:
        rows.append((f"builtin:{w} planned from seed 2", f"builtin:{w}",
                     ["--plan-from", f"builtin:{w}:seed=2"]))
    rows.append(("builtin:moe:routing_skew=2 planned from seed 2",
                 "builtin:moe:routing_skew=2",
                 ["--plan-from", "builtin:moe:routing_skew=2,seed=2"]))
    rows.append(("builtin:varlen planned from seed 2", "builtin:varlen",
                 ["--plan-from", "builtin:varlen:seed=2"]))
    rows.append(("builtin:eval planned from seed 2", "builtin:eval",
                 ["--plan-from", "builtin:eval:seed=2"]))
    rows.append(("builtin:dense planned from seed 2", "builtin:dense",
                 ["--plan-from", "builtin:dense:seed=2"]))
    for trace in sorted(RECORDED.glob("*.ltb")):
        rows.append((f"recorded {trace.stem} planned from iterations 0-2",
                     str(trace), ["--plan-from", "first:3"]))
    # The same models at another micro-batch (regenerate.sh --batch 1) or
    # sequence length (--seq 512), served with the plan of the default
    # one's trace: a user who changed the shape and kept the plan.
    for folder, changed in (("batch1", "at micro-batch 1 planned from "
                             "micro-batch 2"),
                            ("seq512", "at sequence length 512 planned from "
                             "1024")):
        for trace in sorted((RECORDED / folder).glob("*.ltb")):
            default = RECORDED / trace.name
            if default.exists():
                rows.append((f"recorded {trace.stem} {changed}", str(trace),
                             ["--plan-from", str(default)]))
    # The H200's traces, perturbed as the snapshots are; the plan comes from
    # the unperturbed trace.
    for model in GPU_MODELS:
        trace = GPU_TRACES / f"{model}.ltb"
        for level in (1, 3, 10):
            for seed in (1, 2):
                p = f"drop={level}%,add={level}%,resize={level}%,seed={seed}"
                rows.append((f"h200 {model} perturbed {level}% (seed {seed})",
                             str(trace), ["--perturb", p]))
    return rows


def quick_suite(snapshot_traces):
    by_name = dict(snapshot_traces)
    gpt2 = by_name["bcrafton_gpt2small_ctx64_b1_train_step"]
    other = by_name["magma27_small_ctx256_b32_fwd_bwd"]
    return [
        ("bcrafton_gpt2small_ctx64_b1_train_step perturbed 3% (seed 1)", gpt2,
         ["--perturb", "drop=3%,add=3%,resize=3%,seed=1"]),
        ("bcrafton_gpt2small_ctx64_b1_train_step planned from magma27 "
         "(a foreign plan)", gpt2, ["--plan-from", other]),
        ("builtin:moe_comm planned from seed 2", "builtin:moe_comm",
         ["--plan-from", "builtin:moe_comm:seed=2"]),
    ]


def import_snapshots(work, only_first=False):
    out = []
    pickles = sorted(SNAPSHOTS.glob("*.pickle"))
    if only_first:
        pickles = [p for p in pickles if not p.stem.startswith("nothanmin")]
    env = dict(os.environ, PYTHONPATH=str(REPO / "torch_plugin"))
    for p in pickles:
        trace = Path(work) / f"{p.stem}.ltt"
        subprocess.run([sys.executable, "-m", "loom", "import", str(p), "-o",
                        str(trace)], check=True, env=env, cwd=REPO,
                       capture_output=True, text=True)
        out.append((p.stem, str(trace)))
    return out


def tool(*args):
    done = subprocess.run([str(TOOL), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"loom_tool {' '.join(args)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


# Copies of a multi-iteration row's last iteration replayed after it, to
# see loom settle (and expandable segments beside it); loom's last copy
# must make no driver call.
REPEATS = 3
SETTLING = ("pytorch_expandable", "loom")


def plan_options(extra):
    """loom_tool replay's options for the plan compare's loom row serves,
    re-planning as that row does."""
    if extra[0] == "--plan-from":
        return ["--plan-from", extra[1], "--replan"]
    return ["--self-plan", "--perturb", extra[1], "--replan"]


# Each allocator's figures in a row, by allocator (compare --json's, driver
# calls as their total).
FIGURES = ("efficiency", "peak_reserved_bytes", "driver_calls", "driver_time")


def allocator_figure(compared, key):
    """`key` of FIGURES from one allocator's loom_tool compare --json row."""
    value = compared[key]
    return value["total"] if key == "driver_calls" else value


def loom_figures(counters):
    """A row's figures from loom's counters (loom_tool compare --json)."""
    hits, misses = counters.get("plan_hits", 0), counters.get("plan_misses", 0)
    return {
        "loom_steady_driver_calls": counters.get("steady_driver_calls"),
        "loom_counters": counters,
        "hit_rate": hits / (hits + misses) if hits + misses else None,
    }


def measure(label, spec, extra, time_limit):
    t0 = time.time()
    rows = tool("compare", spec, "--json", "--loom-time-limit",
                str(time_limit), *extra)
    by = {r["allocator"]: r for r in rows}
    replay = tool("replay", spec, "--json", "--backend", "host",
                  "--check-data", "--time-limit", str(time_limit),
                  *plan_options(extra))
    loom = by["loom"]
    best = max(BASELINES, key=lambda a: by[a]["efficiency"])
    c = loom["counters"]
    # Does loom settle once the work repeats, and do expandable segments?
    # The row's input, then stationary copies of its last iteration
    # (loom_tool compare --then-repeat): the calls of the last copy.
    repeated = None
    if c.get("steady_driver_calls") is not None:
        again = tool("compare", spec, "--json", "--loom-time-limit",
                     str(time_limit), "--allocators", ",".join(SETTLING),
                     "--then-repeat", str(REPEATS), *extra)
        repeated = {r["allocator"]: r["steady_driver_calls_by_kind"]["total"]
                    for r in again}
    return {
        "row": label,
        "input": spec,
        "options": extra,
        "peak_allocated_bytes": loom["peak_allocated_bytes"],
        **{key: {a: allocator_figure(by[a], key) for a in by}
           for key in FIGURES},
        "best_baseline": best,
        **loom_figures(c),
        "repeated_steady_driver_calls": repeated,
        "host_corrupted": replay["corrupted"],
        "host_data_checked": replay["data_checked"],
        "host_efficiency": replay["efficiency"],
        "seconds": round(time.time() - t0, 1),
    }


def loom_only_result(reference, compared):
    """A row of `--loom-only`: the reference row (an earlier full run's) with
    loom's and unplanned loom's figures from `compared` (loom_tool compare
    --json rows of those two allocators); the baselines stay the
    reference's, and what was not measured (the host replay, the settling
    copies) is None."""
    r = copy.deepcopy(reference)
    for row in compared:
        for key in FIGURES:
            r[key][row["allocator"]] = allocator_figure(row, key)
    loom = next(row for row in compared if row["allocator"] == "loom")
    r.update({
        "loom_only": True,
        **loom_figures(loom["counters"]),
        "repeated_steady_driver_calls": None,
        "host_corrupted": None,
        "host_data_checked": None,
        "host_efficiency": None,
    })
    return r


def measure_loom_only(label, spec, extra, time_limit, reference):
    t0 = time.time()
    compared = tool("compare", spec, "--json", "--loom-time-limit",
                    str(time_limit), "--allocators", "loom,loom_unplanned",
                    *extra)
    r = loom_only_result(reference, compared)
    r["seconds"] = round(time.time() - t0, 1)
    return r


MOE_ROW = ("moe", "mixtral", "qwen3_moe", "deepseek")  # also "h200 moe"


def pct(x):
    return f"{100 * x:.2f}%"


def driver_time(r, allocator):
    """Warm-up / steady-state driver time of one row's allocator, at the
    per-call costs loom_tool used (the H200's unless --driver-costs), as
    loom_tool formats it."""
    t = r["driver_time"][allocator]
    return f"{t['warmup_text']} / {t['steady_text'] or '-'}"


# Issue 23's tolerance: planned loom may be this far (a fraction, 0.1
# point) below the better of the best baseline and unplanned loom.
TOLERANCE = 0.001


def verdicts(r):
    """The targets of the row (issue 23): planned loom >= max(best
    baseline, unplanned loom) - 0.1 point, >= 98% on an MoE row, no
    corrupted allocation, no driver call in the steady state of a
    multi-iteration row, warm-up driver time at most twice expandable
    segments'. Also, without the tolerance: loom >= the best baseline,
    planned >= unplanned."""
    e = r["efficiency"]
    best = e[r["best_baseline"]]
    warmup = r["driver_time"]["loom"]["warmup_us"]
    out = {
        "target": e["loom"] >= max(best, e["loom_unplanned"]) - TOLERANCE,
        "best": e["loom"] >= best - 1e-12,
        "unplanned": e["loom"] >= e["loom_unplanned"] - 1e-12,
        "time": warmup <= 2 * r["driver_time"]["pytorch_expandable"][
            "warmup_us"],
    }
    if r["host_data_checked"] is not None:  # None: not replayed (loom-only)
        out["corrupted"] = r["host_corrupted"] == 0 and r["host_data_checked"]
    if r["loom_steady_driver_calls"] is not None:
        out["steady"] = r["loom_steady_driver_calls"] == 0
    if r.get("repeated_steady_driver_calls"):
        out["settled"] = r["repeated_steady_driver_calls"]["loom"] == 0
    if any(word in r["row"] for word in MOE_ROW):
        out["moe98"] = e["loom"] >= 0.98
    return out


def summary(results):
    lines = []
    for key, what in (("target", "planned loom >= max(best baseline, "
                                 "unplanned loom) - 0.1 point"),
                      ("best", "loom >= the best baseline"),
                      ("unplanned", "planned loom >= unplanned loom"),
                      ("time", "loom's warm-up driver time <= 2x expandable "
                               "segments'"),
                      ("steady", "no driver call in loom's last iteration "
                                 "(multi-iteration rows)"),
                      ("settled", f"no driver call once the last iteration "
                                  f"repeats (in the last of {REPEATS} copies "
                                  f"of it replayed after the row)"),
                      ("moe98", "loom >= 98% on MoE rows"),
                      ("corrupted", "0 corrupted (host backend, "
                                    "--check-data)")):
        rows = [r for r in results if key in verdicts(r)]
        met = [r for r in rows if verdicts(r)[key]]
        missed = ", ".join(r["row"] for r in rows if not verdicts(r)[key])
        lines.append(f"- {what}: {len(met)} of {len(rows)} rows"
                     + (f" (not: {missed})" if missed else ""))
    return "\n".join(lines)


def hit_rate_cell(r):
    """The hit rate, or why there is none: a plan that did not earn its
    place on the trace it was made from is not served
    (whatif/loom/plan_check.h)."""
    if (r.get("loom_counters") or {}).get("plan_not_served"):
        return "plan declined"
    return "-" if r["hit_rate"] is None else pct(r["hit_rate"])


def table(results):
    lines = [
        "| row | peak alloc (GiB) | pytorch | expandable | gmlake | loom "
        "| loom unplanned | loom - best | hit rate | loom driver calls (all / "
        f"last iteration / last of {REPEATS} copies of it) "
        "| expandable's (all / last copy) "
        "| loom driver time (warm-up / steady) | expandable's "
        "| corrupted (host) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        "---:|",
    ]
    for r in results:
        e = r["efficiency"]
        best = e[r["best_baseline"]]
        calls = r["driver_calls"]["loom"]
        steady = r["loom_steady_driver_calls"]
        repeated = r.get("repeated_steady_driver_calls")
        last = "-" if steady is None else str(steady)
        expandable = str(r["driver_calls"]["pytorch_expandable"])
        if repeated:
            last += f" / {repeated['loom']}"
            expandable += f" / {repeated['pytorch_expandable']}"
        lines.append(
            f"| {r['row']} | {r['peak_allocated_bytes'] / 2**30:.2f} "
            f"| {pct(e['pytorch'])} | {pct(e['pytorch_expandable'])} "
            f"| {pct(e['gmlake'])} | **{pct(e['loom'])}** "
            f"| {pct(e['loom_unplanned'])} "
            f"| {100 * (e['loom'] - best):+.2f} "
            f"| {hit_rate_cell(r)} "
            f"| {calls} / {last} "
            f"| {expandable} "
            f"| {driver_time(r, 'loom')} "
            f"| {driver_time(r, 'pytorch_expandable')} "
            f"| {r['host_corrupted']} |")
    return "\n".join(lines) + "\n\n" + summary(results)


def against_reference(results, references):
    """`--loom-only`'s report: each row whose loom or unplanned loom moved
    (efficiency, warm-up driver time against expandable segments'), then
    per target the rows that meet it before and now, and the mean
    efficiencies. "At target" is counted twice: against this run's own
    unplanned loom (the target as the table defines it) and against the
    reference's (a rule that lowers unplanned loom does not lower the bar)."""
    def warmup_ratio(row):
        # loom's warm-up driver time against expandable segments' (the
        # reference's: both rows carry it).
        t = row["driver_time"]
        return t["loom"]["warmup_us"] / max(
            t["pytorch_expandable"]["warmup_us"], 1e-9)

    def met(rows, key):
        return sum(1 for row in rows if verdicts(row).get(key))

    def mean(rows, a):
        return sum(row["efficiency"][a] for row in rows) / max(len(rows), 1)

    lines = []
    before = [references[r["row"]] for r in results]
    for r, ref in zip(results, before):
        e, f = r["efficiency"], ref["efficiency"]
        if all(abs(e[a] - f[a]) < 5e-5 for a in ("loom", "loom_unplanned")):
            continue
        lines.append(f"- {r['row']}: loom {pct(f['loom'])} -> "
                     f"{pct(e['loom'])}, unplanned "
                     f"{pct(f['loom_unplanned'])} -> "
                     f"{pct(e['loom_unplanned'])}, warm-up "
                     f"{warmup_ratio(ref):.2f}x -> {warmup_ratio(r):.2f}x "
                     f"expandable segments'")
    if not lines:
        lines.append("- no row moved")
    # This run's loom against the reference's unplanned loom.
    fixed = [{**r, "efficiency": {**r["efficiency"], "loom_unplanned":
                                  ref["efficiency"]["loom_unplanned"]}}
             for r, ref in zip(results, before)]
    for key, what in (("target", "at target"), ("moe98", "MoE rows >= 98%"),
                      ("time", "warm-ups within 2x expandable segments'"),
                      ("steady", "no call in the last iteration")):
        of = sum(1 for row in results if key in verdicts(row))
        line = (f"- {what}: {met(before, key)} -> {met(results, key)} "
                f"of {of}")
        if key == "target":
            line += (f" ({met(fixed, 'target')} against the reference's "
                     f"unplanned loom)")
        lines.append(line)
    lines.append(f"- mean efficiency, loom / unplanned: "
                 f"{pct(mean(before, 'loom'))} / "
                 f"{pct(mean(before, 'loom_unplanned'))} -> "
                 f"{pct(mean(results, 'loom'))} / "
                 f"{pct(mean(results, 'loom_unplanned'))}")
    return "\n".join(lines)


def write_between_markers(path, text):
    begin, end = "<!-- misses:begin -->", "<!-- misses:end -->"
    block = f"{begin}\n{text}\n{end}"
    old = Path(path).read_text() if Path(path).exists() else ""
    if begin in old and end in old:
        head = old[:old.index(begin)]
        tail = old[old.index(end) + len(end):]
        Path(path).write_text(head + block + tail)
    else:
        Path(path).write_text(old + block + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--json", dest="json_out")
    ap.add_argument("--time-limit", type=float, default=5)
    ap.add_argument("--only", help="substring of the rows to run")
    ap.add_argument("--loom-only", metavar="REF_JSON",
                    help="measure loom and unplanned loom only, against "
                         "the baselines of this earlier --json")
    ap.add_argument("--tool", help="the loom_tool to run (default: "
                                   "bazel-bin/cli/loom_tool)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="rows measured at once")
    args = ap.parse_args()
    global TOOL
    if args.tool:
        TOOL = Path(args.tool).resolve()
    if not TOOL.exists():
        sys.exit(f"{TOOL} is not built: bazel build //cli:loom_tool")
    if args.jobs < 1:
        sys.exit("--jobs: at least 1")
    references = None
    if args.loom_only:
        if args.out:
            sys.exit("--loom-only does not write the table (--out): its "
                     "rows lack the host replay and the settling copies")
        try:
            references = {r["row"]: r for r in
                          json.loads(Path(args.loom_only).read_text())}
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"--loom-only {args.loom_only}: not a misses.py "
                     f"--json file ({e})")
    with tempfile.TemporaryDirectory() as work:
        snaps = import_snapshots(work, only_first=args.quick)
        rows = quick_suite(snaps) if args.quick else full_suite(snaps)
        if args.only:
            rows = [r for r in rows if args.only in r[0]]
        if references is not None:
            missing = [r[0] for r in rows if r[0] not in references]
            if missing:
                sys.exit(f"--loom-only {args.loom_only}: no reference for "
                         f"{', '.join(missing)}")

        def one(row):
            label, spec, extra = row
            if references is not None:
                r = measure_loom_only(label, spec, extra, args.time_limit,
                                      references[label])
            else:
                r = measure(label, spec, extra, args.time_limit)
            print(f"{label}: loom {pct(r['efficiency']['loom'])} best "
                  f"{pct(r['efficiency'][r['best_baseline']])} unplanned "
                  f"{pct(r['efficiency']['loom_unplanned'])} "
                  f"({r['seconds']} s)", file=sys.stderr)
            return r
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(one, rows))
    if references is not None:
        print(against_reference(results, references))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(results, indent=1) +
                                           "\n")
        return
    text = table(results)
    if args.out:
        write_between_markers(args.out, text)
    else:
        print(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
