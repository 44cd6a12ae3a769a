"""Snapshot -> loom trace conversion, on hand-made snapshots."""

import pytest

import snapshot_factory as sf
from loom.tools import snapshot_import
from loom.tools import trace as loom_trace
from loom.tools.snapshot import SnapshotError


def _scenario():
    """Pre-existing blocks (freed and never freed), address reuse, skipped
    actions, two streams, a second device."""
    e = sf.entry
    trace0 = [
        e("free_requested", 0xA000, 300),        # 0: P1, allocated earlier
        e("alloc", 0x1000, 100),                 # 1
        e("free_completed", 0xA000, 300),        # 2: frees P1
        e("alloc", 0x2000, 200, stream=5),       # 3
        e("free_requested", 0x1000, 100),        # 4
        e("free_completed", 0x1000, 100),        # 5
        e("alloc", 0x1000, 150),                 # 6: address reused
        e("segment_alloc", 0x9000, 1 << 21),     # 7
        e("free_completed", 0x1000, 150),        # 8
        e("alloc", 0x1000, 50),                  # 9: reused again, stays
        {"action": "oom", "device_free": 12, "size": 4096, "stream": 0},
        {"action": "snapshot", "addr": 0, "size": 450, "stream": 0},
        e("mystery", 0x5000, 1),                 # 12: unknown action
        e("free_completed", 0xB000, 64, stream=5),  # 13: P2, allocated earlier
        e("alloc", 0xA000, 80),                  # 14: P1's address reused
    ]
    segments = [
        sf.segment(0x1000, [sf.block(0x1000, 512, "active_allocated", 50),
                            sf.block(0x1200, 0xE00, "inactive", 0),
                            sf.block(0x2000, 512, "active_pending_free", 200)]),
        sf.segment(0xA000, [sf.block(0xA000, 512, "active_allocated", 80)]),
        sf.segment(0xC000, [sf.block(0xC000, 512, "active_allocated", 32),
                            sf.block(0xC200, 512, "inactive", 7)], stream=7),
        sf.segment(0xE000, [sf.block(0xE000, 1024, "active_allocated", 1000)],
                   device=1, stream=3),
    ]
    return sf.snapshot([trace0, []], segments)


EXPECTED_TEXT = """loom-trace 1
device 0
granularity 0
provenance "snapshot import of a.pickle device 0"
events
a 0 300
a 1 64 s=5
a 2 32 s=7
a 3 100
f 0
a 4 200 s=5
f 3
a 5 150
f 5
a 6 50
f 1 s=5
a 7 80
end 12
"""


def _import(snap, device=None):
    return snapshot_import.convert_snapshot(snap, device, "dir/a.pickle")


def _text(trace, tmp_path):
    """`trace` in the text form, as libloom writes it."""
    path = tmp_path / "written.ltt"
    loom_trace.write_trace(trace, path)
    return path.read_text(encoding="utf-8")


def test_scenario_converts_exactly(tmp_path):
    result = _import(_scenario())
    assert _text(result.trace, tmp_path) == EXPECTED_TEXT
    assert result.addresses == {0: 0xA000, 1: 0xB000, 2: 0xC000, 3: 0x1000,
                                4: 0x2000, 5: 0x1000, 6: 0x1000, 7: 0xA000}
    assert result.counts == {"alloc": 5, "free_requested": 2,
                             "free_completed": 4, "segment_alloc": 1,
                             "oom": 1, "snapshot": 1, "mystery": 1}
    assert (result.device, result.entries) == (0, 15)
    assert (result.preexisting_freed, result.preexisting_live) == (2, 1)
    # Live bytes: 396 at start, +100 -> 496 (peak), -300, +200, -100, +150,
    # -150, +50, -64, +80 -> 362.
    assert result.peak_live_bytes == 496
    assert result.warnings == []


def test_from_file_round_trips_through_both_forms(tmp_path):
    path = sf.write(tmp_path / "a.pickle", _scenario())
    result = snapshot_import.import_snapshot(path)
    assert _text(result.trace, tmp_path) == EXPECTED_TEXT
    for name in ("a.ltt", "a.ltb"):
        out = tmp_path / name
        loom_trace.write_trace(result.trace, out)
        assert loom_trace.read_trace(out) == result.trace


def test_other_device_explicitly():
    result = _import(_scenario(), device=1)
    assert result.trace.device == 1
    assert result.trace.provenance == "snapshot import of a.pickle device 1"
    assert result.trace.events == [loom_trace.Event.alloc(0, 1000, 3, 1)]
    assert result.addresses == {0: 0xE000}
    assert result.entries == 0


def test_default_device_has_most_entries_lowest_on_ties():
    alloc = sf.entry("alloc", 0x10, 8)
    assert _import(sf.snapshot([[], [alloc], [alloc]])).device == 1
    longer = [alloc, sf.entry("snapshot", 0, 8)]
    assert _import(sf.snapshot([[], [alloc], longer])).device == 2
    only_segments = sf.snapshot(
        [], [sf.segment(0x10, [sf.block(0x10, 512, "active_allocated")],
                        device=4)])
    assert _import(only_segments).device == 4


@pytest.mark.parametrize("snap,device,message", [
    (_scenario(), 3, "dir/a.pickle: device 3 is not in the snapshot "
     "(devices: 0, 1)"),
    (sf.snapshot([]), None, "dir/a.pickle: the snapshot has no device traces "
     "and no segments"),
    (sf.snapshot([[sf.entry("alloc", 0x1000, 8),
                   sf.entry("alloc", 0x1000, 8)]]), None,
     "dir/a.pickle: device_traces[0][1]: alloc at address 0x1000, which is "
     "still live (allocated by entry 0); the history is inconsistent"),
    (sf.snapshot([[sf.entry("alloc", 0x1000, 8),
                   sf.entry("free_completed", 0x1000, 8),
                   sf.entry("free_completed", 0x1000, 8)]]), None,
     "dir/a.pickle: device_traces[0][2]: free_completed of address 0x1000, "
     "which was freed by entry 1 and not allocated again; the history is "
     "inconsistent"),
    (sf.snapshot([[sf.entry("free_completed", 0x1000, 8),
                   sf.entry("free_completed", 0x1000, 8)]]), None,
     "dir/a.pickle: device_traces[0][1]: free_completed of address 0x1000, "
     "which was freed by entry 0 and not allocated again; the history is "
     "inconsistent"),
    (sf.snapshot([[sf.entry("alloc", 0x1000, 8),
                   sf.entry("free_completed", 0x1000, 8)]],
                 [sf.segment(0x1000, [sf.block(0x1000, 512,
                                               "active_allocated", 8)])]),
     None, "dir/a.pickle: segments: the block at 0x1000 is active at the "
     "dump, but device_traces[0][1] freed it and no later entry allocated "
     "it again"),
])
def test_inconsistent_input_is_an_error(snap, device, message):
    with pytest.raises(SnapshotError) as error:
        _import(snap, device)
    assert str(error.value) == message


def test_zero_size_blocks_are_skipped_with_their_frees():
    snap = sf.snapshot(
        [[sf.entry("alloc", 0x1000, 0), sf.entry("free_completed", 0x1000, 0),
          sf.entry("free_completed", 0x2000, 0), sf.entry("alloc", 0x3000, 5),
          sf.entry("alloc", 0x1000, 0)]],
        [sf.segment(0x3000, [sf.block(0x3000, 512, "active_allocated", 5),
                             sf.block(0x3200, 512, "active_allocated", 0)])])
    result = _import(snap)
    assert result.trace.events == [loom_trace.Event.alloc(0, 5)]
    assert result.zero_size_skipped == 4
    assert result.warnings == ["4 zero-size blocks skipped"]
    assert result.addresses == {0: 0x3000}


def test_tolerated_oddities_are_warned_about():
    snap = sf.snapshot(
        [[sf.entry("alloc", 0x1000, 100),
          sf.entry("free_completed", 0x1000, 120),
          sf.entry("alloc", 0x2000, 100), sf.entry("alloc", 0x3000, 10)]],
        [sf.segment(0x2000, [sf.block(0x2000, 512, "active_allocated", 90)])])
    result = _import(snap)
    assert result.warnings == [
        "1 free_completed entries name a size other than their alloc's (the "
        "alloc's size is used)",
        "1 active blocks have a requested size other than their alloc's",
        "1 blocks live at the end of the history are not active in "
        "'segments'",
    ]
    assert [e.size for e in result.trace.events
            if e.kind == loom_trace.ALLOC] == [100, 100, 10]
    assert result.peak_live_bytes == 110
