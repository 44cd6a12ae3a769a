"""A Python model of what pytorch.org/memory_viz (torch/utils/viz/
MemoryViz.js) does with a snapshot, to check exported files without a
browser: its unpickler's opcode set, `annotate_snapshot` (block addresses
tile each segment; free_requested + free_completed pairs fold into
`free`), `process_alloc_data` (each free finds its alloc) and the
Allocator State History replay, which walks the trace backwards from the
final `segments` and dereferences the segment of every live block (a block
outside every segment crashes the page)."""

import pickletools

# The opcodes MemoryViz.js's unpickle() implements (it throws on others)
# and the protocols it accepts.
VIZ_OPCODES = frozenset("""
    APPENDS BINGET BININT BININT1 BININT2 EMPTY_DICT EMPTY_LIST FRAME LONG1
    LONG_BINGET MARK MEMOIZE PROTO SETITEMS SHORT_BINUNICODE STOP TUPLE2
    APPEND NEWFALSE BINPUT BINUNICODE EMPTY_TUPLE NEWTRUE NONE BINFLOAT TUPLE
    TUPLE1 TUPLE3 LONG_BINPUT LIST DICT SETITEM
""".split())


def check_pickle_bytes(data):
    for opcode, arg, _ in pickletools.genops(data):
        assert opcode.name in VIZ_OPCODES, opcode.name
        if opcode.name == "PROTO":
            assert 2 <= arg <= 4


def _fold_frees(trace):
    folded = []
    for entry in trace:
        entry = dict(entry)
        if (entry["action"] == "free_completed" and folded and
                folded[-1]["action"] == "free_requested" and
                folded[-1]["addr"] == entry["addr"]):
            folded[-1]["action"] = "free"
            continue
        folded.append(entry)
    return folded


def check_segments_tile(snapshot):
    for segment in snapshot["segments"]:
        addr = segment["address"]
        for block in segment["blocks"]:
            assert block["address"] == addr
            assert block["size"] > 0
            addr += block["size"]
        assert addr == segment["address"] + segment["total_size"]


def check_alloc_data(snapshot, device):
    """Every free pairs with an alloc of the history, and every active
    block at the end was allocated in the history."""
    live = set()
    for entry in _fold_frees(snapshot["device_traces"][device]):
        if entry["action"] == "alloc":
            assert entry["addr"] not in live
            live.add(entry["addr"])
        elif entry["action"] in ("free", "free_completed"):
            live.remove(entry["addr"])
    active = {b["address"] for s in snapshot["segments"]
              if s["device"] == device for b in s["blocks"]
              if b["state"] == "active_allocated"}
    assert active == live


def _find(segments, addr):
    for segment in segments:
        if segment["addr"] <= addr < segment["addr"] + segment["size"]:
            return segment
    return None


def check_state_history(snapshot, device):
    """Replays the trace backwards like MemoryView.simulate_memory and
    checks, at every event, that each live block lies inside a segment."""
    segments = [{"addr": s["address"], "size": s["total_size"]}
                for s in snapshot["segments"] if s["device"] == device]
    blocks = {b["address"]: b["size"] for s in snapshot["segments"]
              if s["device"] == device for b in s["blocks"]
              if b["state"] in ("active_allocated", "active_pending_free")}
    events = _fold_frees(snapshot["device_traces"][device])
    for event in reversed(events):
        _check_inside(segments, blocks)
        action, addr, size = event["action"], event["addr"], event["size"]
        if action in ("free", "free_completed"):
            blocks[addr] = size
        elif action == "free_requested":
            assert addr in blocks
        elif action == "alloc":
            del blocks[addr]
        elif action == "segment_alloc":
            matches = [s for s in segments if s["addr"] == addr]
            assert len(matches) == 1 and matches[0]["size"] == size
            segments.remove(matches[0])
        elif action == "segment_map":
            existing = _find(segments, addr)
            assert existing is not None
            end, existing_end = addr + size, existing["addr"] + existing["size"]
            assert end <= existing_end
            if existing["addr"] == addr:
                existing["addr"] += size
                existing["size"] -= size
                if existing["size"] == 0:
                    segments.remove(existing)
            elif existing_end == end:
                existing["size"] -= size
            else:
                existing["size"] = addr - existing["addr"]
                segments.append({"addr": end, "size": existing_end - end})
    _check_inside(segments, blocks)
    assert not blocks  # everything was allocated in the history


def _check_inside(segments, blocks):
    for addr, size in blocks.items():
        segment = _find(segments, addr)
        assert segment is not None, hex(addr)
        assert addr + size <= segment["addr"] + segment["size"]


def check_all(data, snapshot):
    check_pickle_bytes(data)
    check_segments_tile(snapshot)
    for device, trace in enumerate(snapshot["device_traces"]):
        if trace:
            check_alloc_data(snapshot, device)
            check_state_history(snapshot, device)
