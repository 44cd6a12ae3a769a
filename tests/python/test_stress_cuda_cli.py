"""`loom stress --backend cuda` from the command line without a GPU:
loom_tool against the stub libcuda (vmm/testing/cuda_stub.h, named by
LOOM_LIBCUDA). The options are those of the async backend; the report says
the page size, cap and largest request the program ran with (the GPU's page
size, the cap and request scaled with it); no driver is a clear error."""

import json
import os
import subprocess

import pytest

from loom import _paths

STUB = _paths.REPO_ROOT / "bazel-bin" / "vmm" / "testing" / "libcuda_stub.so"


def stress(loom_tool, *args, libcuda):
    env = dict(os.environ, LOOM_LIBCUDA=str(libcuda))
    return subprocess.run([str(loom_tool), "stress", "--backend", "cuda",
                           *args], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


@pytest.fixture(name="stub")
def fixture_stub():
    if not STUB.exists():
        pytest.fail(f"{STUB} is not built; run `bazel build "
                    f"//vmm/testing:libcuda_stub.so` first", pytrace=False)
    return STUB


def test_cuda_backend_runs_the_same_program_in_the_gpus_pages(loom_tool,
                                                              stub):
    done = stress(loom_tool, "--ops", "1500", "--seconds", "60", "--seed",
                  "4", "--cap", "6MiB", "--max-request", "512KiB",
                  "--threads", "1", "--json", libcuda=stub)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["backend"] == "cuda" and report["seed"] == 4
    assert report["threads"] == 1 and report["streams"] == 3
    # 64 KiB pages by default: 96 pages of cap, requests of up to 8 pages,
    # in the stub's 2 MiB pages.
    assert report["granularity"] == 2 << 20
    assert report["cap_bytes"] == 96 * (2 << 20)
    assert report["max_request"] == 8 * (2 << 20)
    assert report["ok"] and report["faults"] == 0
    assert report["corrupted"] == 0 and report["invariant_failures"] == 0
    assert report["kernels"] > 500 and report["plans_installed"] == 1


def test_cuda_backend_without_a_driver_says_so(loom_tool, tmp_path):
    done = stress(loom_tool, "--ops", "10",
                  libcuda=tmp_path / "no" / "libcuda.so.1")
    assert done.returncode == 2
    assert "no CUDA driver: cannot load" in done.stderr


def test_cuda_backend_refuses_more_devices_than_present(loom_tool, stub):
    done = stress(loom_tool, "--ops", "10", "--devices", "2", libcuda=stub)
    assert done.returncode == 2
    assert "2 devices asked, 1 present" in done.stderr


def test_driver_failures_lose_nothing_on_the_cuda_backend(loom_tool, stub):
    # Before 10% of the allocations one of the next memory calls fails
    # before it reaches the (stub) driver: the program goes on past what
    # fails, and nothing faults, corrupts or is shared.
    done = stress(loom_tool, "--ops", "1500", "--seconds", "60", "--seed",
                  "2", "--driver-failures", "10", "--json", libcuda=stub)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["driver_failure_percent"] == 10
    assert report["driver_failures"] > 0
    assert report["ok"] and report["faults"] == 0
    assert report["corrupted"] == 0 and report["invariant_failures"] == 0


def test_driver_failures_out_of_range_are_refused(loom_tool, stub):
    done = stress(loom_tool, "--ops", "10", "--driver-failures", "150",
                  libcuda=stub)
    assert done.returncode == 2
    assert "--driver-failures 150 is not 0-100" in done.stderr
