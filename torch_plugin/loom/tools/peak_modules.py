"""Which modules hold a recorded step's peak, and the step as a PyTorch
memory snapshot whose frames are module stacks: `loom what-if --model`'s
peak breakdown and `--snapshot FILE` (loom.tools.whatif_model), for any
loom trace with module markers (loom.record_cpu's, loom's own).

holders(trace) finds the first event at which the live requested bytes
are highest and groups the requests live there by where each was made:
its innermost open module (qualified name), or, outside every module
marker, "(set-up)" before the first iteration, else "(<phase>)" (a CPU
recording marks modules in the forward; in the backward only dynamic
ones, so most gradients are "(backward)"; the optimizer's state is
"(optimizer)"). `layers` groups the same requests by decoder layer: a
name inside `<...>.layers.<i>` (or `.h.<i>`, `.blocks.<i>`) counts for
that layer.

write_snapshot(trace, path) is loom.tools.snapshot_export's export (first
fit addresses, one segment per run of touched granules) with every alloc
entry's and live block's `frames` set to the module stack it was made in,
innermost first: {"name": module, "filename": phase, "line": iteration},
which pytorch.org/memory_viz shows as `phase:iteration:module`.
"""

import pickle
import re

from loom.tools import snapshot_export
from loom.tools import trace as loom_trace


def _origins(trace):
    """Per alloc event (in order): (module stack, phase, iteration)."""
    stack, phase, iteration, seen_iteration = [], None, None, False
    for event in trace.events:
        kind = event.kind
        if kind == loom_trace.ITER_BEGIN:
            iteration, seen_iteration = event.id, True
        elif kind == loom_trace.ITER_END:
            iteration, phase = None, None
            stack.clear()
        elif kind == loom_trace.PHASE:
            phase = event.name
        elif kind == loom_trace.MODULE_ENTER:
            stack.append(event.name)
        elif kind == loom_trace.MODULE_EXIT:
            if event.name in stack:
                while stack and stack.pop() != event.name:
                    pass
        elif kind == loom_trace.ALLOC:
            where = phase if seen_iteration else "set-up"
            yield event, tuple(stack), where or "step", iteration


_LAYER = re.compile(r"(.*?\.(?:layers|h|blocks)\.\d+)(?:\.|$)")


def _layer(label):
    match = _LAYER.match(label)
    return match.group(1) if match else label


def _rows(groups):
    return sorted(({"module": label, "bytes": b, "requests": n}
                   for label, (b, n) in groups.items()),
                  key=lambda r: (-r["bytes"], r["module"]))


def _label(stack, where):
    return stack[-1] if stack else f"({where})"


def holders(trace, top=10):
    """The requests live at the trace's peak, by where they were made:
    {peak_live_bytes, iteration, phase (at the peak), modules: [{module,
    bytes, requests}] largest first (`top` of them; 0: all), others_bytes
    (the rest), layers: the same grouped by decoder layer (`top`)}."""
    live = peak = 0
    peak_index = -1
    sizes = {}
    for index, event in enumerate(trace.events):
        if event.kind == loom_trace.ALLOC:
            sizes[event.id] = event.size
            live += event.size
            if live > peak:
                peak, peak_index = live, index
        elif event.kind == loom_trace.FREE:
            live -= sizes.pop(event.id, 0)
    alive = {}
    origins = _origins(loom_trace.Trace(events=trace.events[:peak_index + 1]))
    for event, stack, where, iteration in origins:
        alive[event.id] = (event.size, _label(stack, where))
    phase = iteration = None
    for event in trace.events[:peak_index + 1]:
        if event.kind == loom_trace.FREE:
            alive.pop(event.id, None)
        elif event.kind == loom_trace.PHASE:
            phase = event.name
        elif event.kind == loom_trace.ITER_BEGIN:
            iteration = event.id
    groups, layers = {}, {}
    for size, label in alive.values():
        for table, key in ((groups, label), (layers, _layer(label))):
            entry = table.setdefault(key, [0, 0])
            entry[0] += size
            entry[1] += 1
    rows = _rows(groups)
    shown = rows[:top] if top else rows
    by_layer = _rows(layers)
    return {"peak_live_bytes": peak, "iteration": iteration, "phase": phase,
            "modules": shown,
            "others_bytes": sum(r["bytes"] for r in rows[len(shown):]),
            "layers": by_layer[:top] if top else by_layer}


def _frames(stack, where, iteration):
    line = -1 if iteration is None else iteration
    names = list(reversed(stack)) or [f"({where})"]
    return [{"name": name, "filename": where, "line": line}
            for name in names]


def build_snapshot(trace):
    """snapshot_export.build_snapshot(trace) with module-stack frames."""
    snapshot = snapshot_export.build_snapshot(trace)
    frames = [_frames(stack, where, iteration)
              for _, stack, where, iteration in _origins(trace)]
    allocs = [e for e in trace.events if e.kind == loom_trace.ALLOC]
    by_device = {}
    for event, frame in zip(allocs, frames):
        by_device.setdefault(event.device, []).append(frame)
    for device, entries in enumerate(snapshot["device_traces"]):
        pending = iter(by_device.get(device, []))
        live = {}
        for entry in entries:
            if entry["action"] == "alloc":
                entry["frames"] = next(pending)
                live[entry["addr"]] = entry["frames"]
            elif entry["action"] == "free_completed":
                live.pop(entry["addr"], None)
        for segment in snapshot["segments"]:
            if segment["device"] != device:
                continue
            for block in segment["blocks"]:
                if block["state"] == "active_allocated":
                    block["frames"] = live.get(block["address"], [])
    return snapshot


def write_snapshot(trace, path):
    """Writes build_snapshot(trace) at `path` (a pickle memory_viz opens);
    returns the snapshot. ExportError when it cannot be written."""
    snapshot = build_snapshot(trace)
    try:
        with open(path, "wb") as out:
            pickle.dump(snapshot, out,
                        protocol=snapshot_export.PICKLE_PROTOCOL)
    except OSError as error:
        raise snapshot_export.ExportError(
            f"{path}: cannot write: {error.strerror}") from None
    return snapshot
