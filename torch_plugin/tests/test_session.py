"""The record / plan / auto state machine against libloom.so on the host
backend (real memory, no torch, no GPU)."""

import logging
import threading

import pytest

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.tools import trace as loom_trace
from loom.errors import LoomError
from loom_fakes import HOST, FakeLoop

FAKE_PLAN = planning.PLAN_MAGIC + b"\x01\x00\x00\x00 a stand-in plan body"


def _run(loom, session, iterations, extra_at=None):
    loop = FakeLoop(session.native, session.device)
    for i in range(iterations):
        loop.iteration(markers=loom.phase,
                       extra=4096 if i == extra_at else None)
        loom.step()
    return loop


def _kinds(trace):
    return [e.kind for e in trace.events]


def test_record_mode_writes_a_trace_that_parses(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     trace_format="text", **HOST)
    assert loom.status()["state"] == "recording"
    loop = _run(loom, session, 3)
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
    _run(loom, session, 2).close()
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
    loop = _run(loom, session, 2)
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
        loop = _run(loom, session, 2)
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
    return session, _run(loom, session, 3)


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
    loop = _run(loom, session, 4)
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
    loop = _run(loom, session, 2)
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
    loop = _run(loom, session, 3)
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
    # A plan that fits serves every iteration: nothing from its idle region.
    assert loom.status()["plan_referee"]["region_reuses"] == 0
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
    loop = _run(loom, session, 4)
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


def test_plan_mode_errors_are_raised_at_enable(loom_env, tmp_path):
    loom = loom_env
    with pytest.raises(LoomError, match="no plan for rank 0: .*plan.rank0."
                                        "lplan does not exist"):
        loom._configure_native(mode="plan", workdir=tmp_path, **HOST)
    assert loom.status() is None
    bad = tmp_path / "plan.rank0.lplan"
    bad.write_text("id,lower,upper,size\n1,0,1,8\n")
    with pytest.raises(LoomError, match="not a loom plan file"):
        loom._configure_native(mode="plan", workdir=tmp_path, **HOST)
    bad.write_bytes(FAKE_PLAN)  # right magic, not a real plan
    with pytest.raises(LoomError, match=r"cannot install plan .*plan.rank0."
                                        r"lplan on device 0: "):
        loom._configure_native(mode="plan", workdir=tmp_path, **HOST)
    assert loom.status() is None
    # Nothing stays configured: another mode starts cleanly.
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    assert session.mode == "record"


def test_enable_once_per_process(loom_env, tmp_path):
    loom = loom_env
    loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    with pytest.raises(LoomError, match="already enabled in this process "
                                        r"\(mode='record'\)"):
        loom._configure_native(mode="auto", workdir=tmp_path, **HOST)


def test_ranks_name_files_and_pick_devices(loom_env, tmp_path, monkeypatch):
    loom = loom_env
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "8")
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    assert session.device == 2
    status = loom.status()
    assert (status["rank"], status["local_rank"], status["world_size"],
            status["device"]) == (5, 2, 8, 2)
    _run(loom, session, 2).close()
    loom.finish()
    assert (tmp_path / "trace.rank5.ltb").exists()
    assert fp.read_sidecar(tmp_path / "trace.rank5.ltb")["device"] == 2
    assert loom.memory_stats(2)["allocation.all.allocated"] > 0
    assert loom.memory_stats("cuda:2") == loom.memory_stats()


def test_ranks_reuse_a_plan_only_with_matching_requests(loom_env, tmp_path,
                                                        monkeypatch):
    loom = loom_env
    # Rank 0 and rank 1 record the same pattern, rank 2 another one.
    for rank, extra in ((0, None), (1, None), (2, 1)):
        monkeypatch.setenv("RANK", str(rank))
        session = loom._configure_native(mode="record", workdir=tmp_path,
                                         **HOST)
        _run(loom, session, 3, extra_at=extra).close()
        loom.finish()
        loom._reset()
    plan0 = config_lib.plan_path(tmp_path, 0)
    plan0.write_bytes(FAKE_PLAN)  # "planned" from rank 0's trace
    ranks = {r: config_lib.RankInfo(rank=r) for r in range(3)}
    cfg = config_lib.parse_config("plan", workdir=tmp_path)
    assert planning.resolve_plan(cfg, ranks[1]) == (plan0, "rank 0")
    with pytest.raises(LoomError, match="plan.rank0.lplan: the requests before"
                                        " the steady state differ"):
        planning.resolve_plan(cfg, ranks[2])


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


def test_files_subcommand_groups_ranks_by_requests(loom_env, tmp_path,
                                                   monkeypatch, capsys):
    from loom.tools import cli
    loom = loom_env
    for rank, extra in ((0, None), (1, 1), (2, None)):
        monkeypatch.setenv("RANK", str(rank))
        session = loom._configure_native(mode="record", workdir=tmp_path,
                                         **HOST)
        _run(loom, session, 3, extra_at=extra).close()
        loom.finish()
        loom._reset()
    config_lib.plan_path(tmp_path, 0).write_bytes(FAKE_PLAN)
    assert cli.main(["files", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "identical requests (may share a plan): ranks 0,2; ranks 1" in out
    assert "plan.rank0.lplan   trace.rank0.ltb.json" in out
    assert cli.main(["files", str(tmp_path), "--json"]) == 0
    import json
    report = json.loads(capsys.readouterr().out)
    assert report["identical_requests"] == [[0, 2], [1]]
    assert [r["steady_requests"] for r in report["ranks"]] == [10, 10, 10]
    assert cli.main(["files", str(tmp_path / "missing")]) == 1
    assert "not a directory" in capsys.readouterr().err


def test_record_then_plan_mode_serves_from_the_plan(loom_env, loom_tool,
                                                    tmp_path, capfd):
    """The two-step workflow of docs/plugin.md: record, `python3 -m loom
    plan` (loom_tool), then a fresh run (here: libloom shut down and
    configured again) in plan mode."""
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    del loom_tool  # built, or the test fails
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    # The first iteration begins after the set-up (as loom.watch(model)
    # marks it): its requests are an early iteration's, placed by the plan.
    loom.begin_iteration()
    _run(loom, session, 4).close()
    loom.finish()
    loom._reset()
    trace = tmp_path / "trace.rank0.ltb"
    plan = tmp_path / "plan.rank0.lplan"
    assert cli.main(["plan", str(trace), "-o", str(plan), "--time-limit",
                     "5"]) == 0, capfd.readouterr().err
    session = loom._configure_native(mode="plan", workdir=tmp_path, **HOST)
    loom.begin_iteration()
    status = loom.status()
    assert status["state"] == "serving" and status["plan_loaded"]
    assert status["plan_source"] == "own"
    # `loom plan` replayed the trace with and without the plan and wrote the
    # verdict in the plan file: plan mode reads it.
    check = status["plan_check"]
    assert check["earns_its_place"] is True
    assert 0 < check["peak_allocated_bytes"] <= \
        check["planned_peak_reserved_bytes"] <= \
        check["unplanned_peak_reserved_bytes"] + check["slack_bytes"]
    loop = _run(loom, session, 4)  # set-up and the recorded iterations
    hits = loom.memory_stats()["loom.plan_hits"]
    assert hits >= 4, "the weights are placed by the plan"
    for _ in range(4):  # steady state: every request at its planned place
        loop.iteration(markers=loom.phase)
        loom.step()
        stats = loom.memory_stats()
        assert stats["loom.plan_hits"] == hits + 10
        assert stats["loom.last_iteration_hit_rate"] == 1.0
        hits = stats["loom.plan_hits"]
        session.native.check_invariants(0)
    loop.close()


def test_an_unmarked_first_iteration_is_set_up_to_the_plan(
        loom_env, loom_tool, tmp_path, capfd):
    """Recorded with loom.step() alone, the first iteration comes before any
    marker: `loom plan` says so, the plan leaves that iteration to the
    dynamic space beside its region, and on this small loop that makes it
    lose its check (docs/design.md, the plan check); marking the first
    iteration makes a plan that earns its place (the two-step test)."""
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    del loom_tool
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    _run(loom, session, 4).close()
    loom.finish()
    loom._reset()
    plan = tmp_path / "plan.rank0.lplan"
    assert cli.main(["plan", str(tmp_path / "trace.rank0.ltb"), "-o",
                     str(plan), "--time-limit", "5"]) == 0
    out = capfd.readouterr().out
    assert "the set-up holds an iteration no marker began (10 of its " \
           "requests line up with the steady iteration's 10)" in out, out
    assert "loom.begin_iteration()" in out
    assert "does not earn its place" in out, out


def test_plan_mode_declines_a_plan_file_that_loses_on_its_recording(
        loom_env, loom_tool, tmp_path, capfd, caplog):
    """`loom plan` records in the plan file whether the plan earns its
    place (the recording replayed with and without it). builtin:moe's plan
    does not (its experts live beside the region: plan_check_test): plan
    mode serves without it, says so, and serves it only with
    check_plan=False."""
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    del loom_tool  # built, or the test fails
    loom = loom_env
    plan = tmp_path / "moe.lplan"
    assert cli.main(["plan", "builtin:moe", "-o", str(plan), "--time-limit",
                     "2"]) == 0, capfd.readouterr().err
    assert "does not earn its place" in capfd.readouterr().out
    with caplog.at_level(logging.WARNING, logger="loom"):
        session = loom._configure_native(mode="plan", workdir=tmp_path,
                                         plan=plan, **HOST)
    status = loom.status()
    assert status["state"] == "declined" and not status["plan_loaded"]
    check = status["plan_check"]
    assert check["earns_its_place"] is False
    assert check["planned_peak_reserved_bytes"] > \
        check["unplanned_peak_reserved_bytes"] + check["slack_bytes"]
    assert status["files"]["plan"] == str(plan)
    assert "does not earn its place" in caplog.text
    assert "check_plan=False" in caplog.text
    loop = _run(loom, session, 3)  # everything from the dynamic space
    stats = loom.memory_stats()
    assert stats["loom.plan_hits"] == 0 and stats["loom.plan_variants"] == 0
    assert stats["loom.static_region_bytes"] == 0
    session.native.check_invariants(0)
    loop.close()
    loom._reset()
    # Asked to: served (another workload's plan, so the run misses it).
    loom._configure_native(mode="plan", workdir=tmp_path, plan=plan,
                           check_plan=False, **HOST)
    status = loom.status()
    assert status["state"] == "serving" and status["plan_loaded"]
    assert status["plan_check"]["earns_its_place"] is False


def test_plan_mode_refuses_a_plan_file_with_a_corrupt_check(
        loom_env, loom_tool, tmp_path, capfd):
    """A CHEK section whose figures contradict its verdict (or any other
    damage the CRC does not see, as a file written by a faulty tool) stops
    enable() with the file and the reason; nothing is configured."""
    from loom.tools import cli  # pylint: disable=import-outside-toplevel
    del loom_tool
    loom = loom_env
    plan = tmp_path / "moe.lplan"
    assert cli.main(["plan", "builtin:moe", "-o", str(plan), "--time-limit",
                     "2"]) == 0, capfd.readouterr().err
    data = bytearray(plan.read_bytes())
    at = data.rindex(b"CHEK")  # the last section
    # Section: tag, u32 flags, u64 length, payload (version 1, flags 0: says
    # mid-run off and does not earn its place), u32 CRC-32C.
    flags_at = at + 4 + 4 + 8 + 1
    assert data[flags_at] == 0, "builtin:moe's plan does not earn its place"
    data[flags_at] = 2  # now says it does, against its own figures
    length = int.from_bytes(data[at + 8:at + 16], "little")
    crc = _crc32c(bytes(data[at:at + 16 + length]))
    data[at + 16 + length:at + 20 + length] = crc.to_bytes(4, "little")
    plan.write_bytes(bytes(data))
    with pytest.raises(LoomError, match=r"cannot install plan .*moe\.lplan "
                       r"on device 0: "
                       r".*CHEK: the verdict \(earns its place\) "
                       r"contradicts its figures"):
        loom._configure_native(mode="plan", workdir=tmp_path, plan=plan,
                               **HOST)
    assert loom.status() is None


def _crc32c(data):
    """CRC-32C (Castagnoli), as base/crc32c.h computes it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_auto_mode_reuses_rank0s_plan_only_when_requests_match(
        loom_env, tmp_path, monkeypatch):
    loom = loom_env
    planned = []

    def planner(trace, plan):
        planned.append(plan)
        with open(plan, "wb") as out:
            out.write(FAKE_PLAN)

    def auto_run(rank, extra_at=None):
        monkeypatch.setenv("RANK", str(rank))
        session = loom._configure_native(
            mode="auto", workdir=tmp_path, record_iterations=3,
            planner=planner, plan_async=False, reuse_plan_from=0,
            plan_timeout=5, **HOST)
        _run(loom, session, 4, extra_at=extra_at).close()
        status = loom.status()
        loom._reset()
        return status

    rank0 = auto_run(0)
    assert planned == [str(tmp_path / "plan.rank0.lplan")]
    # Rank 1, same requests: takes rank 0's plan (which, being a stand-in,
    # cannot be installed: that failure names the reused file).
    rank1 = auto_run(1)
    assert len(planned) == 1, "rank 1 did not plan"
    assert rank1["plan_error"].startswith(
        f"cannot install {tmp_path / 'plan.rank0.lplan'}")
    assert rank0["plan_error"].startswith(
        f"cannot install {tmp_path / 'plan.rank0.lplan'}")
    # Rank 2 makes an extra request: plans its own.
    auto_run(2, extra_at=2)
    assert planned[1:] == [str(tmp_path / "plan.rank2.lplan")]


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
