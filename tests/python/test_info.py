"""`loom info` through the Python front end, against the built loom_tool."""

import json
import subprocess
import sys

import pytest

from loom import _paths


def _tool_or_skip():
    try:
        return _paths.loom_tool()
    except _paths.NotBuiltError as error:
        pytest.skip(f"loom_tool is not built: {error}")


def run_loom(*args):
    return subprocess.run([sys.executable, "-m", "loom", *args],
                          capture_output=True, text=True, check=False,
                          cwd=_paths.REPO_ROOT,
                          env={"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)})


def test_host_backend_json_reports_granularity():
    _tool_or_skip()
    result = run_loom("info", "--backend=host", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["backend"] == "host"
    assert info["granularity"] == 2 * 1024 * 1024
    assert info["devices"][0]["total_bytes"] == 80 * 1024**3


def test_fake_backend_honours_options():
    _tool_or_skip()
    result = run_loom("info", "--backend=fake", "--granularity=64KiB",
                      "--devices=3", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["granularity"] == 65536
    assert [d["ordinal"] for d in info["devices"]] == [0, 1, 2]


def test_cuda_backend_without_gpu_says_no_cuda_driver():
    _tool_or_skip()
    result = run_loom("info", "--backend=cuda")
    if result.returncode == 0:
        pytest.skip("a CUDA driver is present on this machine")
    assert result.returncode == 1
    assert "no CUDA driver" in result.stderr


def test_bad_flags_are_usage_errors():
    _tool_or_skip()
    result = run_loom("info", "--backend=tpu")
    assert result.returncode == 1
    assert "unknown driver backend 'tpu'" in result.stderr
    result = run_loom("info", "--bogus")
    assert result.returncode == 2
    assert "unknown flag --bogus" in result.stderr
    result = run_loom("info", "--help")
    assert result.returncode == 0
    assert "usage: loom info" in result.stdout
