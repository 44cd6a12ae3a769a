"""`loom files [WORKDIR] [--json]`: what a loom work directory holds.

Per rank: its trace (events, requests per steady iteration) and plan, where
the plan's trace is known from, auto mode's remembered whole-run plan
(remember=True) and what it was made from, and which ranks recorded
identical request sequences (and may therefore share one plan, see
loom.fingerprint). Pure Python, no torch, no libloom.
"""

import argparse
import json
import sys
from pathlib import Path

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.errors import LoomError


def describe(workdir):
    """{rank: {...}} plus the groups of ranks with equal fingerprints."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise LoomError(f"{workdir}: not a directory")
    ranks = {}
    for path in sorted(workdir.iterdir()):
        rank = config_lib.start_plan_rank(path)
        if rank is not None:  # remember=True: the next run's plan
            entry = ranks.setdefault(rank, {"rank": rank})
            record = fp.read_sidecar(path)
            entry["start_plan"] = path.name
            entry["start_plan_fingerprint"] = \
                record["fingerprint"] if record else None
            continue
        rank = config_lib.rank_of(path)
        if rank is None:
            continue
        entry = ranks.setdefault(rank, {"rank": rank})
        if path.suffix == config_lib.PLAN_SUFFIX:
            entry["plan"] = path.name
            theirs, source = planning.plan_fingerprint(path, workdir)
            entry["plan_trace_known_from"] = source if theirs else None
            entry["plan_problem"] = None if theirs else source
        else:
            entry["trace"] = path.name
            record = fp.read_sidecar(path)
            if record is not None:
                entry["events"] = record.get("events")
                entry["steady_requests"] = \
                    record["fingerprint"].get("steady_allocs")
                entry["fingerprint"] = record["fingerprint"]
    groups = []
    for rank in sorted(ranks):
        mine = ranks[rank].get("fingerprint")
        if mine is None:
            continue
        for group in groups:
            if fp.compare(mine, ranks[group[0]]["fingerprint"]) is None:
                group.append(rank)
                break
        else:
            groups.append([rank])
    return ranks, groups


def run_files(argv):
    parser = argparse.ArgumentParser(
        prog="loom files",
        description="Traces, plans and plan-sharing groups of a loom "
                    "work directory.")
    parser.add_argument("workdir", nargs="?", default=".loom")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        ranks, groups = describe(args.workdir)
    except LoomError as error:
        print(f"loom files: {error}", file=sys.stderr)
        return 1
    if args.json:
        for entry in ranks.values():
            entry.pop("fingerprint", None)
            entry.pop("start_plan_fingerprint", None)
        print(json.dumps({"ranks": [ranks[r] for r in sorted(ranks)],
                          "identical_requests": groups}, indent=1))
        return 0
    if not ranks:
        print(f"{args.workdir}: no loom traces or plans")
        return 0
    print(f"{'rank':>4}  {'trace':<18} {'events':>9} {'steady':>7}  "
          f"{'plan':<18} plan's trace")
    for rank in sorted(ranks):
        e = ranks[rank]
        events = "" if e.get("events") is None else str(e["events"])
        steady = "" if e.get("steady_requests") is None else \
            str(e["steady_requests"])
        known = e.get("plan_trace_known_from") or e.get("plan_problem") or ""
        print(f"{rank:>4}  {e.get('trace', '-'):<18} {events:>9} {steady:>7}"
              f"  {e.get('plan', '-'):<18} {known}")
    for rank in sorted(ranks):
        e = ranks[rank]
        if "start_plan" not in e:
            continue
        theirs, mine = e["start_plan_fingerprint"], e.get("fingerprint")
        if theirs is None:
            what = "no fingerprint record: not served"
        elif mine is None:
            what = "made from a trace no longer here"
        elif fp.compare(mine, theirs) is None:
            what = "made from this rank's trace"
        else:
            what = "made from another recording than this rank's trace"
        print(f"rank {rank}: {e['start_plan']} (remember=True: served from "
              f"the next run's start; {what})")
    if groups:
        print("identical requests (may share a plan): " +
              "; ".join("ranks " + ",".join(map(str, g)) for g in groups))
    return 0
