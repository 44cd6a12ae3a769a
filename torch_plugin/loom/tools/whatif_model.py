"""`loom what-if --model TYPE ...`: a model's training steps recorded on the
CPU (loom record-cpu's model options and recording,
loom.tools.record_cpu_cli), then every allocator on the recorded trace
(loom.tools.predict): each one's predicted peak reserved memory at
--batch, and with --device-memory the largest micro-batch that fits under
each (recorded at batch 1, 2, 4, ... while anything fits, up to
--max-batch, then bisected; every recording replayed under the device
size). Prints a table, or JSON with --json; progress goes to stderr.
With --tp/--pp/--dp/--zero one rank of a multi-GPU job is recorded
(loom.tools.parallel_shapes); the modules holding the peak are listed, and
--snapshot writes the step as a memory_viz snapshot
(loom.tools.peak_modules).

Exit status 2 for bad arguments (an unknown model type, a --set key the
config lacks, ...), 1 when a step, the comparison or the plot fails, or
when PyTorch or transformers (the wheel's `record` extra) or, for --plot,
matplotlib (`plots`) is missing; the message is one line, without a
traceback.
"""

import dataclasses
import json
import os
import sys
import tempfile
import time

from loom import _extras
from loom.errors import LoomError
from loom.tools import compare_plot
from loom.tools import peak_modules
from loom.tools import predict
from loom.tools import record_cpu_cli
from loom.tools import trace as loom_trace
from loom.tools.forward import capture_tool

PROG = "loom what-if"
DEFAULT_MAX_BATCH = 64


def _human(value):
    for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.2f} {name}"
    return f"{value} B"


class _Recordings:
    """The step recorded once per batch (traces kept, recorders dropped)."""

    def __init__(self, spec, parallel, args, argv):
        self.spec = spec
        self.parallel = parallel
        self.args = args
        self.argv = argv
        self.by_batch = {}  # batch -> (trace, summary, seconds)
        self.recordings = {}  # batch -> parallel_shapes.Recording

    def __call__(self, batch):
        if batch not in self.by_batch:
            started = time.time()
            if self.by_batch:  # the search (the first fails in one line)
                print(f"{PROG}: recording batch {batch}", file=sys.stderr)
            recorder = record_cpu_cli.record_rank(
                dataclasses.replace(self.spec, batch=batch), self.parallel,
                self.args.steps, self.args.dynamic, self.argv,
                command="./loom what-if")
            self.recordings[batch] = recorder
            self.by_batch[batch] = (recorder.trace, recorder.summary(),
                                    time.time() - started)
            _, summary, seconds = self.by_batch[batch]
            print(f"{PROG}: batch {batch} recorded on the CPU: "
                  f"{summary['requests']} requests, peak live "
                  f"{_human(summary['peak_live_bytes'])} ({seconds:.1f} s)",
                  file=sys.stderr)
        return self.by_batch[batch][0]


def _progress(entry):
    fits = [r["allocator"] for r in entry["allocators"] if not r["oom"]]
    print(f"{PROG}: batch {entry['batch']}: peak allocated "
          f"{_human(entry['peak_allocated_bytes'])}, fits under "
          f"{', '.join(fits) if fits else 'none'}", file=sys.stderr)


def run(args, argv):
    """The --model form of `loom what-if` (args parsed by loom.tools.whatif);
    returns the exit status."""
    if record_cpu_cli.missing_recorder(PROG):
        return 1
    # Without matplotlib the prediction runs and prints; one line at the end
    # says the picture was not written (exit status 1).
    plot = args.plot if args.plot and _extras.importable("matplotlib") \
        else None
    try:
        spec, parallel = record_cpu_cli.rank_spec_from_args(args)
        record = _Recordings(spec, parallel, args, argv)
        trace = record(args.batch)
        peak = peak_modules.holders(trace)
        if args.snapshot:
            _snapshot(trace, args.snapshot)
        rows = predict.compare_allocators(trace,
                                          time_limit=args.loom_time_limit)
        search = None
        if args.device_memory is not None:
            search = predict.largest_batch(
                record, args.device_memory,
                max_batch=args.max_batch or DEFAULT_MAX_BATCH,
                time_limit=args.loom_time_limit, on_recording=_progress)
        if plot:
            _plot(trace, args)
    except record_cpu_cli.FAILURES as error:
        return record_cpu_cli.failure_status(PROG, error)
    result = _result(args, spec, record, rows, search)
    result.update(parallel_shapes_result(record, parallel, spec, args))
    result["peak"] = peak
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
        _print_extra(result)
    if args.plot and not plot:
        print(_extras.message(PROG, "--plot", ["matplotlib"],
                              outcome=f"{args.plot} not written"),
              file=sys.stderr)
        return 1
    return 0


def _result(args, spec, record, rows, search):
    _, summary, seconds = record.by_batch[args.batch]
    if search is not None:
        found = {f["allocator"]: f for f in search["allocators"]}
        for row in rows:
            entry = found.get(row["allocator"], {})
            row["largest_batch"] = entry.get("largest_batch")
            row["at_max_batch"] = entry.get("at_max_batch")
    schedule = spec.schedule + (f":{spec.chunks}"
                                if spec.schedule == "interleaved" else "")
    return {
        "model": spec.model_type, "batch": spec.batch, "seq": spec.seq,
        "steps": args.steps, "microbatches": spec.microbatches,
        "schedule": schedule, "dtype": spec.dtype,
        "recompute": spec.recompute,
        "workload": {"requests": summary["requests"],
                     "iterations": summary["iterations"],
                     "peak_live_bytes": summary["peak_live_bytes"],
                     "setup_bytes": summary["setup_bytes"],
                     "seconds": round(seconds, 3)},
        "device_memory_bytes": args.device_memory,
        "allocators": rows,
        "search": None if search is None else {
            "max_batch": search["max_batch"], "batches": search["batches"]},
        "recordings": len(record.by_batch),
    }


def _print(result):
    work = result["workload"]
    micro = result["microbatches"]
    print(f"{result['model']}: {result['steps']} steps of batch "
          f"{result['batch']} x {result['seq']} tokens"
          f"{f' x {micro} micro-batches' if micro > 1 else ''}, recorded "
          f"on the CPU: {work['requests']} requests, peak live "
          f"{_human(work['peak_live_bytes'])} ({work['seconds']:.1f} s)")
    print()
    device = result["device_memory_bytes"]
    header = f"{'allocator':<20} {'peak reserved':>14} {'efficiency':>11}"
    if device is not None:
        header += f"   largest batch in {_human(device)}"
    print(header)
    for row in result["allocators"]:
        line = (f"{row['allocator']:<20} "
                f"{_human(row['peak_reserved_bytes']):>14} "
                f"{100 * row['efficiency']:>10.2f}%")
        if device is not None:
            largest = row["largest_batch"]
            text = ("none (batch 1 does not fit)" if largest == 0 else
                    f">= {largest} (--max-batch)" if row["at_max_batch"]
                    else str(largest))
            line += f"   {text}"
        print(line)
    print()
    print(f"peak reserved at batch {result['batch']}; efficiency = peak "
          f"allocated / peak reserved")
    if result["search"] is not None:
        batches = [str(b["batch"]) for b in result["search"]["batches"]]
        print(f"largest batch: batches 1..{result['search']['max_batch']} "
              f"searched, {len(batches)} replayed in {_human(device)} "
              f"(batches {', '.join(batches)}); "
              f"{result['recordings']} recordings in all")


def parallel_shapes_result(record, parallel, spec, args):
    """The JSON keys of the job's split and the peak's holders."""
    recording = record.recordings[args.batch]
    return {"parallel": {"tp": parallel.tp, "pp": spec.stages,
                         "rank": spec.rank, "dp": parallel.dp,
                         "zero": parallel.zero},
            "optimizer": parallel.optimizer,
            "config": args.config,
            "sharded": {k: {"bytes": v[0], "shard_bytes": v[1]}
                        for k, v in recording.sharded.items()},
            "snapshot": args.snapshot}


def _snapshot(trace, path):
    try:
        peak_modules.write_snapshot(trace, path)
    except ValueError as error:  # ExportError, TraceError
        raise LoomError(f"--snapshot: {error}") from None


def _print_extra(result):
    split = result["parallel"]
    if any(split[k] > 1 for k in ("tp", "pp", "dp")):
        print(f"one rank: tensor-parallel {split['tp']}, pipeline "
              f"{split['pp']} (rank {split['rank']}), data-parallel "
              f"{split['dp']} with ZeRO {split['zero']}; optimizer "
              f"{result['optimizer']}")
    peak = result["peak"]
    print(f"at the peak ({_human(peak['peak_live_bytes'])} live, iteration "
          f"{peak['iteration']}, {peak['phase']}), made in (by layer; "
          f"--json: by module too):")
    for row in peak["layers"][:6]:
        print(f"  {_human(row['bytes']):>11}  {row['module']} "
              f"({row['requests']} requests)")
    if result["snapshot"]:
        print(f"{result['snapshot']}: the step at batch {result['batch']} "
              f"as a memory snapshot; open it at "
              f"https://pytorch.org/memory_viz")


def _plot(trace, args):
    """compare --plot on the trace at --batch; loom_tool's table is not
    printed (the plot message goes to stderr)."""
    def quiet(tool_args):
        result = capture_tool(tool_args)
        sys.stderr.write(result.stderr)
        return result.returncode

    with tempfile.TemporaryDirectory(prefix="loom-whatif-") as temp:
        path = os.path.join(temp, f"{args.model}-batch{args.batch}.ltb")
        loom_trace.write_trace(trace, path)
        options = [path, "--plot", args.plot]
        if args.loom_time_limit is not None:
            options += ["--loom-time-limit", str(args.loom_time_limit)]
        if compare_plot.run(options, quiet) != 0:
            raise LoomError(f"the plot {args.plot} could not be made")
