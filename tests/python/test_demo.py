"""`loom demo` and `loom what-if` end to end (they need the built loom_tool:
the `loom_tool` fixture fails the test when it is not built)."""

import json
import subprocess
import sys

from loom import _paths


def test_demo_prints_every_allocator_and_writes_pictures(tmp_path, loom_tool):
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "loom", "demo", "--out", str(tmp_path),
         "--time-limit", "2"],
        capture_output=True, text=True, check=False, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    for allocator in ("pytorch", "pytorch_expandable", "gmlake", "loom"):
        assert f"gpt2small_train_step   {allocator}" in result.stdout
        assert f"moe                    {allocator}" in result.stdout
    for name in ("gpt2small_train_step", "moe"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 50_000


def test_demo_json_rows(tmp_path, loom_tool):
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "loom", "demo", "--out", str(tmp_path), "--json",
         "--time-limit", "2"],
        capture_output=True, text=True, check=False, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    loom = next(r for r in rows["gpt2small_train_step"] if r["allocator"] == "loom")
    pytorch = next(r for r in rows["gpt2small_train_step"]
                   if r["allocator"] == "pytorch")
    # The real trace: loom's plan is exact and holds less than PyTorch.
    assert loom["efficiency"] > 0.995
    assert loom["peak_reserved_bytes"] < pytorch["peak_reserved_bytes"]
    assert loom["counters"]["plan_misses"] == 0


def test_what_if_on_a_real_snapshot(tmp_path, loom_tool):
    snapshot = (_paths.REPO_ROOT / "bench" / "data" / "pytorch_snapshots" /
                "raw" / "magma27_small_ctx256_b32_fwd_bwd.pickle")
    env = {"PYTHONPATH": str(_paths.PACKAGE_DIR.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "loom", "what-if", str(snapshot), "--json"],
        capture_output=True, text=True, check=False, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {r["allocator"]: r for r in json.loads(result.stdout)}
    assert set(rows) >= {"pytorch", "pytorch_expandable", "gmlake", "loom"}
    # peak allocated = the snapshot's in-trace peak of live bytes
    assert rows["loom"]["peak_allocated_bytes"] == 13923997700
    assert rows["loom"]["peak_reserved_bytes"] <= rows["pytorch"]["peak_reserved_bytes"]
