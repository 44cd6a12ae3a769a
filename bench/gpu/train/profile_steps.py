"""Where a training step's GPU time goes, from torch.profiler's trace.

The worker (worker.py --profile-steps N) runs N steps under
torch.profiler with CPU and CUDA activity, each step inside
`record_function(STEP_LABEL)`, exports the Chrome trace and keeps only
`summarize(trace)`: the GPU work of each step (kernels, copies, memsets),
per name and in total, and the GPU's idle time inside each step. Only
this module's `profile` needs torch; the rest reads the exported JSON
(so it is tested on the CPU on recorded output).

Per step: the step's window is its CPU annotation (each step ends with a
host sync, loss.item(), so its GPU work runs inside it); `busy_us` is the
union of its GPU activities' intervals, `span_us` from the first GPU
activity's start to the last one's end, `idle_us` = span - busy (the GPU
waited inside the step: launch gaps, host work, synchronisations),
`wall_us` the annotation's length.
"""

import gzip
import json
from collections import defaultdict

STEP_LABEL = "loom.profiled_step"
# Chrome-trace categories of GPU activity (PyTorch's Kineto export).
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# Names kept per run (the largest by total time); the rest are summed.
KEEP_NAMES = 300


def gpu_activities(trace):
    """[(name, start_us, duration_us)] of every GPU activity."""
    out = []
    for event in trace.get("traceEvents", []):
        if event.get("ph") != "X" or event.get("cat") not in GPU_CATEGORIES:
            continue
        out.append((str(event.get("name")), float(event["ts"]),
                    float(event.get("dur", 0))))
    return out


def step_windows(trace, label=STEP_LABEL):
    """[(start_us, end_us)] of the CPU annotations named `label`, in order."""
    windows = []
    for event in trace.get("traceEvents", []):
        if (event.get("ph") == "X" and event.get("name") == label
                and event.get("cat") in ("user_annotation", "cpu_op")):
            start = float(event["ts"])
            windows.append((start, start + float(event.get("dur", 0))))
    return sorted(windows)


def union_length(intervals):
    """Total length covered by [(start, end)]."""
    total = 0.0
    end_so_far = None
    for start, end in sorted(intervals):
        if end_so_far is None or start > end_so_far:
            total += end - start
            end_so_far = end
        elif end > end_so_far:
            total += end - end_so_far
            end_so_far = end
    return total


def summarize(trace, label=STEP_LABEL, keep=KEEP_NAMES):
    """The profile record the worker keeps (see the module docstring).
    Raises ValueError when the trace has no annotated step or no GPU
    activity (CUDA activity was not recorded)."""
    windows = step_windows(trace, label)
    if not windows:
        raise ValueError(f"no {label!r} annotation in the profiler trace")
    activities = gpu_activities(trace)
    if not activities:
        raise ValueError("no GPU activity in the profiler trace (was "
                         "ProfilerActivity.CUDA recorded?)")
    steps = []
    by_name = defaultdict(lambda: [0, 0.0])
    for start, end in windows:
        inside = [(name, ts, dur) for name, ts, dur in activities
                  if start <= ts < end]
        intervals = [(ts, ts + dur) for _, ts, dur in inside]
        busy = union_length(intervals)
        span = (max(e for _, e in intervals) - min(s for s, _ in intervals)
                if intervals else 0.0)
        steps.append({"wall_us": end - start, "busy_us": busy,
                      "span_us": span, "idle_us": max(0.0, span - busy),
                      "activities": len(inside),
                      "gpu_time_us": sum(dur for _, _, dur in inside)})
        for name, _, dur in inside:
            by_name[name][0] += 1
            by_name[name][1] += dur
    ranked = sorted(by_name.items(), key=lambda item: -item[1][1])
    kept = {name: [count, round(us, 3)] for name, (count, us) in
            ranked[:keep]}
    rest = ranked[keep:]
    return {
        "steps": len(steps),
        "per_step": steps,
        "names": kept,
        "other_names": len(rest),
        "other_us": round(sum(us for _, (_, us) in rest), 3),
    }


def per_step(profile, key):
    """The mean over the profiled steps of a per-step figure."""
    steps = profile.get("per_step") or []
    return sum(s[key] for s in steps) / len(steps) if steps else None


def kept_events(trace, label=STEP_LABEL):
    """The trace reduced to what summarize() reads: GPU activities and the
    step annotations (a few MB where the whole trace is tens)."""
    events = [e for e in trace.get("traceEvents", [])
              if e.get("ph") == "X" and (e.get("cat") in GPU_CATEGORIES
                                         or e.get("name") == label)]
    return {"traceEvents": events}


def profile(torch, run_step, first_step, steps, trace_path, keep=None):
    """Runs `steps` steps (run_step(index)) under torch.profiler with CPU
    and CUDA activity, exports the Chrome trace to `trace_path`, and returns
    summarize() of it (the file is deleted: it can be tens of MB; with
    `keep`, kept_events() of it is written there, gzipped)."""
    from torch.profiler import ProfilerActivity  # pylint: disable=import-outside-toplevel
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for index in range(first_step, first_step + steps):
            with torch.profiler.record_function(STEP_LABEL):
                run_step(index)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    try:
        with open(trace_path, encoding="utf-8") as source:
            trace = json.load(source)
    finally:
        trace_path.unlink(missing_ok=True)
    if keep:
        with gzip.open(keep, "wt", encoding="utf-8") as sink:
            json.dump(kept_events(trace), sink)
    return summarize(trace)
