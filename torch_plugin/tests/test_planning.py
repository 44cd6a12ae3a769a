"""Which plan a rank loads, and making plans in process with libloom's
planner (fingerprints and plans need libloom: the tests fail without it)."""

import functools
import os
import tempfile
from pathlib import Path

import pytest

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom.tools.trace import Event, Trace

FAKE_PLAN = planning.PLAN_MAGIC + b"\x01\x00\x00\x00 a stand-in plan body"


@pytest.fixture(autouse=True)
def _needs_libloom(libloom):
    return libloom


def _events(sizes):
    events = [Event.alloc(1, 100)]
    next_id = 2
    for i in range(3):
        events.append(Event("iter_begin", id=i))
        for size in sizes:
            events += [Event.alloc(next_id, size), Event.free(next_id)]
            next_id += 1
        events.append(Event("iter_end", id=i))
    return Trace(events=events)


def _write(sizes, path):
    loom_trace.write_trace(_events(sizes), path)
    return Path(path)


@functools.lru_cache()
def _fingerprint_of(sizes):
    with tempfile.TemporaryDirectory() as tmp:
        return fp.fingerprint_trace(_write(sizes, Path(tmp) / "t.ltb"))


def _fingerprint(sizes):
    return dict(_fingerprint_of(tuple(sizes)))


def _record_trace(workdir, rank, sizes):
    trace = config_lib.trace_path(workdir, rank)
    trace.write_bytes(b"stand-in trace")
    fp.write_sidecar(trace, _fingerprint(sizes), rank=rank)
    return trace


def _cfg(workdir, **options):
    return config_lib.parse_config("plan", workdir=workdir, **options)


RANK1 = config_lib.RankInfo(rank=1, local_rank=1, world_size=4)


def test_check_plan_file(tmp_path):
    with pytest.raises(LoomError, match=r"p.lplan: no such plan file"):
        planning.check_plan_file(tmp_path / "p.lplan")
    with pytest.raises(LoomError, match="is a directory"):
        planning.check_plan_file(tmp_path)
    bad = tmp_path / "bad.lplan"
    bad.write_text("id,lower,upper,size\n")
    with pytest.raises(LoomError, match="not a loom plan file .*LOOMPLAN"):
        planning.check_plan_file(bad)
    good = tmp_path / "good.lplan"
    good.write_bytes(FAKE_PLAN)
    planning.check_plan_file(good)


def test_given_and_own_plans(tmp_path):
    given = tmp_path / "mine.lplan"
    with pytest.raises(LoomError, match="no such plan file"):
        planning.resolve_plan(_cfg(tmp_path, plan=given), RANK1)
    given.write_bytes(FAKE_PLAN)
    assert planning.resolve_plan(_cfg(tmp_path, plan=given), RANK1) == \
        (given, "given")
    with pytest.raises(LoomError) as error:
        planning.resolve_plan(_cfg(tmp_path), RANK1)
    assert "no plan for rank 1: " in str(error.value)
    assert "plan.rank1.lplan does not exist" in str(error.value)
    assert "python3 -m loom plan trace.rank1.ltb -o plan.rank1.lplan" in \
        str(error.value)
    own = config_lib.plan_path(tmp_path, 1)
    own.write_bytes(FAKE_PLAN)
    assert planning.resolve_plan(_cfg(tmp_path), RANK1) == (own, "own")


def test_another_ranks_plan_is_reused_only_when_the_traces_match(tmp_path):
    plan0 = config_lib.plan_path(tmp_path, 0)
    plan0.write_bytes(FAKE_PLAN)
    # Rank 1 never recorded: nothing proves the plan fits.
    with pytest.raises(LoomError, match="rank 1 has no recorded trace"):
        planning.resolve_plan(_cfg(tmp_path), RANK1)
    _record_trace(tmp_path, 1, [4096, 512])
    # Rank 0's plan comes with no record of its trace.
    with pytest.raises(LoomError, match="its trace is unknown"):
        planning.resolve_plan(_cfg(tmp_path), RANK1)
    # Rank 0's trace is recorded with the same requests, planned after.
    trace0 = _record_trace(tmp_path, 0, [4096, 512])
    os.utime(trace0, (1000, 1000))
    assert planning.resolve_plan(_cfg(tmp_path), RANK1) == (plan0, "rank 0")
    # A plan older than its trace is stale.
    os.utime(plan0, (500, 500))
    with pytest.raises(LoomError, match="older than trace.rank0.ltb"):
        planning.resolve_plan(_cfg(tmp_path), RANK1)
    # The plan's own record wins, and it is checked.
    fp.write_sidecar(plan0, _fingerprint([4096, 512, 8]), trace="x")
    with pytest.raises(LoomError) as error:
        planning.resolve_plan(_cfg(tmp_path), RANK1)
    assert "plan.rank0.lplan: the steady-state iterations differ" in \
        str(error.value)
    fp.write_sidecar(plan0, _fingerprint([4096, 512]), trace="x")
    assert planning.resolve_plan(_cfg(tmp_path), RANK1) == (plan0, "rank 0")


def test_reuse_from_a_named_rank_and_the_first_that_fits(tmp_path):
    _record_trace(tmp_path, 1, [64, 64])
    for rank, sizes in ((0, [64, 128]), (2, [64, 64]), (3, [64, 64])):
        plan = config_lib.plan_path(tmp_path, rank)
        plan.write_bytes(FAKE_PLAN)
        fp.write_sidecar(plan, _fingerprint(sizes))
    assert planning.resolve_plan(_cfg(tmp_path), RANK1) == \
        (config_lib.plan_path(tmp_path, 2), "rank 2")
    assert planning.resolve_plan(_cfg(tmp_path, reuse_plan_from=3), RANK1) \
        == (config_lib.plan_path(tmp_path, 3), "rank 3")
    with pytest.raises(LoomError, match="plan.rank0.lplan: the steady"):
        planning.resolve_plan(_cfg(tmp_path, reuse_plan_from=0), RANK1)


def test_plan_trace_with_a_planner_callable(tmp_path):
    trace = tmp_path / "trace.rank0.ltb"
    trace.write_bytes(b"t")
    plan = tmp_path / "plan.rank0.lplan"
    seen = []

    def planner(trace_path, plan_path):
        seen.append((trace_path, plan_path))
        with open(plan_path, "wb") as out:
            out.write(FAKE_PLAN)

    record = _fingerprint([1, 2])
    planning.plan_trace(trace, plan, record, planner=planner, rank=0)
    assert seen == [(str(trace), str(plan))]
    side = fp.read_sidecar(plan)
    assert side["fingerprint"] == record and side["trace"] == "trace.rank0.ltb"
    assert side["seconds"] >= 0

    def crashing(trace_path, plan_path):
        raise ValueError("no feasible layout")

    with pytest.raises(planning.PlanningError,
                       match="the planner raised ValueError: no feasible"):
        planning.plan_trace(trace, tmp_path / "p2.lplan", record,
                            planner=crashing)
    with pytest.raises(planning.PlanningError, match="wrote no plan file"):
        planning.plan_trace(trace, tmp_path / "p3.lplan", record,
                            planner=lambda t, p: None)


def test_plan_trace_plans_in_process_with_libloom(tmp_path):
    trace = _write([4096, 512], tmp_path / "trace.rank0.ltb")
    plan = tmp_path / "plan.rank0.lplan"
    record = fp.fingerprint_trace(trace)
    report = planning.plan_trace(trace, plan, record,
                                 options={"time_limit": 2, "persistent": True},
                                 rank=0)
    planning.check_plan_file(plan)
    assert report["valid"] and report["fits"]
    assert report["input"] == str(trace)
    assert report["peak_bytes"] >= report["lower_bound_bytes"] > 0
    side = fp.read_sidecar(plan)
    assert side["fingerprint"] == record and side["trace"] == trace.name
    assert side["peak_bytes"] == report["peak_bytes"]
    assert side["algorithm"] == report["algorithm"]


def test_planner_failures_carry_libloom_s_message(tmp_path):
    trace = _write([4096, 512], tmp_path / "t.ltb")
    record = fp.fingerprint_trace(trace)
    plan = tmp_path / "p.lplan"
    with pytest.raises(planning.PlanningError) as error:
        planning.plan_trace(trace, plan, record, options={"capacity": 1000})
    assert str(error.value) == (
        f"planning t.ltb failed: {trace}: no plan within the capacity of "
        f"1000 bytes (best peak 4608)")
    assert not plan.exists()
    with pytest.raises(planning.PlanningError,
                       match="unknown plan option 'bogus'"):
        planning.plan_trace(trace, plan, record, options={"bogus": 1})
    with pytest.raises(planning.PlanningError,
                       match=r"algorithm 'magic'"):
        planning.plan_trace(trace, plan, record,
                            options={"algorithm": "magic"})
    bad = tmp_path / "bad.ltb"
    bad.write_bytes(b"LOOMTRC\x00 not really")
    with pytest.raises(planning.PlanningError, match=r"bad.ltb"):
        planning.plan_trace(bad, plan, record)


def test_wait_for_plan(tmp_path):
    plan = tmp_path / "plan.rank0.lplan"
    assert planning.wait_for_plan(plan, timeout=0.05, poll=0.01) is None
    assert planning.wait_for_plan(plan, timeout=100, poll=0.01,
                                  stop=lambda: True) is None
    plan.write_bytes(FAKE_PLAN)
    fp.write_sidecar(plan, _fingerprint([1]))
    assert planning.wait_for_plan(plan, timeout=1)["fingerprint"] == \
        _fingerprint([1])
