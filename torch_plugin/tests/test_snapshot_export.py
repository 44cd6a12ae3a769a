"""loom trace -> memory snapshot export, and back."""

import pickle
import random

import pytest

import viz_model
from loom.tools import snapshot
from loom.tools import snapshot_export
from loom.tools import snapshot_import
from loom.tools import trace as loom_trace
from loom.tools.snapshot_export import ExportError
from loom.tools.trace import Event, Trace

MIB = 1 << 20


def _small_trace():
    return Trace(device=0, granularity=0, provenance="t", events=[
        Event.alloc(0, 100),
        Event.alloc(1, 50, stream=3),
        Event.free(0, stream=3),
        Event(loom_trace.PHASE, name="x"),
        Event.alloc(2, 10),
    ])


SMALL_ADDRESSES = {0: 0x200000, 1: 0x200080, 2: 0x600000}


def _entry(action, addr, size, stream, time_us):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": time_us, "frames": []}


def _segment(address, blocks, expandable, stream=0):
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    return {"device": 0, "address": address, "total_size": 2 * MIB,
            "allocated_size": active, "active_size": active,
            "requested_size": active, "stream": stream,
            "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": expandable, "frames": [], "blocks": blocks}


def _block(address, size, state):
    return {"address": address, "size": size,
            "requested_size": 0 if state == "inactive" else size,
            "state": state, "frames": []}


@pytest.mark.parametrize("mode", ["alloc", "map"])
def test_small_export_is_exact(mode):
    got = snapshot_export.build_snapshot(_small_trace(), SMALL_ADDRESSES,
                                         segment_mode=mode)
    segment_action = "segment_alloc" if mode == "alloc" else "segment_map"
    assert got["device_traces"] == [[
        _entry(segment_action, 0x200000, 2 * MIB, 0, 0),
        _entry("alloc", 0x200000, 100, 0, 0),
        _entry("alloc", 0x200080, 50, 3, 1),
        _entry("free_requested", 0x200000, 100, 3, 2),
        _entry("free_completed", 0x200000, 100, 3, 2),
        _entry(segment_action, 0x600000, 2 * MIB, 0, 4),
        _entry("alloc", 0x600000, 10, 0, 4),
    ]]
    expandable = mode == "map"
    assert got["segments"] == [
        _segment(0x200000, [
            _block(0x200000, 0x80, "inactive"),
            _block(0x200080, 50, "active_allocated"),
            _block(0x200080 + 50, 2 * MIB - 0x80 - 50, "inactive")],
            expandable),
        _segment(0x600000, [
            _block(0x600000, 10, "active_allocated"),
            _block(0x600000 + 10, 2 * MIB - 10, "inactive")], expandable),
    ]


def test_map_mode_maps_new_granules_and_merges_final_segments():
    trace = Trace(events=[Event.alloc(0, 3 * MIB), Event.alloc(1, 1 * MIB),
                          Event.free(0), Event.alloc(2, 4 * MIB)])
    addresses = {0: 0, 1: 4 * MIB, 2: 0}
    got = snapshot_export.build_snapshot(trace, addresses, segment_mode="map")
    maps = [(e["addr"], e["size"]) for e in got["device_traces"][0]
            if e["action"] == "segment_map"]
    # [0, 4) MiB, then [4, 6) MiB; the 4 MiB block at 0 is already mapped.
    assert maps == [(0, 4 * MIB), (4 * MIB, 2 * MIB)]
    assert [(s["address"], s["total_size"]) for s in got["segments"]] == [
        (0, 6 * MIB)]
    data = pickle.dumps(got, protocol=4)
    viz_model.check_all(data, got)


def test_granularity_is_respected():
    got = snapshot_export.build_snapshot(_small_trace(), SMALL_ADDRESSES,
                                         granularity=4096)
    assert [(s["address"], s["total_size"]) for s in got["segments"]] == [
        (0x200000, 4096), (0x600000, 4096)]


def test_devices_and_header_device():
    trace = Trace(device=2, events=[Event.alloc(0, 8, device=2)])
    got = snapshot_export.build_snapshot(trace)
    assert [len(t) for t in got["device_traces"]] == [0, 0, 2]
    assert [s["device"] for s in got["segments"]] == [2]


def _random_trace(seed, n=300):
    """Allocs and frees on two streams, with markers and reused ids."""
    rng = random.Random(seed)
    events, live, freed, next_id = [], [], [], 0
    for i in range(n):
        if i % 50 == 0:
            events.append(Event(loom_trace.ITER_BEGIN, id=i // 50))
        if live and rng.random() < 0.45:
            request = live.pop(rng.randrange(len(live)))
            freed.append(request)
            events.append(Event.free(request, stream=rng.choice([0, 7])))
            continue
        if freed and rng.random() < 0.2:
            request = freed.pop(rng.randrange(len(freed)))
        else:
            request, next_id = next_id, next_id + 1
        live.append(request)
        size = rng.choice([8, 512, 4096, 3 * MIB, rng.randint(1, 10 ** 6)])
        events.append(Event.alloc(request, size, stream=rng.choice([0, 7])))
    return Trace(granularity=0, provenance="random", events=events)


def _reference_first_fit(trace, alignment=512):
    offsets, live = [], {}
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            candidates = [0] + [-(-hi // alignment) * alignment
                                for lo, hi in live.values()]
            offset = min(c for c in candidates if all(
                c + event.size <= lo or hi <= c for lo, hi in live.values()))
            live[event.id] = (offset, offset + event.size)
            offsets.append(offset)
        elif event.kind == loom_trace.FREE:
            del live[event.id]
    return offsets


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_matches_a_brute_force_reference(seed):
    trace = _random_trace(seed)
    assert snapshot_export.first_fit(trace) == _reference_first_fit(trace)


def test_first_fit_reuses_holes():
    trace = Trace(events=[Event.alloc(0, 100), Event.alloc(1, 100),
                          Event.free(0), Event.alloc(2, 512),
                          Event.alloc(3, 513), Event.alloc(0, 1)])
    assert snapshot_export.first_fit(trace) == [0, 512, 0, 1024, 2048]


def _alloc_free_sequence(trace):
    """(kind, number, size): allocs numbered in order, frees by the number
    of the alloc they end (so ids renumbered consistently compare equal)."""
    current, out = {}, []
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            current[event.id] = len(current) + sum(o[0] == "free" for o in out)
            out.append(("alloc", current[event.id], event.size))
        elif event.kind == loom_trace.FREE:
            out.append(("free", current.pop(event.id), None))
    return out


def _peak(trace):
    live = peak = 0
    sizes = {}
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            sizes[event.id] = event.size
            live += event.size
            peak = max(peak, live)
        elif event.kind == loom_trace.FREE:
            live -= sizes.pop(event.id)
    return peak


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["alloc", "map"])
def test_export_then_import_gives_the_same_history(tmp_path, seed, mode):
    trace = _random_trace(seed)
    path = tmp_path / "out.pickle"
    exported = snapshot_export.export_snapshot(trace, path, segment_mode=mode)
    data = path.read_bytes()
    assert pickle.loads(data) == exported  # plain types only
    viz_model.check_all(data, exported)
    result = snapshot_import.import_snapshot(path)
    assert _alloc_free_sequence(result.trace) == _alloc_free_sequence(trace)
    assert result.peak_live_bytes == _peak(trace)
    assert result.preexisting_freed == result.preexisting_live == 0
    assert result.warnings == []
    streams = [e.stream for e in result.trace.events]
    assert streams == [e.stream for e in trace.events
                       if e.kind in (loom_trace.ALLOC, loom_trace.FREE)]


def test_export_accepts_a_trace_path(tmp_path):
    trace_path = tmp_path / "t.ltt"
    loom_trace.write_trace(_small_trace(), trace_path)
    got = snapshot_export.export_snapshot(trace_path, tmp_path / "o.pickle",
                                          SMALL_ADDRESSES)
    assert snapshot.loads_snapshot((tmp_path / "o.pickle").read_bytes()) == got


@pytest.mark.parametrize("addresses,error,message", [
    ({0: 0, 1: 50, 2: 0}, ExportError, r"^request 1 at \[0x32, 0x64\) "
     r"overlaps live request 0 at \[0x0, 0x64\) on device 0$"),
    ({0: 0, 2: 0}, ExportError, r"^event 1: no address for request 1$"),
    ({0: 0, 1: -8, 2: 0}, ExportError, r"^request 1: address -8 is not a "
     r"non-negative integer$"),
    ({0: 0, 1: 1.5, 2: 0}, ExportError, r"^request 1: address 1.5 is not"),
    ({0: 0, 1: (1 << 53) - 49, 2: 0}, ExportError, r"^request 1: address "
     r"0x1fffffffffffcf \+ size 50 exceeds 2\^53"),
])
def test_bad_addresses_are_refused(addresses, error, message):
    with pytest.raises(error, match=message):
        snapshot_export.build_snapshot(_small_trace(), addresses)


def test_invalid_trace_and_mode_are_refused(tmp_path):
    with pytest.raises(loom_trace.TraceError, match="free of request 3"):
        snapshot_export.build_snapshot(Trace(events=[Event.free(3)]))
    with pytest.raises(ExportError, match="granularity -1 is not a positive"):
        snapshot_export.build_snapshot(_small_trace(), granularity=-1)
    with pytest.raises(ExportError, match="segment mode 'x'"):
        snapshot_export.build_snapshot(_small_trace(), segment_mode="x")
    with pytest.raises(ExportError, match="cannot write"):
        snapshot_export.export_snapshot(_small_trace(),
                                        tmp_path / "no" / "x.pickle")


# ------------------------------------------------------------- offsets CSV

def _csv(tmp_path, text):
    path = tmp_path / "plan.csv"
    path.write_text(text)
    return path


def test_offsets_csv_round_trip(tmp_path):
    path = _csv(tmp_path, "id,lower,upper,size,offset\n0,0,2,100,2097152\n"
                "1,1,5,50,2097280\n\n2,4,5,10,6291456\n")
    plan = snapshot_export.read_offsets_csv(path)
    assert plan == {0: (0x200000, 100), 1: (0x200080, 50), 2: (0x600000, 10)}
    assert snapshot_export.addresses_from_plan(_small_trace(), plan) == \
        SMALL_ADDRESSES


@pytest.mark.parametrize("text,message", [
    ("", "plan.csv:1: empty file, expected a header line"),
    ("id,lower,upper,size,offset,colour\n", "plan.csv:1: unknown column "
     "'colour'"),
    ("id,lower,upper,size\n", "plan.csv:1: missing column 'offset'"),
    ("id,buffer,size,offset\n", "plan.csv:1: column 'buffer' given twice"),
    ("id,size,offset\n0,1\n", "plan.csv:2: 2 fields, the header has 3"),
    ("id,size,offset\n0,1,-5\n", "plan.csv:2: offset '-5' is not an unsigned "
     "integer"),
    ("id,size,offset\nx,1,5\n", "plan.csv:2: id 'x' is not an unsigned "
     "integer"),
    ("id,size,offset\n0,1,5\n0,1,6\n", "plan.csv:3: id 0 given twice"),
])
def test_bad_offsets_csv(tmp_path, text, message):
    with pytest.raises(ExportError) as error:
        snapshot_export.read_offsets_csv(_csv(tmp_path, text))
    assert str(error.value) == f"{tmp_path}/{message}"


@pytest.mark.parametrize("plan,message", [
    ({0: (0, 100), 1: (512, 50)}, "p.csv: no offset for request 2 of the "
     "trace"),
    ({0: (0, 100), 1: (512, 51), 2: (0, 10)}, "p.csv: id 1 has size 51, the "
     "trace's request 1 has size 50"),
    ({0: (0, 100), 1: (512, 50), 2: (0, 10), 9: (0, 1)}, "p.csv: 1 ids are "
     "not requests of the trace (first: 9)"),
])
def test_plan_must_match_the_trace(plan, message):
    with pytest.raises(ExportError) as error:
        snapshot_export.addresses_from_plan(_small_trace(), plan, "p.csv")
    assert str(error.value) == message


def test_viz_model_catches_broken_snapshots():
    good = snapshot_export.build_snapshot(_small_trace(), SMALL_ADDRESSES)
    viz_model.check_all(pickle.dumps(good, protocol=4), good)
    with pytest.raises(AssertionError):  # protocol 5 is not readable there
        viz_model.check_pickle_bytes(pickle.dumps(good, protocol=5))
    late_segment = snapshot_export.build_snapshot(_small_trace(),
                                                  SMALL_ADDRESSES)
    trace = late_segment["device_traces"][0]
    trace.insert(2, trace.pop(0))  # segment_alloc after its first alloc
    with pytest.raises(AssertionError):
        viz_model.check_state_history(late_segment, 0)
    gap = snapshot_export.build_snapshot(_small_trace(), SMALL_ADDRESSES)
    del gap["segments"][0]["blocks"][0]  # blocks no longer tile
    with pytest.raises(AssertionError):
        viz_model.check_segments_tile(gap)
