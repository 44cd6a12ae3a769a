"""loom against the real PyTorch of the project's Python: the CPU build
(torch 2.13.0) that `./loom setup` installs. A missing torch fails these
tests with the command to run (fixture `torch`, installed.real).

What the CPU build allows, and is checked here:
- the hand-over's entry points: `loom.enable()` (CUDA backend) and
  `loom.pool()` stop with loom's one-line LoomError (CUDA not available,
  torch.version.cuda = None), configure nothing and write nothing;
- the pluggable-allocator API loom calls exists with the signatures loom
  uses (CUDAPluggableAllocator(path, alloc_fn_name, free_fn_name) and its
  allocator(), change_current_allocator, MemPool(allocator), use_mem_pool
  (pool, device), CUDAGraph.capture_begin), and PyTorch's own code
  resolves libloom's loom_torch_malloc / loom_free;
- graph-capture refusal wraps the real torch.cuda.CUDAGraph;
- torch.cuda.memory_stats() and every function that reads it
  (memory_allocated, max_memory_allocated, memory_reserved,
  max_memory_reserved, the deprecated memory_cached family),
  reset_peak_memory_stats() and memory_summary() report loom's figures
  after loom._torch.patch_stats (the keys torch reads are loom's);
- snapshots exported by loom (of the current run and of a trace file),
  loaded and drawn by torch.cuda._memory_viz: segsum (`stats`), trace,
  memory, segments, compare, trace_plot and segment_plot, in process and
  through its command line, with the drawn totals checked.

What only a GPU can test (tests/gpu/python/test_torch_handover_gpu.py):
constructing CUDAPluggableAllocator (the CPU build has no
torch._C._cuda_customAllocator), so the `_allocator` setters
set_record_stream_fn, set_reset_fn, set_memory_fraction_fn,
set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and
set_release_pool (not even declared in the CPU build's torch/_C stubs),
change_current_allocator itself, MemPool / use_mem_pool and CUDAGraph
instances (dummy classes here), and CUDA tensors served by libloom.

Not redirected by patch_stats (torch's own, which raise under a pluggable
allocator on a GPU): torch.cuda.memory_stats_as_nested_dict,
reset_accumulated_memory_stats and the torch.accelerator.memory_*
functions."""

import ast
import base64
import copy
import inspect
import json
import os
import pickle
import re
import runpy
import sys
import warnings

import pytest

import installed
import viz_model
from loom import _torch
from loom import stats as loom_stats
from loom.errors import LoomError
from loom.tools import trace as loom_trace
from loom_fakes import HOST, FakeLoop

KiB, MiB = 1 << 10, 1 << 20


# ------------------------------------------------------------- hand-over

def test_enable_and_pool_without_cuda_are_one_clear_loom_error(tmp_path,
                                                               torch):
    """In a child with no GPU visible (CUDA_VISIBLE_DEVICES empty: also
    true of a CUDA build on a GPU machine), as a training script would run
    it: loom.enable() first, nothing touched CUDA before."""
    del torch  # the child imports it; here: fail clearly when it is missing
    workdir = tmp_path / "w"
    script = f"""
        import json
        import loom
        from loom import _state
        from loom.errors import LoomError
        out = {{}}
        try:
            loom.enable(mode="record", workdir={str(workdir)!r})
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
        import torch
        out["torch"] = [torch.__version__, torch.version.cuda,
                        torch.cuda.is_initialized()]
        print(json.dumps(out), flush=True)
        loom.enable(workdir={str(workdir)!r})  # uncaught: what a script shows
        """
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    result = installed.run_python(script, env=env)
    out = installed.last_json(result)
    version, cuda, initialised = out["torch"]
    expected = (
        f"loom.enable(): CUDA is not available to PyTorch {version} (no GPU "
        f"or driver visible, or a CPU-only build: torch.version.cuda = "
        f"{cuda}). loom serves CUDA memory only; without a GPU use its "
        f"offline tools, or backend='host' to exercise the allocator on the "
        f"CPU.")
    assert out["enable"] == expected
    assert not out["chained"]
    assert out["pool"] == "loom.pool(): CUDA is not available to PyTorch"
    assert not out["session"] and not out["session_after_pool"], \
        "nothing configured: enable() can be called again"
    assert not initialised, "loom's checks do not initialise CUDA"
    assert not workdir.exists(), "nothing written"
    assert result.returncode == 1
    assert result.stderr.count("Traceback") == 1
    assert "During handling" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        f"loom.errors.LoomError: {expected}"


def _parameters(function):
    return list(inspect.signature(function).parameters)


def test_the_pluggable_allocator_api_loom_calls(torch, libloom):
    memory = torch.cuda.memory
    # loom._torch.ready_torch / pool_torch look for exactly these.
    for name in ("CUDAPluggableAllocator", "change_current_allocator"):
        assert hasattr(memory, name), name
    for name in ("MemPool", "use_mem_pool", "CUDAGraph", "is_available",
                 "is_initialized", "set_device", "current_device"):
        assert hasattr(torch.cuda, name), name
    assert torch.cuda.MemPool is memory.MemPool
    assert torch.cuda.use_mem_pool is memory.use_mem_pool
    # The calls loom makes, by signature.
    assert _parameters(memory.CUDAPluggableAllocator) == [
        "path_to_so_file", "alloc_fn_name", "free_fn_name"]
    assert _parameters(memory.change_current_allocator) == ["allocator"]
    assert _parameters(torch.cuda.MemPool)[0] == "allocator"
    assert _parameters(torch.cuda.use_mem_pool) == ["pool", "device"]
    assert issubclass(memory.CUDAPluggableAllocator, memory._CUDAAllocator)
    # loom._torch._raw: the raw allocator behind the wrapper, by allocator().
    raw = object()
    assert _torch._raw(memory._CUDAAllocator(raw)) is raw
    assert _torch.set_hooks(raw, native=None) == [], "no setter, no hook"
    # PyTorch resolves loom's two functions in libloom with ctypes before
    # it needs CUDA: a wrong name fails there, loom's names get past it.
    with pytest.raises(AttributeError, match="undefined symbol: loom_nope"):
        memory.CUDAPluggableAllocator(str(libloom), "loom_nope", "loom_free")
    with pytest.raises(AttributeError, match="undefined symbol: loom_nope"):
        memory.CUDAPluggableAllocator(str(libloom), "loom_torch_malloc",
                                      "loom_nope")
    if torch.version.cuda is None:
        _cpu_build_stops_at_cuda(torch, libloom)
    else:  # a CUDA build (not the project's): the setters, without a swap
        allocator = memory.CUDAPluggableAllocator(
            str(libloom), "loom_torch_malloc", "loom_free")
        from loom import _native  # pylint: disable=import-outside-toplevel
        native = _native.load(str(libloom))
        assert _torch.set_hooks(_torch._raw(allocator), native) == [
            setter for setter, _ in _torch.HOOKS]
    assert not torch.cuda.is_initialized()


def _cpu_build_stops_at_cuda(torch, libloom):
    """The CPU build (`./loom setup`'s) stops at the CUDA part: no
    _cuda_customAllocator (so no raw allocator and none of its setters), no
    allocator swap, dummy MemPool and CUDAGraph, no CUDA."""
    memory = torch.cuda.memory
    assert not torch.cuda.is_available()
    with pytest.raises(AttributeError, match="_cuda_customAllocator"):
        memory.CUDAPluggableAllocator(str(libloom), "loom_torch_malloc",
                                      "loom_free")
    assert not hasattr(torch._C, "_cuda_customAllocator")
    for setter, _ in _torch.HOOKS:
        assert not hasattr(torch._C._cuda_CUDAAllocator, setter), setter
    with pytest.raises(AttributeError, match="_cuda_changeCurrentAllocator"):
        memory.change_current_allocator(memory._CUDAAllocator(object()))
    with pytest.raises(RuntimeError, match="dummy base class MemPool"):
        torch.cuda.MemPool()
    with pytest.raises(RuntimeError, match="dummy base class CUDAGraph"):
        torch.cuda.CUDAGraph()


def test_graph_capture_is_refused_on_the_real_cudagraph(torch, monkeypatch):
    graph = torch.cuda.CUDAGraph
    original = graph.capture_begin
    # Undone after the test: the original method, no _loom_refused.
    monkeypatch.setattr(graph, "capture_begin", original)
    monkeypatch.setattr(graph, "_loom_refused", False, raising=False)
    _torch.refuse_graph_capture(torch)
    wrapper = graph.capture_begin
    assert wrapper is not original and wrapper.__wrapped__ is original
    _torch.refuse_graph_capture(torch)
    assert graph.capture_begin is wrapper, "wrapped once"
    # torch.cuda.graph and make_graphed_callables use this very class.
    assert torch.cuda.graphs.CUDAGraph is graph
    with pytest.raises(LoomError) as error:
        graph.capture_begin(None, capture_error_mode="global")
    assert "allocate-to-pool hooks" in str(error.value)
    assert f"this PyTorch ({torch.__version__})" in str(error.value)


# ------------------------------------------------------------------ stats

# torch.cuda function -> the memory_stats() key it returns.
READERS = {
    "memory_allocated": "allocated_bytes.all.current",
    "max_memory_allocated": "allocated_bytes.all.peak",
    "memory_reserved": "reserved_bytes.all.current",
    "max_memory_reserved": "reserved_bytes.all.peak",
}


def _restored_after_the_test(torch, monkeypatch):
    """torch.cuda's functions that patch_stats replaces come back after the
    test (each must exist in both namespaces: patch_stats would skip it)."""
    for name in _torch._STATS_FUNCTIONS:
        for namespace in (torch.cuda, torch.cuda.memory):
            assert hasattr(namespace, name), f"torch has no {name}"
            monkeypatch.setattr(namespace, name, getattr(namespace, name))


@pytest.fixture(name="patched")
def fixture_patched(torch, monkeypatch):
    """Real torch with torch.cuda's stats functions pointed at loom's by
    loom._torch.patch_stats (what loom.enable() does)."""
    _restored_after_the_test(torch, monkeypatch)
    _torch.patch_stats(torch)
    return torch


def test_torch_reads_the_keys_loom_provides(loom_env, tmp_path, torch,
                                            monkeypatch):
    """Which memory_stats() key each of torch's functions returns, found by
    calling them over a probe whose every key has its own value."""
    probe = {key: index + 1 for index, key in enumerate(READERS.values())}
    seen = []

    def memory_stats(device=None):
        seen.append(device)
        return probe

    monkeypatch.setattr(torch.cuda.memory, "memory_stats", memory_stats)
    for name, key in READERS.items():
        function = getattr(torch.cuda, name)
        assert function is getattr(torch.cuda.memory, name)
        assert function() == probe[key], name
        assert function(device=3) == probe[key], name
    assert seen == [None, 3] * len(READERS), "device passed through"
    # The deprecated names read memory_reserved() and friends.
    with pytest.warns(FutureWarning):
        assert torch.cuda.memory_cached() == probe["reserved_bytes.all.current"]
    with pytest.warns(FutureWarning):
        assert torch.cuda.max_memory_cached() == \
            probe["reserved_bytes.all.peak"]
    # loom has every one of those keys.
    loom = loom_env
    loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    assert set(READERS.values()) <= set(loom.memory_stats())


def test_torch_stats_functions_report_loom(loom_env, tmp_path, patched):
    torch = patched
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     devices=2, **HOST)
    native = session.native
    for name in _torch._STATS_FUNCTIONS:
        assert getattr(torch.cuda, name) is getattr(loom_stats, name)
        assert getattr(torch.cuda.memory, name) is getattr(loom_stats, name)
    a = native.malloc(3 * MiB + 5)
    b = native.malloc(1000)
    c = native.malloc(5000, 1)
    assert torch.cuda.memory_stats() == loom.memory_stats()
    assert torch.cuda.memory_allocated() == 3 * MiB + 1005
    reserved = loom.memory_stats()["reserved_bytes.all.current"]
    assert reserved >= 3 * MiB + 1005 and reserved % (64 * KiB) == 0
    assert torch.cuda.memory_reserved() == reserved
    # Devices as torch takes them.
    assert torch.cuda.memory_allocated(1) == 5000
    assert torch.cuda.memory_allocated("cuda:1") == 5000
    assert torch.cuda.memory_allocated(torch.device("cuda", 1)) == 5000
    assert torch.cuda.memory_allocated(torch.device("cuda")) == 3 * MiB + 1005
    with pytest.raises(LoomError, match="is not a CUDA device"):
        torch.cuda.memory_allocated(torch.device("cpu"))
    native.free(a)
    assert torch.cuda.memory_allocated() == 1000
    assert torch.cuda.max_memory_allocated() == 3 * MiB + 1005
    assert torch.cuda.max_memory_reserved() == reserved
    assert torch.cuda.memory_stats()["allocated_bytes.all.freed"] == \
        3 * MiB + 5
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == 1000
    assert torch.cuda.max_memory_reserved() == \
        torch.cuda.memory_reserved()
    assert torch.cuda.max_memory_allocated(1) == 5000, "device 0 only"
    d = native.malloc(2 * MiB)
    native.free(d)
    assert torch.cuda.max_memory_allocated() == 2 * MiB + 1000
    with pytest.warns(FutureWarning):  # calls reset_peak_memory_stats
        torch.cuda.reset_max_memory_allocated()
    assert torch.cuda.max_memory_allocated() == 1000
    # memory_summary: loom's table, with torch's arguments.
    assert torch.cuda.memory_summary() == loom.memory_summary()
    short = torch.cuda.memory_summary(device=1, abbreviated=True)
    assert short == loom.memory_summary(1, abbreviated=True)
    assert "loom memory summary, device ID 1" in short
    line = next(l for l in short.splitlines()
                if l.startswith("| Allocated memory"))
    assert line.split("|")[2].strip() == "5000 B"
    native.free(b)
    native.free(c, 5000, 1)
    assert torch.cuda.memory_allocated() == 0


def test_names_imported_before_the_patch_keep_torchs(loom_env, tmp_path,
                                                     torch, monkeypatch):
    """As docs/plugin.md says: `from torch.cuda import memory_stats` before
    loom.enable() keeps PyTorch's (on this CPU build: empty, CUDA never
    initialised); memory_allocated() follows either way."""
    early = torch.cuda.memory_stats
    _restored_after_the_test(torch, monkeypatch)
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    pointer = session.native.malloc(4096)
    assert torch.cuda.memory_allocated() == 0, "torch's before the patch"
    _torch.patch_stats(torch)
    assert early() == {}
    assert torch.cuda.memory_allocated() == 4096
    session.native.free(pointer)


# -------------------------------------------------------------- snapshots

def _identity(lines):
    return lines


def _flame(lines):
    """flamegraph input lines `frames size` -> [(frames, size)]."""
    out = []
    for line in lines.splitlines():
        frames, size = line.rsplit(" ", 1)
        out.append((frames.split(";"), int(size)))
    return out


def _embedded(html):
    """(viz kind, pickle bytes) of a trace_plot / segment_plot page."""
    files = json.loads(re.search(r"const local_files = (\[.*\])\n",
                                 html).group(1))
    assert [f["name"] for f in files] == ["snapshot.pickle"]
    kind = ast.literal_eval(re.search(r"add_local_files\(local_files, (.*)\)",
                                      html).group(1))
    return kind, base64.b64decode(files[0]["base64"])


def _live(snapshot):
    return sorted((b["address"], b["requested_size"])
                  for s in snapshot["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated")


def _run(native):
    """Set-up, two iterations and a half (activations live at the end)."""
    loop = FakeLoop(native)
    for _ in range(2):
        loop.iteration()
    held = [loop.alloc(size) for size in (2 * MiB, 700 * KiB, 3000)]
    return loop, held


def test_memory_viz_draws_the_exported_run(loom_env, tmp_path, torch):
    from torch.cuda import _memory_viz as viz
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    loop, _ = _run(session.native)
    path = tmp_path / "run.pickle"
    loom.export_snapshot(path)
    with open(path, "rb") as source:
        snapshot = pickle.load(source)  # as _memory_viz's command line does
    entries = snapshot["device_traces"][0]
    segments = snapshot["segments"]
    live = loom.memory_stats()["allocated_bytes.all.current"]
    assert live == sum(size for size, _ in loop.live.values())
    assert len(_live(snapshot)) == len(loop.live) == 7
    reserved = sum(s["total_size"] for s in segments)
    actions = [e["action"] for e in entries]

    # `stats`: segsum checks its own accounting (free + allocated ==
    # reserved) and prints the totals.
    summary = viz.segsum(snapshot)
    assert f"segments: {len(segments)}\n" in summary
    assert f"total_reserved: {viz._format_size(reserved)}\n" in summary
    assert f"total_allocated: {viz._format_size(live)}\n" in summary

    # `trace`: every alloc lies in a segment it saw cudaMalloc'd.
    text = viz.trace(snapshot).splitlines()
    assert text[:2] == ["Device 0 ----------------", f"{len(entries)} entries"]
    mallocs = [l for l in text if "= cudaMalloc(" in l]
    allocs = [l for l in text if re.fullmatch(r"\w+ = \w+\[\d+:.*\]", l)]
    assert len(mallocs) == actions.count("segment_alloc") == len(segments)
    assert len(allocs) == actions.count("alloc") == 4 + 2 * 10 + 3
    segment_names = {l.split(" = ")[0] for l in mallocs}
    assert all(l.split(" = ")[1].split("[")[0] in segment_names
               for l in allocs), "an alloc outside every segment"
    assert sum(l.startswith("del ") for l in text) == \
        actions.count("free_requested") == 2 * 10

    # `memory` and `segments` (flamegraph input): bytes by block state and
    # by segment.
    by_state = {}
    for frames, size in _flame(viz.memory(snapshot, _identity)):
        by_state[frames[1]] = by_state.get(frames[1], 0) + size
    assert by_state == {"active_allocated": live,
                        "inactive": reserved - live}
    by_segment = {}
    for frames, size in _flame(viz.segments(snapshot, _identity)):
        by_segment[frames[1]] = by_segment.get(frames[1], 0) + size
    assert by_segment == {f"seg_{s['address']}": s["total_size"]
                          for s in segments}

    # trace_plot / segment_plot: the page embeds the snapshot, re-pickled
    # by torch, for MemoryViz.js (whose unpickler viz_model models).
    for html, kind in ((viz.trace_plot(snapshot), "Active Memory Timeline"),
                       (viz.trace_plot(snapshot, plot_segments=True),
                        "Active Cached Memory Timeline"),
                       (viz.segment_plot(snapshot), "Allocator State History")):
        got_kind, data = _embedded(html)
        assert got_kind == kind
        assert pickle.loads(data) == snapshot
        viz_model.check_all(data.rstrip(b"\0"), snapshot)
    # filter_freed: only the allocations still live at the end remain.
    _, data = _embedded(viz.trace_plot(copy.deepcopy(snapshot),
                                       filter_freed=True))
    kept = pickle.loads(data)["device_traces"][0]
    assert sorted((e["addr"], e["size"]) for e in kept
                  if e["action"] == "alloc") == _live(snapshot)
    assert {e["action"] for e in kept} == {"segment_alloc", "alloc"}
    loop.close()


def test_memory_viz_compares_two_exports(loom_env, tmp_path, torch, capsys):
    from torch.cuda import _memory_viz as viz
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    loop = FakeLoop(session.native)
    before = loom.export_snapshot(tmp_path / "before.pickle")
    loop.iteration()
    big = loop.alloc(9 * MiB)  # does not fit the set-up's segment
    after = loom.export_snapshot(tmp_path / "after.pickle")

    def keys(snapshot):
        return {(s["address"], s["total_size"]) for s in snapshot["segments"]}

    only_before, only_after = keys(before) - keys(after), \
        keys(after) - keys(before)
    assert only_after, "the run grew"
    drawn = _flame(viz.compare(before["segments"], after["segments"],
                               _identity))
    printed = dict(line.split(" = ") for line in
                   capsys.readouterr().out.splitlines())
    assert set(ast.literal_eval(printed["only_before"])) == \
        {a for a, _ in only_before}
    assert set(ast.literal_eval(printed["only_after"])) == \
        {a for a, _ in only_after}
    sides = {}
    for frames, size in drawn:
        key = (frames[0], int(frames[2][len("seg_"):]))
        sides[key] = sides.get(key, 0) + size
    assert sides == {**{("only_before", a): n for a, n in only_before},
                     **{("only_after", a): n for a, n in only_after}}
    live_after = sum(size for frames, size in drawn
                     if frames[0] == "only_after" and
                     frames[3] == "active_allocated")
    assert live_after >= 9 * MiB
    loop.free(big)
    loop.close()


def _memory_viz_main(monkeypatch, capsys, *argv):
    """`python -m torch.cuda._memory_viz ARGV...`, in this process."""
    monkeypatch.setattr(sys, "argv", ["_memory_viz", *argv])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # already imported
        runpy.run_module("torch.cuda._memory_viz", run_name="__main__")
    return capsys.readouterr().out


@pytest.mark.parametrize("mode", ["alloc", "map"])
def test_memory_viz_command_line_reads_an_exported_trace_file(
        loom_env, tmp_path, torch, monkeypatch, capsys, mode):
    """A recorded trace file exported with loom.export_snapshot(trace, path)
    (loom.tools.snapshot_export), read by PyTorch's own command line."""
    del torch
    from torch.cuda import _memory_viz as viz
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    loop, held = _run(session.native)
    for pointer in held:
        loop.free(pointer)
    loom.finish()
    trace_path = tmp_path / "trace.rank0.ltb"
    trace = loom_trace.read_trace(trace_path)
    out = tmp_path / f"{mode}.pickle"
    snapshot = loom.export_snapshot(trace_path, out, segment_mode=mode)
    live = sum(size for size, _ in loop.live.values())  # the weights
    reserved = sum(s["total_size"] for s in snapshot["segments"])

    summary = _memory_viz_main(monkeypatch, capsys, "stats", str(out))
    assert f"segments: {len(snapshot['segments'])}\n" in summary
    assert f"total_allocated: {viz._format_size(live)}\n" in summary
    assert f"total_reserved: {viz._format_size(reserved)}\n" in summary

    text = _memory_viz_main(monkeypatch, capsys, "trace", str(out))
    entries = snapshot["device_traces"][0]
    assert f"\n{len(entries)} entries\n" in text
    allocs = sum(e.kind == loom_trace.ALLOC for e in trace.events)
    assert len(re.findall(r"^\w+ = \w+\[\d+:", text, re.M)) == allocs

    page = tmp_path / "page.html"
    _memory_viz_main(monkeypatch, capsys, "segment_plot", str(out), "-o",
                     str(page))
    kind, data = _embedded(page.read_text())
    assert kind == "Allocator State History"
    assert pickle.loads(data) == snapshot
    viz_model.check_all(data.rstrip(b"\0"), snapshot)
    loop.close()

