"""`loom plan` and `loom verify` through the Python front end."""

import json
import subprocess
import sys

import pytest

from loom import _paths

README = "bench/data/minimalloc/examples/input.12.csv"
CHALLENGING_C = "bench/data/minimalloc/challenging/C.1048576.csv"


def _tool():
    """loom_tool's path; the test fails (it does not skip) when loom_tool is
    not built."""
    try:
        return _paths.loom_tool()
    except _paths.NotBuiltError as error:
        pytest.fail(f"loom_tool is not built ({error}); run `bazel build "
                    f"//cli:loom_tool //torch_plugin:libloom.so`",
                    pytrace=False)


def run_loom(*args):
    return subprocess.run([sys.executable, "-m", "loom", *map(str, args)],
                          capture_output=True, text=True, check=False,
                          cwd=_paths.REPO_ROOT,
                          env={"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)})


def test_plan_writes_a_plan_and_offsets_that_verify(tmp_path):
    _tool()
    plan, offsets = tmp_path / "r.plan", tmp_path / "r.csv"
    result = run_loom("plan", README, "-o", plan, "--offsets", offsets, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["peak_bytes"] == 12
    assert report["lower_bound_bytes"] == 12
    assert report["buffers"] == 5
    assert report["valid"] is True
    assert report["optimal"] is True
    assert report["algorithm"]
    assert report["seconds"] >= 0
    lines = offsets.read_text().splitlines()
    assert lines[0] == "id,lower,upper,size,offset"
    assert len(lines) == 6
    for solution in (plan, offsets):
        check = run_loom("verify", solution, README)
        assert check.returncode == 0, check.stdout + check.stderr
        assert check.stdout.startswith("valid: 5 buffers, peak 12 bytes")


def test_verify_names_a_planted_overlap(tmp_path):
    _tool()
    offsets = tmp_path / "bad.csv"
    # b4 lives [9, 21) and b5 [0, 21) at offset 0: b4 at 2 meets b5.
    offsets.write_text("id,lower,upper,size,offset\n"
                       "b1,0,3,4,8\nb2,3,9,4,8\nb3,0,9,4,4\n"
                       "b4,9,21,4,2\nb5,0,21,4,0\n")
    result = run_loom("verify", offsets, README, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert report["violation"] == (
        "buffer 3 (id 3, 'b4') at [2, 6) and buffer 4 (id 4, 'b5') at [0, 4) "
        "share bytes [2, 4) at time 9")


def test_capacity_mode_and_show(tmp_path):
    _tool()
    result = run_loom("plan", README, "--capacity", 11)
    assert result.returncode == 1
    assert "does not fit in 11 bytes" in result.stderr
    plan = tmp_path / "c.plan"
    result = run_loom("plan", CHALLENGING_C, "--capacity", "1048576",
                      "--time-limit", 30, "-o", plan, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["fits"] is True
    assert report["peak_bytes"] == 1039360  # C's lower bound
    shown = run_loom("plan", plan)
    assert shown.returncode == 0
    assert "peak          1039360 bytes = 1.000000 x lower bound" in shown.stdout


def test_corrupt_plan_is_rejected(tmp_path):
    _tool()
    plan = tmp_path / "r.plan"
    assert run_loom("plan", README, "-o", plan).returncode == 0
    data = bytearray(plan.read_bytes())
    data[-10] ^= 0xFF
    plan.write_bytes(bytes(data))
    result = run_loom("verify", plan, README)
    assert result.returncode == 1
    assert "checksum mismatch" in result.stderr
    assert str(plan) in result.stderr


def test_cyclic_plan_with_dynamic_windows(tmp_path):
    _tool()
    plan = tmp_path / "cyclic.plan"
    # Period 21: the README instance replayed; window [9, 21) named moe.
    result = run_loom("plan", README, "--period", 21, "--windows",
                      "9:21:moe,20:25", "--granule", 4, "-o", plan, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["valid"] is True
    assert report["peak_bytes"] == 12
    windows = report["dynamic_windows"]
    assert [w["name"] for w in windows] == ["moe", ""]
    # During [9, 21) only b4 and b5 are live: 4 of the region's 12 bytes
    # (one 4-byte granule) are idle.
    assert windows[0]["idle_bytes"] == 4
    assert windows[0]["idle_granules"] == 1
    # [20, 25) wraps to [0, 4): b4 ends at 21 and b1, b3, b5 live at 0-3.
    assert windows[1]["idle_bytes"] == 0
    check = run_loom("verify", plan, README, "--json")
    assert check.returncode == 0, check.stdout
    assert json.loads(check.stdout)["period"] == 21
    bad = run_loom("plan", README, "--windows", "9:3")
    assert bad.returncode == 1
    assert "[9, 3) is empty or negative" in bad.stderr


def test_plan_says_whether_the_plan_earns_its_place(tmp_path):
    """A trace's plan is replayed on that trace with and without it
    (whatif/loom/plan_check.h): the generated MoE workload's plan holds
    more there than loom without a plan (its experts' requests sit in the
    dynamic space beside the region), the dense one's less. A CSV instance
    has no trace to replay; --no-check skips the replays."""
    _tool()
    reports = {}
    for name in ("moe", "dense"):
        result = run_loom("plan", f"builtin:{name}:seed=2", "--time-limit",
                          "2", "-o", tmp_path / f"{name}.lplan", "--json")
        assert result.returncode == 0, result.stderr
        reports[name] = json.loads(result.stdout)["check"]
    moe, dense = reports["moe"], reports["dense"]
    assert moe["earns_its_place"] is False and moe["mid_run"] is False
    assert moe["planned_peak_reserved_bytes"] > \
        moe["unplanned_peak_reserved_bytes"] + moe["slack_bytes"]
    assert dense["earns_its_place"] is True
    assert dense["planned_peak_reserved_bytes"] < \
        dense["unplanned_peak_reserved_bytes"]
    text = run_loom("plan", "builtin:moe:seed=2", "--time-limit", "2")
    assert "check        on its recording the plan holds" in text.stdout
    assert "does not earn its place (not served)" in text.stdout
    skipped = run_loom("plan", "builtin:moe:seed=2", "--time-limit", "2",
                       "--no-check", "--json")
    assert "check" not in json.loads(skipped.stdout)
    csv = run_loom("plan", README, "--json")
    assert "check" not in json.loads(csv.stdout)


def test_the_check_travels_with_the_plan_file(tmp_path):
    """`loom plan` writes the check into the plan file (section CHEK):
    `loom plan <file>` shows it, `loom replay --plan` serves the plan only
    if it earns its place (as plan mode does), `--no-check` anyway. A plan
    made with --no-check has none and is served as given."""
    _tool()
    moe = tmp_path / "moe.lplan"
    made = run_loom("plan", "builtin:moe:seed=2", "--time-limit", "2", "-o",
                    moe, "--json")
    assert made.returncode == 0, made.stderr
    check = json.loads(made.stdout)["check"]
    shown = run_loom("plan", moe, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["check"] == check
    assert "does not earn its place" in run_loom("plan", moe).stdout

    def replay(plan, *extra):
        result = run_loom("replay", "builtin:moe:seed=2", "--plan", plan,
                          "--json", *extra)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    declined = replay(moe)
    assert declined["plan_check"] == check
    assert declined["plan_hits"] == 0 and declined["dynamic_requests"] > 0
    served = replay(moe, "--no-check")
    assert "plan_check" not in served and served["plan_hits"] > 0
    # Served, it holds more than without it: the check was right.
    assert served["peak_reserved_bytes"] > declined["peak_reserved_bytes"]

    unchecked = tmp_path / "unchecked.lplan"
    assert run_loom("plan", "builtin:moe:seed=2", "--time-limit", "2",
                    "--no-check", "-o", unchecked).returncode == 0
    assert json.loads(run_loom("plan", unchecked, "--json").stdout)[
        "check"] is None
    assert "none recorded" in run_loom("plan", unchecked).stdout
    assert replay(unchecked)["plan_hits"] > 0


def test_replay_serves_a_plan_at_the_granularity_it_was_planned_for(
        tmp_path):
    """A trace recorded at 64 KiB (the host backend's granularity) is planned
    for 64 KiB granules by `loom plan`, and `loom replay --plan` serves it
    at the same granularity by default: the replay holds exactly what the
    plan's recorded check says the plan holds on its recording. At 2 MiB (the
    default before) the same plan holds more."""
    _tool()
    source = _paths.REPO_ROOT / "bench/data/traces/gpt2small_train_step.ltt"
    text = source.read_text()
    assert "\ngranularity 0\n" in text
    trace = tmp_path / "host64k.ltt"
    trace.write_text(text.replace("\ngranularity 0\n", "\ngranularity 65536\n",
                                  1))
    plan = tmp_path / "host64k.lplan"
    made = run_loom("plan", trace, "--time-limit", "2", "-o", plan, "--json")
    assert made.returncode == 0, made.stderr
    check = json.loads(made.stdout)["check"]
    assert check["earns_its_place"]

    def replay(*extra):
        result = run_loom("replay", trace, "--plan", plan, "--json", *extra)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    served = replay()
    assert served["plan_misses"] == 0 and served["plan_hits"] > 0
    assert served["peak_reserved_bytes"] == check[
        "planned_peak_reserved_bytes"]
    at_2mib = replay("--granularity", "2MiB")
    assert at_2mib["peak_reserved_bytes"] > served["peak_reserved_bytes"]
