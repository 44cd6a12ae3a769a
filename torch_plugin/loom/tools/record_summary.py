"""Counting and comparing the events of a CPU recording
(loom.tools.record_cpu): frees in a canonical order, the summary `loom
record-cpu` prints, and how a CPU recording differs from a GPU trace of the
same step (bench/data/recorded/compare_gpu.py).
"""

from loom.tools import trace as loom_trace


def canonical_frees(events):
    """`events` with each run of consecutive frees in request order. Frees
    with nothing between them happen at one point of the program (a
    container dropped at once, such as the recomputed tensors of a
    checkpointed layer), in an order Python picks (hashes of objects, which
    change from run to run); no allocator can tell the orders apart, since
    nothing is allocated between them. In request order, the same step
    gives the same trace."""
    result = []
    run = []
    for event in events:
        if event.kind == loom_trace.FREE:
            run.append(event)
            continue
        if run:
            run.sort(key=lambda e: e.id)
            result += run
            run = []
        result.append(event)
    run.sort(key=lambda e: e.id)
    return result + run


def summarize(events, peak=None, setup=None):
    """Counts of a list of events (see Recorder.summary)."""
    allocs = frees = 0
    per_iteration = []
    current = None
    live = top = 0
    sizes = {}
    for event in events:
        kind = event.kind
        if kind == loom_trace.ALLOC:
            allocs += 1
            sizes[event.id] = event.size
            live += event.size
            top = max(top, live)
            if current is not None:
                current += 1
        elif kind == loom_trace.FREE:
            frees += 1
            live -= sizes.pop(event.id, 0)
        elif kind == loom_trace.ITER_BEGIN:
            current = 0
        elif kind == loom_trace.ITER_END and current is not None:
            per_iteration.append(current)
            current = None
    return {"requests": allocs, "frees": frees,
            "iterations": len(per_iteration),
            "requests_per_iteration": per_iteration,
            "peak_live_bytes": top if peak is None else peak,
            "setup_bytes": setup, "events": len(events)}


def compare_traces(cpu, gpu, skip=1):
    """How a CPU recording differs from a GPU trace of the same step: for
    each trace, requests and requested bytes per complete iteration (from
    iteration `skip` on: iteration 0 holds the optimizer's lazy state, and
    a GPU recording's also the set-up), peak live bytes, and the sizes of
    the steady iterations' requests only one side made (a multiset
    difference; the GPU's extra sizes are what the CPU cannot see).
    `cpu`, `gpu`: Trace objects or trace files."""
    traces = [loom_trace.read_trace(t) if not isinstance(
        t, loom_trace.Trace) else t for t in (cpu, gpu)]
    sides = []
    for trace in traces:
        iterations = []
        current = None
        for event in trace.events:
            if event.kind == loom_trace.ITER_BEGIN:
                current = []
            elif event.kind == loom_trace.ITER_END and current is not None:
                iterations.append(current)
                current = None
            elif event.kind == loom_trace.ALLOC and current is not None:
                current.append(event.size)
        steady = iterations[skip:]
        info = summarize(trace.events)
        sides.append({
            "requests_per_iteration": [len(i) for i in steady],
            "bytes_per_iteration": [sum(i) for i in steady],
            "peak_live_bytes": info["peak_live_bytes"],
            "requests": info["requests"],
            "sizes": [size for i in steady for size in i],
            "iterations": len(steady)})
    cpu_side, gpu_side = sides
    only = []
    for mine, theirs in ((cpu_side, gpu_side), (gpu_side, cpu_side)):
        counts = {}
        for size in mine["sizes"]:
            counts[size] = counts.get(size, 0) + 1
        for size in theirs["sizes"]:
            if counts.get(size):
                counts[size] -= 1
        per = max(1, mine["iterations"])
        only.append(sorted(((size, n / per) for size, n in counts.items()
                            if n), key=lambda x: -x[0] * x[1]))
    for side in sides:
        del side["sizes"]
    return {"cpu": cpu_side, "gpu": gpu_side,
            "cpu_only_sizes": only[0], "gpu_only_sizes": only[1]}
