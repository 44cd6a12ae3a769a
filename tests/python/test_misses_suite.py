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
