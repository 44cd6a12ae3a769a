"""Snapshot import and export on the three real PyTorch snapshots in
bench/data/pytorch_snapshots/raw, checked against figures computed here
independently of loom's importer (and against the dataset README's buffer
counts). Run with `-s` to see the figures recorded in
bench/results/snapshot_import.md."""

import collections
import importlib.util
import pickle
from pathlib import Path

import pytest

from loom.tools import snapshot
from loom.tools import snapshot_export
from loom.tools import snapshot_import
from loom.tools import trace as loom_trace

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "bench" / "data" / "pytorch_snapshots" / "raw"

# Buffers per snapshot, from bench/data/pytorch_snapshots/instances/README.md
# (allocs + blocks allocated before recording).
README_BUFFERS = {
    "bcrafton_gpt2small_ctx64_b1_train_step": 2609,
    "magma27_small_ctx256_b32_fwd_bwd": 1950,
    "nothanmin_large_fwd_fp32": 5113,
}


def _viz_model():
    path = REPO / "torch_plugin" / "tests" / "viz_model.py"
    spec = importlib.util.spec_from_file_location("viz_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Strict(pickle.Unpickler):
    """An independent restricted loader for these trusted files."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"global {module}.{name}")


@pytest.fixture(scope="module", params=sorted(README_BUFFERS))
def real(request, tmp_path_factory):
    path = RAW / f"{request.param}.pickle"
    with open(path, "rb") as source:
        raw = _Strict(source).load()
    result = snapshot_import.import_snapshot(path)
    out = tmp_path_factory.mktemp("real") / f"{request.param}.ltt"
    loom_trace.write_trace(result.trace, out)
    return request.param, path, raw, result, loom_trace.read_trace(out)


def _trace_figures(trace):
    """(allocs, frees, peak live bytes, {id: size} live at the end)."""
    live, allocs, frees, current, peak = {}, 0, 0, 0, 0
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            allocs += 1
            live[event.id] = event.size
            current += event.size
            peak = max(peak, current)
        elif event.kind == loom_trace.FREE:
            frees += 1
            current -= live.pop(event.id)
    return allocs, frees, peak, live


def _active(raw):
    return {(b["address"], b["requested_size"]) for s in raw["segments"]
            if s["device"] == 0 for b in s["blocks"]
            if b["state"] in ("active_allocated", "active_pending_free")}


def _backward_peak(raw):
    """Peak live bytes walking the history backwards from the dump's live
    bytes (the active blocks): before an alloc there were `size` bytes
    fewer, before a free_completed `size` bytes more."""
    current = sum(size for _, size in _active(raw))
    peak = current
    for entry in reversed(raw["device_traces"][0]):
        if entry["action"] == "alloc":
            current -= entry["size"]
        elif entry["action"] == "free_completed":
            current += entry["size"]
        peak = max(peak, current)
    assert current >= 0
    return peak


def test_loader_agrees_with_an_independent_one(real):
    _, path, raw, _, _ = real
    assert snapshot.load_snapshot(path) == raw


def test_counts_peak_and_final_live_set(real):
    name, _, raw, result, trace = real
    entries = raw["device_traces"][0]
    counts = collections.Counter(e["action"] for e in entries)
    allocs, frees, peak, live = _trace_figures(trace)
    assert trace == result.trace
    assert result.device == 0 and trace.device == 0
    assert trace.provenance == f"snapshot import of {name}.pickle device 0"
    assert allocs == README_BUFFERS[name]
    assert allocs == (counts["alloc"] + result.preexisting_freed +
                      result.preexisting_live)
    assert frees == counts["free_completed"]
    assert allocs - frees == len(_active(raw))
    assert peak == _backward_peak(raw) == result.peak_live_bytes
    final = {(result.addresses[i], size) for i, size in live.items()}
    assert final == _active(raw)
    assert result.warnings == []
    print(f"\n{name}: entries {len(entries)} ({dict(sorted(counts.items()))});"
          f" trace allocs {allocs} = {counts['alloc']} + "
          f"{result.preexisting_freed} pre-existing freed + "
          f"{result.preexisting_live} pre-existing live; frees {frees}; "
          f"live at end {allocs - frees} = active blocks {len(_active(raw))};"
          f" peak live {peak} B")


def test_export_and_reimport_keep_history_and_peak(real, tmp_path):
    _, _, raw, result, trace = real
    viz = _viz_model()
    allocs, frees, peak, _ = _trace_figures(trace)
    for addresses in (result.addresses, None):
        out = tmp_path / "x.pickle"
        exported = snapshot_export.export_snapshot(trace, out, addresses)
        viz.check_all(out.read_bytes(), exported)
        back = snapshot_import.import_snapshot(out)
        assert [(e.kind, e.size) for e in back.trace.events] == \
            [(e.kind, e.size) for e in trace.events]
        assert back.peak_live_bytes == peak
        assert _trace_figures(back.trace)[:2] == (allocs, frees)
    # With the original addresses, the final blocks are PyTorch's.
    assert back.addresses != result.addresses
    exported = snapshot_export.build_snapshot(trace, result.addresses)
    final = {(b["address"], b["requested_size"]) for s in exported["segments"]
             for b in s["blocks"] if b["state"] == "active_allocated"}
    assert final == _active(raw)
