"""Small hand-made memory snapshots, shaped like _dump_snapshot's output."""

import pickle


def entry(action, addr, size, stream=0, time_us=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": time_us, "frames": [{"filename": "x.py", "line": 1,
                                            "name": "f"}]}


def block(address, size, state, requested=None):
    return {"address": address, "size": size,
            "requested_size": size if requested is None else requested,
            "state": state, "frames": []}


def segment(address, blocks, device=0, stream=0):
    total = sum(b["size"] for b in blocks)
    return {"device": device, "address": address, "total_size": total,
            "allocated_size": 0, "active_size": 0, "requested_size": 0,
            "stream": stream, "segment_type": "large",
            "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
            "blocks": blocks}


def snapshot(traces, segments=()):
    return {"segments": list(segments), "device_traces": list(traces),
            "allocator_settings": {"expandable_segments": False},
            "external_annotations": []}


def dumps(snap):
    return pickle.dumps(snap, protocol=4)


def write(path, snap):
    path.write_bytes(dumps(snap))
    return path
