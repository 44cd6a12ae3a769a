"""Design A of issue 23, item 1, measured without building it: a budget per
dynamic window (STAlloc's per-window dynamic space).

Every dynamic window ("module@phase", the innermost module marked dynamic
and the phase, as `plan/planning_problem.h` names them) gets one planned
buffer: the most bytes its requests ever held live at once in the recorded
iterations (0 .. --recorded - 1), held from the window's first request to
its last free in each iteration. However well a planner packs them, the
memory such a plan holds is at least the peak, over time, of the live bytes
outside dynamic modules plus the budgets of the windows open then: this
script prints that bound for the last recorded iteration next to the
trace's own peak (what a perfect allocator holds), so the efficiency design
A could reach at best. The rows are the recorded MoE traces of the plan-miss
suite (bench/results/misses.md, "dynamic requests with a home").

Usage: .venv/bin/python bench/misses/window_budgets.py TRACE... [--recorded 3]
(reads traces through libloom: build //torch_plugin:libloom.so first).
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..",
                                "torch_plugin"))
from loom.tools.trace import read_trace  # noqa: E402


def requests(trace):
    """(alloc time, free time, size, window or None, iteration) per request."""
    stack, phase, iteration, live, out = [], "", -1, {}, []
    for t, e in enumerate(trace.events):
        if e.kind == "iter_begin":
            iteration += 1
        elif e.kind == "phase":
            phase = e.name
        elif e.kind == "module_enter":
            stack.append((e.name, e.dynamic))
        elif e.kind == "module_exit" and stack:
            stack.pop()
        elif e.kind == "alloc":
            dynamic = [name for name, d in stack if d]
            window = dynamic[-1] + "@" + phase if dynamic else None
            live[e.id] = len(out)
            out.append([t, None, e.size, window, iteration])
        elif e.kind == "free":
            out[live.pop(e.id)][1] = t
    end = len(trace.events)
    for r in out:
        if r[1] is None:
            r[1] = end
    return out


def peak(spans):
    """The most bytes live at once over (start, end, bytes) spans."""
    deltas = sorted([(s, b) for s, _, b in spans] + [(e, -b) for _, e, b in spans])
    live = most = 0
    for _, b in deltas:
        live += b
        most = max(most, live)
    return most


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--recorded", type=int, default=3,
                    help="iterations the plan is made from (default 3)")
    args = ap.parse_args()
    print("| trace | peak allocated | design A at least | A's best efficiency |")
    print("|---|---:|---:|---:|")
    for path in args.traces:
        reqs = requests(read_trace(path))
        budget = collections.Counter()  # window -> most live bytes
        by_iteration = collections.defaultdict(list)
        for r in reqs:
            if r[3] is not None and 0 <= r[4] < args.recorded:
                by_iteration[(r[3], r[4])].append((r[0], r[1], r[2]))
        for (window, _), spans in by_iteration.items():
            budget[window] = max(budget[window], peak(spans))
        last = args.recorded - 1
        spans = [(s, e, b) for s, e, b, w, _ in reqs if w is None]
        for (window, iteration), window_spans in by_iteration.items():
            if iteration == last:
                spans.append((min(s for s, _, _ in window_spans),
                              max(e for _, e, _ in window_spans),
                              budget[window]))
        exact = peak([(s, e, b) for s, e, b, _, _ in reqs])
        bound = peak(spans)
        print(f"| {os.path.basename(path)} | {exact / 2**30:.2f} GiB | "
              f"{bound / 2**30:.2f} GiB | {100 * exact / bound:.1f}% |")


if __name__ == "__main__":
    main()
