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

The fingerprint itself is computed by libloom from the trace file (the same
C++ that reads traces, plan/trace/fingerprint.h); this module compares
fingerprints and keeps them in loom's JSON sidecars.
"""

import json
import os
import time
from pathlib import Path

from loom import _native
from loom.config import sidecar_path
from loom.errors import LoomError, NativeError


def fingerprint_trace(path, native=None):
    """The fingerprint of the trace file at `path` (either form), computed
    by libloom (plan/trace/fingerprint.h): a dict with `prologue` and
    `steady` (hex SHA-256), `prologue_allocs`, `steady_allocs`,
    `steady_frees`, `iterations`, `events`, `has_steady` and `version`.
    `native`: the libloom to use (default: the process's). Raises LoomError
    naming the file when it cannot be read."""
    native = native if native is not None else _native.load()
    try:
        return native.fingerprint_trace(os.fspath(path))
    except NativeError as error:
        raise LoomError(f"cannot fingerprint {path}: "
                        f"{_native.status_text(error.message)}") from None


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
