"""Driver time in `loom_tool compare` and `loom_tool replay`: each row's
driver calls priced with measured per-call costs (whatif/compare/
driver_costs.h), warm-up and steady state apart, on an H200 trace with the
H200's own cost file (--driver-costs)."""

import json
import subprocess

import pytest

from loom import _paths

RUN = _paths.REPO_ROOT / "bench" / "data" / "traces" / "gpu" / "h200_2026-11-26"
TRACE = RUN / "moe.ltb"
COSTS_FILE = RUN / "driver_costs.json"
COSTS = json.loads(COSTS_FILE.read_text())
PRICED = ("cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
          "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree")


def run(tool, *args):
    done = subprocess.run([str(tool), *args], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(name="rows")
def fixture_rows(loom_tool):
    rows = run(loom_tool, "compare", str(TRACE), "--json", "--plan-from",
               "first:2", "--loom-time-limit", "5", "--driver-costs",
               str(COSTS_FILE))
    return {row["allocator"]: row for row in rows}


def cost_bounds(kind):
    """The cheapest and the dearest measured cost of one call of `kind`
    (pricing is linear between measured sizes and clamped outside them)."""
    costs = [r[kind]["median_us"] for r in COSTS["sizes"]]
    return min(costs), max(costs)


def test_loom_rows_are_priced_by_size(rows):
    """vmm records the size of every memory call (Driver::sized_calls): no
    loom call is priced at a guessed size, and the time lies between every
    call at its kind's cheapest and at its dearest measured cost."""
    for name in ("loom", "loom_unplanned"):
        row = rows[name]
        time = row["driver_time"]
        calls = row["driver_calls"]
        assert calls["total"] > 0
        assert time["complete"] and time["unpriced_calls"] == 0
        assert time["unsized_calls"] == 0
        low = sum(calls[kind] * cost_bounds(kind)[0] for kind in PRICED)
        high = sum(calls[kind] * cost_bounds(kind)[1] for kind in PRICED)
        assert low <= time["total_us"] <= high
        assert "NVIDIA H200" in time["costs"]
        steady = row["steady_driver_calls_by_kind"]
        warm = row["warmup_driver_calls_by_kind"]
        assert time["warmup_us"] + time["steady_us"] <= \
            time["total_us"] * (1 + 1e-9)
        assert time["steady_us"] == 0 and steady["total"] == 0
        assert warm["total"] + steady["total"] <= calls["total"]
        # The counter of the last complete iteration is the steady state.
        assert row["counters"]["steady_driver_calls"] == steady["total"]


def test_simulated_rows_are_priced_by_size(rows):
    expandable = rows["pytorch_expandable"]["driver_time"]
    assert expandable["complete"] and expandable["unsized_calls"] == 0
    assert expandable["total_us"] > 0
    # cudaMalloc has no measured cost: the time says it is incomplete.
    torch = rows["pytorch"]["driver_time"]
    assert not torch["complete"]
    assert torch["unpriced_kinds"] == ["cudaMalloc"]
    assert torch["unpriced_calls"] == rows["pytorch"]["driver_calls"]["total"]
    assert torch["total_us"] == 0
    for row in rows.values():
        time = row["driver_time"]
        assert time["warmup_us"] <= time["total_us"] + 1e-9
        assert time["steady_us"] is not None  # the trace has iterations


def test_replay_reports_the_same_driver_time(loom_tool, rows):
    replay = run(loom_tool, "replay", str(TRACE), "--json", "--driver-costs",
                 str(COSTS_FILE))
    unplanned = rows["loom_unplanned"]
    assert replay["driver_calls"] == unplanned["driver_calls"]["total"]
    assert replay["driver_time"] == unplanned["driver_time"]
    assert replay["steady_driver_calls_by_kind"] == \
        unplanned["steady_driver_calls_by_kind"]
    assert replay["steady_driver_calls"] == \
        replay["steady_driver_calls_by_kind"]["total"]


def test_the_embedded_table_is_the_default(loom_tool):
    rows = run(loom_tool, "compare", str(TRACE), "--json", "--allocators",
               "loom_unplanned")
    assert rows[0]["driver_time"]["costs"].startswith("NVIDIA H200")
    text = subprocess.run(
        [str(loom_tool), "replay", str(TRACE)], capture_output=True,
        text=True, check=True, timeout=300).stdout
    assert "driver time    warm-up " in text
    # vmm records every call's size: nothing is priced at a guessed one.
    assert "sizes not recorded" not in text


@pytest.mark.parametrize("content, reason", [
    ("{\"sizes\": [", "unexpected end of the text"),
    ("{\"device\": \"x\"}", "no \"sizes\" list"),
    ("{\"sizes\": [{\"bytes\": 2097152, \"cuMemMap\": {\"median_us\": "
     "\"fast\"}}]}", "is not a non-negative number"),
])
def test_a_bad_cost_file_is_one_clear_line(loom_tool, tmp_path, content,
                                           reason):
    path = tmp_path / "costs.json"
    path.write_text(content)
    for command in ("compare", "replay"):
        done = subprocess.run(
            [str(loom_tool), command, str(TRACE), "--driver-costs",
             str(path)], capture_output=True, text=True, check=False,
            timeout=300)
        assert done.returncode == 1
        assert done.stdout == ""
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith(f"loom {command}: driver costs {path}: ")
        assert reason in lines[0]
