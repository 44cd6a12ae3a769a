"""The hand-over to PyTorch on a GPU: what torch_plugin/tests cannot check
with the project's CPU build of torch (see test_real_torch.py there), where
CUDAPluggableAllocator cannot be constructed (no
torch._C._cuda_customAllocator, so none of its `_allocator` setters),
change_current_allocator cannot run and MemPool / CUDAGraph are dummies.

Each check runs in a fresh process (the allocator can be swapped once per
process):
- loom.enable(): every setter loom knows is installed (set_record_stream_fn,
  set_reset_fn, set_memory_fraction_fn, set_begin_allocate_to_pool,
  set_end_allocate_to_pool_fn, set_release_pool on this PyTorch), CUDA
  tensors are served by libloom byte for byte, torch.cuda.memory_allocated()
  and friends report loom's figures, record_stream / empty_cache reach loom
  without error, and the run's exported snapshot is drawn by
  torch.cuda._memory_viz with the live bytes;
- enabling after CUDA is initialised is loom's "too late" error;
- loom.pool(): a torch.cuda.MemPool with libloom's allocator, used by the
  current thread inside the block only (use_mem_pool);
- CUDA graph capture and replay through the pool hooks.
Skips without torch or CUDA, as the other GPU tests. Run by
tests/gpu/run_gpu.sh with LOOM_LIB pointing at the packed libloom.so.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[3]
MiB = 1 << 20


def child(script, tmp_path):
    """Runs `script` in a fresh Python; returns the JSON it printed last."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "torch_plugin"), env.get("PYTHONPATH", "")])
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_enable_hands_every_cuda_tensor_to_loom(tmp_path):
    out = child(f"""
        import json, pickle
        import loom
        status = loom.enable(mode="record", workdir={str(tmp_path)!r},
                             atexit=False)
        import torch
        from torch.cuda import _memory_viz
        from loom import _torch
        x = torch.empty(3 * {MiB} + 5, dtype=torch.uint8, device="cuda")
        y = torch.ones(1000, device="cuda")
        stats = loom.memory_stats()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            z = y * 2
        y.record_stream(side)
        torch.cuda.synchronize()
        total = float(z.sum())
        del z
        torch.cuda.empty_cache()
        snapshot = loom.export_snapshot({str(tmp_path / "run.pickle")!r})
        print(json.dumps({{
            "hooks": status["torch_hooks"],
            "known": [setter for setter, _ in _torch.HOOKS],
            "served": stats["allocated_bytes.all.current"],
            "torch_allocated": torch.cuda.memory_allocated(),
            "loom_allocated": loom.memory_stats()["allocated_bytes.all.current"],
            "torch_reserved": torch.cuda.max_memory_reserved(),
            "loom_reserved": loom.memory_stats()["reserved_bytes.all.peak"],
            "summary": torch.cuda.memory_summary() == loom.memory_summary(),
            "total": total,
            "segsum": _memory_viz.segsum(snapshot),
            "live": sum(b["requested_size"] for s in snapshot["segments"]
                        for b in s["blocks"]
                        if b["state"] == "active_allocated"),
            "format_live": repr(_memory_viz.Bytes(
                loom.memory_stats()["allocated_bytes.all.current"])),
        }}))
        """, tmp_path)
    assert out["hooks"] == out["known"], "every hook installed"
    assert out["served"] == 3 * MiB + 5 + 4000, \
        "the two tensors, and nothing else, served by libloom byte for byte"
    assert out["torch_allocated"] == out["loom_allocated"]
    assert out["torch_reserved"] == out["loom_reserved"]
    assert out["summary"]
    assert out["total"] == 2000.0
    assert out["live"] == out["loom_allocated"]
    assert f"total_allocated: {out['format_live']}" in out["segsum"]


def test_enable_after_cuda_is_initialised_is_too_late(tmp_path):
    out = child(f"""
        import json
        import torch
        torch.zeros(1, device="cuda")
        import loom
        from loom import _torch
        try:
            loom.enable(workdir={str(tmp_path)!r})
        except loom.LoomError as error:
            print(json.dumps([str(error), _torch.TOO_LATE]))
        """, tmp_path)
    assert out[0] == out[1]


def test_pool_routes_this_threads_allocations_only(tmp_path):
    out = child(f"""
        import json
        import torch
        import loom
        outside = torch.empty({MiB}, dtype=torch.uint8, device="cuda")
        with loom.pool() as pool:
            inside = torch.empty(3 * {MiB}, dtype=torch.uint8, device="cuda")
            in_pool = loom.memory_stats()["allocated_bytes.all.current"]
        after = torch.empty({MiB}, dtype=torch.uint8, device="cuda")
        print(json.dumps({{
            "is_mem_pool": isinstance(pool, torch.cuda.MemPool),
            "in_pool": in_pool,
            "after": loom.memory_stats()["allocated_bytes.all.current"],
            "torch_allocated": torch.cuda.memory_allocated(),
        }}))
        """, tmp_path)
    assert out["is_mem_pool"]
    # The caching allocator asks loom for whole segments (20 MiB here).
    assert out["in_pool"] >= 3 * MiB
    assert out["after"] == out["in_pool"], "outside the block: not loom's"
    assert out["torch_allocated"] >= 5 * MiB, "PyTorch's own stats work"


def test_graph_capture_goes_through_the_pool_hooks(tmp_path):
    out = child(f"""
        import json
        import loom
        status = loom.enable(mode="record", workdir={str(tmp_path)!r},
                             atexit=False)
        import torch
        x = torch.ones(1 << 16, device="cuda")
        y = x * 2  # warm-up, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2 + 1
        x.fill_(3)
        graph.replay()
        torch.cuda.synchronize()
        print(json.dumps({{"hooks": status["torch_hooks"],
                          "value": float(y[0]), "sum": float(y.sum())}}))
        """, tmp_path)
    assert "set_begin_allocate_to_pool" in out["hooks"]
    assert out["value"] == 7.0 and out["sum"] == 7.0 * (1 << 16)
