"""`python3 -m loom analyze` forwards to the built loom_tool."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loom import _paths
from loom.tools import cli

PLUGIN_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PLUGIN_DIR.parent
EXAMPLE_CSV = REPO_ROOT / "bench" / "data" / "minimalloc" / "examples" / "input.12.csv"


def _tool():
    """loom_tool's path; the test fails (it does not skip) when loom_tool is
    not built."""
    try:
        return _paths.loom_tool()
    except _paths.NotBuiltError as error:
        pytest.fail(f"loom_tool is not built ({error}); run `bazel build "
                    f"//cli:loom_tool //torch_plugin:libloom.so`",
                    pytrace=False)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "loom", *args], cwd=PLUGIN_DIR,
                          capture_output=True, text=True, check=False)


def test_analyze_is_forwarded():
    assert "analyze" in cli.FORWARDED


def test_analyze_csv_json_matches_hand_computed_values():
    _tool()
    result = _run("analyze", str(EXAMPLE_CSV), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    # input.12.csv: five 4-byte buffers b1 [0,3) b2 [3,9) b3 [0,9) b4 [9,21)
    # b5 [0,21): at most three live at once.
    assert report["events"] == 10
    assert report["allocs"] == 5
    assert report["frees"] == 5
    assert report["peak_live_bytes"] == 12
    assert report["peak_live_bytes_512"] == 3 * 512
    assert report["iterations"] == 1
    assert report["iteration_source"] == "whole_trace"
    # Phases inferred from the peak (first reached by the third alloc): b1,
    # b3, b5 are allocated before it and freed after it (scoped); b2 and b4
    # live entirely after it (transient).
    assert report["classes"]["scoped"] == {"count": 3, "bytes": 12}
    assert report["classes"]["transient"] == {"count": 2, "bytes": 8}
    assert sum(c["count"] for c in report["classes"].values()) == 5


def test_analyze_text_report_and_missing_file():
    _tool()
    result = _run("analyze", str(EXAMPLE_CSV))
    assert result.returncode == 0, result.stderr
    assert "peak live" in result.stdout and "scoped" in result.stdout
    missing = _run("analyze", "/nonexistent/trace.ltb")
    assert missing.returncode == 1
    assert missing.stdout == ""
    lines = missing.stderr.strip().splitlines()
    assert lines == ["loom analyze: /nonexistent/trace.ltb: cannot open: "
                     "No such file or directory"]


def test_single_training_step_snapshot_is_one_iteration():
    """A one-step PyTorch snapshot repeats per layer, but layers are not
    iterations (memory grows through forward and falls through backward)."""
    _tool()
    csv = (REPO_ROOT / "bench" / "data" / "pytorch_snapshots" / "instances" /
           "bcrafton_gpt2small_ctx64_b1_train_step.csv")
    result = _run("analyze", str(csv), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["allocs"] == 2609
    assert report["events"] == 2 * 2609
    assert report["iterations"] == 1
    assert report["iteration_source"] == "whole_trace"
