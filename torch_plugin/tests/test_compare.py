"""`loom compare`: the JSON rows and the --plot picture.

Tests that run loom_tool fail, naming the build command, when it is not built
(`bazel build //cli:loom_tool`); the plotting itself is tested without it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loom import _paths
from loom.tools import compare_plot

PLUGIN_DIR = Path(__file__).resolve().parent.parent
REPO = PLUGIN_DIR.parent
EXAMPLE_CSV = REPO / "bench/data/minimalloc/examples/input.12.csv"
ROW_KEYS = {"allocator", "peak_allocated_bytes", "peak_reserved_bytes",
            "efficiency", "fragmentation", "driver_calls"}



def _loom(*args):
    env = dict(os.environ, PYTHONPATH=str(PLUGIN_DIR))
    return subprocess.run([sys.executable, "-m", "loom", *map(str, args)],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          check=False, timeout=300)


def test_json_rows_have_the_documented_keys_and_hand_checked_values(loom_tool):
    result = _loom("compare", EXAMPLE_CSV, "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["allocator"] for r in rows] == [
        "pytorch", "pytorch_expandable", "gmlake", "loom", "loom_unplanned"]
    for row in rows:
        assert ROW_KEYS <= set(row), row.keys()
        # Five 4-byte buffers, at most three live: 12 bytes. Each allocator
        # holds one 2 MiB small-pool segment or page.
        assert row["peak_allocated_bytes"] == 12
        assert row["peak_reserved_bytes"] == 2 * 1024 * 1024
        assert row["efficiency"] == pytest.approx(12 / (2 << 20))
        assert row["fragmentation"] == pytest.approx(1 - 12 / (2 << 20))
        assert row["oom"] is False
    assert rows[0]["driver_calls"]["cudaMalloc"] == 1
    assert rows[1]["driver_calls"]["total"] == 4  # reserve, create, map, access
    # loom: the plan is exact (12 bytes in one granule), every request hits.
    assert rows[3]["counters"]["plan_hits"] == 5
    assert rows[3]["counters"]["plan_misses"] == 0


def test_plot_writes_a_real_png_and_keeps_stdout_clean(tmp_path, loom_tool):
    out = tmp_path / "moe.png"
    result = _loom("compare", "builtin:moe:layers=2,iterations=2", "--json",
                   "--plot", out)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)  # the plot message goes to stderr
    assert len(rows) == 5
    assert "plot written" in result.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 30_000
    import matplotlib.image
    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[0] > 500 and pixels.shape[1] > 1000
    assert pixels[..., :3].std() > 0.05  # not a blank canvas


def test_plot_keeps_a_series_the_user_asked_for(tmp_path, loom_tool):
    series = tmp_path / "series.csv"
    result = _loom("compare", EXAMPLE_CSV, "--series", series, "--plot",
                   tmp_path / "x.png")
    assert result.returncode == 0, result.stderr
    data = compare_plot.read_series(series)
    assert list(data) == ["pytorch", "pytorch_expandable", "gmlake", "loom",
                          "loom_unplanned"]
    assert max(data["pytorch"]["requested_bytes"]) == 12


def test_errors_pass_through(loom_tool):
    result = _loom("compare", "builtin:nothing", "--plot", "/tmp/never.png")
    assert result.returncode == 1
    assert "unknown builtin workload" in result.stderr
    assert not Path("/tmp/never.png").exists()
    result = _loom("compare", EXAMPLE_CSV, "--plot")
    assert result.returncode == 2
    assert "--plot needs a value" in result.stderr


def _write_series(path, rows):
    lines = [",".join(compare_plot.SERIES_COLUMNS)]
    lines += [",".join(map(str, row)) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_plot_series_without_loom_tool(tmp_path):
    series_path = tmp_path / "s.csv"
    mib = 1 << 20
    _write_series(series_path, [
        ("a", 0, -1, 1 * mib, 1 * mib, 2 * mib),
        ("a", 1, 0, 3 * mib, 3 * mib, 4 * mib),
        ("a", 2, 1, 0, 0, 4 * mib),
        ("b", 0, -1, 1 * mib, 1 * mib, 2 * mib),
        ("b", 1, 0, 3 * mib, 3 * mib, 20 * mib),  # b stops early: OOM
    ])
    data = compare_plot.read_series(series_path)
    assert list(data) == ["a", "b"]
    assert data["a"]["reserved_bytes"] == [2 * mib, 4 * mib, 4 * mib]
    calls = []
    out = tmp_path / "p.png"
    compare_plot.plot_series(data, out, "test",
                             extra_panels=[lambda ax: calls.append(ax)])
    assert len(calls) == 1  # the hook for loom's plan picture
    assert out.stat().st_size > 10_000


@pytest.mark.parametrize("text,fragment", [
    ("", "expected the header"),
    ("a,b\n", "expected the header"),
    (",".join(compare_plot.SERIES_COLUMNS) + "\n", "no samples"),
    (",".join(compare_plot.SERIES_COLUMNS) + "\nx,1,2,3\n", ":2: expected 6"),
    (",".join(compare_plot.SERIES_COLUMNS) + "\nx,1,2,3,4,z\n", ":2:"),
])
def test_read_series_rejects_bad_files(tmp_path, text, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(compare_plot.SeriesError, match=fragment):
        compare_plot.read_series(path)
    with pytest.raises(compare_plot.SeriesError, match="No such file"):
        compare_plot.read_series(tmp_path / "missing.csv")


def test_usage_lists_compare(capsys):
    from loom.tools import cli
    assert cli.main(["--help"]) == 0
    assert "compare" in capsys.readouterr().out
