"""Handing libloom to PyTorch: what loom does with torch's pluggable-
allocator API when the swap can happen, against a fake `torch`
(loom_fakes.fake_torch), and the error without torch at all.

Fake torch stays here because the real one cannot go: the project's torch
is the CPU build, where torch.cuda.memory.CUDAPluggableAllocator cannot be
constructed (torch._C._cuda_customAllocator is missing, and the allocator
setters set_record_stream_fn ... set_release_pool with it),
change_current_allocator cannot run, CUDA is never available or initialised
and MemPool / CUDAGraph cannot be instantiated. So the swap itself, the
hooks, set_device under torchrun, "CUDA initialised too early", PyTorch
refusing the swap, graph capture with and without the pool hooks, an old
PyTorch without the API and loom.pool()'s MemPool are checked here with
the fake, which records what loom calls; test_real_torch.py checks what the
real torch allows (the API surface, the no-CUDA error, the stats, snapshots
drawn by torch.cuda._memory_viz), and tests/gpu/python/
test_torch_handover_gpu.py the hand-over on a GPU."""

import logging
import sys

import pytest

import installed
from loom import _torch
from loom import _state
from loom import stats
from loom.errors import LoomError
from loom_fakes import fake_torch


def _use(monkeypatch, **kwargs):
    torch, calls, state = fake_torch(**kwargs)
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch, calls, state


def test_without_torch_the_error_is_one_clear_line(tmp_path):
    """In a Python where torch is not installed (torch is here: the child
    makes its import fail as a missing package does)."""
    workdir = tmp_path / "w"
    script = f"""
        import json
        import loom
        from loom import _state
        from loom.errors import LoomError
        out = {{}}
        try:
            loom.enable(workdir={str(workdir)!r})
        except LoomError as error:
            out["enable"] = str(error)
            out["chained"] = error.__cause__ is not None or (
                error.__context__ is not None and
                not error.__suppress_context__)
        out["session"] = _state.current() is not None
        try:
            with loom.pool():
                pass
        except LoomError as error:
            out["pool"] = str(error)
        out["session_after_pool"] = _state.current() is not None
        print(json.dumps(out), flush=True)
        loom.enable(workdir={str(workdir)!r})  # uncaught, as in a script
        """
    result = installed.run_python(script, without=["torch"])
    out = installed.last_json(result)
    assert out["enable"].startswith(
        "loom.enable() needs PyTorch, which cannot be imported here (No "
        "module named 'torch')")
    assert not out["chained"]
    assert not out["session"] and not out["session_after_pool"]
    assert out["pool"].startswith("loom.pool() needs PyTorch")
    assert not workdir.exists(), "nothing written before the check"
    # As a script: one exception, no chained tracebacks.
    assert result.returncode == 1
    assert "During handling" not in result.stderr
    assert result.stderr.count("Traceback") == 1
    assert result.stderr.strip().splitlines()[-1].startswith(
        "loom.errors.LoomError: loom.enable() needs PyTorch")


def test_a_python_without_torch_is_what_the_test_above_sees():
    result = installed.run_python("""
        import importlib.util
        try:
            import torch
        except ModuleNotFoundError as error:
            print(repr(error), error.name)
        try:
            import torch.cuda
        except ModuleNotFoundError as error:
            print(repr(error))
        print(importlib.util.find_spec("json") is not None)
        """, without=["torch"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "ModuleNotFoundError(\"No module named 'torch'\") torch",
        "ModuleNotFoundError(\"No module named 'torch'\")",
        "True"]


def test_importing_loom_does_not_import_torch():
    result = installed.run_python(
        "import sys, loom; print('torch' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_old_torch(loom_env, tmp_path, monkeypatch):
    torch, _, _ = _use(monkeypatch, version="1.13.1")
    del torch.cuda.memory.CUDAPluggableAllocator
    with pytest.raises(LoomError, match=r"needs torch.cuda.memory.CUDAPluggable"
                                        r"Allocator \(PyTorch >= 2.0\); this "
                                        r"is PyTorch 1.13.1"):
        loom_env.enable(workdir=tmp_path)


def test_cuda_already_initialised(loom_env, tmp_path, monkeypatch):
    _use(monkeypatch, initialized=True)
    with pytest.raises(LoomError) as error:
        loom_env.enable(workdir=tmp_path)
    assert str(error.value) == _torch.TOO_LATE
    assert "Call loom.enable() first thing" in str(error.value)
    assert _state.current() is None


def test_swap_refused_by_torch(loom_env, tmp_path, monkeypatch):
    _use(monkeypatch, swap_error="Can't swap an already initialized allocator")
    with pytest.raises(LoomError) as error:
        loom_env.enable(mode="record", workdir=tmp_path)
    assert str(error.value) == _torch.TOO_LATE
    assert _state.current() is None, "the half-enabled session is dropped"
    # libloom was shut down again: it can be configured afresh.
    _use(monkeypatch, swap_error="something else broke")
    with pytest.raises(LoomError, match="change_current_allocator failed: "
                                        "something else broke"):
        loom_env.enable(mode="record", workdir=tmp_path)


def test_enable_installs_libloom_with_its_hooks(loom_env, tmp_path,
                                                monkeypatch):
    loom = loom_env
    torch, calls, _ = _use(monkeypatch)
    status = loom.enable(mode="record", workdir=tmp_path, cap="40GiB")
    session = _state.current()
    native = session.native
    assert calls[0] == ("CUDAPluggableAllocator", native.path,
                        "loom_torch_malloc", "loom_free")
    assert calls[1:4] == [
        ("set_record_stream_fn", native.address("loom_record_stream")),
        ("set_reset_fn", native.address("loom_empty_cache")),
        ("set_memory_fraction_fn", native.address("loom_set_memory_fraction")),
    ]
    assert all(address for _, address in calls[1:4])
    assert calls[4][0] == "change_current_allocator"
    assert calls[4][1] is session.torch_allocator
    assert len(calls) == 5, "no set_device without LOCAL_RANK or device="
    assert status["torch_allocator"] and status["mode"] == "record"
    assert status["torch_hooks"] == ["set_record_stream_fn", "set_reset_fn",
                                     "set_memory_fraction_fn"]
    # torch.cuda's stats functions now read loom's.
    assert torch.cuda.memory_stats is stats.memory_stats
    assert torch.cuda.memory.memory_stats is stats.memory_stats
    assert torch.cuda.reset_peak_memory_stats is stats.reset_peak_memory_stats
    assert torch.cuda.memory_summary is stats.memory_summary
    # A second enable() says so (not "CUDA is already initialised").
    with pytest.raises(LoomError, match="already enabled in this process"):
        loom.enable(mode="plan", workdir=tmp_path)
    # PyTorch cannot give the allocator back.
    with pytest.raises(LoomError, match="cannot be shut down"):
        loom._reset()


def test_torchrun_rank_gets_its_device(loom_env, tmp_path, monkeypatch):
    _, calls, _ = _use(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("RANK", "11")
    loom_env.enable(mode="record", workdir=tmp_path, torch_stats=False)
    assert calls[-1] == ("set_device", 3)
    assert _state.current().device == 3
    assert _state.current().ranks.rank == 11


def test_missing_record_stream_hook_is_a_warning(loom_env, tmp_path,
                                                 monkeypatch, caplog):
    _, calls, _ = _use(monkeypatch, hooks=("set_reset_fn",))
    with caplog.at_level(logging.WARNING, logger="loom"):
        status = loom_env.enable(mode="record", workdir=tmp_path, device=1)
    assert status["torch_hooks"] == ["set_reset_fn"]
    assert "cannot forward record_stream" in caplog.text
    assert calls[-1] == ("set_device", 1)


GRAPH_HOOKS = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn",
               "set_release_pool")


def test_graph_pool_hooks_are_installed_when_offered(loom_env, tmp_path,
                                                     monkeypatch):
    torch, calls, _ = _use(monkeypatch, graphs=True,
                           hooks=("set_record_stream_fn", "set_reset_fn",
                                  "set_memory_fraction_fn") + GRAPH_HOOKS)
    status = loom_env.enable(mode="record", workdir=tmp_path)
    native = _state.current().native
    installed = dict(c for c in calls if c[0] in GRAPH_HOOKS)
    assert installed == {
        "set_begin_allocate_to_pool":
            native.address("loom_begin_allocate_to_pool"),
        "set_end_allocate_to_pool_fn":
            native.address("loom_end_allocate_to_pool"),
        "set_release_pool": native.address("loom_release_pool"),
    }
    assert all(installed.values())
    assert set(GRAPH_HOOKS) <= set(status["torch_hooks"])
    # Capture goes to PyTorch as usual: loom serves its private pool.
    torch.cuda.CUDAGraph().capture_begin()
    assert calls[-1][0] == "capture_begin"


def test_graph_capture_is_refused_without_the_pool_hooks(loom_env, tmp_path,
                                                         monkeypatch):
    torch, calls, _ = _use(monkeypatch, graphs=True)
    loom_env.enable(mode="record", workdir=tmp_path)
    with pytest.raises(LoomError, match="allocate-to-pool hooks"):
        torch.cuda.CUDAGraph().capture_begin()
    assert all(c[0] != "capture_begin" for c in calls), "never reached torch"


def test_pool(loom_env, monkeypatch):
    loom = loom_env
    _use(monkeypatch)
    with pytest.raises(LoomError, match=r"needs torch.cuda.MemPool and "
                                        r"torch.cuda.use_mem_pool "
                                        r"\(PyTorch >= 2.5\)"):
        with loom.pool():
            pass
    assert _state.current() is None, "nothing configured after the error"
    _, calls, _ = _use(monkeypatch, mem_pool=True)
    with loom.pool(device=0) as first:
        pass
    assert _state.current().mode == "pool"
    with loom.pool(device=0) as second:
        pass
    assert first is second, "one MemPool per device, reused"
    names = [c[0] for c in calls]
    assert names == ["CUDAPluggableAllocator", "set_record_stream_fn",
                     "set_reset_fn", "set_memory_fraction_fn", "MemPool",
                     "use_mem_pool", "end_mem_pool", "use_mem_pool",
                     "end_mem_pool"]
    assert "change_current_allocator" not in names
    with pytest.raises(LoomError, match="options are taken on first use"):
        with loom.pool(cap="1GiB"):
            pass


def test_pool_after_enable_is_refused(loom_env, tmp_path, monkeypatch):
    _use(monkeypatch, mem_pool=True)
    loom_env.enable(mode="record", workdir=tmp_path)
    with pytest.raises(LoomError, match="already made loom the allocator"):
        with loom_env.pool():
            pass
