"""The record / plan / auto state machine against libloom.so on the host
backend (real memory, no torch, no GPU): record mode and auto mode. Plan
mode, plan files and ranks: test_session_plans.py."""

import logging
import threading

import pytest

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.tools import trace as loom_trace
from loom.errors import LoomError
from loom_fakes import HOST, FakeLoop, run_steps

FAKE_PLAN = planning.PLAN_MAGIC + b"\x01\x00\x00\x00 a stand-in plan body"

def _kinds(trace):
    return [e.kind for e in trace.events]


def test_record_mode_writes_a_trace_that_parses(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     trace_format="text", **HOST)
    assert loom.status()["state"] == "recording"
    loop = run_steps(loom, session, 3)
    status = loom.finish()
    trace_file = tmp_path / "trace.rank0.ltt"
    assert status["files"]["trace"] == str(trace_file)
    trace = loom_trace.read_trace(trace_file)
    kinds = _kinds(trace)
    # Weights (4 allocs), then iteration 0 (unmarked: the first step() ends
    # it), iterations 1 and 2 marked, and iteration 3 closed by finish().
    assert kinds[:4] == ["alloc"] * 4
    assert [e.id for e in trace.events if e.kind == "iter_begin"] == [1, 2, 3]
    assert [e.id for e in trace.events if e.kind == "iter_end"] == [1, 2, 3]
    assert kinds[-2:] == ["iter_begin", "iter_end"]
    one = kinds.index("iter_begin")
    two = kinds.index("iter_begin", one + 1)
    iteration = kinds[one + 1:two - 1]
    assert iteration.count("alloc") == iteration.count("free") == 10
    assert [e.name for e in trace.events[one:two] if e.kind == "phase"] == \
        ["forward", "backward", "optimizer"]
    sizes = [e.size for e in trace.events[one:two] if e.kind == "alloc"]
    assert sizes[:5] == [2 << 20, 2 << 20, 512 << 10, 3000, 1 << 20]
    side = fp.read_sidecar(trace_file)
    assert side["fingerprint"] == fp.fingerprint_trace(trace_file)
    assert side["fingerprint"]["steady_allocs"] == 10
    assert side["events"] == len(trace.events)
    # finish() is idempotent; markers keep working afterwards.
    loom.finish()
    loop.iteration()
    loom.step()
    loop.close()
    assert loom.memory_stats()["allocated_bytes.all.current"] == 0


def test_record_mode_binary_trace_by_default(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    run_steps(loom, session, 2).close()
    loom.finish()
    trace_file = tmp_path / "trace.rank0.ltb"
    assert trace_file.read_bytes()[:4] != b"loom"  # binary form
    side = fp.read_sidecar(trace_file)
    assert side["fingerprint"]["has_steady"]
    assert side["fingerprint"] == fp.fingerprint_trace(trace_file)
    # The fingerprint is libloom's, of the file written: no other copy.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "trace.rank0.ltb", "trace.rank0.ltb.json"]


def test_full_record_buffer_is_a_clear_error(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     record_events=10, **HOST)
    loop = run_steps(loom, session, 2)
    with pytest.raises(LoomError, match="record with a larger record="):
        loom.finish()
    loop.close()


def test_auto_mode_planning_failure_keeps_training(loom_env, tmp_path, caplog):
    loom = loom_env

    def planner(trace, plan):
        raise RuntimeError("solver exploded")

    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=3, planner=planner,
                                     plan_async=False, trace_format="text",
                                     **HOST)
    with caplog.at_level(logging.WARNING, logger="loom"):
        loop = run_steps(loom, session, 2)
        assert loom.status()["state"] == "recording"
        loop.iteration()
        loom.step()  # third iteration end: trace, plan, failure
    status = loom.status()
    assert status["state"] == "fallback"
    assert status["plan_error"] == ("the planner raised RuntimeError: solver "
                                    "exploded")
    assert "planning failed, training goes on" in caplog.text
    assert not status["plan_loaded"]
    # The trace of the first three iterations is there, with its fingerprint.
    trace = loom_trace.read_trace(tmp_path / "trace.rank0.ltt")
    assert [e.id for e in trace.events if e.kind == "iter_end"] == [1, 2]
    assert fp.read_sidecar(tmp_path / "trace.rank0.ltt") is not None
    # Training goes on, served by the dynamic space, data intact.
    for _ in range(3):
        loop.iteration()
        loom.step()
    loop.close()
    stats = loom.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["loom.plan_hits"] == 0
    session.native.check_invariants(0)


def _auto_with_report(loom, tmp_path, monkeypatch, edit, **options):
    """Auto mode over three iterations of the fake loop, libloom's planning
    report changed by `edit(report)` before the session reads it; returns
    the session and the loop."""
    real = planning.plan_trace

    def edited(*args, **kwargs):
        report = real(*args, **kwargs)
        edit(report)
        return report

    monkeypatch.setattr(planning, "plan_trace", edited)
    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=3, plan_async=False,
                                     plan_options={"time_limit": 2},
                                     **options, **HOST)
    return session, run_steps(loom, session, 3)


def test_auto_mode_declines_a_plan_that_loses_on_its_recording(
        loom_env, tmp_path, monkeypatch, caplog):
    """libloom replays the recorded iterations with and without the plan it
    made (whatif/loom/plan_check.h); a plan that holds more there than the
    dynamic space alone is not installed. The fake loop's plan earns its
    place (checked first), so the report is turned into a losing one."""
    loom = loom_env
    checks = []

    def losing(report):
        checks.append(dict(report["check"]))
        report["check"]["earns_its_place"] = False
        report["check"]["planned_peak_reserved_bytes"] = \
            report["check"]["unplanned_peak_reserved_bytes"] + (8 << 20)

    with caplog.at_level(logging.INFO, logger="loom"):
        session, loop = _auto_with_report(loom, tmp_path, monkeypatch,
                                          losing)
    # What libloom said of the real plan: both peaks, and that it earns it.
    assert len(checks) == 1 and checks[0]["earns_its_place"] is True
    assert 0 < checks[0]["planned_peak_reserved_bytes"] <= \
        checks[0]["unplanned_peak_reserved_bytes"] + checks[0]["slack_bytes"]
    assert checks[0]["peak_allocated_bytes"] > 0
    status = loom.status()
    assert status["state"] == "declined"
    assert status["plan_check"]["earns_its_place"] is False
    assert status["plan_error"] is None and status["plan_source"] == "own"
    # The plan file carries libloom's own verdict (section CHEK), for plan
    # mode to read later.
    assert session.native.plan_file_check(status["files"]["plan"]) == \
        checks[0]
    assert not status["plan_loaded"]
    assert "does not earn its place" in caplog.text
    # Training goes on in the dynamic space, data intact.
    for _ in range(3):
        loop.iteration(markers=loom.phase)
        loom.step()
        session.native.check_invariants(0)
    loop.close()
    stats = loom.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0
    assert stats["loom.plan_hits"] == 0
    assert stats["loom.static_region_bytes"] == 0


def test_auto_mode_serves_a_losing_plan_when_told_to(loom_env, tmp_path,
                                                     monkeypatch):
    """check_plan=False: the plan is installed whatever its check says
    (the check is still reported)."""
    loom = loom_env

    def losing(report):
        report["check"]["earns_its_place"] = False

    session, loop = _auto_with_report(loom, tmp_path, monkeypatch, losing,
                                      check_plan=False)
    status = loom.status()
    assert status["state"] == "planned" and status["plan_loaded"]
    assert status["plan_check"]["earns_its_place"] is False
    loop.iteration(markers=loom.phase)
    loom.step()
    assert loom.memory_stats()["loom.plan_hits"] > 0
    session.native.check_invariants(0)
    loop.close()


def test_auto_mode_installs_a_plan_whose_check_could_not_run(
        loom_env, tmp_path, monkeypatch, caplog):
    """A check that cannot run (libloom's report says "check_error") costs
    the plan nothing: it is installed, and a warning says it is unchecked."""
    loom = loom_env

    def unchecked(report):
        del report["check"]
        report["check_error"] = "INTERNAL: replaying the recording failed"

    with caplog.at_level(logging.WARNING, logger="loom"):
        _, loop = _auto_with_report(loom, tmp_path, monkeypatch, unchecked)
    status = loom.status()
    assert status["state"] == "planned" and status["plan_loaded"]
    assert status["plan_check"] is None
    assert "the plan check could not run (INTERNAL: replaying" in caplog.text
    loop.close()


def test_auto_mode_plan_that_cannot_be_installed(loom_env, tmp_path):
    loom = loom_env

    def planner(trace, plan):
        with open(plan, "wb") as out:
            out.write(FAKE_PLAN)

    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=2, planner=planner,
                                     plan_async=False, **HOST)
    loop = run_steps(loom, session, 4)
    status = loom.status()
    assert status["state"] == "fallback"
    assert status["plan_error"].startswith(
        f"cannot install {tmp_path / 'plan.rank0.lplan'}: loom_load_plan(")
    # The plan records the trace it came from.
    side = fp.read_sidecar(tmp_path / "plan.rank0.lplan")
    assert side["trace"] == "trace.rank0.ltb"
    assert side["fingerprint"] == \
        fp.read_sidecar(tmp_path / "trace.rank0.ltb")["fingerprint"]
    loop.close()


def test_auto_mode_plans_in_the_background(loom_env, tmp_path):
    loom = loom_env
    release = threading.Event()
    calls = []

    def planner(trace, plan):
        calls.append(threading.current_thread().name)
        release.wait(10)
        raise RuntimeError("done waiting")

    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=1, planner=planner,
                                     **HOST)
    loop = run_steps(loom, session, 2)
    assert loom.status()["state"] == "planning"  # training is not blocked
    release.set()
    assert loom.wait_for_plan(10)["state"] == "planning"  # until a boundary
    loop.iteration()
    loom.step()  # the result is taken at an iteration boundary
    assert loom.status()["state"] == "fallback"
    assert calls == ["loom-planner"]
    loop.close()


def test_auto_mode_serves_later_iterations_from_the_plan(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=3, plan_async=False,
                                     plan_options={"time_limit": 5}, **HOST)
    loop = run_steps(loom, session, 3)
    status = loom.status()
    assert status["state"] == "planned", status["plan_error"]
    assert status["plan_source"] == "own" and status["plan_loaded"]
    hits = loom.memory_stats()["loom.plan_hits"]
    for _ in range(3):
        loop.iteration(markers=loom.phase)
        loom.step()
        stats = loom.memory_stats()
        assert stats["loom.plan_hits"] >= hits + 10
        hits = stats["loom.plan_hits"]
        assert stats["loom.last_iteration_hit_rate"] == 1.0
        session.native.check_invariants(0)
    assert loom.status()["hit_rate"] == 1.0
    # A plan that fits serves every iteration: nothing from its idle region,
    # and no persistent request larger than planned pushed the others.
    assert loom.status()["plan_referee"]["region_reuses"] == 0
    assert loom.status()["plan_referee"]["persistent_pushes"] == 0
    assert loom.status()["plan_verdict"] in ("watching", "confirmed")
    # An extra request costs only itself (the matcher resynchronises).
    loop.iteration(markers=loom.phase, extra=12345)
    loom.step()
    loop.iteration(markers=loom.phase)
    loom.step()
    assert loom.memory_stats()["loom.last_iteration_hit_rate"] == 1.0
    loop.close()


def test_auto_mode_does_not_plan_the_persistent_tensors_twice(loom_env,
                                                              tmp_path):
    """Auto mode installs its plan mid-run, when the weights (and optimizer
    state) already live in loom's dynamic space: a plan that placed them
    again would hold their memory twice. The static region holds only what
    an iteration allocates."""
    loom = loom_env
    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=3, plan_async=False,
                                     plan_options={"time_limit": 2}, **HOST)
    loop = run_steps(loom, session, 4)
    assert loom.status()["state"] == "planned", loom.status()["plan_error"]
    stats = loom.memory_stats()
    weights = sum(size for size, _ in
                  (loop.live[p] for p in loop.weights))
    # The loop's iteration peaks near 6 MiB; with the 8.1 MiB of weights the
    # region would be at least 14 MiB.
    assert stats["loom.static_region_bytes"] < weights
    # Reserved memory is the weights (dynamic space) plus the region, not
    # the weights twice.
    assert stats["reserved_bytes.all.current"] < 2 * weights + \
        stats["loom.static_region_bytes"] - weights + 4 * (64 << 10)
    # The user may still ask for them.
    assert session._planner_options() == {"time_limit": 2,
                                          "persistent": False}
    loop.close()


def test_enable_once_per_process(loom_env, tmp_path):
    loom = loom_env
    loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    with pytest.raises(LoomError, match="already enabled in this process "
                                        r"\(mode='record'\)"):
        loom._configure_native(mode="auto", workdir=tmp_path, **HOST)


def test_recording_a_device_that_never_allocated(loom_env, tmp_path):
    loom = loom_env
    loom._configure_native(mode="record", workdir=tmp_path, device=1,
                           **HOST)
    loom.step()
    with pytest.raises(LoomError) as error:
        loom.finish()
    assert "device 1 served no allocation" in str(error.value)
    assert "loom.enable(device=N)" in str(error.value)


def test_long_recording_ends_at_a_boundary_before_the_buffer_fills(
        loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     record_events=150, trace_format="text",
                                     **HOST)
    loop = FakeLoop(session.native)
    states = []
    for _ in range(12):
        loop.iteration(markers=loom.phase)
        loom.step()
        states.append(loom.status()["state"])
    # ~25 events per iteration: written once fewer than two iterations fit.
    assert states[:3] == ["recording"] * 3
    assert states[-1] == "recorded"
    trace_file = tmp_path / "trace.rank0.ltt"
    written = trace_file.read_bytes()
    trace = loom_trace.read_trace(trace_file)
    assert len(trace.events) <= 150
    assert trace.events[-1].kind == "iter_end", "ends at a boundary"
    ends = [e.id for e in trace.events if e.kind == "iter_end"]
    assert ends == list(range(1, len(ends) + 1)) and len(ends) >= 2
    loom.finish()  # nothing more to write, no error
    assert trace_file.read_bytes() == written
    assert fp.read_sidecar(trace_file)["fingerprint"]["steady_allocs"] == 10
    loop.close()


def test_auto_mode_replans_a_new_shape_as_a_plan_variant(loom_env, tmp_path,
                                                         caplog):
    """A new shape of iteration (as with another sequence length) does not
    fit the plan: libloom serves it from its dynamic space, says so, records
    it, plans it in the background and installs it as a second plan variant;
    from then on both shapes hit their plans."""
    loom = loom_env
    session = loom._configure_native(mode="auto", workdir=tmp_path,
                                     record_iterations=2, plan_async=False,
                                     plan_options={"time_limit": 2}, **HOST)
    assert session.config.replan
    loop = FakeLoop(session.native, session.device)

    def iteration(unit):  # a stack of 48 activations, then their grads
        acts = [loop.alloc(unit + 512 * i) for i in range(48)]
        for act in reversed(acts):
            loop.free(act)
        loom.step()

    for _ in range(3):
        iteration(64 << 10)
    assert loom.status()["state"] == "planned", loom.status()["plan_error"]
    iteration(64 << 10)
    hits = loom.memory_stats()["loom.plan_hits"]
    iteration(64 << 10)
    assert loom.memory_stats()["loom.plan_hits"] == hits + 48
    # The new shape: suspended, recorded with the next iteration, planned.
    with caplog.at_level(logging.INFO, logger="loom"):
        for _ in range(4):
            iteration(96 << 10)
            if loom.status()["replans"]:
                break
        for _ in range(200):  # the planner thread may need a moment
            if loom.status()["replans"]:
                break
            iteration(96 << 10)
    status = loom.status()
    assert status["suspended_iterations"] >= 1
    # The plan referee's verdict and numbers (issue 23).
    assert status["plan_verdict"] in ("watching", "confirmed", "lost")
    assert status["plan_referee"]["plan_bytes"] >= 0
    assert status["replans"] == 1, status["replan_error"]
    assert status["plan_variants"] == 2
    # Both shapes now hit.
    with caplog.at_level(logging.INFO, logger="loom"):
        for unit in (96 << 10, 64 << 10, 96 << 10, 64 << 10):
            before = loom.memory_stats()["loom.plan_hits"]
            iteration(unit)
            assert loom.memory_stats()["loom.plan_hits"] == before + 48, unit
    assert "did not fit the plan" in caplog.text
    assert "plan variant for a new shape" in caplog.text
    session.native.check_invariants(0)
    loop.check_all()
    loop.close()


def test_auto_mode_remembers_a_whole_run_plan_for_the_next_run(
        loom_env, tmp_path, caplog, capsys):
    """remember=True: a first run records, switches to its plan mid-run and
    leaves, for the next run, a plan of the whole run (start-plan.rank0);
    the next run serves it from its first request (the weights placed by
    it), confirms it against its own recording, and holds less at its peak
    than the first run; a run whose requests changed is told so and leaves
    a plan made from itself."""
    loom = loom_env
    start_plan = tmp_path / "start-plan.rank0.lplan"

    def auto_run(extra_at=None):
        session = loom._configure_native(
            mode="auto", workdir=tmp_path, remember=True,
            record_iterations=2, plan_async=False,
            plan_options={"time_limit": 2}, **HOST)
        at_start = loom.status()
        loom.begin_iteration()
        loop = FakeLoop(session.native, session.device)
        hits_after_first = None
        for i in range(6):
            loop.iteration(markers=loom.phase,
                           extra=4096 if i == extra_at else None)
            loom.step()
            session.native.check_invariants(0)
            if hits_after_first is None:
                hits_after_first = loom.memory_stats()["loom.plan_hits"]
        peak = loom.memory_stats()["reserved_bytes.all.peak"]
        loop.close()
        status = loom.finish()
        loom._reset()
        return at_start, status, hits_after_first, peak

    with caplog.at_level(logging.INFO, logger="loom"):
        at_start, first, hits, first_peak = auto_run()
    assert at_start["state"] == "recording" and at_start["remembered"] is None
    assert "nothing remembered to serve from the start" in caplog.text
    assert hits == 0 and first["state"] == "planned", first["plan_error"]
    record = fp.read_sidecar(start_plan)
    assert record["fingerprint"] == fp.read_sidecar(
        tmp_path / "trace.rank0.ltb")["fingerprint"]
    assert record["check"]["earns_its_place"] is True
    assert not record["check"]["mid_run"], "a plan of the whole run"

    at_start, second, hits, second_peak = auto_run()
    assert at_start["state"] == "planned" and at_start["plan_loaded"]
    assert at_start["plan_source"] == "previous run"
    assert at_start["remembered"] == "serving, to be confirmed"
    assert hits >= 4, "the weights are placed by the remembered plan"
    assert second["remembered"] == "confirmed"
    assert second["hit_rate"] == 1.0
    assert second_peak < first_peak, (second_peak, first_peak)
    assert fp.read_sidecar(start_plan) == record, "kept: it was confirmed"
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    capsys.readouterr()
    assert cli.main(["files", str(tmp_path)]) == 0
    assert "rank 0: start-plan.rank0.lplan (remember=True: served from the " \
        "next run's start; made from this rank's trace)" in \
        capsys.readouterr().out

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="loom"):
        _, third, _, _ = auto_run(extra_at=1)
    assert third["remembered"].startswith("differs from this run ("), third
    assert "the next run gets a plan made from this one" in caplog.text
    assert fp.read_sidecar(start_plan)["fingerprint"] == fp.read_sidecar(
        tmp_path / "trace.rank0.ltb")["fingerprint"] != record["fingerprint"]

    # A damaged record beside the plan: not served, the run records.
    config_lib.sidecar_path(start_plan).write_text("{not json")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loom"):
        at_start, fourth, _, _ = auto_run()
    assert at_start["state"] == "recording" and at_start["remembered"] is None
    assert "start-plan.rank0.lplan is unusable" in caplog.text
    assert fourth["state"] == "planned"
    assert fp.read_sidecar(start_plan)["fingerprint"], "made again"


def test_remember_is_for_auto_mode_and_skips_an_unusable_plan(
        loom_env, tmp_path, caplog):
    loom = loom_env
    with pytest.raises(LoomError, match="remember applies to mode='auto'"):
        loom._configure_native(mode="plan", workdir=tmp_path, remember=True,
                               **HOST)
    # A remembered plan without its fingerprint record cannot be confirmed
    # later: not served, the run records as auto mode does.
    (tmp_path / "start-plan.rank0.lplan").write_bytes(FAKE_PLAN)
    with caplog.at_level(logging.INFO, logger="loom"):
        loom._configure_native(mode="auto", workdir=tmp_path, remember=True,
                               **HOST)
    assert loom.status()["state"] == "recording"
    assert "start-plan.rank0.lplan" in caplog.text
    loom._reset()


def test_a_remembered_plan_is_confirmed_in_the_background(loom_env, tmp_path):
    """The default plan_async: the confirmation runs on a thread while the
    plan serves; its verdict is taken at a later iteration boundary."""
    loom = loom_env
    for run in range(2):
        session = loom._configure_native(
            mode="auto", workdir=tmp_path, remember=True, record_iterations=2,
            plan_options={"time_limit": 2}, **HOST)
        loom.begin_iteration()
        loop = FakeLoop(session.native, session.device)
        for _ in range(200):
            loop.iteration(markers=loom.phase)
            loom.step()
            status = loom.status()
            if run == 0 and (tmp_path / "start-plan.rank0.lplan.json").exists():
                break
            if run == 1 and status["remembered"] != "serving, to be confirmed":
                break
        loop.close()
        loom.finish()
        loom._reset()
    assert status["remembered"] == "confirmed"
    assert status["plan_source"] == "previous run" and status["plan_loaded"]
