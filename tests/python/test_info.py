"""`loom info` through the Python front end, against the built loom_tool."""

import json
import subprocess
import sys

import pytest

from loom import _paths


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
    return subprocess.run([sys.executable, "-m", "loom", *args],
                          capture_output=True, text=True, check=False,
                          cwd=_paths.REPO_ROOT,
                          env={"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)})


def test_host_backend_json_reports_granularity():
    _tool()
    result = run_loom("info", "--backend=host", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["backend"] == "host"
    assert info["granularity"] == 2 * 1024 * 1024
    assert info["devices"][0]["total_bytes"] == 80 * 1024**3
    assert info["simulated"] is True


def test_a_simulated_device_says_so():
    """The host backend's 80 GiB is --capacity's default, not a GPU's."""
    _tool()
    result = run_loom("info", "--backend=host", "--capacity=16GiB")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == ("backend: host (simulated: no GPU; the devices and "
                        "their memory are --devices and --capacity, default "
                        "1 x 80 GiB)")
    assert "      memory: 16.00 GiB total, 16.00 GiB free (simulated)" in lines


def test_fake_backend_honours_options():
    _tool()
    result = run_loom("info", "--backend=fake", "--granularity=64KiB",
                      "--devices=3", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["granularity"] == 65536
    assert [d["ordinal"] for d in info["devices"]] == [0, 1, 2]


def test_cuda_backend_reports_the_gpus_or_that_there_is_no_driver():
    _tool()
    result = run_loom("info", "--backend=cuda", "--json")
    if result.returncode == 0:  # a machine with a CUDA driver
        info = json.loads(result.stdout)
        assert info["backend"] == "cuda"
        assert info["device_count"] == len(info["devices"]) >= 1
        assert info["granularity"] > 0
        assert all(d["total_bytes"] >= d["free_bytes"] > 0
                   for d in info["devices"])
    else:
        assert result.returncode == 1
        assert "no CUDA driver" in result.stderr


def test_bad_flags_are_usage_errors():
    _tool()
    result = run_loom("info", "--backend=tpu")
    assert result.returncode == 1
    assert "unknown driver backend 'tpu'" in result.stderr
    result = run_loom("info", "--bogus")
    assert result.returncode == 2
    assert "unknown flag --bogus" in result.stderr
    result = run_loom("info", "--help")
    assert result.returncode == 0
    assert "usage: loom info" in result.stdout
