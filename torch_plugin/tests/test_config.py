"""loom.enable()'s configuration: checking, libloom settings, rank files."""

from pathlib import Path

import pytest

from loom import config
from loom.errors import LoomError


def test_defaults_per_mode():
    record = config.parse_config("record")
    assert record.backend == "cuda"
    assert record.record_events == config.DEFAULT_RECORD_EVENTS
    assert record.workdir == Path(".loom")
    plan = config.parse_config("plan", workdir="/w", plan="/w/p.lplan")
    assert plan.record_events == 0
    assert plan.plan == Path("/w/p.lplan")
    auto = config.parse_config("auto", record_iterations=5)
    assert auto.record_iterations == 5 and auto.record_events > 0
    assert config.parse_config("pool").record_events == 0


@pytest.mark.parametrize("args, options, message", [
    (("replay",), {}, "mode: 'replay' is not one of 'record', 'plan', 'auto'"),
    (("auto",), {"colour": 1}, "unknown option 'colour' (options: atexit,"),
    (("auto",), {"backend": "tpu"}, "backend: 'tpu' is not one of 'cuda'"),
    (("auto",), {"cap": "lots"}, "cap: 'lots' is not a byte count"),
    (("auto",), {"cap": -1}, "cap: -1 is negative"),
    (("auto",), {"cap": 1.5}, "cap: expected a byte count, got float"),
    (("auto",), {"fraction": 1.5}, "fraction: 1.5 is not a number in [0, 1]"),
    (("auto",), {"fraction": "half"}, "fraction: 'half' is not a number"),
    (("auto",), {"record_iterations": 0},
     "record_iterations: 0 is not in >= 1"),
    (("auto",), {"record_iterations": 2.0}, "expected an integer, got 2.0"),
    (("record",), {"record_events": 0}, "record_events must be > 0"),
    (("auto",), {"record_events": 1 << 33}, "record_events: 8589934592 is not "
                                            "in 0..4294967296"),
    (("plan",), {"record_iterations": 3}, "record_iterations applies to "
                                          "mode='auto' only"),
    (("auto",), {"granularity": "64KiB"}, "granularity applies to the host "
                                          "and fake backends only"),
    (("auto",), {"devices": 2}, "devices applies to the host and fake"),
    (("auto",), {"backend": "host", "devices": 65}, "devices: 65 is not in "
                                                    "1..64"),
    (("auto",), {"trace_format": "xml"}, "trace_format: 'xml' is not one of"),
    (("auto",), {"plan_args": ["--time-limit", "5"]},
     "plan_args is gone: the planner runs inside libloom now; pass "
     "plan_options, a dict such as {'time_limit': 5}"),
    (("auto",), {"plan_options": ["time_limit", 5]},
     "plan_options: expected a dict of planner options"),
    (("auto",), {"plan_options": {"time-limit": 5}},
     "plan_options: unknown planner option 'time-limit' (options: algorithm, "
     "align, capacity"),
    (("auto",), {"plan_options": {"time_limit": 0}},
     "plan_options['time_limit']: expected a positive number of seconds"),
    (("auto",), {"plan_options": {"capacity": "lots"}},
     "plan_options['capacity']: 'lots' is not a byte count"),
    (("auto",), {"plan_options": {"persistent": "no"}},
     "plan_options['persistent']: expected True or False"),
    (("auto",), {"plan_options": {"steady_iteration": -2}},
     "plan_options['steady_iteration']: -2 is not in >= -1"),
    (("auto",), {"plan_options": {"algorithm": "a;b"}},
     "plan_options['algorithm']: expected a name, got 'a;b'"),
    (("auto",), {"plan_timeout": 0}, "plan_timeout: expected a positive "
                                     "number of seconds"),
    (("auto",), {"plan_async": 1}, "plan_async: expected True or False"),
    (("auto",), {"planner": "loom_tool"}, "planner: expected a callable"),
    (("auto",), {"reuse_plan_from": -1}, "reuse_plan_from: -1 is not in >= 0"),
    (("auto", ".loom", None, -2), {}, "device: -2 is not in 0..32767"),
    (("auto", None), {}, "workdir: expected a directory path, got None"),
    (("plan", ".loom", 7), {}, "plan: expected a file path, got 7"),
])
def test_bad_configuration_is_named(args, options, message):
    with pytest.raises(LoomError) as error:
        config.parse_config(*args, **options)
    assert message in str(error.value)


def test_plan_options_are_checked_and_passed_as_libloom_text():
    cfg = config.parse_config("auto", plan_options={
        "time_limit": 5, "capacity": "40GiB", "persistent": False,
        "algorithm": "best-fit", "steady_iteration": -1})
    assert cfg.plan_options == {"time_limit": 5.0, "capacity": 40 << 30,
                                "persistent": False, "algorithm": "best-fit",
                                "steady_iteration": -1}
    from loom import _native  # pylint: disable=import-outside-toplevel
    assert _native.plan_options_string(cfg.plan_options) == (
        "time_limit=5.0;capacity=42949672960;persistent=0;"
        "algorithm=best-fit;steady_iteration=-1")
    assert config.parse_config("auto").plan_options == {}
    assert sorted(config.PLAN_OPTIONS) == [
        "algorithm", "align", "capacity", "granule", "minimize", "period",
        "persistent", "round", "scope", "seed", "source", "steady_iteration",
        "time_limit"]


def test_sizes():
    assert config.parse_size(12345, "x") == 12345
    assert config.parse_size("512", "x") == 512
    assert config.parse_size("64KiB", "x") == 64 << 10
    assert config.parse_size("3M", "x") == 3 << 20
    assert config.parse_size(" 40 GiB ", "x") == 40 << 30
    assert config.parse_size("2TiB", "x") == 2 << 40
    for bad in ("1.5GiB", "GiB", "12 PB", "-3", ""):
        with pytest.raises(LoomError, match="is not a byte count"):
            config.parse_size(bad, "cap")
    with pytest.raises(LoomError, match="expected a byte count"):
        config.parse_size(True, "cap")


def test_settings_name_every_key_so_nothing_leaks_from_a_previous_configure():
    cfg = config.parse_config("record", backend="host", granularity="64KiB",
                              device_memory="1GiB", cap="256MiB",
                              fraction=0.5, record_events=1000)
    assert config.settings_string(cfg) == (
        "backend=host;granularity=65536;device_memory=1073741824;devices=1;"
        "cap=268435456;fraction=0.5;record=1000;plan=;replan=0;"
        "max_chunk_pages=512;host_sample_every=256;stitch=1")
    plan = config.parse_config("plan", plan="/p/plan.rank0.lplan")
    text = config.settings_string(plan, plan=plan.plan)
    assert text.startswith("backend=cuda;granularity=2097152;"
                           "device_memory=85899345920;devices=1;cap=0;")
    assert text.endswith(";record=0;plan=/p/plan.rank0.lplan;replan=0;"
                         "max_chunk_pages=512;host_sample_every=256;stitch=1")
    # Auto mode re-plans shapes its plan does not fit, with the planner's
    # time limit; plan mode only when asked; record mode cannot.
    auto = config.parse_config("auto", plan_options={"time_limit": 2})
    assert config.settings_string(auto).endswith(
        ";replan=1;max_chunk_pages=512;host_sample_every=256;stitch=1;"
        "replan_time_limit=2.0")
    assert config.settings_string(config.parse_config(
        "plan", plan="p.lplan", replan=True)).endswith(
            ";replan=1;max_chunk_pages=512;host_sample_every=256;stitch=1")
    assert not config.parse_config("auto", replan=False).replan
    with pytest.raises(LoomError, match="replan applies to modes"):
        config.parse_config("record", replan=True)
    # A plan that does not earn its place is served only when asked.
    assert config.parse_config("plan", plan="p.lplan").check_plan
    assert not config.parse_config("auto", check_plan=False).check_plan
    with pytest.raises(LoomError, match="check_plan applies to modes"):
        config.parse_config("record", check_plan=False)
    with pytest.raises(LoomError, match="check_plan: expected True or False"):
        config.parse_config("plan", plan="p.lplan", check_plan="no")
    # Host devices cover the rank's device.
    assert ";devices=4;" in config.settings_string(cfg, device_count=4)
    with pytest.raises(LoomError, match="contains ';'"):
        config.settings_string(plan, plan="/a;b.lplan")


def test_physical_layout_and_host_timing_options():
    cfg = config.parse_config("auto", max_chunk_pages=10, host_sample_every=64)
    text = config.settings_string(cfg)
    assert ";max_chunk_pages=10;host_sample_every=64" in text
    assert config.parse_config("auto", host_sample_every=0).host_sample_every \
        == 0
    for bad in (0, 513, True, "8"):
        with pytest.raises(LoomError, match="max_chunk_pages"):
            config.parse_config("auto", max_chunk_pages=bad)
    for bad in (3, -1, 1 << 21, 1.0):
        with pytest.raises(LoomError, match="host_sample_every"):
            config.parse_config("auto", host_sample_every=bad)
    # Stitching idle chunks: on unless turned off.
    assert config.parse_config("auto").stitch
    off = config.parse_config("record", stitch=False)
    assert config.settings_string(off).endswith(";stitch=0")
    with pytest.raises(LoomError, match="stitch: expected True or False"):
        config.parse_config("auto", stitch=1)


def test_rank_info_from_torchrun_variables():
    assert config.rank_info({}) == config.RankInfo(0, None, 1)
    info = config.rank_info({"RANK": "5", "LOCAL_RANK": "1",
                             "WORLD_SIZE": "8"})
    assert (info.rank, info.local_rank, info.world_size) == (5, 1, 8)
    with pytest.raises(LoomError, match="RANK='one' is not a rank number"):
        config.rank_info({"RANK": "one"})
    with pytest.raises(LoomError, match="LOCAL_RANK='-1' is not a rank"):
        config.rank_info({"LOCAL_RANK": "-1"})
    with pytest.raises(LoomError, match="RANK=8 is not below WORLD_SIZE=8"):
        config.rank_info({"RANK": "8", "WORLD_SIZE": "8"})
    with pytest.raises(LoomError, match="WORLD_SIZE=0 is not >= 1"):
        config.rank_info({"WORLD_SIZE": "0"})


def test_file_names_per_rank():
    assert config.trace_path("/w", 3) == Path("/w/trace.rank3.ltb")
    assert config.trace_path("/w", 3, "text") == Path("/w/trace.rank3.ltt")
    assert config.plan_path("/w", 12) == Path("/w/plan.rank12.lplan")
    assert config.sidecar_path("/w/plan.rank12.lplan") == \
        Path("/w/plan.rank12.lplan.json")
    assert config.rank_of("/w/plan.rank12.lplan") == 12
    assert config.rank_of("trace.rank0.ltb") == 0
    assert config.rank_of("plan.lplan") is None
    assert config.rank_of("plan.rank1.lplan.json") is None
