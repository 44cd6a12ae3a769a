"""The short plan-miss suite (bench/misses/misses.py --quick): loom planned
from another trace than the one it serves (a perturbed copy, another
model's plan, another seed), next to the baselines on the same trace."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_quick_suite_meets_its_targets(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench/misses/misses.py"), "--quick",
         "--json", str(out), "--time-limit", "2"],
        capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {r["row"]: r for r in json.loads(out.read_text())}
    assert len(rows) == 3
    for name, r in rows.items():
        e = r["efficiency"]
        # Real memory, every allocation stamped and checked at its free.
        assert r["host_data_checked"] and r["host_corrupted"] == 0, name
        # Never below the best of PyTorch's allocator, expandable segments
        # and the GMLake-style stitcher on the same trace.
        assert e["loom"] >= e[r["best_baseline"]], (name, e)
    moe = rows["builtin:moe_comm planned from seed 2"]
    assert moe["efficiency"]["loom"] >= 0.98
    assert moe["loom_steady_driver_calls"] == 0
    # Copies of its last iteration replayed after it: the last makes no
    # call, loom's nor expandable segments'.
    assert moe["repeated_steady_driver_calls"] == {
        "pytorch_expandable": 0, "loom": 0}
    # Driver time beside the calls: none in the steady state.
    assert moe["driver_time"]["loom"]["steady_us"] == 0
    assert moe["driver_time"]["loom"]["warmup_us"] > 0
    assert "| loom driver time (warm-up / steady) | expandable's |" in \
        done.stdout
    # Warm-up: at most twice expandable segments' driver calls.
    assert moe["driver_calls"]["loom"] <= 2 * \
        moe["driver_calls"]["pytorch_expandable"]
    # A foreign plan is noticed within the first requests: suspended, and
    # almost none of its region is ever backed.
    foreign = next(r for n, r in rows.items() if "foreign" in n)
    counters = foreign["loom_counters"]
    assert counters["plan_suspensions"] >= 1
    assert counters["static_backed_bytes"] < \
        0.05 * counters["static_region_bytes"]
    assert foreign["hit_rate"] < 0.5


def run_misses(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "bench/misses/misses.py"), *args],
        capture_output=True, text=True, cwd=REPO, timeout=600)


def test_loom_only_reuses_the_reference_baselines(tmp_path):
    """--loom-only: loom and unplanned loom measured, every other figure the
    reference's; the report compares the targets with the reference."""
    reference = REPO / "bench/results/misses.json"
    refs = {r["row"]: r for r in json.loads(reference.read_text())}
    out = tmp_path / "rows.json"
    done = run_misses("--quick", "--loom-only", str(reference), "--json",
                      str(out), "--jobs", "2")
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())
    assert len(rows) == 3
    for r in rows:
        ref = refs[r["row"]]
        assert r["loom_only"]
        for baseline in ("pytorch", "pytorch_expandable", "gmlake"):
            assert r["efficiency"][baseline] == ref["efficiency"][baseline]
            assert r["driver_time"][baseline] == ref["driver_time"][baseline]
        # Measured now: the counters of this run's loom.
        assert r["loom_counters"]["iterations"] == \
            ref["loom_counters"]["iterations"]
        assert r["host_data_checked"] is None
    assert "- at target: " in done.stdout
    assert "against the reference's unplanned loom" in done.stdout
    assert "- mean efficiency, loom / unplanned: " in done.stdout


def test_loom_only_refuses_what_it_cannot_do(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    done = run_misses("--quick", "--loom-only", str(bad))
    assert done.returncode != 0
    assert "not a misses.py --json file" in done.stderr
    done = run_misses("--quick", "--loom-only",
                      str(REPO / "bench/results/misses.json"), "--out",
                      str(tmp_path / "table.md"))
    assert done.returncode != 0
    assert "does not write the table" in done.stderr
    assert not (tmp_path / "table.md").exists()
    other = tmp_path / "other.json"
    other.write_text("[]")
    done = run_misses("--quick", "--loom-only", str(other))
    assert done.returncode != 0
    assert "no reference for" in done.stderr


def test_against_reference_counts_against_both_unplanned_figures():
    sys.path.insert(0, str(REPO / "bench/misses"))
    import misses
    ref = {
        "row": "recorded x_moe planned from iterations 0-2",
        "efficiency": {"pytorch": 0.90, "pytorch_expandable": 0.95,
                       "gmlake": 0.93, "loom": 0.985,
                       "loom_unplanned": 0.980},
        "peak_reserved_bytes": {}, "driver_calls": {},
        "best_baseline": "pytorch_expandable",
        "driver_time": {"pytorch_expandable": {"warmup_us": 100.0},
                        "loom": {"warmup_us": 150.0},
                        "loom_unplanned": {"warmup_us": 150.0}},
        "loom_steady_driver_calls": 0, "repeated_steady_driver_calls": None,
        "host_corrupted": 0, "host_data_checked": True,
    }
    compared = [
        {"allocator": "loom", "efficiency": 0.975,
         "peak_reserved_bytes": 10, "driver_calls": {"total": 5},
         "driver_time": {"warmup_us": 300.0},
         "counters": {"plan_hits": 3, "plan_misses": 1,
                      "steady_driver_calls": 2}},
        {"allocator": "loom_unplanned", "efficiency": 0.970,
         "peak_reserved_bytes": 11, "driver_calls": {"total": 4},
         "driver_time": {"warmup_us": 90.0}, "counters": {}},
    ]
    row = misses.loom_only_result(ref, compared)
    assert row["efficiency"]["loom"] == 0.975
    assert row["efficiency"]["pytorch"] == 0.90
    assert row["hit_rate"] == 0.75
    assert row["loom_steady_driver_calls"] == 2
    assert "corrupted" not in misses.verdicts(row)
    assert ref["efficiency"]["loom"] == 0.985  # the reference is not changed
    report = misses.against_reference([row], {ref["row"]: ref})
    # Against its own unplanned loom (97.0%) the row is at target; against
    # the reference's (98.0%) it is not.
    assert "- at target: 1 -> 1 of 1 (0 against the reference's" in report
    assert "- MoE rows >= 98%: 1 -> 0 of 1" in report
    assert "- warm-ups within 2x expandable segments': 1 -> 0 of 1" in report
    assert "- no call in the last iteration: 1 -> 0 of 1" in report
    assert "loom 98.50% -> 97.50%" in report
    assert "warm-up 1.50x -> 3.00x" in report
