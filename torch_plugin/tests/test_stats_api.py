"""loom.memory_stats(), reset_peak_memory_stats(), memory_summary() and
export_snapshot() of the current run, on the host backend (devices given
as real torch.device objects too). test_real_torch.py checks that torch's
own functions report these figures once loom has replaced them."""

import pickle

import pytest

from loom import stats
from loom.errors import LoomError
from loom_fakes import HOST

KiB, MiB = 1 << 10, 1 << 20


def test_memory_stats_have_torch_keys_and_exact_bytes(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    native = session.native
    a = native.malloc(3 * MiB + 5)
    b = native.malloc(1000)
    s = loom.memory_stats()
    assert list(s) == sorted(s), "sorted like torch.cuda.memory_stats()"
    assert s["allocated_bytes.all.current"] == 3 * MiB + 5 + 1000
    assert s["allocation.all.current"] == 2
    assert s["reserved_bytes.all.current"] >= 3 * MiB + 1005
    assert s["reserved_bytes.all.current"] % (64 * KiB) == 0  # whole pages
    native.free(a)
    s = loom.memory_stats()
    assert s["allocated_bytes.all.current"] == 1000
    assert s["allocated_bytes.all.peak"] == 3 * MiB + 1005
    assert s["allocated_bytes.all.freed"] == 3 * MiB + 5
    loom.reset_peak_memory_stats()
    assert loom.memory_stats()["allocated_bytes.all.peak"] == 1000
    native.free(b)
    for key in ("num_ooms", "num_alloc_retries", "loom.plan_hits",
                "loom.last_iteration_hit_rate", "loom.driver_calls.total"):
        assert key in s


def test_stats_outgrowing_the_buffer(loom_env, tmp_path):
    """Native.stats reads the JSON in one call with a buffer the size of
    the last answer; a longer answer takes a second call, whole."""
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    native = session.native
    native.free(native.malloc(1000))
    whole = native.stats(0)
    native._stats_capacity = 16  # pylint: disable=protected-access
    assert native.stats(0).keys() == whole.keys()
    assert native._stats_capacity > 16  # pylint: disable=protected-access


def test_device_arguments(loom_env, tmp_path, torch):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path,
                                     devices=2, **HOST)
    pointer = session.native.malloc(5000, 1)
    assert loom.memory_stats(1)["allocated_bytes.all.current"] == 5000
    assert loom.memory_stats("cuda:1") == loom.memory_stats(1)
    assert loom.memory_stats(torch.device("cuda", 1)) == loom.memory_stats(1)
    assert loom.memory_stats(torch.device("cuda:1")) == loom.memory_stats(1)
    assert loom.memory_stats()["allocated_bytes.all.current"] == 0
    assert loom.memory_stats("cuda") == loom.memory_stats(0)
    assert loom.memory_stats(torch.device("cuda")) == loom.memory_stats(0)
    for bad, message in (("cpu", "is not 'cuda' or 'cuda:N'"),
                         (torch.device("cpu"), "is not a CUDA device"),
                         (torch.device("meta"), "is not a CUDA device"),
                         (True, "is not a device"), (2.0, "is not a device"),
                         (-1, "out of range")):
        with pytest.raises(LoomError, match=message):
            loom.memory_stats(bad)
    session.native.free(pointer, 5000, 1)


def test_memory_summary(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    pointer = session.native.malloc(3 * MiB)
    text = loom.memory_summary()
    lines = text.splitlines()
    assert all(len(line) == 77 for line in lines), "a fixed-width table"
    assert "loom memory summary, device ID 0" in lines[1]
    assert "mode: record (recording) | plan loaded: no | last iteration hit " \
           "rate: n/a" in text
    allocated = next(l for l in lines if l.startswith("| Allocated memory"))
    assert allocated.split("|")[2].strip() == "3072 KiB"
    assert "Plan hits" in text and "Driver calls" in text
    short = loom.memory_summary(abbreviated=True)
    assert "Plan hits" not in short and "Allocated memory" in short
    session.native.free(pointer)


def test_format_size_follows_torch():
    assert stats.format_size(1023) == "  1023 B  "
    assert stats.format_size(786432) == "   768 KiB"
    assert stats.format_size(3 * MiB) == "  3072 KiB"
    assert stats.format_size(5 << 30) == "  5120 MiB"
    assert stats.format_size(10, preferred=5 << 30) == "     0 MiB"
    assert stats.format_count(999) == "    999   "
    assert stats.format_count(2_000_000) == "   2000 K "


def test_export_snapshot_of_the_current_run(loom_env, tmp_path):
    loom = loom_env
    session = loom._configure_native(mode="record", workdir=tmp_path, **HOST)
    native = session.native
    a = native.malloc(3000)
    b = native.malloc(2 * MiB)
    native.free(a)
    out = tmp_path / "run.pickle"
    snapshot = loom.export_snapshot(out)
    with open(out, "rb") as source:
        assert pickle.load(source) == snapshot
    entries = snapshot["device_traces"][0]
    assert [(e["action"], e["size"]) for e in entries
            if e["action"] != "segment_alloc"] == [
        ("alloc", 3000), ("alloc", 2 * MiB), ("free_requested", 3000),
        ("free_completed", 3000)]
    live = [blk for seg in snapshot["segments"] for blk in seg["blocks"]
            if blk["state"] == "active_allocated"]
    assert [blk["requested_size"] for blk in live] == [2 * MiB]
    assert not list(tmp_path.glob(".export-*"))
    native.free(b)
    with pytest.raises(LoomError, match="give the output path"):
        loom.export_snapshot()


def test_export_snapshot_needs_a_recording(loom_env, tmp_path):
    loom = loom_env
    loom._configure_native(mode="pool", workdir=tmp_path, **HOST)
    with pytest.raises(LoomError, match="this run records no trace"):
        loom.export_snapshot(tmp_path / "x.pickle")
