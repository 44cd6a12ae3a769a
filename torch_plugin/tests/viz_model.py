"""A Python model of what pytorch.org/memory_viz (torch/utils/viz/
MemoryViz.js) does with a snapshot, to check exported files without a
browser: its unpickler's opcode set, `annotate_snapshot` (block addresses
tile each segment; free_requested + free_completed pairs fold into
`free`), `process_alloc_data` (each free finds its alloc) and the
Allocator State History replay, which walks the trace backwards from the
final `segments` and dereferences the segment of every live block (a block
outside every segment crashes the page)."""

import bisect
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


class _Segments:
    """Segments by start address: start -> size, with sorted starts."""

    def __init__(self, pairs):
        self.size = dict(pairs)
        self.starts = sorted(self.size)

    def find(self, addr):
        """(start, size) of the segment holding `addr`, or None."""
        k = bisect.bisect_right(self.starts, addr) - 1
        if k >= 0 and addr < self.starts[k] + self.size[self.starts[k]]:
            return self.starts[k], self.size[self.starts[k]]
        return None

    def remove(self, start):
        del self.size[start]
        del self.starts[bisect.bisect_left(self.starts, start)]

    def put(self, start, size):
        if start not in self.size:
            bisect.insort(self.starts, start)
        self.size[start] = size


class _Blocks:
    """Live blocks by address, sorted, for range queries."""

    def __init__(self, blocks):
        self.size = dict(blocks)
        self.starts = sorted(self.size)

    def add(self, addr, size, segments):
        assert addr not in self.size
        segment = segments.find(addr)
        assert segment is not None, f"block {addr:#x} is in no segment"
        assert addr + size <= segment[0] + segment[1]
        self.size[addr] = size
        bisect.insort(self.starts, addr)

    def remove(self, addr):
        del self.size[addr]
        del self.starts[bisect.bisect_left(self.starts, addr)]

    def check_range_empty(self, lo, hi):
        """No live block may touch [lo, hi), which stops being mapped."""
        k = bisect.bisect_left(self.starts, lo)
        assert k == len(self.starts) or self.starts[k] >= hi, \
            f"block {self.starts[k]:#x} loses its segment"
        if k > 0:
            before = self.starts[k - 1]
            assert before + self.size[before] <= lo, \
                f"block {before:#x} loses its segment"


def check_state_history(snapshot, device):
    """Replays the trace backwards like MemoryView.simulate_memory and
    checks that at every event each live block lies inside one segment:
    checked when a block appears and when a segment shrinks or goes."""
    segments = _Segments((s["address"], s["total_size"])
                         for s in snapshot["segments"] if s["device"] == device)
    assert len(segments.starts) == sum(
        1 for s in snapshot["segments"] if s["device"] == device)
    blocks = _Blocks([])
    for s in snapshot["segments"]:
        if s["device"] == device:
            for b in s["blocks"]:
                if b["state"] in ("active_allocated", "active_pending_free"):
                    blocks.add(b["address"], b["size"], segments)
    events = _fold_frees(snapshot["device_traces"][device])
    for event in reversed(events):
        action, addr, size = event["action"], event["addr"], event["size"]
        if action in ("free", "free_completed"):
            blocks.add(addr, size, segments)
        elif action == "free_requested":
            assert addr in blocks.size
        elif action == "alloc":
            blocks.remove(addr)
        elif action == "segment_alloc":
            assert segments.size.get(addr) == size
            segments.remove(addr)
            blocks.check_range_empty(addr, addr + size)
        elif action == "segment_map":
            existing = segments.find(addr)
            assert existing is not None
            start, existing_end = existing[0], existing[0] + existing[1]
            end = addr + size
            assert end <= existing_end
            segments.remove(start)
            if start < addr:
                segments.put(start, addr - start)
            if end < existing_end:
                segments.put(end, existing_end - end)
            blocks.check_range_empty(addr, end)
    assert not blocks.size  # everything was allocated in the history


def check_all(data, snapshot):
    check_pickle_bytes(data)
    check_segments_tile(snapshot)
    for device, trace in enumerate(snapshot["device_traces"]):
        if trace:
            check_alloc_data(snapshot, device)
            check_state_history(snapshot, device)
