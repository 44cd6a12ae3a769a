"""Plan mode, plan files and ranks against libloom.so on the host backend
(real memory, no torch, no GPU): a plan file recorded, planned and served;
the plan check a file carries (a losing plan declined, a corrupt check
refused); errors at enable; ranks naming their files and devices, and
reusing rank 0's plan only when their requests match."""

import logging

import pytest

from loom import config as config_lib
from loom import fingerprint as fp
from loom import planning
from loom.errors import LoomError
from loom_fakes import HOST, run_steps

FAKE_PLAN = planning.PLAN_MAGIC + b"\x01\x00\x00\x00 a stand-in plan body"


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
    run_steps(loom, session, 2).close()
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
        run_steps(loom, session, 3, extra_at=extra).close()
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


def test_files_subcommand_groups_ranks_by_requests(loom_env, tmp_path,
                                                   monkeypatch, capsys):
    from loom.tools import cli
    loom = loom_env
    for rank, extra in ((0, None), (1, 1), (2, None)):
        monkeypatch.setenv("RANK", str(rank))
        session = loom._configure_native(mode="record", workdir=tmp_path,
                                         **HOST)
        run_steps(loom, session, 3, extra_at=extra).close()
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
    run_steps(loom, session, 4).close()
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
    loop = run_steps(loom, session, 4)  # set-up and the recorded iterations
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
    run_steps(loom, session, 4).close()
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
    loop = run_steps(loom, session, 3)  # everything from the dynamic space
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
        run_steps(loom, session, 4, extra_at=extra_at).close()
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
