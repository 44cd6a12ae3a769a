"""PyTorch memory snapshot -> loom trace.

One device's allocation history becomes a loom trace:
  - each `alloc` entry is an alloc with a fresh request id, size = the
    entry's requested size, stream = the entry's stream;
  - each `free_completed` frees the request live at that address (that is
    when PyTorch can reuse the memory); `free_requested` is counted only;
  - `segment_*`, `snapshot`, `oom` and unknown actions are counted and
    skipped; frames are dropped.
Blocks allocated before recording started get an alloc at the very start
of the trace: those freed in the history (a `free_completed` of an address
never seen before), in the order of their frees, sized from the free entry;
then the blocks active at the dump (`segments`, state active_allocated or
active_pending_free) that the history never allocated, by address, never
freed. Request ids are 0, 1, 2, ... in trace order. Zero-size allocs carry
no memory (a trace forbids size 0): they and their frees are skipped
and counted.

The history must be consistent: an alloc at an address that is live, a
free of an address that was freed and not allocated again, or an active
block whose address the history freed last are SnapshotErrors.
"""

import collections
import dataclasses
import os

from loom.tools import snapshot as snapshot_lib
from loom.tools import trace as loom_trace
from loom.tools.snapshot import SnapshotError


@dataclasses.dataclass
class ImportResult:
    """A converted snapshot. `addresses` maps request id -> the address
    PyTorch gave the block (usable by export_snapshot to redraw the original
    layout); `counts` is the number of entries per action in the device's
    history; `warnings` lists tolerated oddities (one line each)."""
    trace: loom_trace.Trace
    addresses: dict
    device: int
    entries: int
    counts: dict
    preexisting_freed: int
    preexisting_live: int
    zero_size_skipped: int
    peak_live_bytes: int
    warnings: list


class _Request:
    __slots__ = ("addr", "size", "stream", "entry", "skip", "id")

    def __init__(self, addr, size, stream, entry):
        self.addr, self.size, self.stream = addr, size, stream
        self.entry = entry
        self.skip = size == 0
        self.id = None


def pick_device(snapshot, device=None, source="<snapshot>"):
    """The device to import: `device` if given (checked), else the one with
    the most trace entries (lowest index on ties)."""
    traces = snapshot["device_traces"]
    known = set(range(len(traces)))
    known.update(segment["device"] for segment in snapshot["segments"])
    if device is not None:
        if device not in known:
            listed = ", ".join(map(str, sorted(known))) or "none"
            raise SnapshotError(f"{source}: device {device} is not in the "
                                f"snapshot (devices: {listed})")
        return device
    if not known:
        raise SnapshotError(f"{source}: the snapshot has no device traces "
                            f"and no segments")
    return max(sorted(known), key=lambda d: len(traces[d]) if d < len(traces)
               else 0)


def _replay_history(entries, source, device):
    """Pairs allocs and frees by address. Returns (history, pre_freed, live,
    last_free, counts, mismatches): history is a list of (kind, request,
    stream); pre_freed the blocks freed before any alloc at their address;
    live the requests live at the end, by address; last_free the entry index
    of each address's last free; mismatches the frees whose size differs
    from their alloc's."""
    counts = collections.Counter()
    history, pre_freed = [], []
    live = {}         # address -> _Request
    last_free = {}    # address -> entry index of its last free_completed
    mismatches = 0
    for index, entry in enumerate(entries):
        action = entry["action"]
        counts[action] += 1
        if action == "alloc":
            addr = entry["addr"]
            if addr in live:
                raise SnapshotError(
                    f"{source}: device_traces[{device}][{index}]: alloc at "
                    f"address {addr:#x}, which is still live (allocated by "
                    f"entry {live[addr].entry}); the history is inconsistent")
            request = _Request(addr, entry["size"], entry["stream"], index)
            live[addr] = request
            if not request.skip:
                history.append((loom_trace.ALLOC, request, request.stream))
        elif action == "free_completed":
            addr = entry["addr"]
            request = live.pop(addr, None)
            if request is None:
                if addr in last_free:
                    raise SnapshotError(
                        f"{source}: device_traces[{device}][{index}]: "
                        f"free_completed of address {addr:#x}, which was "
                        f"freed by entry {last_free[addr]} and not allocated "
                        f"again; the history is inconsistent")
                request = _Request(addr, entry["size"], entry["stream"], index)
                pre_freed.append(request)
            elif request.size != entry["size"]:
                mismatches += 1
            last_free[addr] = index
            if not request.skip:
                history.append((loom_trace.FREE, request, entry["stream"]))
    return history, pre_freed, live, last_free, counts, mismatches


def convert_snapshot(snapshot, device=None, source="<snapshot>"):
    """Converts a validated snapshot dict (see loom.tools.snapshot) to a loom
    trace. Raises SnapshotError on an inconsistent history."""
    device = pick_device(snapshot, device, source)
    traces = snapshot["device_traces"]
    entries = traces[device] if device < len(traces) else []
    history, pre_freed, live, last_free, counts, mismatches = _replay_history(
        entries, source, device)

    pre_live, end_mismatches = [], 0
    active = snapshot_lib.active_blocks(snapshot, device)
    for addr, requested, stream in active:
        if addr in live:
            end_mismatches += live[addr].size != requested
        elif addr in last_free:
            raise SnapshotError(
                f"{source}: segments: the block at {addr:#x} is active at the "
                f"dump, but device_traces[{device}][{last_free[addr]}] freed "
                f"it and no later entry allocated it again")
        else:
            pre_live.append(_Request(addr, requested, stream, None))
    active_addresses = {addr for addr, _, _ in active}
    not_active = sum(1 for addr, request in live.items()
                     if addr not in active_addresses and not request.skip)

    events, addresses = [], {}
    zero_skipped = sum(1 for r in pre_freed + pre_live if r.skip) + sum(
        1 for e in entries if e["action"] == "alloc" and e["size"] == 0)
    pre_freed = [r for r in pre_freed if not r.skip]
    pre_live = [r for r in pre_live if not r.skip]
    live_bytes = 0
    for request in pre_freed + pre_live:
        request.id = len(addresses)
        addresses[request.id] = request.addr
        events.append(loom_trace.Event.alloc(request.id, request.size,
                                             request.stream, device))
        live_bytes += request.size
    peak = live_bytes
    for kind, request, stream in history:
        if kind == loom_trace.ALLOC:
            request.id = len(addresses)
            addresses[request.id] = request.addr
            events.append(loom_trace.Event.alloc(request.id, request.size,
                                                 stream, device))
            live_bytes += request.size
            peak = max(peak, live_bytes)
        elif request.id is not None:
            events.append(loom_trace.Event.free(request.id, stream, device))
            live_bytes -= request.size

    warnings = []
    if mismatches:
        warnings.append(f"{mismatches} free_completed entries name a size "
                        f"other than their alloc's (the alloc's size is used)")
    if end_mismatches:
        warnings.append(f"{end_mismatches} active blocks have a requested "
                        f"size other than their alloc's")
    if not_active:
        warnings.append(f"{not_active} blocks live at the end of the history "
                        f"are not active in 'segments'")
    if zero_skipped:
        warnings.append(f"{zero_skipped} zero-size blocks skipped")

    name = os.path.basename(str(source))
    trace = loom_trace.Trace(
        device=device, granularity=0,
        provenance=f"snapshot import of {name} device {device}",
        events=events)
    return ImportResult(
        trace=trace, addresses=addresses, device=device, entries=len(entries),
        counts=dict(counts), preexisting_freed=len(pre_freed),
        preexisting_live=len(pre_live), zero_size_skipped=zero_skipped,
        peak_live_bytes=peak, warnings=warnings)


def import_snapshot(path, device=None):
    """Loads the snapshot at `path` safely and converts one device's history
    (default: the device with the most entries) to a loom trace."""
    snapshot = snapshot_lib.load_snapshot(path)
    return convert_snapshot(snapshot, device, str(path))
