"""Choosing, making and checking plan files (no torch).

- `resolve_plan(config, ranks)`: which plan file plan mode loads: the one
  given, this rank's own, or another rank's whose recorded request
  sequence is proven identical (loom.fingerprint).
- `plan_trace(trace, plan, ...)`: plans the trace in this process with
  libloom's planner (`loom_plan_trace`: plan/'s entry point, the same code
  as `loom_tool plan`), or with a user's callable, and records in
  `<plan>.json` which trace, by fingerprint, the plan was made from.
- `previous_start_plan(config, rank, native)`: auto mode with remember:
  the whole-run plan an earlier run left for this one, if usable.
- `check_plan_file(path)`: exists, readable, has the plan magic.
- `wait_for_plan(plan, timeout)`: another rank's plan, when it appears.

Every failure is a `LoomError` (`PlanningError` for planner failures) whose
message names the file and the reason.
"""

import collections
import time
from pathlib import Path

from loom import _native
from loom import config as config_lib
from loom import fingerprint as fp
from loom.errors import LoomError, NativeError

PLAN_MAGIC = b"LOOMPLAN"  # plan/planfile/plan_file.h


class PlanningError(LoomError):
    """The planner failed; training goes on without a plan."""


def check_plan_file(path):
    """Raises LoomError unless `path` is a readable file with the magic of a
    loom plan."""
    path = Path(path)
    try:
        with open(path, "rb") as source:
            head = source.read(len(PLAN_MAGIC))
    except FileNotFoundError:
        raise LoomError(f"{path}: no such plan file") from None
    except IsADirectoryError:
        raise LoomError(f"{path}: is a directory, not a plan file") from None
    except OSError as error:
        raise LoomError(f"{path}: cannot read: {error.strerror}") from None
    if head != PLAN_MAGIC:
        raise LoomError(f"{path}: not a loom plan file (it does not start with "
                        f"'LOOMPLAN'; make one with `python3 -m loom plan "
                        f"<trace> -o {path.name}`)")


def _trace_sidecar(workdir, rank):
    """The fingerprint record of rank `rank`'s trace (either form)."""
    for trace_format in config_lib.TRACE_FORMATS:
        trace = config_lib.trace_path(workdir, rank, trace_format)
        record = fp.read_sidecar(trace)
        if record is not None:
            return trace, record
    return None, None


def plan_fingerprint(plan, workdir):
    """The fingerprint of the trace `plan` was made from, and how it is
    known; (None, reason) when it is not known. From `<plan>.json` (written
    when loom planned it), else from the same rank's trace record when the
    plan is newer than that trace (`python3 -m loom plan` of that trace)."""
    record = fp.read_sidecar(plan)
    if record is not None:
        return record["fingerprint"], f"{config_lib.sidecar_path(plan).name}"
    rank = config_lib.rank_of(plan)
    if rank is None:
        return None, f"{plan.name} has no {config_lib.sidecar_path(plan).name}"
    trace, record = _trace_sidecar(workdir, rank)
    if record is None:
        return None, (f"neither {config_lib.sidecar_path(plan).name} nor a "
                      f"recorded trace of rank {rank} is there")
    if plan.stat().st_mtime < trace.stat().st_mtime:
        return None, (f"{plan.name} is older than {trace.name} (re-plan it "
                      f"from that trace)")
    return record["fingerprint"], f"{config_lib.sidecar_path(trace).name}"


def resolve_plan(config, ranks):
    """(plan path, where it comes from) for plan mode. Raises LoomError when
    there is no plan this rank may use."""
    if config.plan is not None:
        check_plan_file(config.plan)
        return Path(config.plan), "given"
    workdir, rank = config.workdir, ranks.rank
    own = config_lib.plan_path(workdir, rank)
    if own.exists():
        check_plan_file(own)
        return own, "own"
    if config.reuse_plan_from is not None:
        candidates = [config_lib.plan_path(workdir, config.reuse_plan_from)]
    else:
        candidates = sorted(
            (p for p in workdir.glob(f"plan.rank*{config_lib.PLAN_SUFFIX}")
             if config_lib.rank_of(p) is not None),
            key=config_lib.rank_of)
    hint = (f"record this rank first (loom.enable(mode='record') or "
            f"mode='auto'), then `python3 -m loom plan "
            f"{config_lib.trace_path(workdir, rank).name} -o {own.name}`")
    if not candidates or not any(p.exists() for p in candidates):
        raise LoomError(f"no plan for rank {rank}: {own} does not exist; "
                        f"{hint}")
    _, mine = _trace_sidecar(workdir, rank)
    if mine is None:
        raise LoomError(
            f"no plan for rank {rank} ({own} does not exist); other ranks' "
            f"plans are reused only when this rank's recorded requests are "
            f"proven identical to theirs, and rank {rank} has no recorded "
            f"trace in {workdir}: {hint}")
    reasons = []
    for candidate in candidates:
        if not candidate.exists():
            reasons.append(f"{candidate.name}: does not exist")
            continue
        theirs, source = plan_fingerprint(candidate, workdir)
        if theirs is None:
            reasons.append(f"{candidate.name}: its trace is unknown ({source})")
            continue
        reason = fp.compare(mine["fingerprint"], theirs)
        if reason is None:
            check_plan_file(candidate)
            return candidate, f"rank {config_lib.rank_of(candidate)}"
        reasons.append(f"{candidate.name}: {reason}")
    raise LoomError(f"no plan for rank {rank} ({own} does not exist) and no "
                    f"other rank's plan fits: " + "; ".join(reasons))


# A remembered whole-run plan: its path, its sidecar record (the
# fingerprint of the recording it was made from) and the check in the file.
Remembered = collections.namedtuple("Remembered", "plan record check")


def previous_start_plan(config, rank, native):
    """Auto mode with remember=True: the whole-run plan an earlier run in
    this workdir made for this rank, if it may be served from the start:
    (Remembered, None), or (None, why not). It needs its sidecar (to
    confirm it later) and, with check_plan on, a check that does not say it
    loses on that recording."""
    plan = config_lib.start_plan_path(config.workdir, rank)
    if not plan.exists():
        return None, f"no {plan.name} in {config.workdir} yet"
    try:
        check_plan_file(plan)
        check = native.plan_file_check(plan)
        record = fp.read_sidecar(plan)
    except (LoomError, NativeError) as error:
        return None, f"{plan.name} is unusable ({error})"
    if record is None:
        return None, (f"{plan.name} has no "
                      f"{config_lib.sidecar_path(plan).name}")
    if check is not None and not check["earns_its_place"] and \
            config.check_plan:
        return None, (f"{plan.name} does not earn its place on the run it "
                      f"was made from")
    return Remembered(plan, record, check), None


def plan_trace(trace, plan, fingerprint, planner=None, options=None,
               rank=None, native=None):
    """Plans `trace` into `plan` and writes `<plan>.json` with the trace's
    `fingerprint`. Without `planner`, libloom plans in this process with
    `options` ({"time_limit": 5, ...}, plan/make_plan.h; the ctypes call
    releases the GIL, so other threads, training included, run meanwhile);
    `planner` is a callable(trace_path, plan_path) used instead. Returns the
    planner's report (a dict; {} for a callable); libloom's has "check",
    the plan replayed on the trace with and without it
    (whatif/loom/plan_check.h), kept in the sidecar too. Raises
    PlanningError (planner failure) or LoomError."""
    start = time.monotonic()
    report = {}
    try:
        if planner is not None:
            planner(str(trace), str(plan))
        else:
            native = native if native is not None else _native.load()
            report = native.plan_trace(str(trace), str(plan), options)
    except NativeError as error:
        raise PlanningError(f"planning {Path(trace).name} failed: "
                            f"{_native.status_text(error.message)}") from None
    except LoomError:
        raise
    except Exception as error:  # a user planner: report, never crash
        raise PlanningError(f"the planner raised {type(error).__name__}: "
                            f"{error}") from None
    if not Path(plan).exists():
        raise PlanningError(f"the planner wrote no plan file at {plan}")
    check_plan_file(plan)
    summary = {key: report[key] for key in (
        "peak_bytes", "lower_bound_bytes", "algorithm", "steady_iteration",
        "check") if key in report}
    fp.write_sidecar(plan, fingerprint, trace=Path(trace).name, rank=rank,
                     seconds=round(time.monotonic() - start, 3), **summary)
    return report


def wait_for_plan(plan, timeout, poll=0.2, stop=None):
    """Waits until `<plan>.json` exists (written after the plan itself);
    returns its record, or None after `timeout` seconds or once `stop()`."""
    deadline = time.monotonic() + timeout
    while True:
        record = fp.read_sidecar(plan) if Path(plan).exists() else None
        if record is not None:
            return record
        if time.monotonic() >= deadline or (stop is not None and stop()):
            return None
        time.sleep(poll)
