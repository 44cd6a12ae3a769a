"""One training run of the GPU comparison, in a fresh process.

    python3 worker.py --model NAME --allocator torch|expandable|loom|loom-...
        --micro-batch N --warmup N --steps N --out result.json
        [--workdir DIR] [--snapshot FILE] [--scale full|tiny]
        [--profile-steps N] [--seed N] [--plan FILE]

The allocator is chosen before CUDA is touched (it can be chosen once per
process): `torch` is PyTorch's caching allocator as configured by default,
`expandable` the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
`loom` is loom in auto mode (records `--record-iterations` iterations,
plans them in the background, serves the plan from the next iteration
boundary on; the warm-up waits for the plan so the measured steps run on
it); a loom layout variant (models.LOOM_VARIANTS, e.g. loom-chunk1) is loom
with those options; `loom-plan` is loom in plan mode with the plan file
`--plan` (made beforehand from another run's recording: no recording and
no planning in this process); `loom-remember` is auto mode with
remember=True (a second run in the same --workdir serves the first run's
whole-run plan from its first request). Then `--warmup` steps, then `--steps` timed steps (each
ends with a host sync: loss.item()), then, with --profile-steps N, N more
steps under torch.profiler with CUDA activity (profile_steps.py: GPU time
per kernel name and per step, the GPU's idle time inside each step) and,
under loom, its counters over those steps (waits by call site, mapping
layout, sampled host time per C ABI call).

Written to --out (JSON): peak allocated and reserved over the whole
process (torch.cuda.memory_stats; loom's under loom), the seconds of each
timed step, for loom the driver calls and plan hits during the timed steps
and its status, or {"oom": true} when the run ran out of memory. Exit code
0 for a finished run and for an OOM, 1 for anything else (the JSON then
holds the error). `--snapshot` records PyTorch's allocation history from
process start (torch/expandable only) and dumps it there.
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402  pylint: disable=wrong-import-position
import profile_steps  # noqa: E402  pylint: disable=wrong-import-position


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=models.MODEL_NAMES, required=True)
    parser.add_argument("--allocator", choices=models.ALL_ALLOCATORS,
                        required=True)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", default=".loom-train")
    parser.add_argument("--snapshot", default=None)
    parser.add_argument("--snapshot-entries", type=int, default=2_000_000)
    parser.add_argument("--scale", choices=("full", "tiny"), default="full")
    parser.add_argument("--record-iterations", type=int, default=3)
    parser.add_argument("--plan-time-limit", type=float, default=20)
    parser.add_argument("--seed", type=int, default=1234,
                        help="the weights' and the data's seed (a plan "
                        "made from a run of another seed)")
    parser.add_argument("--plan", default=None,
                        help="the plan file of --allocator loom-plan")
    parser.add_argument("--profile-steps", type=int, default=0)
    parser.add_argument("--profile-trace", default=None,
                        help="keep the profiled steps' GPU activities and "
                        "step annotations here (Chrome trace, gzip)")
    args = parser.parse_args(argv)
    if args.profile_steps < 0:
        parser.error("--profile-steps must not be negative")
    if args.snapshot and models.is_loom(args.allocator):
        parser.error("--snapshot records PyTorch's allocator (torch or "
                     "expandable), not loom")
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be positive and --warmup not negative")
    if (args.allocator == models.PLANNED) != (args.plan is not None):
        parser.error("--plan FILE goes with --allocator loom-plan, and only "
                     "with it")
    if args.plan is not None and not Path(args.plan).is_file():
        parser.error(f"--plan {args.plan}: no such file")
    return args


def choose_allocator(args):
    """Before torch touches CUDA. Returns the loom module or None."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "expandable_segments" in conf:
        raise SystemExit("PYTORCH_CUDA_ALLOC_CONF already sets "
                         "expandable_segments; unset it")
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(
            filter(None, [conf, "expandable_segments:True"]))
    if not models.is_loom(args.allocator):
        return None
    import loom  # pylint: disable=import-outside-toplevel
    if args.allocator == models.PLANNED:
        loom.enable(mode="plan", plan=args.plan, workdir=args.workdir)
        return loom
    options = models.loom_options(args.allocator)
    if args.allocator == models.REMEMBERED:
        options["remember"] = True
    loom.enable(mode="auto", workdir=args.workdir,
                record_iterations=args.record_iterations,
                plan_options={"time_limit": args.plan_time_limit},
                **options)
    return loom


def is_oom(torch, error):
    oom_type = getattr(torch, "OutOfMemoryError",
                       getattr(torch.cuda, "OutOfMemoryError", ()))
    if oom_type and isinstance(error, oom_type):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error)


def environment(torch):
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_bytes": props.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": sys.version.split()[0]}


def loom_counters(loom):
    stats = loom.memory_stats()
    return {"driver_calls": stats.get("loom.driver_calls.total", 0),
            "plan_hits": stats.get("loom.plan_hits", 0),
            "plan_misses": stats.get("loom.plan_misses", 0),
            "dynamic_requests": stats.get("loom.dynamic_requests", 0)}


# loom.memory_stats() keys kept from the profiled steps: the waits loom
# did (by call site), its mapping layout, its sampled host time.
INSTRUMENT_PREFIXES = ("loom.waits.", "loom.layout.", "loom.host.",
                       "loom.driver_calls.")


def instruments(loom):
    stats = loom.memory_stats()
    return {k: v for k, v in stats.items()
            if k.startswith(INSTRUMENT_PREFIXES)}


def counter_delta(before, after):
    """after - before for counters (waits, calls, host), the value after
    for the layout (a state, not a count)."""
    out = {}
    for key, value in after.items():
        if key.startswith("loom.layout.") or key.endswith(".sample_every"):
            out[key] = value
        elif key.endswith(".mean_ns"):
            continue  # a mean since start: recomputed below from the deltas
        elif isinstance(value, (int, float)):
            out[key] = value - before.get(key, 0)
    for key in list(out):
        if key.endswith(".samples") and out[key]:
            stem = key[:-len(".samples")]
            out[stem + ".mean_ns"] = out.get(stem + ".sampled_ns", 0) // out[key]
    return out


def profile_run(args, torch, loom, trainer, step, result):
    """--profile-steps steps under torch.profiler; returns the next step."""
    before = instruments(loom) if loom is not None else None
    trace = Path(args.out).with_suffix(".profile.json")
    try:
        result["profile"] = profile_steps.profile(
            torch, trainer.step, step, args.profile_steps, trace,
            keep=args.profile_trace)
    except ValueError as error:  # the profiler recorded nothing usable
        result["profile_error"] = str(error)
        return step + args.profile_steps
    if loom is not None:
        result["profile"]["loom"] = counter_delta(before, instruments(loom))
    return step + args.profile_steps


def train(args, torch, loom, result):
    spec = models.spec(args.model, args.scale)
    micro_batch = args.micro_batch or spec.micro_batch
    result["micro_batch"] = micro_batch
    trainer = models.build(torch, spec, micro_batch, seed=args.seed)
    if loom is not None:
        loom.watch(trainer.model, dynamic=models.dynamic_modules(spec))
        loom.watch(trainer.optimizer)
    step = 0
    started = time.monotonic()
    # loom's auto mode: record, plan, then warm up on the plan (plan mode
    # serves its plan from the first request).
    if loom is not None and args.allocator != models.PLANNED:
        for _ in range(args.record_iterations + 1):
            trainer.step(step)
            step += 1
        loom.wait_for_plan(timeout=600)
        result["plan_wait_s"] = time.monotonic() - started
    for _ in range(args.warmup):
        trainer.step(step)
        step += 1
    before = loom_counters(loom) if loom is not None else None
    times, losses = [], []
    for _ in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(trainer.step(step))
        times.append(time.perf_counter() - t0)
        step += 1
    result["step_seconds"] = times
    result["median_step_s"] = statistics.median(times)
    result["final_loss"] = losses[-1]
    if loom is not None:
        after = loom_counters(loom)
        delta = {k: after[k] - before[k] for k in after}
        result["timed"] = delta
        result["driver_calls_per_step"] = delta["driver_calls"] / args.steps
        planned = delta["plan_hits"] + delta["plan_misses"]
        result["hit_rate"] = delta["plan_hits"] / planned if planned else None
        status = loom.status()
        result["loom_state"] = status["state"]
        result["plan_loaded"] = status["plan_loaded"]
        result["plan_error"] = status["plan_error"]
        # The plan referee's verdict (issue 23): a plan that held more than
        # the dynamic space alone would stops serving ("lost"), and the
        # timed steps then route no request to it (hit_rate None).
        result["plan_verdict"] = status["plan_verdict"]
        result["plan_referee"] = status["plan_referee"]
        # The plan replayed on its recording (auto mode; "declined" state
        # when it loses there: whatif/loom/plan_check.h).
        result["plan_check"] = status["plan_check"]
        result["trace"] = status["files"].get("trace")
        result["plan_file"] = args.plan
        result["plan_source"] = status["plan_source"]
        result["remembered"] = status["remembered"]
    if args.profile_steps:
        profile_run(args, torch, loom, trainer, step, result)


def memory(torch, result):
    stats = torch.cuda.memory_stats()
    for key in ("allocated_bytes.all.peak", "reserved_bytes.all.peak",
                "num_alloc_retries", "num_ooms"):
        result[key] = stats.get(key)
    allocated = result["allocated_bytes.all.peak"]
    reserved = result["reserved_bytes.all.peak"]
    result["efficiency"] = allocated / reserved if reserved else None
    free, total = torch.cuda.mem_get_info()
    result["device_used_bytes"] = total - free


def main(argv):
    args = parse_args(argv)
    result = {"model": args.model, "allocator": args.allocator,
              "scale": args.scale, "seed": args.seed, "warmup": args.warmup,
              "steps": args.steps, "oom": False}
    out = Path(args.out)
    code = 0
    loom = None
    try:
        loom = choose_allocator(args)
        import torch  # pylint: disable=import-outside-toplevel
        if args.snapshot:
            torch.cuda.memory._record_memory_history(  # pylint: disable=protected-access
                max_entries=args.snapshot_entries, context=None)
        result["env"] = environment(torch)
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            train(args, torch, loom, result)
        except Exception as error:  # pylint: disable=broad-except
            if not is_oom(torch, error):
                raise
            result["oom"] = True
            result["error"] = str(error)[:1000]
        memory(torch, result)
        if args.snapshot:
            torch.cuda.memory._dump_snapshot(args.snapshot)  # pylint: disable=protected-access
        if loom is not None:
            loom.finish()
    except BaseException as error:  # pylint: disable=broad-except
        result["error"] = "".join(traceback.format_exception(error))[-4000:]
        code = 1
    out.write_text(json.dumps(result, indent=1, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
