"""Fingerprints of request sequences, for reusing another rank's plan.

The fingerprint is libloom's (loom_fingerprint_trace reads a trace file):
the traces are built with loom.tools.trace and written to temporary files,
in both forms."""

import itertools
import json

import pytest

from loom import fingerprint as fp
from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom.tools.trace import Event, Trace


# The digests of _trace(3, moe_sizes=(100, 200, 300)) computed by the
# Python implementation loom had before libloom computed fingerprints.
PROLOGUE_DIGEST = \
    "1ce4c9521d6bcfd1deb82bdb2997d97d69d194d5be8f5cd1ebb9ddfebcd91b1d"
STEADY_DIGEST = \
    "646827e4c4b050d3e7d19927e7692b7a4645b6b1a2cca1a6aaf9684c3af34423"


@pytest.fixture()
def fingerprint(tmp_path, libloom):  # pylint: disable=unused-argument
    """fingerprint(trace): libloom's fingerprint of `trace`, written to a
    file in tmp_path first (binary and text alternately: both must give
    the same fingerprint)."""
    files = itertools.count()

    def make(trace):
        number = next(files)
        path = tmp_path / f"trace{number}{('.ltb', '.ltt')[number % 2]}"
        loom_trace.write_trace(trace, path)
        return fp.fingerprint_trace(path)
    return make


def _trace(iterations, stream=7, first_id=1, moe_sizes=(), setup=(1000,),
           extra_in=None):
    """Set-up allocs, then `iterations` marked iterations of a fixed
    pattern (plus a dynamic module allocating `moe_sizes[i]`)."""
    events, next_id = [], first_id
    for size in setup:
        events.append(Event.alloc(next_id, size, stream=stream))
        next_id += 1
    for i in range(iterations):
        events.append(Event("iter_begin", id=i))
        events.append(Event("phase", name="forward"))
        a = next_id
        events.append(Event.alloc(a, 4096, stream=stream))
        b = a + 1
        events.append(Event.alloc(b, 512, stream=0))
        next_id += 2
        if i < len(moe_sizes):
            events.append(Event("module_enter", name="moe", dynamic=True))
            events.append(Event.alloc(next_id, moe_sizes[i], stream=stream))
            events.append(Event.free(next_id, stream=stream))
            next_id += 1
            events.append(Event("module_exit", name="moe"))
        if extra_in == i:
            events.append(Event.alloc(next_id, 64))
            events.append(Event.free(next_id))
            next_id += 1
        events.append(Event.free(b, stream=0))
        events.append(Event.free(a, stream=stream))
        events.append(Event("iter_end", id=i))
    trace = Trace(events=events)
    loom_trace.validate_trace(trace)
    return trace


def test_identical_requests_match_whatever_the_ids_and_stream_handles(
        fingerprint):
    mine = fingerprint(_trace(3, stream=0x7f001, first_id=1))
    theirs = fingerprint(_trace(3, stream=0x55aa0, first_id=900))
    assert mine == theirs
    assert fp.compare(mine, theirs) is None
    assert mine["has_steady"] and mine["iterations"] == 3
    # Steady part = the last iteration: 2 allocs, 2 frees.
    assert (mine["steady_allocs"], mine["steady_frees"]) == (2, 2)
    assert mine["prologue_allocs"] == 1 + 2 * 2


def test_dynamic_module_requests_do_not_count(fingerprint):
    dense = fingerprint(_trace(3))
    moe_a = fingerprint(_trace(3, moe_sizes=(100, 200, 300)))
    moe_b = fingerprint(_trace(3, moe_sizes=(999, 5, 77777)))
    # Everything but the event count (which counts every event) is equal.
    del moe_a["events"], moe_b["events"], dense["events"]
    assert moe_a == moe_b == dense


def test_differences_are_found_and_located(fingerprint):
    base = fingerprint(_trace(3))
    steady = fingerprint(_trace(3, extra_in=2))
    assert "steady-state iterations differ" in fp.compare(base, steady)
    prologue = fingerprint(_trace(3, setup=(1000, 8)))
    reason = fp.compare(base, prologue)
    assert "requests before the steady state differ" in reason
    assert "(5 vs 6 requests" in reason
    earlier = fingerprint(_trace(3, extra_in=0))
    assert "before the steady state" in fp.compare(base, earlier)
    # Which request is freed matters, not only sizes.
    swapped = _trace(3)
    last_frees = [i for i, e in enumerate(swapped.events) if e.kind == "free"]
    i, j = last_frees[-2], last_frees[-1]
    swapped.events[i], swapped.events[j] = swapped.events[j], swapped.events[i]
    assert fp.compare(base, fingerprint(swapped)) is not None


def test_unmarked_traces_never_match(fingerprint):
    unmarked = Trace(events=[Event.alloc(1, 10), Event.free(1)])
    mine = fingerprint(unmarked)
    assert not mine["has_steady"]
    assert "no complete marked iteration" in fp.compare(mine, mine)
    other = dict(mine, version=99, has_steady=True)
    assert "versions differ" in fp.compare(mine, other)


def test_iteration_without_end_is_closed_by_the_next_begin(fingerprint):
    events = [Event("iter_begin", id=0), Event.alloc(1, 10), Event.free(1),
              Event("iter_begin", id=1), Event.alloc(2, 10), Event.free(2),
              Event("iter_begin", id=2), Event.alloc(3, 99)]
    result = fingerprint(Trace(events=events))
    # The last complete iteration is 1 (iteration 2 never ended).
    assert result["has_steady"] and result["steady_allocs"] == 1
    assert result["prologue_allocs"] == 1


def test_sidecars_round_trip_and_bad_ones_are_named(tmp_path, fingerprint):
    target = tmp_path / "trace.rank0.ltb"
    assert fp.read_sidecar(target) is None
    record = fingerprint(_trace(2))
    written = fp.write_sidecar(target, record, rank=0)
    assert written == tmp_path / "trace.rank0.ltb.json"
    back = fp.read_sidecar(target)
    assert back["fingerprint"] == record and back["rank"] == 0
    assert back["file"] == "trace.rank0.ltb"
    written.write_text("{not json")
    with pytest.raises(LoomError, match=r"trace.rank0.ltb.json: not JSON"):
        fp.read_sidecar(target)
    written.write_text(json.dumps({"fingerprint": {"steady": 3}}))
    with pytest.raises(LoomError, match="no fingerprint in it"):
        fp.read_sidecar(target)


def test_empty_trailing_iteration_is_not_the_steady_state(fingerprint):
    trace = _trace(3)
    trace.events += [Event("iter_begin", id=3), Event("iter_end", id=3)]
    assert fingerprint(trace) == fingerprint(_trace(3)) | {
        "iterations": 4, "events": len(trace.events)}


def test_both_forms_and_the_digests_of_the_python_implementation(tmp_path,
                                                                   libloom):
    """The digests are those the Python implementation (loom <= 0.1, before
    libloom computed them) wrote into sidecars, so old sidecars still
    match; and a trace gives the same fingerprint in either form."""
    del libloom
    trace = _trace(3, moe_sizes=(100, 200, 300))
    results = []
    for suffix in (".ltb", ".ltt"):
        path = tmp_path / f"t{suffix}"
        loom_trace.write_trace(trace, path)
        results.append(fp.fingerprint_trace(path))
    assert results[0] == results[1]
    assert results[0] == {
        "version": 1, "prologue": PROLOGUE_DIGEST, "steady": STEADY_DIGEST,
        "prologue_allocs": 5, "steady_allocs": 2, "steady_frees": 2,
        "iterations": 3, "events": len(trace.events), "has_steady": True}


def test_unreadable_traces_are_loom_errors_naming_the_file(tmp_path,
                                                           libloom):
    del libloom
    with pytest.raises(LoomError, match=r"cannot fingerprint .*missing.ltb: "
                       r".*cannot open"):
        fp.fingerprint_trace(tmp_path / "missing.ltb")
    bad = tmp_path / "bad.ltt"
    bad.write_text("loom-trace 1\ndevice 0\n")
    with pytest.raises(LoomError, match=r"bad.ltt:3: truncated"):
        fp.fingerprint_trace(bad)
