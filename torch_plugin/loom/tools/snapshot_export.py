"""loom trace -> PyTorch memory snapshot, for pytorch.org/memory_viz.

`export_snapshot(trace, path, addresses=None)` writes a pickle (protocol 4,
plain types only: what the visualizer's own unpickler reads) shaped like
`torch.cuda.memory._dump_snapshot`'s:
  - `device_traces[d]`: per loom alloc an `alloc` entry; per loom free a
    `free_requested` entry immediately followed by `free_completed` (the
    visualizer folds the pair into one `free`); every entry has `addr`,
    `size` (the requested size), `stream`, `time_us` (= the loom event
    index) and `frames: []`. Markers are not exported.
  - segment entries, by `segment_mode`: "alloc" (default) emits one
    `segment_alloc` per segment just before the first alloc inside it, where
    the segments are the maximal runs of granules any request ever touches
    (so every block lies in a segment the whole time); "map" mimics an
    expandable segment: before each alloc, a `segment_map` for each run of
    granules it touches that no earlier alloc touched. Nothing is unmapped.
  - `segments`: the final state, one entry per segment (per maximal run of
    mapped granules), whose blocks tile it: the requests live at the end
    (`active_allocated`, size = requested size) and `inactive` gaps.
Addresses come from `addresses` ({request id: address}, e.g. a plan's
offsets, or the original addresses from import), else from `first_fit`.
Invariants checked before writing: every alloc has an address, no two live
requests of a device overlap, and every address + size is below 2^53 (the
visualizer's JavaScript numbers are exact only up to there).
"""

import bisect
import csv
import pickle

from loom.tools import trace as loom_trace

DEFAULT_GRANULARITY = 2 << 20  # bytes: CUDA's VMM granule on current GPUs
FIRST_FIT_ALIGNMENT = 512      # PyTorch's minimum block size
MAX_VIZ_ADDRESS = 1 << 53
PICKLE_PROTOCOL = 4            # the visualizer reads protocols 2..4


class ExportError(ValueError):
    """The trace and the addresses cannot be exported; the message says why."""


class _Runs:
    """Disjoint, sorted, half-open integer intervals; touching ones merge."""

    def __init__(self):
        self.los, self.his = [], []

    def add(self, lo, hi):
        """Adds [lo, hi); returns the sub-intervals that were not covered."""
        first = bisect.bisect_left(self.his, lo)
        last = bisect.bisect_right(self.los, hi)
        pieces, cursor = [], lo
        for k in range(first, last):
            if self.los[k] > cursor:
                pieces.append((cursor, min(self.los[k], hi)))
            cursor = max(cursor, self.his[k])
        if cursor < hi:
            pieces.append((cursor, hi))
        if first < last:
            lo, hi = min(lo, self.los[first]), max(hi, self.his[last - 1])
        self.los[first:last] = [lo]
        self.his[first:last] = [hi]
        return pieces

    def find(self, point):
        """The interval containing `point`, or None."""
        k = bisect.bisect_right(self.los, point) - 1
        if k >= 0 and point < self.his[k]:
            return self.los[k], self.his[k]
        return None

    def __iter__(self):
        return iter(zip(self.los, self.his))


_UNBOUNDED = 1 << 80  # end of the last hole: above any address


class _FirstFit:
    """First-fit placement in one address space from 0 up. The free space is
    kept as sorted holes [lo, hi) (the last one unbounded), in blocks of
    BLOCK holes with the largest gap of each block, so a search skips whole
    blocks of holes too small for the request."""

    BLOCK = 64

    def __init__(self, alignment):
        self.alignment = alignment
        self.los, self.his, self.gaps = [0], [_UNBOUNDED], [_UNBOUNDED]
        self.block_max = [_UNBOUNDED]

    def _replace(self, k, count, holes):
        """Replaces holes k..k+count-1 by `holes`; refreshes block maxima."""
        self.los[k:k + count] = [lo for lo, _ in holes]
        self.his[k:k + count] = [hi for _, hi in holes]
        self.gaps[k:k + count] = [hi - lo for lo, hi in holes]
        size, gaps = self.BLOCK, self.gaps
        first = k // size
        self.block_max[first:] = [max(gaps[i:i + size])
                                  for i in range(first * size, len(gaps), size)]

    def alloc(self, size):
        align, block = self.alignment, self.BLOCK
        for b, largest in enumerate(self.block_max):
            if largest < size:
                continue
            for k in range(b * block, min((b + 1) * block, len(self.los))):
                lo, hi = self.los[k], self.his[k]
                offset = -(-lo // align) * align
                if offset + size <= hi:
                    pieces = [(lo, offset)] if offset > lo else []
                    if offset + size < hi:
                        pieces.append((offset + size, hi))
                    self._replace(k, 1, pieces)
                    return offset
        raise AssertionError("the last hole is unbounded")

    def free(self, lo, hi):
        k = bisect.bisect_left(self.los, lo)
        first, count = k, 0
        if k > 0 and self.his[k - 1] == lo:  # merge with the hole before
            first, count = k - 1, 1
            lo = self.los[k - 1]
        if k < len(self.los) and self.los[k] == hi:  # and the one after
            count += 1
            hi = self.his[k]
        self._replace(first, count, [(lo, hi)])


def first_fit(trace, alignment=FIRST_FIT_ALIGNMENT):
    """A simple placement: each alloc, in trace order, gets the lowest
    `alignment`-aligned offset where it does not overlap a live request of
    its device. Returns the offsets of the alloc events, in trace order (a
    list, since a request id may be allocated again after its free).
    REQUIRES: validate_trace(trace) passes."""
    offsets, spaces, placed = [], {}, {}
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            space = spaces.get(event.device)
            if space is None:
                space = spaces[event.device] = _FirstFit(alignment)
            offset = space.alloc(event.size)
            offsets.append(offset)
            placed[event.id] = (space, offset, offset + event.size)
        elif event.kind == loom_trace.FREE:
            space, lo, hi = placed.pop(event.id)
            space.free(lo, hi)
    return offsets


def _entry(action, addr, size, stream, time_us):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": time_us, "frames": []}


class _Device:
    """Export state of one device's address space."""

    def __init__(self, granularity, components):
        self.granularity = granularity
        self.components = components   # alloc mode: _Runs of granules
        self.emitted = set()           # alloc mode: emitted segment starts
        self.mapped = _Runs()          # granules with a segment event
        self.segment_stream = {}       # segment start granule -> stream
        self.starts = []               # live blocks' addresses, sorted
        self.live = {}                 # address -> (end, request id, size)
        self.entries = []

    def place(self, event, addr):
        """Checks [addr, addr+size) against the live blocks and records it."""
        end = addr + event.size
        k = bisect.bisect_left(self.starts, addr)
        for neighbour in (k - 1, k):
            if 0 <= neighbour < len(self.starts):
                start = self.starts[neighbour]
                other_end, other_id, _ = self.live[start]
                if start < end and addr < other_end:
                    raise ExportError(
                        f"request {event.id} at [{addr:#x}, {end:#x}) overlaps "
                        f"live request {other_id} at [{start:#x}, "
                        f"{other_end:#x}) on device {event.device}")
        self.starts.insert(k, addr)
        self.live[addr] = (end, event.id, event.size)

    def segment_events(self, addr, size, stream, time_us, mode):
        g = self.granularity
        first, last = addr // g, -(-(addr + size) // g)
        if mode == "map":
            for lo, hi in self.mapped.add(first, last):
                self.segment_stream.setdefault(lo, stream)
                self.entries.append(_entry("segment_map", lo * g, (hi - lo) * g,
                                           stream, time_us))
            return
        lo, hi = self.components.find(first)
        if lo not in self.emitted:
            self.emitted.add(lo)
            self.mapped.add(lo, hi)
            self.segment_stream[lo] = stream
            self.entries.append(_entry("segment_alloc", lo * g, (hi - lo) * g,
                                       stream, time_us))

    def final_segments(self, device, mode):
        g = self.granularity
        segments = []
        for lo, hi in self.mapped:
            start, end = lo * g, hi * g
            blocks, cursor = [], start
            k = bisect.bisect_left(self.starts, start)
            while k < len(self.starts) and self.starts[k] < end:
                addr = self.starts[k]
                _, _, size = self.live[addr]
                if addr > cursor:
                    blocks.append(_block(cursor, addr - cursor, 0, "inactive"))
                blocks.append(_block(addr, size, size, "active_allocated"))
                cursor = addr + size
                k += 1
            if cursor < end:
                blocks.append(_block(cursor, end - cursor, 0, "inactive"))
            active = sum(b["size"] for b in blocks if b["requested_size"])
            segments.append({
                "device": device, "address": start, "total_size": end - start,
                "allocated_size": active, "active_size": active,
                "requested_size": active,
                "stream": self.segment_stream.get(lo, 0),
                "segment_type": "large", "segment_pool_id": (0, 0),
                "is_expandable": mode == "map", "frames": [],
                "blocks": blocks})
        return segments


def _block(address, size, requested, state):
    return {"address": address, "size": size, "requested_size": requested,
            "state": state, "frames": []}


def _alloc_addresses(trace, addresses):
    """The address of each alloc event, in trace order: addresses[id], or
    first_fit's offsets when `addresses` is None. Checked."""
    if addresses is None:
        return first_fit(trace)
    result = []
    for index, event in enumerate(trace.events):
        if event.kind != loom_trace.ALLOC:
            continue
        addr = addresses.get(event.id)
        if addr is None:
            raise ExportError(f"event {index}: no address for request "
                              f"{event.id}")
        if type(addr) is not int or addr < 0:
            raise ExportError(f"request {event.id}: address {addr!r} is not "
                              f"a non-negative integer")
        result.append(addr)
    return result


def _components(trace, alloc_addresses, granularity):
    """Per device, the runs of granules touched by any request."""
    runs = {}
    allocs = (e for e in trace.events if e.kind == loom_trace.ALLOC)
    for event, addr in zip(allocs, alloc_addresses):
        if addr + event.size > MAX_VIZ_ADDRESS:
            raise ExportError(f"request {event.id}: address {addr:#x} + size "
                              f"{event.size} exceeds 2^53, which the "
                              f"visualizer cannot represent exactly")
        runs.setdefault(event.device, _Runs()).add(
            addr // granularity, -(-(addr + event.size) // granularity))
    return runs


def build_snapshot(trace, addresses=None, granularity=None,
                   segment_mode="alloc"):
    """The snapshot dict for `trace` (see the module docstring).
    `granularity` defaults to the trace's, or 2 MiB if that is 0. Raises
    ExportError (bad addresses, overlaps) or TraceError (invalid trace)."""
    loom_trace.validate_trace(trace)
    if segment_mode not in ("alloc", "map"):
        raise ExportError(f"segment mode {segment_mode!r} is not 'alloc' or "
                          f"'map'")
    granularity = granularity or trace.granularity or DEFAULT_GRANULARITY
    if type(granularity) is not int or granularity < 1:
        raise ExportError(f"granularity {granularity!r} is not a positive "
                          f"integer")
    alloc_addresses = _alloc_addresses(trace, addresses)
    components = _components(trace, alloc_addresses, granularity)
    next_address = iter(alloc_addresses)
    devices = {}
    where = {}  # live request id -> (its _Device, addr, size)
    for time_us, event in enumerate(trace.events):
        if event.kind == loom_trace.ALLOC:
            state = devices.get(event.device)
            if state is None:
                state = devices[event.device] = _Device(
                    granularity, components[event.device])
            addr = next(next_address)
            state.place(event, addr)
            state.segment_events(addr, event.size, event.stream, time_us,
                                 segment_mode)
            state.entries.append(_entry("alloc", addr, event.size,
                                        event.stream, time_us))
            where[event.id] = (state, addr, event.size)
        elif event.kind == loom_trace.FREE:
            state, addr, size = where.pop(event.id)
            del state.starts[bisect.bisect_left(state.starts, addr)]
            del state.live[addr]
            for action in ("free_requested", "free_completed"):
                state.entries.append(_entry(action, addr, size, event.stream,
                                            time_us))
    count = max([trace.device + 1, *[d + 1 for d in devices]])
    device_traces = [devices[d].entries if d in devices else []
                     for d in range(count)]
    segments = []
    for device in sorted(devices):
        segments.extend(devices[device].final_segments(device, segment_mode))
    return {"segments": segments, "device_traces": device_traces}


def export_snapshot(trace, path, addresses=None, granularity=None,
                    segment_mode="alloc"):
    """Writes `trace` (a loom.tools.trace.Trace, or the path of a trace
    file, either form) as a memory-snapshot pickle at `path`; returns the
    snapshot dict."""
    if not isinstance(trace, loom_trace.Trace):
        trace = loom_trace.read_trace(trace)
    snapshot = build_snapshot(trace, addresses, granularity, segment_mode)
    data = pickle.dumps(snapshot, protocol=PICKLE_PROTOCOL)
    try:
        with open(path, "wb") as out:
            out.write(data)
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror}") from None
    return snapshot


# --------------------------------------------------------------- offsets CSV

_COLUMN_ALIASES = {
    "id": "id", "buffer": "id", "buffer_id": "id",
    "lower": "lower", "begin": "lower", "start": "lower",
    "upper": "upper", "end": "upper", "size": "size",
    "alignment": "alignment", "offset": "offset",
}


def read_offsets_csv(path):
    """Reads a plan's offsets from a MiniMalloc-style CSV (`id,lower,upper,
    size,offset`, as written by `loom plan --offsets`; ids are request ids).
    Returns {id: (offset, size)}. Raises ExportError naming file and line."""
    try:
        with open(path, newline="", encoding="utf-8") as source:
            rows = list(csv.reader(source))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ExportError(f"{path}: cannot read: {reason}") from None
    if not rows:
        raise ExportError(f"{path}:1: empty file, expected a header line")
    header = [name.strip() for name in rows[0]]
    columns = {}
    for index, name in enumerate(header):
        key = _COLUMN_ALIASES.get(name)
        if key is None:
            raise ExportError(f"{path}:1: unknown column {name!r}")
        if key in columns:
            raise ExportError(f"{path}:1: column {name!r} given twice")
        columns[key] = index
    for needed in ("id", "size", "offset"):
        if needed not in columns:
            raise ExportError(f"{path}:1: missing column '{needed}'")
    offsets = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row or (len(row) == 1 and not row[0].strip()):
            continue
        if len(row) != len(header):
            raise ExportError(f"{path}:{line}: {len(row)} fields, the header "
                              f"has {len(header)}")
        values = {}
        for key in ("id", "size", "offset"):
            text = row[columns[key]].strip()
            if not text.isdigit() or not text.isascii() or len(text) > 20:
                raise ExportError(f"{path}:{line}: {key} {text!r} is not an "
                                  f"unsigned integer")
            values[key] = int(text)
        if values["id"] in offsets:
            raise ExportError(f"{path}:{line}: id {values['id']} given twice")
        offsets[values["id"]] = (values["offset"], values["size"])
    return offsets


def addresses_from_plan(trace, plan, source="<plan>"):
    """{request id: offset} from read_offsets_csv's result, after checking
    that the plan covers exactly the trace's requests with the same sizes."""
    sizes = {}
    for event in trace.events:
        if event.kind == loom_trace.ALLOC:
            sizes.setdefault(event.id, event.size)
            if event.id not in plan:
                raise ExportError(f"{source}: no offset for request "
                                  f"{event.id} of the trace")
            if plan[event.id][1] != event.size:
                raise ExportError(
                    f"{source}: id {event.id} has size {plan[event.id][1]}, "
                    f"the trace's request {event.id} has size {event.size}")
    extra = sorted(set(plan) - set(sizes))
    if extra:
        raise ExportError(f"{source}: {len(extra)} ids are not requests of "
                          f"the trace (first: {extra[0]})")
    return {request: offset for request, (offset, _) in plan.items()}
