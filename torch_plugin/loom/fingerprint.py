"""Fingerprints of recorded request sequences: may rank r reuse rank k's plan?

A plan places the requests of one recorded run. Another rank may replay it
only if it makes the same requests in the same order, which data-parallel
ranks do and pipeline stages do not. That is checked, never assumed: each
recorded trace gets a fingerprint (written next to it as `<trace>.json`),
each plan loom makes records the fingerprint of the trace it came from
(`<plan>.json`), and a plan is reused only when the fingerprints are equal.

The fingerprint hashes the request sequence the plan depends on, with
everything that legitimately differs between processes taken out:
  - requests made inside modules marked dynamic (MoE buffers; the plan
    never places them) and their frees are skipped;
  - stream handles (pointers, different in every process) become the order
    in which streams first appear (the default stream stays 0);
  - a free is identified by how many requests back its allocation was,
    not by request id.
Each alloc contributes (size, stream), each free (age, stream). Markers do
not count, only where iterations begin and end. Two parts are hashed apart:
the steady part (the last complete iteration that allocates) and the
prologue (everything before it), so a mismatch can say which differs.
"""

import hashlib
import json
import time
from pathlib import Path

from loom import trace_text
from loom.config import sidecar_path
from loom.errors import LoomError

VERSION = 1


class _Hasher:
    def __init__(self):
        self.hash = hashlib.sha256()
        self.allocs = 0
        self.frees = 0

    def add(self, token):
        self.hash.update(token.encode())

    def digest(self):
        return self.hash.hexdigest()


def fingerprint_trace(trace):
    """Fingerprint of a trace_text.Trace: a dict with `prologue` and
    `steady` (hex SHA-256), counts, and `version`."""
    events = trace.events
    # The steady part: the last complete iteration (an iter_begin followed by
    # its iter_end or the next iter_begin) that allocates anything; an empty
    # one (closed by loom.finish() right after loom.step()) does not count.
    steady_start = steady_end = None
    end = None
    for index in range(len(events) - 1, -1, -1):
        kind = events[index].kind
        if kind == trace_text.ITER_BEGIN and end is not None and any(
                e.kind == trace_text.ALLOC for e in events[index + 1:end]):
            steady_start, steady_end = index, end
            break
        if kind in (trace_text.ITER_END, trace_text.ITER_BEGIN):
            end = index
    parts = {"prologue": _Hasher(), "steady": _Hasher()}
    streams = {0: 0}
    alloc_index = {}   # request id -> ordinal among counted allocs
    dynamic_stack = []
    counted = 0
    iterations = sum(1 for e in events if e.kind == trace_text.ITER_BEGIN)
    for position, event in enumerate(events):
        if steady_start is not None and steady_start <= position <= steady_end:
            part = parts["steady"]
        elif steady_end is not None and position > steady_end:
            continue  # after the steady iteration: not part of any plan
        else:
            part = parts["prologue"]
        kind = event.kind
        if kind == trace_text.MODULE_ENTER:
            dynamic_stack.append(event.dynamic or
                                 (bool(dynamic_stack) and dynamic_stack[-1]))
        elif kind == trace_text.MODULE_EXIT:
            if dynamic_stack:
                dynamic_stack.pop()
        elif kind == trace_text.ITER_BEGIN:
            part.add("ib;")
        elif kind == trace_text.ITER_END:
            part.add("ie;")
        elif kind == trace_text.ALLOC:
            if dynamic_stack and dynamic_stack[-1]:
                continue
            stream = streams.setdefault(event.stream, len(streams))
            alloc_index[event.id] = counted
            counted += 1
            part.allocs += 1
            part.add(f"a{event.size},{stream};")
        elif kind == trace_text.FREE:
            ordinal = alloc_index.pop(event.id, None)
            if ordinal is None:
                continue  # the free of a dynamic request
            stream = streams.setdefault(event.stream, len(streams))
            part.frees += 1
            part.add(f"f{counted - ordinal},{stream};")
    return {
        "version": VERSION,
        "prologue": parts["prologue"].digest(),
        "steady": parts["steady"].digest(),
        "prologue_allocs": parts["prologue"].allocs,
        "steady_allocs": parts["steady"].allocs,
        "steady_frees": parts["steady"].frees,
        "iterations": iterations,
        "has_steady": steady_start is not None,
    }


def compare(mine, theirs):
    """None when two fingerprints match, else the reason they do not."""
    if mine.get("version") != theirs.get("version"):
        return (f"fingerprint versions differ ({mine.get('version')} vs "
                f"{theirs.get('version')})")
    if not mine.get("has_steady") or not theirs.get("has_steady"):
        return ("a trace has no complete marked iteration (call loom.step() "
                "or loom.watch(optimizer))")
    if mine["steady"] != theirs["steady"]:
        return (f"the steady-state iterations differ ({mine['steady_allocs']} "
                f"vs {theirs['steady_allocs']} planned requests, or different "
                f"sizes/order)")
    if mine["prologue"] != theirs["prologue"]:
        return (f"the requests before the steady state differ "
                f"({mine['prologue_allocs']} vs {theirs['prologue_allocs']} "
                f"requests, or different sizes/order)")
    return None


# ---------------------------------------------------------------- sidecars

def write_sidecar(path, fingerprint, **extra):
    """Writes `<path>.json` describing file `path`."""
    record = {"file": Path(path).name, "fingerprint": fingerprint,
              "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **extra}
    target = sidecar_path(path)
    temporary = target.with_name(target.name + ".tmp")
    try:
        temporary.write_text(json.dumps(record, indent=1, sort_keys=True) +
                             "\n")
        temporary.replace(target)  # readers never see half a file
    except OSError as error:
        raise LoomError(f"{target}: cannot write: {error.strerror}") from None
    return target


def read_sidecar(path):
    """The sidecar of `path` as a dict, or None when there is none. Raises
    LoomError for a sidecar that exists but is not loom's."""
    target = sidecar_path(path)
    try:
        text = target.read_text()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise LoomError(f"{target}: cannot read: {error.strerror}") from None
    try:
        record = json.loads(text)
    except ValueError as error:
        raise LoomError(f"{target}: not JSON ({error})") from None
    fingerprint = record.get("fingerprint") if isinstance(record, dict) \
        else None
    if not isinstance(fingerprint, dict) or not all(
            isinstance(fingerprint.get(k), str)
            for k in ("prologue", "steady")):
        raise LoomError(f"{target}: no fingerprint in it (not written by loom)")
    return record
